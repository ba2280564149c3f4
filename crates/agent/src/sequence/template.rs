//! `{{name}}` substitution in configured command arguments. Values come from the agent itself
//! (root) or from a validated version, never from free server text; templates are checked when
//! the config is loaded so a typo fails at start, not mid-upgrade. `{{record.<name>}}` (a value a
//! sequence's `record:` command printed before the step began, bounded and restricted by
//! `crate::sequence::undo`) and `{{record.<name>.minor}}` (`v1.33` of a recorded `1.33.4-1.1`) exist only in
//! `undo:` commands. `{{image}}` (a validated OS image) exists only in `osImage.apply` commands.

use std::collections::BTreeMap;

/// Variables a template may use besides `pin.<name>`.
pub(crate) const KNOWN_VARIABLES: [&str; 4] = ["version", "bareVersion", "minor", "root"];

/// Values for one expansion.
#[derive(Clone, Debug, Default)]
pub(crate) struct Vars {
    /// Plain variables (`version`, `bareVersion`, `minor`, `root`).
    pub plain: BTreeMap<&'static str, String>,
    /// `pin.<name>` values for the version at hand.
    pub pins: BTreeMap<String, String>,
    /// `record.<name>` values (undo commands only).
    pub records: BTreeMap<String, String>,
}

impl Vars {
    /// Variables for a Kubernetes version `v1.34.1` and a root: `version` = `v1.34.1`,
    /// `bareVersion` = `1.34.1`, `minor` = `v1.34`, `root` = the root path.
    pub fn for_version(version: &str, root: &str, pins: BTreeMap<String, String>) -> Self {
        let bare = version.strip_prefix('v').unwrap_or(version);
        let minor = {
            let mut parts = bare.splitn(3, '.');
            match (parts.next(), parts.next()) {
                (Some(major), Some(minor)) => format!("v{major}.{minor}"),
                _ => version.to_owned(),
            }
        };
        let mut plain = BTreeMap::new();
        plain.insert("version", version.to_owned());
        plain.insert("bareVersion", bare.to_owned());
        plain.insert("minor", minor);
        plain.insert("root", root.to_owned());
        Self {
            plain,
            pins,
            records: BTreeMap::new(),
        }
    }

    /// Variables of an `osImage.apply` command: `image` and `root`.
    pub fn for_image(image: &str, root: &str) -> Self {
        let mut vars = Self::root_only(root);
        vars.plain.insert("image", image.to_owned());
        vars
    }

    /// Variables with only `root`.
    pub fn root_only(root: &str) -> Self {
        let mut plain = BTreeMap::new();
        plain.insert("root", root.to_owned());
        Self {
            plain,
            ..Self::default()
        }
    }
}

/// The names used in `template` (checked syntax: `{{` always closed by `}}`).
pub(crate) fn variables(template: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| TemplateError::Unclosed {
            template: template.to_owned(),
        })?;
        names.push(after[..end].trim());
        rest = &after[end + 2..];
    }
    Ok(names)
}

/// Variables an `osImage.apply` command may use (no Kubernetes version, so no pins either).
pub(crate) const OS_IMAGE_VARIABLES: [&str; 2] = ["image", "root"];

/// Which variables a configured text may use.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scope<'a> {
    /// A Kubernetes version step's forward command: [`KNOWN_VARIABLES`] and `pin.<name>`.
    Forward,
    /// An `undo:` command: also `record.<name>` for these declared record names.
    Undo(&'a [&'a str]),
    /// An `osImage` command: [`OS_IMAGE_VARIABLES`] only.
    OsImage,
    /// A command that knows only `root` (the reboot commands).
    Root,
}

/// Checks a template's variables against [`KNOWN_VARIABLES`] and `pin.<name>`.
pub(crate) fn check(template: &str) -> Result<(), String> {
    check_in(template, Scope::Forward)
}

