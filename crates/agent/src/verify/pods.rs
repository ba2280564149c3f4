//! Which pods the node verification waits for, without I/O: before the drain evicts, the pods bound to the node
//! that are Running and Ready are recorded (by drainNode: `crate::drivers::pods_before_drain::to_record`); after the last step, each recorded pod that is bound
//! to the node again must be Running and Ready ([`check`]).
//!
//! "Bound to the node again", by Kubernetes' semantics:
//! - a pod is matched by `namespace/name`, whatever its uid: a pod the drain skipped (the drain label) keeps its
//!   object, the kubelet restarts its containers; a StatefulSet pod evicted and scheduled back here keeps its name;
//! - a DaemonSet's pod is matched by its DaemonSet (`namespace` + owner name): the DaemonSet controller replaces a
//!   deleted pod with one of another name on the same node. It is never evicted, so it must be back: missing, it
//!   is waited for;
//! - a static pod's mirror (`kubernetes.io/config.mirror`) is named `<name>-<node>` by the kubelet, the same after
//!   a kubelet restart or a reboot: missing, it is waited for too (a control plane whose API server's static pod
//!   does not come back is what the verification is for);
//! - any other recorded pod that is not on the node (evicted, and its controller put its replacement elsewhere)
//!   is not waited for.
//!
//! A pod being deleted (`deletionTimestamp`) is never taken for the one that came back.

use inplace_drain::decide::{MAX_PODS_NAMED, PodFacts, bound};

use crate::drivers::pods_before_drain::{RecordedPod, running_and_ready};

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodsCheck {
    /// Recorded pods bound to the node again (or replaced there), each Running and Ready: `namespace/name` now.
    pub ready: Vec<String>,
    /// Recorded pods waited for that are not Running and Ready, each with why (`web/db-0: Running, Ready False
    /// (ContainersNotReady: …)`, `kube-system/kube-proxy-x: not back on the node`).
    pub not_ready: Vec<String>,
    /// Recorded pods no longer bound to the node (evicted and moved elsewhere): not waited for.
    pub moved: usize,
}

impl PodsCheck {
    /// Every pod waited for is Running and Ready.
    pub fn passed(&self) -> bool {
        self.not_ready.is_empty()
    }

    /// `2 pod(s) not Running and Ready: a: …; b: …` (bounded), or what passed.
    pub fn text(&self) -> String {
        if self.passed() {
            let moved = if self.moved > 0 {
                format!(" ({} moved off the node, not waited for)", self.moved)
            } else {
                String::new()
            };
            return format!("{} pod(s) Running and Ready again{moved}", self.ready.len());
        }
        // Each entry says why with commas of its own: `;` between them.
        let mut named = self
            .not_ready
            .iter()
            .take(MAX_PODS_NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if self.not_ready.len() > MAX_PODS_NAMED {
            named.push_str(&format!(
                " and {} more",
                self.not_ready.len() - MAX_PODS_NAMED
            ));
        }
        bound(format!(
            "{} pod(s) not Running and Ready: {named}",
            self.not_ready.len()
        ))
    }
}

/// Which of `recorded` are Running and Ready among `now` (the node's pods after the last step), which are not
/// (and why), and how many moved off the node (see the module docs).
pub fn check(recorded: &[RecordedPod], now: &[PodFacts]) -> PodsCheck {
    let mut found = PodsCheck::default();
    for pod in recorded {
        let candidates: Vec<&PodFacts> = now.iter().filter(|p| pod.matches(p)).collect();
        if let Some(ready) = candidates.iter().find(|p| running_and_ready(p)) {
            found.ready.push(ready.key());
            continue;
        }
        match candidates.first() {
            Some(there) => {
                let phase = there.phase.as_deref().unwrap_or("no phase");
                let gap = if there.ready_gap.is_empty() {
                    String::new()
                } else {
                    format!(", {}", there.ready_gap)
                };
                found
                    .not_ready
                    .push(format!("{}: {phase}{gap}", there.key()));
            }
            None if pod.of_the_node() => found.not_ready.push(format!(
                "{}: not back on the node{}",
                pod.key(),
                pod.daemon_set
                    .as_ref()
                    .map(|ds| format!(" (no pod of DaemonSet {}/{ds})", pod.namespace))
                    .unwrap_or_default()
            )),
            None => found.moved += 1,
        }
    }
    found
}

#[cfg(test)]
#[path = "pods_tests.rs"]
mod tests;
