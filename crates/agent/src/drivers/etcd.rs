//! The `etcdImage` driver: changes the etcd image in the static pod manifest by editing only the
//! `image:` line, so every other byte stays as kubeadm wrote it. kubelet notices the new manifest
//! and restarts the pod. The edited text is parsed as YAML before it is written, as a check.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use inplace_agent_api::{StepAction, StepKind};

use super::driver::{Driver, StepFuture, blocking_step, wrong_kind};
use super::error::DriverError;
use super::step::StepContext;
use super::undo::Place;
use crate::fsutil::{FileMeta, atomic_write, read_optional};
use crate::os::driver_env::DriverEnv;

/// The `etcdImage` driver. No restart of its own: kubelet restarts the static pod when its manifest
/// changes, so it does not use the restart protocol of [`super::restart`].
pub(crate) struct EtcdImage;

impl Driver for EtcdImage {
    fn kind(&self) -> StepKind {
        StepKind::EtcdImage
    }

    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture {
        let StepAction::EtcdImage {
            image_tag,
            image_repository,
        } = ctx.step.action.clone()
        else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        blocking_step(env, ctx, move |env, plan_id| {
            apply(env, plan_id, &image_tag, image_repository.as_deref())
        })
    }

    /// The manifest only: kubelet restarts the static pod when it changes back.
    fn undo_places(
        &self,
        env: &DriverEnv,
        _action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        Ok(Some(vec![Place::Node(env.config.etcd.manifest.clone())]))
    }
}

/// Converges the manifest's etcd image; returns a summary.
fn apply(
    env: &DriverEnv,
    plan_id: &str,
    tag: &str,
    repository: Option<&str>,
) -> Result<String, DriverError> {
    let node_path = &env.config.etcd.manifest;
    let path = env.fs.path(node_path)?;
    let bytes = read_optional(&path, crate::limits::MAX_ETCD_MANIFEST_BYTES)?.ok_or_else(|| {
        DriverError::refused(format!(
            "{node_path} does not exist: not a control-plane node with local etcd"
        ))
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| DriverError::refused(format!("{node_path} is not UTF-8")))?;
    let (edited, old, new) = edit_manifest(&text, tag, repository)
        .map_err(|e| DriverError::refused(format!("{node_path}: {e}")))?;
    if edited == text {
        return Ok(format!("etcd image already {new}"));
    }
    check_yaml(&edited, &new).map_err(|e| {
        DriverError::Unverified(format!(
            "{node_path}: edited manifest failed its check: {e}"
        ))
    })?;
    let found = std::fs::metadata(&path).map_err(|source| DriverError::NodeFile {
        what: node_path.clone(),
        source,
    })?;
    let meta = FileMeta {
        mode: std::os::unix::fs::PermissionsExt::mode(&found.permissions()) & 0o7777,
        owner: env.is_root.then_some((found.uid(), found.gid())),
    };
    env.backups.save(plan_id, node_path, &path)?;
    atomic_write(&path, edited.as_bytes(), meta)?;
    Ok(format!("etcd image {old} -> {new}"))
}

/// Rewrites the one `image:` line whose image is named `etcd`. Returns (text, old, new image).
pub(crate) fn edit_manifest(
    text: &str,
    tag: &str,
    repository: Option<&str>,
) -> Result<(String, String, String), String> {
    let mut hits = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if let Some(found) = image_in_line(line) {
            let (repo, name) = split_image(found.value);
            if name == "etcd" {
                hits.push((offset, found, repo.to_owned()));
            }
        }
        offset += line.len();
    }
    let (line_start, found, repo) = match hits.len() {
        1 => hits.remove(0),
        0 => return Err("no `image:` line naming an etcd image".into()),
        n => {
            return Err(format!(
                "{n} `image:` lines name an etcd image; refusing to guess"
            ));
        }
    };
    let repo = repository.map(str::to_owned).unwrap_or(repo);
    let new = if repo.is_empty() {
        format!("etcd:{tag}")
    } else {
        format!("{repo}/etcd:{tag}")
    };
    let start = line_start + found.start;
    let end = start + found.value.len();
    let mut out = String::with_capacity(text.len() + new.len());
    out.push_str(&text[..start]);
    out.push_str(&new);
    out.push_str(&text[end..]);
    Ok((out, found.value.to_owned(), new))
}

