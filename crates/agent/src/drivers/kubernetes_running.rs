//! What the node runs, read before a Kubernetes version step's first effect (issue 43): a `kubeadmUpgrade`
//! whose target the node already runs is passed over, and so is an `installKubelet` only once the running
//! kubelet is the target, not merely the file on disk.
//!
//! - **The running kubelet** is the version the Node reports (`status.nodeInfo.kubeletVersion`), read through
//!   the node API the node steps use (`node:` in the agent config). It is what the kubelet process reported
//!   when it started, and what Cluster API waits for before it calls the Machine up to date. `kubelet
//!   --version` reads the file on disk instead, which a package install or a systemd-sysext switch replaces
//!   before the kubelet restarts: on a sysext node `installKubeadm` merges the new kubelet, so the file says
//!   "done" while the old one runs. The running process's binary (`/proc/<pid>/exe`) would need the node's
//!   service manager to find the process; the Node is one API call the agent already makes.
//! - **The control-plane static pods** are what `kubeadm upgrade apply|node` rewrites on a control-plane node:
//!   the image tags of the kube-apiserver, kube-controller-manager and kube-scheduler manifests, which kubeadm
//!   sets to the Kubernetes version. A node without a kube-apiserver manifest is a worker, where `kubeadm
//!   upgrade node` only writes the kubelet's configuration: there the running kubelet at the target (installed
//!   after the upgrade in every plan) says the upgrade was done.
//!
//! A check that cannot read what it needs (no `node:` section, the API unreachable within
//! [`RUNNING_CHECK_TIMEOUT`], a manifest unreadable) says so and the step runs: nothing is passed over on a
//! guess.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::etcd::manifest_containers;
use super::node::drainer;
use crate::fsutil::read_optional;
use crate::limits::MAX_CONTROL_PLANE_MANIFEST_BYTES;
use crate::os::driver_env::DriverEnv;

/// How long reading the Node's kubelet version before a Kubernetes version step may take (at most until the
/// step's deadline); past it the version is unknown and the step runs.
pub const RUNNING_CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// The control-plane static pods `kubeadm upgrade` moves to the target version, each in `<name>.yaml` beside
/// `etcd.manifest` (kubeadm writes every static pod manifest in one directory).
pub const CONTROL_PLANE_COMPONENTS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Runs {
    /// The node runs the target; what shows it.
    Target(String),
    /// It does not, or it cannot be told; why.
    Not(String),
}

/// Whether the running kubelet is `version`: the Node's reported kubelet version, read through the node API.
pub(super) async fn kubelet_runs(env: &DriverEnv, version: &str, deadline: Instant) -> Runs {
    if env.config.node.is_none() {
        return Runs::Not(
            "the running kubelet's version is unknown: the agent config has no `node:` section"
                .into(),
        );
    }
    let read = async {
        let drainer = drainer(env, "the running kubelet's version")
            .await
            .map_err(|failed| failed.to_string())?;
        drainer.kubelet_version().await.map_err(|e| e.to_string())
    };
    let until = deadline.min(Instant::now() + RUNNING_CHECK_TIMEOUT);
    let within = until.saturating_duration_since(Instant::now()).as_secs();
    match tokio::time::timeout_at(until, read).await {
        Ok(Ok(Some(running))) if running == version => {
            Runs::Target(format!("the Node reports kubelet {running}"))
        }
        Ok(Ok(Some(running))) => Runs::Not(format!("the Node reports kubelet {running}")),
        Ok(Ok(None)) => Runs::Not("the Node reports no kubelet version".into()),
        Ok(Err(e)) => Runs::Not(format!("the Node's kubelet version is unknown: {e}")),
        Err(_) => Runs::Not(format!(
            "the Node's kubelet version is unknown: not read within {within} s"
        )),
    }
}

/// Whether the node already runs what `kubeadm upgrade` to `version` makes it run: on a control-plane node
/// (one with a kube-apiserver manifest) every [`CONTROL_PLANE_COMPONENTS`] manifest at `version`, and on every
/// node the running kubelet at `version`.
pub(super) async fn upgraded(env: &DriverEnv, version: &str, deadline: Instant) -> Runs {
    let dir = manifests_dir(env);
    let root_dir = match env.fs.path(&dir) {
        Ok(path) => path,
        Err(e) => return Runs::Not(e.to_string()),
    };
    let target = version.to_owned();
    let pods = tokio::task::spawn_blocking(move || control_plane_at(&root_dir, &dir, &target))
        .await
        .unwrap_or_else(|e| Err(format!("reading the manifests crashed: {e}")));
    let pods = match pods {
        Ok(found) => found,
        Err(why) => return Runs::Not(why),
    };
    match (pods, kubelet_runs(env, version, deadline).await) {
        (_, Runs::Not(why)) => Runs::Not(why),
        (Some(pods), Runs::Target(kubelet)) => Runs::Target(format!("{pods}; {kubelet}")),
        (None, Runs::Target(kubelet)) => Runs::Target(format!("a worker node: {kubelet}")),
    }
}

