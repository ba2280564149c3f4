//! The `runtime:` section of the agent config (issue 31): the node's runtime matrix — for each Kubernetes minor
//! the containerd, runc and CNI plugin versions (a bundle) the node must run, each with the artifact it comes
//! from — the commands that report what the node runs now, and the sequence that installs a bundle. The
//! `containerRuntime` step picks the bundle of its target version's minor; the inventory reports the versions.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::artifact::ArtifactSource;
use crate::config::CommandSequence;
use crate::sequence::command::check_argv;

/// Most bundles a matrix may hold (one per Kubernetes minor: far more minors than are ever supported at once).
pub const MAX_RUNTIME_BUNDLES: usize = 32;
/// Longest component version accepted (`2.1.4`, `1.3.3-rc.1`).
pub const MAX_COMPONENT_VERSION_BYTES: usize = 64;

/// The components of a bundle, in the order they are checked and reported.
pub const COMPONENTS: [&str; 3] = ["containerd", "runc", "cniPlugins"];

/// `runtime:`: the matrix, the version commands and the install sequence.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeConfig {
    /// One bundle per Kubernetes minor.
    pub matrix: Vec<Bundle>,
    /// How the node reports each component's version (inventory, the step's check and its verification).
    #[serde(default)]
    pub versions: VersionCommands,
    /// Installs a bundle. Its templates know the Kubernetes `{{version}}`/`{{minor}}` and, as pins, the bundle:
    /// `{{pin.containerdVersion}}`, `{{pin.containerdSource}}`, `{{pin.containerdSha256}}` (when set), the same
    /// for `runc` and `cniPlugins`. Its `record:`/`undo:` are the step's rollback.
    pub install: CommandSequence,
}

/// The runtime a node must run for one Kubernetes minor.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bundle {
    /// The Kubernetes minor, `v1.34`: every `v1.34.x` target gets this bundle.
    pub kubernetes: String,
    /// containerd.
    pub containerd: Component,
    /// runc.
    pub runc: Component,
    /// The CNI plugins.
    pub cni_plugins: Component,
}

/// One component of a bundle: its version and where it comes from.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Component {
    /// The version its version command must report (`2.1.4`; a leading `v` is ignored).
    pub version: String,
    /// `oci://registry/repository@sha256:<hex>` (a tag is refused), `https://…` or `file://…` (with `sha256`).
    pub source: String,
    /// The SHA-256 of an `https://` or `file://` source.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// The commands whose output names each component's version (the first line containing it counts).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VersionCommands {
    /// Default `containerd --version` (`containerd github.com/containerd/containerd/v2 v2.1.4 <commit>`).
    #[serde(default = "default_containerd")]
    pub containerd: Vec<String>,
    /// Default `runc --version` (`runc version 1.3.3`).
    #[serde(default = "default_runc")]
    pub runc: Vec<String>,
    /// Default `/opt/cni/bin/loopback --version` (upstream builds print `CNI loopback plugin v1.8.0`; builds
    /// without a version, Debian's among them, need another command, e.g. a file the install sequence writes).
    #[serde(default = "default_cni")]
    pub cni_plugins: Vec<String>,
}

impl Default for VersionCommands {
    fn default() -> Self {
        Self {
            containerd: default_containerd(),
            runc: default_runc(),
            cni_plugins: default_cni(),
        }
    }
}

fn default_containerd() -> Vec<String> {
    vec!["containerd".into(), "--version".into()]
}

fn default_runc() -> Vec<String> {
    vec!["runc".into(), "--version".into()]
}

fn default_cni() -> Vec<String> {
    vec!["{{root}}/opt/cni/bin/loopback".into(), "--version".into()]
}

impl VersionCommands {
    /// The command of `component` (one of [`COMPONENTS`]).
    pub fn of(&self, component: &str) -> &[String] {
        match component {
            "containerd" => &self.containerd,
            "runc" => &self.runc,
            _ => &self.cni_plugins,
        }
    }
}

impl Bundle {
    /// The component named `name` (one of [`COMPONENTS`]).
    pub fn component(&self, name: &str) -> &Component {
        match name {
            "containerd" => &self.containerd,
            "runc" => &self.runc,
            _ => &self.cni_plugins,
        }
    }