/// Checks a template's variables against what `scope` knows.
pub(crate) fn check_in(template: &str, scope: Scope<'_>) -> Result<(), String> {
    for name in variables(template)? {
        let only: Option<&[&str]> = match scope {
            Scope::OsImage => Some(&OS_IMAGE_VARIABLES),
            Scope::Root => Some(&["root"]),
            Scope::Forward | Scope::Undo(_) => None,
        };
        if let Some(only) = only {
            if !only.contains(&name) {
                return Err(format!(
                    "unknown variable {{{{{name}}}}} in {template:?} (this command knows: {})",
                    only.join(", ")
                ));
            }
            continue;
        }
        if let Some(record) = name.strip_prefix("record.") {
            let record = record.strip_suffix(".minor").unwrap_or(record);
            match scope {
                Scope::Undo(declared) if declared.contains(&record) => continue,
                Scope::Undo(declared) => {
                    return Err(format!(
                        "{{{{{name}}}}} in {template:?} names no record of this sequence (declared: {})",
                        if declared.is_empty() {
                            "none".to_owned()
                        } else {
                            declared.join(", ")
                        }
                    ));
                }
                _ => {
                    return Err(format!(
                        "{{{{{name}}}}} in {template:?}: `record.` values exist only in `undo:` commands"
                    ));
                }
            }
        }
        let known = KNOWN_VARIABLES.contains(&name)
            || name.strip_prefix("pin.").is_some_and(|p| !p.is_empty());
        if !known {
            return Err(format!(
                "unknown variable {{{{{name}}}}} in {template:?} (known: {}, pin.<name>)",
                KNOWN_VARIABLES.join(", ")
            ));
        }
    }
    Ok(())
}

/// Expands `template`; a variable without a value (e.g. a `pin.` missing for this version) is an
/// error naming it.
pub(crate) fn expand(template: &str, vars: &Vars) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| TemplateError::Unclosed {
            template: template.to_owned(),
        })?;
        let name = after[..end].trim();
        let value = if let Some(pin) = name.strip_prefix("pin.") {
            vars.pins.get(pin)
        } else if let Some(record) = name.strip_prefix("record.") {
            match record.strip_suffix(".minor") {
                Some(record) => {
                    let value = vars.records.get(record).map(String::as_str);
                    let minor =
                        value
                            .and_then(minor_of)
                            .ok_or_else(|| TemplateError::NotAVersion {
                                name: name.to_owned(),
                                record: record.to_owned(),
                                value: value.map(str::to_owned),
                            })?;
                    out.push_str(&minor);
                    rest = &after[end + 2..];
                    continue;
                }
                None => vars.records.get(record),
            }
        } else {
            vars.plain.get(name)
        };
        out.push_str(value.ok_or_else(|| TemplateError::NoValue {
            name: name.to_owned(),
        })?);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Why a template cannot be expanded for this step.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TemplateError {
    /// A `{{` without its `}}`.
    #[error("unclosed `{{{{` in {template:?}")]
    Unclosed {
        /// The template.
        template: String,
    },
    /// A variable without a value here (a `pin.` the version's pins lack, a record not taken).
    #[error("no value for {{{{{name}}}}}")]
    NoValue {
        /// The variable.
        name: String,
    },
    /// `{{record.<name>.minor}}` of a recorded value that is not a version.
    #[error(
        "no value for {{{{{name}}}}}: record {record} is {value:?}, not a version like 1.33.4-1.1"
    )]
    NotAVersion {
        /// The variable.
        name: String,
        /// The record it reads.
        record: String,
        /// What the record holds (`None`: nothing).
        value: Option<String>,
    },
}

// The callers that still carry their errors as text (config checks, sysext).
impl From<TemplateError> for String {
    fn from(e: TemplateError) -> Self {
        e.to_string()
    }
}