/// The node directory of the static pod manifests: that of `etcd.manifest`.
fn manifests_dir(env: &DriverEnv) -> String {
    Path::new(&env.config.etcd.manifest)
        .parent()
        .map_or_else(|| "/".to_owned(), |dir| dir.display().to_string())
}

/// `Ok(Some(what))` when every control-plane manifest in `dir` (node path `shown`) names `version`;
/// `Ok(None)` when there is no kube-apiserver manifest (not a control-plane node); `Err(why)` otherwise.
fn control_plane_at(dir: &Path, shown: &str, version: &str) -> Result<Option<String>, String> {
    let mut first = true;
    for component in CONTROL_PLANE_COMPONENTS {
        let path = dir.join(format!("{component}.yaml"));
        let shown = format!("{shown}/{component}.yaml");
        let bytes = read_optional(&path, MAX_CONTROL_PLANE_MANIFEST_BYTES)
            .map_err(|e| format!("{shown}: {e}"))?;
        let Some(bytes) = bytes else {
            if first {
                return Ok(None);
            }
            return Err(format!("{shown} is missing"));
        };
        first = false;
        let tag = image_tag(&bytes, component).map_err(|e| format!("{shown}: {e}"))?;
        if tag != version {
            return Err(format!("{shown} runs {component} {tag}"));
        }
    }
    Ok(Some(format!(
        "{} at {version}",
        CONTROL_PLANE_COMPONENTS.join(", ")
    )))
}

/// The tag of the image of the manifest's container named `component`.
fn image_tag(bytes: &[u8], component: &str) -> Result<String, String> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(bytes).map_err(|e| format!("not YAML: {e}"))?;
    let image = manifest_containers(&value)?
        .iter()
        .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(component))
        .and_then(|c| c.get("image"))
        .and_then(|i| i.as_str())
        .ok_or_else(|| format!("no container {component} with an image"))?;
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    match last.split_once(':') {
        Some((_, tag)) if !tag.is_empty() => Ok(tag.to_owned()),
        _ => Err(format!("image {image} has no tag")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(component: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {component}\nspec:\n  containers:\n  - command: [{component}]\n    image: {image}\n    name: {component}\n"
        )
    }

    #[test]
    fn the_tag_is_read_from_the_components_container() {
        let text = manifest("kube-apiserver", "registry.k8s.io/kube-apiserver:v1.33.4");
        assert_eq!(
            image_tag(text.as_bytes(), "kube-apiserver").unwrap(),
            "v1.33.4"
        );
        let port = manifest(
            "kube-scheduler",
            "mirror.example:5000/k8s/kube-scheduler:v1.34.1@sha256:abcd",
        );
        assert_eq!(
            image_tag(port.as_bytes(), "kube-scheduler").unwrap(),
            "v1.34.1"
        );
        let untagged = manifest("kube-scheduler", "mirror.example:5000/kube-scheduler");
        assert!(
            image_tag(untagged.as_bytes(), "kube-scheduler")
                .unwrap_err()
                .contains("has no tag")
        );
        assert!(
            image_tag(text.as_bytes(), "kube-scheduler")
                .unwrap_err()
                .contains("no container kube-scheduler")
        );
        assert!(image_tag(b"{", "x").unwrap_err().starts_with("not YAML"));
    }

    #[test]
    fn every_control_plane_manifest_must_name_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let shown = "/etc/kubernetes/manifests";
        assert_eq!(
            control_plane_at(dir.path(), shown, "v1.33.4"),
            Ok(None),
            "no kube-apiserver manifest: a worker"
        );
        let write = |component: &str, tag: &str| {
            let image = format!("registry.k8s.io/{component}:{tag}");
            std::fs::write(
                dir.path().join(format!("{component}.yaml")),
                manifest(component, &image),
            )
            .unwrap();
        };
        write("kube-apiserver", "v1.33.4");
        assert_eq!(
            control_plane_at(dir.path(), shown, "v1.33.4"),
            Err(format!("{shown}/kube-controller-manager.yaml is missing"))
        );
        write("kube-controller-manager", "v1.33.4");
        write("kube-scheduler", "v1.34.1");
        assert_eq!(
            control_plane_at(dir.path(), shown, "v1.33.4"),
            Err(format!(
                "{shown}/kube-scheduler.yaml runs kube-scheduler v1.34.1"
            ))
        );
        write("kube-scheduler", "v1.33.4");
        assert_eq!(
            control_plane_at(dir.path(), shown, "v1.33.4"),
            Ok(Some(
                "kube-apiserver, kube-controller-manager, kube-scheduler at v1.33.4".into()
            ))
        );
        assert!(control_plane_at(dir.path(), shown, "v1.34.1").is_err());
    }
}