    /// The bundle as `{{pin.<component>Version|Source|Sha256}}` values of the install sequence.
    pub fn pins(&self) -> BTreeMap<String, String> {
        let mut pins = BTreeMap::new();
        for name in COMPONENTS {
            let c = self.component(name);
            pins.insert(format!("{name}Version"), bare(&c.version).to_owned());
            pins.insert(format!("{name}Source"), c.source.clone());
            if let Some(sha256) = &c.sha256 {
                pins.insert(format!("{name}Sha256"), sha256.clone());
            }
        }
        pins
    }

    /// `containerd 2.1.4, runc 1.3.3, CNI plugins 1.8.0`.
    pub fn summary(&self) -> String {
        format!(
            "containerd {}, runc {}, CNI plugins {}",
            bare(&self.containerd.version),
            bare(&self.runc.version),
            bare(&self.cni_plugins.version)
        )
    }
}

impl RuntimeConfig {
    /// The bundle for a Kubernetes version `v1.34.1` (its minor's), if the matrix has one.
    pub fn bundle_for(&self, kubernetes_version: &str) -> Option<&Bundle> {
        let minor = minor_of(kubernetes_version)?;
        self.matrix.iter().find(|b| b.kubernetes == minor)
    }

    /// The minors the matrix covers, for messages.
    pub fn minors(&self) -> String {
        let minors: Vec<&str> = self.matrix.iter().map(|b| b.kubernetes.as_str()).collect();
        minors.join(", ")
    }

    /// Checks the matrix (minors unique and well formed, versions plain, sources by digest), the version
    /// commands and the install sequence; every error names its key.
    pub fn validate(&self) -> Result<(), String> {
        if self.matrix.is_empty() {
            return Err("runtime.matrix: needs at least one bundle".into());
        }
        if self.matrix.len() > MAX_RUNTIME_BUNDLES {
            return Err(format!(
                "runtime.matrix: {} bundles, at most {MAX_RUNTIME_BUNDLES}",
                self.matrix.len()
            ));
        }
        for (i, bundle) in self.matrix.iter().enumerate() {
            let at = format!("runtime.matrix[{i}]");
            if !is_minor(&bundle.kubernetes) {
                return Err(format!(
                    "{at}.kubernetes: {:?} is not a Kubernetes minor like v1.34",
                    bundle.kubernetes
                ));
            }
            if self.matrix[..i]
                .iter()
                .any(|b| b.kubernetes == bundle.kubernetes)
            {
                return Err(format!(
                    "{at}.kubernetes: {} has a bundle already",
                    bundle.kubernetes
                ));
            }
            for name in COMPONENTS {
                let c = bundle.component(name);
                let ok = !c.version.is_empty()
                    && c.version.len() <= MAX_COMPONENT_VERSION_BYTES
                    && c.version
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_alphanumeric())
                    && c.version
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._+~-".contains(&b));
                if !ok {
                    return Err(format!(
                        "{at}.{name}.version: {:?} is not a version like 2.1.4",
                        c.version
                    ));
                }
                ArtifactSource::parse(&c.source, c.sha256.as_deref())
                    .map_err(|e| format!("{at}.{name}.source: {e}"))?;
            }
        }
        for name in COMPONENTS {
            check_argv(self.versions.of(name))
                .map_err(|e| format!("runtime.versions.{name}: {e}"))?;
        }
        self.install
            .validate(true)
            .map_err(|e| format!("runtime.install: {e}"))
    }
}

/// `2.1.4` of `v2.1.4`.
pub fn bare(version: &str) -> &str {
    version.strip_prefix('v').unwrap_or(version)
}

/// `v1.34` of `v1.34.1`.
fn minor_of(version: &str) -> Option<String> {
    let mut parts = bare(version).splitn(3, '.');
    Some(format!("v{}.{}", parts.next()?, parts.next()?))
}

fn is_minor(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('v') else {
        return false;
    };
    let mut parts = rest.split('.');
    let number =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    number(parts.next()) && number(parts.next()) && parts.next().is_none()
}

