//! The pure half of `sysextSwitch`: extension names are checked by the config (`crate::sequence::command`); reading os-release style files (the node's `/etc/os-release`, an
//! image's `extension-release.<name>`), systemd-sysext's rule for whether an extension may be merged on
//! this node ([`compatibility`]), and what `systemd-sysext list`/`status --json=short` say is merged
//! ([`merged_names`], [`listed_path`]). Functions over text, tested synchronously.

use std::collections::BTreeMap;

/// The scope `systemd-sysext` merges in (it runs as a system tool, not for portable services).
const HOST_SCOPE: &str = "system";

/// Parses an os-release style file: `KEY=value` lines, values optionally in single or double quotes
/// (`\` escapes in double quotes), `#` comments and blank lines ignored. A line without `=` is ignored,
/// as systemd's parser warns and goes on.
pub(crate) fn parse_release(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        fields.insert(key.trim().to_owned(), unquote(value.trim()));
    }
    fields
}

fn unquote(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.to_owned();
    }
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.extend(chars.next()),
                c => out.push(c),
            }
        }
        return out;
    }
    value.to_owned()
}

/// Why an extension would not be merged on this node: the field and both values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {extension:?} in the extension, {node:?} on this node")]
pub(crate) struct Mismatch {
    /// The os-release field that decides (`ID`, `VERSION_ID`, `SYSEXT_LEVEL`, `ARCHITECTURE`, `SYSEXT_SCOPE`).
    pub field: &'static str,
    /// Its value in the image's extension-release (empty: not set).
    pub extension: String,
    /// Its value on the node (empty: not set).
    pub node: String,
}

/// systemd-sysext's rule (v252, `extension_release_validate`): an empty release file never matches;
/// `SYSEXT_SCOPE`, when set, must include `system`; `ARCHITECTURE`, when set and not `_any`, must be the
/// node's; `ID` must be set, and be `_any` (no further checks) or the node's `ID`; then, when the node has
/// neither `VERSION_ID` nor `SYSEXT_LEVEL` (a rolling release) it matches; when both sides set
/// `SYSEXT_LEVEL` they must be equal; otherwise, when the node sets `VERSION_ID`, the extension must set the
/// same one. `node_arch` is the node's architecture in systemd's spelling (`x86-64`, `arm64`, …).
pub(crate) fn compatibility(
    extension: &BTreeMap<String, String>,
    node: &BTreeMap<String, String>,
    node_arch: &str,
) -> Result<(), Mismatch> {
    let get = |fields: &BTreeMap<String, String>, key: &str| -> String {
        fields.get(key).cloned().unwrap_or_default()
    };
    let mismatch = |field: &'static str, extension: String, node: String| {
        Err(Mismatch {
            field,
            extension,
            node,
        })
    };
    if extension.values().all(String::is_empty) {
        return mismatch("ID", String::new(), get(node, "ID"));
    }
    if let Some(scope) = extension.get("SYSEXT_SCOPE")
        && !scope.split_whitespace().any(|s| s == HOST_SCOPE)
    {
        return mismatch("SYSEXT_SCOPE", scope.clone(), HOST_SCOPE.to_owned());
    }
    let arch = get(extension, "ARCHITECTURE");
    if !arch.is_empty() && arch != "_any" && arch != node_arch {
        return mismatch("ARCHITECTURE", arch, node_arch.to_owned());
    }
    let (id, node_id) = (get(extension, "ID"), get(node, "ID"));
    if id == "_any" {
        return Ok(());
    }
    if id.is_empty() || id != node_id {
        return mismatch("ID", id, node_id);
    }
    let (node_version, node_level) = (get(node, "VERSION_ID"), get(node, "SYSEXT_LEVEL"));
    let level = get(extension, "SYSEXT_LEVEL");
    if !node_level.is_empty() && !level.is_empty() {
        if level != node_level {
            return mismatch("SYSEXT_LEVEL", level, node_level);
        }
    } else if !node_version.is_empty() {
        let version = get(extension, "VERSION_ID");
        if version != node_version {
            return mismatch("VERSION_ID", version, node_version);
        }
    }
    Ok(())
}

/// This machine's architecture as systemd spells it in `ARCHITECTURE=` (its `architecture_to_string`).
pub(crate) fn node_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86-64",
        "x86" => "x86",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64-le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loongarch64",
        other => other,
    }
}

