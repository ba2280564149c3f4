//! The `artifacts:` section of the agent's `--config`: how `fetch` commands reach registries and `https://`
//! servers (mirror rewrites, the credentials file, the one CA trusted, the size limit, the layer media type,
//! the retries through an outage) and where downloads are kept (`<state-dir>/artifacts`, pruned after [`ARTIFACT_RETENTION`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::artifact::{
    Credentials, DEFAULT_FETCH_RETRY, FetchOptions, MAX_ARTIFACT_BYTES, MirrorRewrite,
    OptionsError, check_ca_file,
};
use crate::fsutil::{FsError, fs_err, remove_file};
use crate::retry::RetryPolicy;

/// The download directory under the state dir.
pub const ARTIFACT_DIR: &str = "artifacts";

/// A verified artifact not used for this long (its mtime: a fetch that reuses it touches it), and a
/// `.partial` not written for this long, are removed when the agent starts and when a plan ends.
pub const ARTIFACT_RETENTION: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// `artifacts:` — every key is optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactsConfig {
    /// Registry prefix rewrites, first match wins: `{prefix: registry.example.com/k8s, replacement:
    /// mirror.local:5443/k8s}`.
    #[serde(default)]
    pub mirrors: Vec<MirrorConfig>,
    /// A Docker `config.json` (`auths`), read at each fetch (a rotated file is picked up); never logged.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// PEM CA bundle: when set, the only CA trusted for registries and `https://` sources.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Largest artifact accepted, 1 ..= [`MAX_ARTIFACT_BYTES`] (the default).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// When an image has several layers, the media type of the one to fetch.
    #[serde(default)]
    pub layer_media_type: Option<String>,
    /// How often, and how far apart, a fetch that failed for a transient cause (no connection, 5xx, 429, a
    /// body cut short) is tried again within the step's timeout; [`DEFAULT_FETCH_RETRY`] when absent.
    #[serde(default)]
    pub retry: Option<RetryPolicy>,
}

/// One `artifacts.mirrors` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MirrorConfig {
    /// `registry[:port][/repository prefix]` as the sources name it.
    pub prefix: String,
    /// `registry[:port][/repository prefix]` to fetch from instead.
    pub replacement: String,
}

impl ArtifactsConfig {
    /// Checks every key (naming it); reads the credentials and CA files once, so a bad one fails at start.
    pub fn validate(&self) -> Result<(), String> {
        for (i, mirror) in self.mirrors.iter().enumerate() {
            for (key, value) in [
                ("prefix", &mirror.prefix),
                ("replacement", &mirror.replacement),
            ] {
                if !is_registry_name(value) {
                    return Err(format!(
                        "artifacts.mirrors[{i}].{key}: {value:?} is not registry[:port][/path] \
                         (no scheme, no tag or digest)"
                    ));
                }
            }
        }
        if let Some(path) = &self.credentials_file {
            absolute("credentialsFile", path)?;
            Credentials::from_file(path).map_err(|e| format!("artifacts.credentialsFile: {e}"))?;
        }
        if let Some(path) = &self.ca_file {
            absolute("caFile", path)?;
            check_ca_file(path).map_err(|e| format!("artifacts.caFile: {e}"))?;
        }
        if let Some(max) = self.max_bytes
            && !(1..=MAX_ARTIFACT_BYTES).contains(&max)
        {
            return Err(format!(
                "artifacts.maxBytes: {max} is not between 1 and {MAX_ARTIFACT_BYTES}"
            ));
        }
        if let Some(media_type) = &self.layer_media_type
            && (media_type.is_empty() || media_type.contains(char::is_whitespace))
        {
            return Err(format!(
                "artifacts.layerMediaType: {media_type:?} is not a media type"
            ));
        }
        if let Some(retry) = &self.retry {
            retry.validate().map_err(|e| format!("artifacts.{e}"))?;
        }
        Ok(())
    }

    /// The rewrites as the fetcher takes them.
    pub fn rewrites(&self) -> Vec<MirrorRewrite> {
        self.mirrors
            .iter()
            .map(|m| MirrorRewrite {
                prefix: m.prefix.clone(),
                replacement: m.replacement.clone(),
            })
            .collect()
    }

    /// The options of one fetch into `<state_dir>/artifacts`, the credentials file read now.
    pub fn fetch_options(&self, state_dir: &Path) -> Result<FetchOptions, OptionsError> {
        let mut options = FetchOptions::new(state_dir.join(ARTIFACT_DIR));
        options.mirrors = self.rewrites();
        if let Some(path) = &self.credentials_file {
            options.credentials = Credentials::from_file(path)?;
        }
        options.ca_file.clone_from(&self.ca_file);
        options.max_bytes = self.max_bytes.unwrap_or(MAX_ARTIFACT_BYTES);
        options.layer_media_type.clone_from(&self.layer_media_type);
        options.retry = self.retry.unwrap_or(DEFAULT_FETCH_RETRY);
        Ok(options)
    }
}