/// Whether a version command's output reports `version`: `2.1.4` (or `v2.1.4`) as a whole token, not as the
/// start of `2.1.45` or the end of `12.1.4`.
pub fn reports_version(output: &str, version: &str) -> bool {
    let want = bare(version);
    let bytes = output.as_bytes();
    let mut from = 0;
    while let Some(found) = output[from..].find(want) {
        let start = from + found;
        let end = start + want.len();
        let before_ok = match start.checked_sub(1).map(|i| bytes[i]) {
            None => true,
            Some(b'v') => start < 2 || !bytes[start - 2].is_ascii_alphanumeric(),
            Some(b) => !b.is_ascii_alphanumeric() && b != b'.',
        };
        let after_ok = bytes.get(end).is_none_or(|b| {
            !b.is_ascii_digit() && *b != b'.'
                || (*b == b'.' && !bytes.get(end + 1).is_some_and(u8::is_ascii_digit))
        });
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_counts_only_as_a_whole_token() {
        let containerd = "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376";
        assert!(reports_version(containerd, "2.1.4"));
        assert!(reports_version(containerd, "v2.1.4"));
        assert!(!reports_version(containerd, "2.1"));
        assert!(!reports_version(containerd, "1.4"));
        assert!(!reports_version("runc version 1.3.35", "1.3.3"));
        assert!(reports_version(
            "runc version 1.3.3\ncommit: v1.3.3-0-gd842d771",
            "1.3.3"
        ));
        assert!(!reports_version("runc version 11.3.3", "1.3.3"));
        assert!(reports_version("CNI loopback plugin v1.8.0.", "1.8.0"));
        assert!(!reports_version(
            "CNI loopback plugin version unknown",
            "1.8.0"
        ));
    }

    #[test]
    fn the_bundle_of_a_version_is_its_minors() {
        let yaml = r#"
matrix:
  - kubernetes: v1.33
    containerd: {version: "1.7.28", source: "oci://r.example/containerd@sha256:1111111111111111111111111111111111111111111111111111111111111111"}
    runc: {version: "1.3.3", source: "https://r.example/runc.amd64", sha256: "2222222222222222222222222222222222222222222222222222222222222222"}
    cniPlugins: {version: "v1.8.0", source: "file:///srv/cni.tgz", sha256: "3333333333333333333333333333333333333333333333333333333333333333"}
install:
  commands:
    - run: [true]
"#;
        let config: RuntimeConfig = serde_yaml_ng::from_str(yaml).unwrap();
        config.validate().unwrap();
        assert!(config.bundle_for("v1.34.0").is_none());
        let bundle = config.bundle_for("v1.33.4").unwrap();
        assert_eq!(
            bundle.summary(),
            "containerd 1.7.28, runc 1.3.3, CNI plugins 1.8.0"
        );
        let pins = bundle.pins();
        assert_eq!(pins["cniPluginsVersion"], "1.8.0");
        assert_eq!(pins["runcSha256"].len(), 64);
        assert!(!pins.contains_key("containerdSha256"));
    }

    #[test]
    fn bad_matrices_are_refused_naming_the_key() {
        let base = |kubernetes: &str, source: &str| {
            format!(
                r#"
matrix:
  - kubernetes: {kubernetes}
    containerd: {{version: "2.1.4", source: "{source}"}}
    runc: {{version: "1.3.3", source: "file:///r", sha256: "2222222222222222222222222222222222222222222222222222222222222222"}}
    cniPlugins: {{version: "1.8.0", source: "file:///c", sha256: "3333333333333333333333333333333333333333333333333333333333333333"}}
install:
  commands:
    - run: [true]
"#
            )
        };
        let digest = "oci://r.example/containerd@sha256:1111111111111111111111111111111111111111111111111111111111111111";
        let check = |yaml: String| {
            let config: RuntimeConfig = serde_yaml_ng::from_str(&yaml).unwrap();
            config.validate().unwrap_err()
        };
        let err = check(base("v1.34", "oci://r.example/containerd:2.1.4"));
        assert!(
            err.starts_with("runtime.matrix[0].containerd.source:") && err.contains("tag"),
            "{err}"
        );
        let err = check(base("1.34", digest));
        assert!(err.contains("runtime.matrix[0].kubernetes"), "{err}");
        let err = check(base("v1.34.1", digest));
        assert!(err.contains("not a Kubernetes minor"), "{err}");
    }
}