struct ImageValue<'a> {
    /// Byte offset of the value in the line.
    start: usize,
    /// The image reference, without quotes.
    value: &'a str,
}

/// Finds `image: <ref>` (also `- image:`, quoted values, trailing comments) in a line.
fn image_in_line(line: &str) -> Option<ImageValue<'_>> {
    let body = line.trim_end_matches(['\n', '\r']);
    let indent = body.len() - body.trim_start().len();
    let mut rest = &body[indent..];
    let mut at = indent;
    if let Some(after) = rest.strip_prefix("- ") {
        let skipped = after.len() - after.trim_start().len();
        at += 2 + skipped;
        rest = after.trim_start();
    }
    let after = rest.strip_prefix("image:")?;
    at += "image:".len();
    let value_text = after.trim_start();
    at += after.len() - value_text.len();
    let (value, quote_len) = match value_text.chars().next()? {
        q @ ('"' | '\'') => (value_text[1..].split(q).next()?, 1),
        _ => (value_text.split([' ', '\t', '#']).next()?, 0),
    };
    if value.is_empty() {
        return None;
    }
    Some(ImageValue {
        start: at + quote_len,
        value,
    })
}

/// `registry.k8s.io/etcd:3.5.21-0@sha256:…` → (`registry.k8s.io`, `etcd`).
fn split_image(image: &str) -> (&str, &str) {
    let no_digest = image.split('@').next().unwrap_or(image);
    let (repo, last) = match no_digest.rsplit_once('/') {
        Some((repo, last)) => (repo, last),
        None => ("", no_digest),
    };
    let name = last.split(':').next().unwrap_or(last);
    (repo, name)
}

/// The `spec.containers` of a static pod manifest.
pub(super) fn manifest_containers(
    value: &serde_yaml_ng::Value,
) -> Result<&serde_yaml_ng::Sequence, &'static str> {
    value
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(|c| c.as_sequence())
        .ok_or("no spec.containers")
}

fn check_yaml(text: &str, expected_image: &str) -> Result<(), String> {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let ok = manifest_containers(&value)?
        .iter()
        .any(|c| c.get("image").and_then(|i| i.as_str()) == Some(expected_image));
    if ok {
        Ok(())
    } else {
        Err(format!("no container has image {expected_image}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_only_the_etcd_image() {
        let text = "spec:\n  containers:\n  - command:\n    - etcd\n    image: registry.k8s.io/etcd:3.5.15-0 # pinned\n    name: etcd\n  initContainers:\n  - image: \"busybox:1.36\"\n";
        let (out, old, new) = edit_manifest(text, "3.5.21-0", None).unwrap();
        assert_eq!(old, "registry.k8s.io/etcd:3.5.15-0");
        assert_eq!(new, "registry.k8s.io/etcd:3.5.21-0");
        assert_eq!(out, text.replace("3.5.15-0", "3.5.21-0"));
        let (out, _, new) = edit_manifest(text, "3.6.0-0", Some("mirror.local:5000/k8s")).unwrap();
        assert_eq!(new, "mirror.local:5000/k8s/etcd:3.6.0-0");
        assert!(out.contains("    image: mirror.local:5000/k8s/etcd:3.6.0-0 # pinned\n"));
    }

    #[test]
    fn quoted_digest_and_ambiguity() {
        let text = "  - image: 'reg/etcd:3.5.1-0@sha256:abc'\n";
        let (out, _, _) = edit_manifest(text, "3.5.2-0", None).unwrap();
        assert_eq!(out, "  - image: 'reg/etcd:3.5.2-0'\n");
        assert!(
            edit_manifest("image: a/etcd:1\nimage: b/etcd:2\n", "3", None)
                .unwrap_err()
                .contains("2 `image:`")
        );
        assert!(
            edit_manifest("image: nginx:1\n", "3", None)
                .unwrap_err()
                .contains("no `image:`")
        );
    }
}
