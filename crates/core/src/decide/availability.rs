//! `affectsAvailability` and the drain of an accepted change: whether performing it disturbs what runs on
//! the node, and what it does to the node ([`NodeChange`]) for [`crate::drain`].

use serde_json::Value;

use crate::action::Action;
use crate::diff::Change;
use crate::drain::VersionChange;
use crate::path::Seg;

/// Directories whose files kubelet, containerd or the static pods read: writing a file there can restart
/// or reconfigure what runs on the node, so such a change affects availability even though the files step
/// itself restarts nothing.
pub const AVAILABILITY_FILE_DIRS: &[&str] = &[
    "/var/lib/kubelet/",
    "/etc/kubernetes/manifests/",
    "/etc/containerd/",
    "/etc/systemd/system/kubelet.service.d/",
    "/etc/systemd/system/containerd.service.d/",
    "/usr/lib/systemd/system/kubelet.service.d/",
];

/// Whether a file path lies under one of [`AVAILABILITY_FILE_DIRS`].
pub fn disturbing_file(path: &str) -> bool {
    AVAILABILITY_FILE_DIRS
        .iter()
        .any(|dir| path.starts_with(dir))
}

/// The `path` members of a `files` list, or of one `files` item.
fn listed_paths(value: Option<&Value>) -> Vec<&str> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| item.get("path")?.as_str())
            .collect(),
        Some(item @ Value::Object(_)) => item
            .get("path")
            .and_then(Value::as_str)
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether a change the files action performs writes or removes a file under [`AVAILABILITY_FILE_DIRS`].
/// `lists` are both sides' whole `files` lists, the fallback when the change names no file (a list compared
/// by position).
pub(crate) fn files_change_disturbs(change: &Change, lists: [Option<&Value>; 2]) -> bool {
    let keyed = change.path.0.iter().find_map(|seg| match seg {
        Seg::Key { field, value } if field == "path" => Some(value.as_str()),
        _ => None,
    });
    if let Some(path) = keyed {
        return disturbing_file(path);
    }
    let mut named = listed_paths(change.old);
    named.extend(listed_paths(change.new));
    if named.is_empty() {
        named = lists.into_iter().flat_map(listed_paths).collect();
    }
    named.into_iter().any(disturbing_file)
}

/// Whether the change is the Machine's `spec.version`, and then how it changes.
pub(crate) fn version_change(change: &Change) -> Option<VersionChange> {
    let is_version = matches!(
        change.path.0.as_slice(),
        [Seg::Field(spec), Seg::Field(version)] if spec == "spec" && version == "version"
    );
    is_version.then(|| {
        VersionChange::of(
            change.old.and_then(Value::as_str),
            change.new.and_then(Value::as_str),
        )
    })
}

/// Whether an accepted change with these actions disturbs workloads: any action that restarts kubelet or
/// control-plane static pods, or files under [`AVAILABILITY_FILE_DIRS`].
pub(crate) fn disturbs(actions: &std::collections::BTreeSet<Action>, files_disturb: bool) -> bool {
    files_disturb || actions.iter().any(|a| a.disturbs_workloads())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_under_the_runtime_directories_disturb() {
        for path in [
            "/var/lib/kubelet/config.yaml",
            "/etc/kubernetes/manifests/kube-apiserver.yaml",
            "/etc/containerd/config.toml",
            "/etc/containerd/certs.d/r.example/hosts.toml",
            "/etc/systemd/system/kubelet.service.d/20-extra.conf",
        ] {
            assert!(disturbing_file(path), "{path}");
        }
        for path in [
            "/etc/motd",
            "/etc/kubernetes/audit-policy.yaml",
            "/var/lib/kubeletx",
            "/etc/containerd",
        ] {
            assert!(!disturbing_file(path), "{path}");
        }
    }
}