/// The extensions `systemd-sysext status --json=short` says are merged, in any hierarchy:
/// `[{"hierarchy":"/usr","extensions":["kubernetes"],…},{"hierarchy":"/opt","extensions":"none",…}]`.
pub(crate) fn merged_names(status_json: &str) -> Result<Vec<String>, NotAJsonList> {
    let hierarchies: Vec<serde_json::Value> =
        serde_json::from_str(status_json.trim()).map_err(|source| NotAJsonList {
            command: "status --json=short",
            source,
        })?;
    let mut names = Vec::new();
    for hierarchy in &hierarchies {
        // "none" (a string) when nothing is merged there.
        if let Some(list) = hierarchy.get("extensions").and_then(|e| e.as_array()) {
            names.extend(list.iter().filter_map(|n| n.as_str()).map(str::to_owned));
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The path `systemd-sysext list --json=short` gives for extension `name` (`None`: not listed):
/// `[{"name":"kubernetes","type":"raw","path":"/etc/extensions/kubernetes.raw",…}]`.
pub(crate) fn listed_path(list_json: &str, name: &str) -> Result<Option<String>, NotAJsonList> {
    let images: Vec<serde_json::Value> =
        serde_json::from_str(list_json.trim()).map_err(|source| NotAJsonList {
            command: "list --json=short",
            source,
        })?;
    Ok(images
        .iter()
        .find(|i| i.get("name").and_then(|n| n.as_str()) == Some(name))
        .and_then(|i| i.get("path").and_then(|p| p.as_str()))
        .map(str::to_owned))
}

/// What a `systemd-sysext … --json=short` printed is not the JSON list it prints.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` printed no JSON list ({source})")]
pub(crate) struct NotAJsonList {
    /// The sub-command and its flag.
    command: &'static str,
    /// What the JSON parser said.
    #[source]
    source: serde_json::Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str) -> BTreeMap<String, String> {
        parse_release(text)
    }

    #[test]
    fn parses_quotes_escapes_and_comments() {
        let fields = release(
            "# comment\nNAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\n\nVERSION_ID='4152.2.3'\n\
             PRETTY=\"a \\\"b\\\"\"\nnot a line\n SYSEXT_LEVEL = 1.0 \n",
        );
        assert_eq!(fields["NAME"], "Flatcar Container Linux by Kinvolk");
        assert_eq!(fields["ID"], "flatcar");
        assert_eq!(fields["VERSION_ID"], "4152.2.3");
        assert_eq!(fields["PRETTY"], "a \"b\"");
        assert_eq!(fields["SYSEXT_LEVEL"], "1.0");
        assert_eq!(fields.len(), 5);
    }

    #[test]
    fn follows_systemd_sysext_rule() {
        let flatcar = release("ID=flatcar\nVERSION_ID=4152.2.3\nSYSEXT_LEVEL=1.0\n");
        let debian = release("ID=debian\nVERSION_ID=12\n");
        let arch = "x86-64";
        let ok = |ext: &str, node: &BTreeMap<String, String>| {
            compatibility(&release(ext), node, arch).map_err(|m| m.to_string())
        };
        // The sysext-bakery's images: ID=_any with an architecture.
        assert_eq!(ok("ID=_any\nARCHITECTURE=x86-64\n", &flatcar), Ok(()));
        assert_eq!(
            ok("ID=_any\nARCHITECTURE=arm64\n", &flatcar),
            Err("ARCHITECTURE is \"arm64\" in the extension, \"x86-64\" on this node".into())
        );
        assert_eq!(ok("ID=flatcar\nSYSEXT_LEVEL=1.0\n", &flatcar), Ok(()));
        assert_eq!(
            ok("ID=flatcar\nSYSEXT_LEVEL=2.0\n", &flatcar),
            Err("SYSEXT_LEVEL is \"2.0\" in the extension, \"1.0\" on this node".into())
        );
        assert_eq!(
            ok("ID=flatcar\nVERSION_ID=4152.2.3\n", &flatcar),
            Ok(()),
            "no level in the extension: the version decides"
        );
        assert_eq!(ok("ID=debian\nVERSION_ID=12\n", &debian), Ok(()));
        assert_eq!(
            ok("ID=debian\nVERSION_ID=11\n", &debian),
            Err("VERSION_ID is \"11\" in the extension, \"12\" on this node".into())
        );
        assert_eq!(
            ok("ID=debian\n", &debian),
            Err("VERSION_ID is \"\" in the extension, \"12\" on this node".into()),
            "the node has a version and no level: the extension must name the version"
        );
        assert_eq!(
            ok("ID=flatcar\nVERSION_ID=4152.2.3\n", &debian),
            Err("ID is \"flatcar\" in the extension, \"debian\" on this node".into())
        );
        assert_eq!(
            ok("VERSION_ID=12\n", &debian),
            Err("ID is \"\" in the extension, \"debian\" on this node".into())
        );
        assert!(ok("", &debian).unwrap_err().starts_with("ID is \"\""));
        assert_eq!(ok("ID=arch\n", &release("ID=arch\n")), Ok(()), "rolling");
        assert_eq!(
            ok("ID=_any\nSYSEXT_SCOPE=portable\n", &debian),
            Err("SYSEXT_SCOPE is \"portable\" in the extension, \"system\" on this node".into())
        );
        assert_eq!(
            ok("ID=_any\nSYSEXT_SCOPE=\"system portable\"\n", &debian),
            Ok(())
        );
    }

    #[test]
    fn reads_what_systemd_sysext_252_prints() {
        let status = r#"[{"hierarchy":"/opt","extensions":"none","since":null},{"hierarchy":"/usr","extensions":["kubernetes","containerd"],"since":1796575131925489}]"#;
        assert_eq!(merged_names(status).unwrap(), ["containerd", "kubernetes"]);
        let none = r#"[{"hierarchy":"/opt","extensions":"none","since":null},{"hierarchy":"/usr","extensions":"none","since":null}]"#;
        assert!(merged_names(none).unwrap().is_empty());
        assert!(
            merged_names("Failed to open")
                .unwrap_err()
                .to_string()
                .contains("no JSON")
        );
        let list = r#"[{"name":"kubernetes","type":"raw","path":"/etc/extensions/kubernetes.raw","time":1796575131766237}]"#;
        assert_eq!(
            listed_path(list, "kubernetes").unwrap().as_deref(),
            Some("/etc/extensions/kubernetes.raw")
        );
        assert_eq!(listed_path(list, "containerd").unwrap(), None);
        assert_eq!(listed_path("[]", "kubernetes").unwrap(), None);
    }
}