fn absolute(key: &str, path: &Path) -> Result<(), String> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(format!(
            "artifacts.{key}: {} is not an absolute path",
            path.display()
        ))
    }
}

/// `host[:port]` optionally followed by `/path`: lower-case repository characters, no `@`.
fn is_registry_name(text: &str) -> bool {
    let (host, path) = text.split_once('/').unwrap_or((text, ""));
    !host.is_empty()
        && !host.ends_with(':')
        && (path.is_empty() || path.split('/').all(|segment| !segment.is_empty()))
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        && path
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
}

/// What [`prune`] removes: the names among `entries` (name, last modified) whose age at `now` is over
/// `retention` — finished artifacts (`sha256-<hex>`) and `.partial` downloads alike; other names are left.
pub fn expired(
    entries: &[(String, SystemTime)],
    now: SystemTime,
    retention: Duration,
) -> Vec<String> {
    entries
        .iter()
        .filter(|(name, _)| name.starts_with("sha256-"))
        .filter(|(_, modified)| {
            now.duration_since(*modified)
                .is_ok_and(|age| age > retention)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Removes what [`expired`] names from `<state_dir>/artifacts`; answers how many files went.
pub fn prune(state_dir: &Path, now: SystemTime) -> Result<usize, FsError> {
    let dir = state_dir.join(ARTIFACT_DIR);
    let read = match std::fs::read_dir(&dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(fs_err("list", &dir)(e)),
    };
    let mut entries = Vec::new();
    for entry in read {
        let entry = entry.map_err(fs_err("list", &dir))?;
        let meta = entry.metadata().map_err(fs_err("stat", &entry.path()))?;
        if meta.is_file()
            && let Ok(modified) = meta.modified()
        {
            entries.push((entry.file_name().to_string_lossy().into_owned(), modified));
        }
    }
    let names = expired(&entries, now, ARTIFACT_RETENTION);
    for name in &names {
        remove_file(&dir.join(name))?;
    }
    Ok(names.len())
}

/// [`prune`] now, its outcome logged (a failure only means old downloads stay a while longer).
pub(crate) fn prune_now(state_dir: &Path) {
    match prune(state_dir, SystemTime::now()) {
        Ok(0) => {}
        Ok(removed) => tracing::info!(
            removed,
            retention_days = ARTIFACT_RETENTION.as_secs() / 86_400,
            "pruned old artifact downloads"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot prune old artifact downloads"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Result<ArtifactsConfig, String> {
        let config: ArtifactsConfig = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        config.validate().map(|()| config)
    }

    #[test]
    fn every_bad_key_is_named() {
        for (yaml, wanted) in [
            (
                "mirrors: [{prefix: \"https://r.example\", replacement: m.local}]",
                "artifacts.mirrors[0].prefix: \"https://r.example\" is not registry[:port][/path]",
            ),
            (
                "mirrors: [{prefix: r.example, replacement: \"m.local/k8s@sha256:ab\"}]",
                "artifacts.mirrors[0].replacement:",
            ),
            ("maxBytes: 0", "artifacts.maxBytes: 0 is not between 1 and"),
            (
                "maxBytes: 2147483649",
                "artifacts.maxBytes: 2147483649 is not between 1 and 2147483648",
            ),
            (
                "credentialsFile: relative.json",
                "artifacts.credentialsFile: relative.json is not an absolute path",
            ),
            (
                "caFile: /nonexistent/ca.pem",
                "artifacts.caFile: /nonexistent/ca.pem:",
            ),
            (
                "layerMediaType: \"a b\"",
                "artifacts.layerMediaType: \"a b\" is not a media type",
            ),
            ("mirror: []", "unknown field `mirror`"),
        ] {
            let err = config(yaml).unwrap_err();
            assert!(err.contains(wanted), "{yaml}: {err}");
        }
    }

    #[test]
    fn a_ca_file_without_a_certificate_fails_at_load_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let err = config(&format!("caFile: {}", ca.display())).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "artifacts.caFile: registry CA file {}:",
                ca.display()
            )),
            "{err}"
        );
        let creds = dir.path().join("config.json");
        std::fs::write(&creds, "agent:s3cret").unwrap();
        let err = config(&format!("credentialsFile: {}", creds.display())).unwrap_err();
        assert!(
            err.contains("not a Docker config.json") && !err.contains("s3cret"),
            "{err}"
        );
    }

    #[test]
    fn options_take_every_key_and_the_state_dir() {
        let config = config(
            "mirrors: [{prefix: registry.example.com/k8s, replacement: \"127.0.0.1:5443/mirror/k8s\"}]\n\
             maxBytes: 1000\nlayerMediaType: application/vnd.example.raw\n",
        )
        .unwrap();
        let options = config.fetch_options(Path::new("/var/lib/agent")).unwrap();
        assert_eq!(options.download_dir, Path::new("/var/lib/agent/artifacts"));
        assert_eq!(options.mirrors, config.rewrites());
        assert_eq!(options.max_bytes, 1000);
        assert_eq!(
            options.layer_media_type.as_deref(),
            Some("application/vnd.example.raw")
        );
        let defaults = ArtifactsConfig::default()
            .fetch_options(Path::new("/s"))
            .unwrap();
        assert_eq!(defaults.max_bytes, MAX_ARTIFACT_BYTES);
        assert!(defaults.ca_file.is_none() && defaults.mirrors.is_empty());
    }

    #[test]
    fn a_fetch_command_is_checked_at_load_naming_the_key() {
        let hex = "ab".repeat(32);
        let load = |fetch: &str| {
            let yaml =
                format!("kubernetes:\n  installKubelet:\n    commands:\n      - fetch: {fetch}\n");
            crate::config::DriverConfig::from_yaml(&yaml).map(|_| ())
        };
        load(&format!(
            "{{source: \"oci://r.example/k8s/kubelet@sha256:{hex}\", to: /usr/bin/kubelet, mode: \"0755\"}}"
        ))
        .unwrap();
        // Templated: checked when the step prepares.
        load("{source: \"{{pin.kubeletSource}}\", sha256: \"{{pin.kubeletSha256}}\", to: /usr/bin/kubelet}")
            .unwrap();
        load("{source: \"https://dl.example/kubelet\", sha256: \"{{pin.kubeletSha256}}\", to: /usr/bin/kubelet}")
            .unwrap();
        for (fetch, wanted) in [
            (
                "{source: \"oci://r.example/k8s/kubelet:v1.34.1\", to: /usr/bin/kubelet}"
                    .to_owned(),
                "kubernetes.installKubelet: commands[0]: fetch.source: \"oci://r.example/k8s/kubelet:v1.34.1\" names a tag",
            ),
            (
                "{source: \"https://dl.example/kubelet\", to: /usr/bin/kubelet}".to_owned(),
                "commands[0]: fetch.source: \"https://dl.example/kubelet\": needs its sha256",
            ),
            (
                format!(
                    "{{source: \"oci://r.example/k8s/kubelet@sha256:{hex}\", sha256: \"{hex}\", to: /usr/bin/kubelet}}"
                ),
                "`sha256` is for https:// and file:// sources",
            ),
            (
                format!(
                    "{{source: \"oci://r.example/k8s/kubelet@sha256:{hex}\", to: usr/bin/kubelet}}"
                ),
                "commands[0]: fetch.to: \"usr/bin/kubelet\" is not an absolute node path",
            ),
            (
                format!(
                    "{{source: \"oci://r.example/k8s/kubelet@sha256:{hex}\", to: /k, mode: \"rwx\"}}"
                ),
                "commands[0]: fetch.mode: mode \"rwx\" is not octal",
            ),
            (
                format!("{{source: \"oci://r.example/k8s/kubelet@sha256:{hex}\", path: /k}}"),
                "unknown field `path`",
            ),
        ] {
            let err = load(&fetch).unwrap_err().to_string();
            assert!(err.contains(wanted), "{fetch}: {err}");
        }
    }

    #[test]
    fn pruning_takes_old_artifacts_and_partials_only() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 24 * 3600);
        let day = Duration::from_secs(24 * 3600);
        let entries = [
            ("sha256-aa".to_owned(), now - 8 * day),
            ("sha256-bb.partial".to_owned(), now - 8 * day),
            ("sha256-cc".to_owned(), now - 6 * day),
            ("sha256-dd.partial".to_owned(), now - day),
            ("notes.txt".to_owned(), now - 30 * day),
            // A clock set back: never "expired".
            ("sha256-ee".to_owned(), now + day),
        ];
        assert_eq!(
            expired(&entries, now, ARTIFACT_RETENTION),
            ["sha256-aa", "sha256-bb.partial"]
        );
    }

    #[test]
    fn prune_removes_the_expired_files_from_the_download_dir() {
        let state = tempfile::tempdir().unwrap();
        assert_eq!(prune(state.path(), SystemTime::now()).unwrap(), 0);
        let dir = state.path().join(ARTIFACT_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sha256-old"), "x").unwrap();
        std::fs::write(dir.join("sha256-new.partial"), "x").unwrap();
        let old = std::fs::File::options()
            .write(true)
            .open(dir.join("sha256-old"))
            .unwrap();
        old.set_modified(SystemTime::now() - ARTIFACT_RETENTION - Duration::from_secs(60))
            .unwrap();
        assert_eq!(prune(state.path(), SystemTime::now()).unwrap(), 1);
        assert!(!dir.join("sha256-old").exists());
        assert!(dir.join("sha256-new.partial").exists());
    }
}