/// `v1.33` of a package version like `1.33.4-1.1` (or `1:1.33.4-150500.1.1`, `v1.33.4`).
fn minor_of(version: &str) -> Option<String> {
    let version = version.rsplit_once(':').map_or(version, |(_, v)| v);
    let version = version.strip_prefix('v').unwrap_or(version);
    let mut parts = version.split(['.', '-']);
    let (major, minor) = (parts.next()?, parts.next()?);
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    (numeric(major) && numeric(minor)).then(|| format!("v{major}.{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_version_forms_and_pins() {
        let pins = BTreeMap::from([("kubeadmSha256".to_owned(), "ab12".to_owned())]);
        let vars = Vars::for_version("v1.34.1", "/sandbox", pins);
        assert_eq!(
            expand("kubeadm={{bareVersion}}-*", &vars).unwrap(),
            "kubeadm=1.34.1-*"
        );
        assert_eq!(
            expand("/core:/stable:/{{ minor }}/deb/", &vars).unwrap(),
            "/core:/stable:/v1.34/deb/"
        );
        assert_eq!(
            expand("{{root}}/usr/bin/{{version}}", &vars).unwrap(),
            "/sandbox/usr/bin/v1.34.1"
        );
        assert_eq!(expand("{{pin.kubeadmSha256}}", &vars).unwrap(), "ab12");
        assert!(
            expand("{{pin.kubeletSha256}}", &vars)
                .unwrap_err()
                .to_string()
                .contains("pin.kubeletSha256")
        );
    }

    #[test]
    fn check_rejects_unknown_and_unclosed() {
        assert!(check("apt-get install kubeadm={{bareVersion}}").is_ok());
        assert!(check("{{pin.x}}").is_ok());
        assert!(check("{{verison}}").unwrap_err().contains("verison"));
        assert!(check("{{version").unwrap_err().contains("unclosed"));
    }

    #[test]
    fn record_values_only_in_undo_commands_and_only_declared_ones() {
        assert!(
            check("kubelet={{record.kubelet}}")
                .unwrap_err()
                .contains("only in `undo:`")
        );
        assert!(check_in("kubelet={{record.kubelet}}", Scope::Undo(&["kubelet"])).is_ok());
        let err = check_in("{{record.kubectl}}", Scope::Undo(&["kubelet"])).unwrap_err();
        assert!(
            err.contains("record.kubectl") && err.contains("declared: kubelet"),
            "{err}"
        );
        let mut vars = Vars::for_version("v1.34.1", "/", BTreeMap::new());
        vars.records.insert("kubelet".into(), "1.33.4-1.1".into());
        assert_eq!(
            expand("kubelet={{record.kubelet}}", &vars).unwrap(),
            "kubelet=1.33.4-1.1"
        );
        assert!(check_in("{{record.kubelet.minor}}", Scope::Undo(&["kubelet"])).is_ok());
        assert_eq!(
            expand("/stable:/{{record.kubelet.minor}}/deb/", &vars).unwrap(),
            "/stable:/v1.33/deb/"
        );
        vars.records.insert("kubectl".into(), String::new());
        assert!(
            expand("{{record.kubectl.minor}}", &vars)
                .unwrap_err()
                .to_string()
                .contains("not a version")
        );
        assert_eq!(minor_of("1:1.34.1-150500.1.1").as_deref(), Some("v1.34"));
    }

    #[test]
    fn image_only_in_os_image_commands() {
        assert!(
            check("bootc switch {{image}}")
                .unwrap_err()
                .contains("image")
        );
        assert!(check_in("{{root}}/bin/bootc switch {{image}}", Scope::OsImage).is_ok());
        let err = check_in("{{version}}", Scope::OsImage).unwrap_err();
        assert!(err.contains("image, root"), "{err}");
        assert!(check_in("{{image}}", Scope::Root).is_err());
        let vars = Vars::for_image("quay.io/os:41", "/r");
        assert_eq!(
            expand("{{image}}@{{root}}", &vars).unwrap(),
            "quay.io/os:41@/r"
        );
    }
}
