//! Waiting for the node to be Ready again, at the kubelet version a Kubernetes upgrade installed; and the
//! readiness of the other control-plane Nodes (the agent's control-plane preflight).

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use tokio::time::Instant;

use crate::decide::bound;
use crate::drainer::{DrainError, Drainer, api_error};

/// The label kubeadm puts on every control-plane Node (its value is empty).
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Most control-plane Nodes read in one list (a control plane has a handful; more are not looked at).
pub const MAX_CONTROL_PLANE_NODES: u32 = 100;

impl Drainer {
    /// Waits until the node's `Ready` condition is `True` and, when `kubelet_version` is given,
    /// `status.nodeInfo.kubeletVersion` equals it, and when `boot_id` is given, `status.nodeInfo.bootID` does
    /// (after a reboot: a `Ready` the kubelet reported before it is stale until the node controller's grace
    /// runs out); until `deadline`. `progress` gets what is missing whenever that changes.
    pub async fn wait_node_ready(
        &self,
        kubelet_version: Option<&str>,
        boot_id: Option<&str>,
        deadline: Instant,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<String, DrainError> {
        let mut last_text = String::new();
        loop {
            let node = self.get_node().await?;
            let mut missing = ready_gaps(&node, kubelet_version);
            missing.extend(boot_id.and_then(|want| boot_gap(&node, want)));
            if missing.is_empty() {
                let version = node_kubelet_version(&node).unwrap_or_default();
                return Ok(format!("node {} is Ready (kubelet {version})", self.node));
            }
            let text = bound(format!(
                "waiting for node {}: {}",
                self.node,
                missing.join(", ")
            ));
            if text != last_text {
                progress(text.clone());
                last_text = text.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DrainError::Timeout(format!("timed out {text}")));
            }
            tokio::time::sleep_until((now + self.timing.poll_interval).min(deadline)).await;
        }
    }
}

impl Drainer {
    /// The node's `status.nodeInfo.kubeletVersion` now (`None` when the Node does not report one).
    pub async fn kubelet_version(&self) -> Result<Option<String>, DrainError> {
        Ok(node_kubelet_version(&self.get_node().await?).filter(|v| !v.is_empty()))
    }
}

impl Drainer {
    /// The control-plane Nodes (label [`CONTROL_PLANE_LABEL`]) other than this one that are not Ready, each
    /// with what keeps it from Ready (`Ready is False (KubeletNotReady)`), in the API's order.
    pub async fn control_plane_not_ready(&self) -> Result<Vec<(String, String)>, DrainError> {
        let params = ListParams::default()
            .labels(CONTROL_PLANE_LABEL)
            .limit(MAX_CONTROL_PLANE_NODES);
        let list = self.nodes().list(&params).await.map_err(api_error(format!(
            "list Nodes labelled {CONTROL_PLANE_LABEL}"
        )))?;
        Ok(list
            .items
            .iter()
            .filter_map(|node| {
                let name = node.metadata.name.clone().unwrap_or_default();
                if name == self.node {
                    return None;
                }
                let gaps = ready_gaps(node, None);
                (!gaps.is_empty()).then(|| (name, gaps.join(", ")))
            })
            .collect())
    }
}

fn node_kubelet_version(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
}

/// Why the Node does not yet speak of boot `want` (its kubelet has not reported since that boot), if it does not.
pub fn boot_gap(node: &Node, want: &str) -> Option<String> {
    let have = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str())
        .unwrap_or_default();
    (have != want).then(|| {
        let short = |id: &str| id.chars().take(8).collect::<String>();
        format!(
            "the kubelet has not reported since this boot ({}; the Node says boot {:?})",
            short(want),
            short(have)
        )
    })
}

/// What keeps `node` from counting as ready (empty when nothing does).
pub fn ready_gaps(node: &Node, kubelet_version: Option<&str>) -> Vec<String> {
    let mut gaps = Vec::new();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => gaps.push(format!(
            "Ready is {}{}",
            c.status,
            c.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        None => gaps.push("no Ready condition".into()),
    }
    if let Some(want) = kubelet_version {
        let have = node_kubelet_version(node).unwrap_or_default();
        if have != want {
            gaps.push(format!("kubelet is {have:?}, want {want}"));
        }
    }
    gaps
}
