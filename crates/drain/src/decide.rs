//! The drain's decisions, without I/O: which pods of a node must go and which are left alone,
//! which block the drain unless an option allows them, in what order evictions are asked for, and
//! the progress text operators see. Modelled on Cluster API's Machine drain
//! (`internal/controllers/machine/drain`: `filters.go`, `drain.go`), which follows `kubectl drain`.
//!
//! Differences from Cluster API, on purpose:
//! - MachineDrainRules are management-cluster objects; the agent only talks to its own workload
//!   cluster with the node's credentials and does NOT read them. Every pod therefore has drain
//!   order 0, which is what Cluster API uses when no rule matches; pods are handled in
//!   `namespace/name` order, as Cluster API sorts them. (Cluster API has no pod label or
//!   annotation for the order: the order comes only from MachineDrainRules.)
//! - DaemonSet-owned pods are always skipped: deciding whether the DaemonSet still exists (Cluster
//!   API evicts orphans) would need a read of DaemonSets, which the node authorizer does not grant.
//! - Pods with `emptyDir` volumes and pods without a controller block the drain unless the step
//!   allows them (`deleteEmptyDirData`, `forceUnmanaged`), as `kubectl drain` does without
//!   `--delete-emptydir-data` / `--force`; Cluster API only warns.
//! - Pods that already ended (phase `Succeeded`/`Failed`) hold nothing and need no eviction.

use k8s_openapi::api::core::v1::Pod;

/// Label that excludes a pod from the drain when its value is [`DRAIN_LABEL_SKIP`] (Cluster API's
/// `clusterv1.PodDrainLabel`).
pub const DRAIN_LABEL: &str = "cluster.x-k8s.io/drain";
/// The [`DRAIN_LABEL`] value that means "skip this pod".
pub const DRAIN_LABEL_SKIP: &str = "skip";
/// Annotation the kubelet puts on the API mirror of a static pod (`corev1.MirrorPodAnnotationKey`).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Most pods named in one progress or error text; the rest are counted (`and 7 more`).
pub const MAX_PODS_NAMED: usize = 5;
/// Longest progress or error text, in bytes (cut on a character boundary).
pub const MAX_SUMMARY_BYTES: usize = 400;

/// What the step allows beyond plain evictions (the `drainNode` step's options).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainOptions {
    /// Evict pods with `emptyDir` volumes (their data is lost).
    pub delete_empty_dir_data: bool,
    /// Evict pods no controller owns (nothing recreates them).
    pub force_unmanaged: bool,
}

/// Why a pod is left on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// A DaemonSet owns it (the DaemonSet would put it back; it tolerates the cordon).
    DaemonSet,
    /// The API mirror of a static pod: only the kubelet's manifest removes it.
    Mirror,
    /// It already ended (`Succeeded`/`Failed`).
    Finished,
    /// It carries `cluster.x-k8s.io/drain: skip`.
    Label,
}

/// Why a pod stops the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockReason {
    /// It has an `emptyDir` volume and the step does not allow `deleteEmptyDirData`.
    EmptyDir,
    /// No controller owns it and the step does not allow `forceUnmanaged`.
    Unmanaged,
}

impl BlockReason {
    /// The step option that would allow the pod.
    pub fn option(self) -> &'static str {
        match self {
            Self::EmptyDir => "deleteEmptyDirData",
            Self::Unmanaged => "forceUnmanaged",
        }
    }
}

/// What the drain does with one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Left alone; does not count as remaining.
    Skip(SkipReason),
    /// Evicted (with PodDisruptionBudgets honoured), then waited for.
    Evict,
    /// Already being deleted: only waited for.
    WaitDeleting,
    /// Stops the drain: the step must allow it first.
    Block(BlockReason),
}

/// The facts about a pod the decisions use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid` (a pod recreated under the same name has another).
    pub uid: String,
    /// Kind of the owner reference marked `controller: true`, if any.
    pub controller_kind: Option<String>,
    /// Name of that owner (a DaemonSet's pods share it, whatever their own names).
    pub controller_name: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// Has the mirror-pod annotation.
    pub mirror: bool,
    /// Has `cluster.x-k8s.io/drain: skip`.
    pub skip_label: bool,
    /// Has at least one `emptyDir` volume.
    pub empty_dir: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// What its `Ready` condition says when it is not `True`: `Ready False (ContainersNotReady: …)`, or
    /// `no Ready condition` (empty when Ready).
    pub ready_gap: String,
}

impl PodFacts {
    /// Reads the facts from an API pod (missing fields count as absent).
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let controller = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        let empty_dir = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()));
        let ready_condition = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let ready = ready_condition.is_some_and(|c| c.status == "True");
        let ready_gap = match ready_condition {
            _ if ready => String::new(),
            None => "no Ready condition".to_owned(),
            Some(c) => {
                let why: Vec<&str> = [c.reason.as_deref(), c.message.as_deref()]
                    .into_iter()
                    .flatten()
                    .filter(|t| !t.is_empty())
                    .collect();
                if why.is_empty() {
                    format!("Ready {}", c.status)
                } else {
                    format!("Ready {} ({})", c.status, why.join(": "))
                }
            }
        };
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            controller_kind: controller.map(|o| o.kind.clone()),
            controller_name: controller.map(|o| o.name.clone()),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION)),
            skip_label: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(DRAIN_LABEL))
                .is_some_and(|v| v == DRAIN_LABEL_SKIP),
            empty_dir,
            deleting: meta.deletion_timestamp.is_some(),
            ready,
            ready_gap,
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// Decides what the drain does with `pod`. DaemonSet and mirror pods are skipped, a pod being deleted is
/// waited for, then the other skips (as Cluster API's filters short-circuit on the first skip), then
/// blockers, emptyDir before unmanaged.
pub fn classify(pod: &PodFacts, options: DrainOptions) -> Verdict {
    if pod.controller_kind.as_deref() == Some("DaemonSet") {
        return Verdict::Skip(SkipReason::DaemonSet);
    }
    if pod.mirror {
        return Verdict::Skip(SkipReason::Mirror);
    }
    // A pod being deleted is waited for even when its phase already says finished: the kubelet sets
    // Succeeded/Failed during graceful deletion, before the volumes are torn down and the object goes.
    if pod.deleting {
        return Verdict::WaitDeleting;
    }
    if pod.finished() {
        return Verdict::Skip(SkipReason::Finished);
    }
    if pod.skip_label {
        return Verdict::Skip(SkipReason::Label);
    }
    if pod.empty_dir && !options.delete_empty_dir_data {
        return Verdict::Block(BlockReason::EmptyDir);
    }
    if pod.controller_kind.is_none() && !options.force_unmanaged {
        return Verdict::Block(BlockReason::Unmanaged);
    }
    Verdict::Evict
}

/// The node's pods the drain must act on, sorted by `namespace/name` (eviction order), with their
/// verdicts; skipped pods are left out.
pub fn plan(pods: &[PodFacts], options: DrainOptions) -> Vec<(PodFacts, Verdict)> {
    let mut acted: Vec<_> = pods
        .iter()
        .map(|p| (p.clone(), classify(p, options)))
        .filter(|(_, v)| !matches!(v, Verdict::Skip(_)))
        .collect();
    acted.sort_by(|a, b| (&a.0.namespace, &a.0.name).cmp(&(&b.0.namespace, &b.0.name)));
    acted
}

/// `a/x, b/y and 3 more`: at most [`MAX_PODS_NAMED`] names.
pub fn name_pods(keys: &[String]) -> String {
    let shown: Vec<&str> = keys
        .iter()
        .take(MAX_PODS_NAMED)
        .map(String::as_str)
        .collect();
    let mut text = shown.join(", ");
    if keys.len() > MAX_PODS_NAMED {
        text.push_str(&format!(" and {} more", keys.len() - MAX_PODS_NAMED));
    }
    text
}

/// The first at most [`MAX_SUMMARY_BYTES`] bytes of `text`, cut on a character boundary.
pub fn bound(mut text: String) -> String {
    if text.len() > MAX_SUMMARY_BYTES {
        let mut end = MAX_SUMMARY_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// What holds the drain back right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// An eviction was refused (429) because of this PodDisruptionBudget (`namespace/name`, or the
    /// API's message when it named none).
    Pdb(String),
    /// A pod is covered by more than one PodDisruptionBudget (500): the API cannot evict it.
    MultiplePdbs(String),
    /// Evicted pods are still terminating.
    Terminating,
    /// Another eviction answer (message).
    Other(String),
}

/// `draining node-a: 4 pods left (ns/a, ns/b, …), waiting on PDB web/pdb`, bounded by
/// [`MAX_SUMMARY_BYTES`].
pub fn progress_text(node: &str, remaining: &[String], waiting: Option<&Waiting>) -> String {
    let count = remaining.len();
    let plural = if count == 1 { "" } else { "s" };
    let mut text = format!("draining {node}: {count} pod{plural} left");
    if count > 0 {
        text.push_str(&format!(" ({})", name_pods(remaining)));
    }
    match waiting {
        Some(Waiting::Pdb(pdb)) => text.push_str(&format!(", waiting on PDB {pdb}")),
        Some(Waiting::MultiplePdbs(pod)) => text.push_str(&format!(
            ", {pod} is covered by more than one PDB (eviction refused; retrying)"
        )),
        Some(Waiting::Terminating) => text.push_str(", waiting for evicted pods to terminate"),
        Some(Waiting::Other(message)) => {
            text.push_str(&format!(", last eviction error: {message}"))
        }
        None => {}
    }
    bound(text)
}

/// The PodDisruptionBudget named in an eviction refusal, `namespace/name`: the API's 429 carries a
/// `DisruptionBudget` cause whose message reads `The disruption budget <name> needs …`.
pub fn pdb_from_refusal(namespace: &str, cause_messages: &[String]) -> Option<String> {
    cause_messages.iter().find_map(|m| {
        let rest = m.strip_prefix("The disruption budget ")?;
        let name = rest.split_whitespace().next()?;
        Some(format!("{namespace}/{name}"))
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
