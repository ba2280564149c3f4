//! The pods Running and Ready on the node before a plan's drain evicted anything, for the node verification after
//! the plan's last step (`crate::verify`), which may come after a crash or a reboot: drainNode lists them
//! ([`note_pods_before_drain`], [`to_record`]) and keeps them in `<state-dir>/verify-pods.json`.
//!
//! drainNode writes it (fsynced, renamed into place) before its first eviction, and only when it does not name
//! the plan already: a resumed drain keeps the first record (a list taken after some evictions would lack the
//! evicted pods' readiness). It names the plan, so a record an earlier plan left is never used for another.
//! It lives with the drivers because drainNode writes it; the verification reads it.

use std::path::{Path, PathBuf};

use inplace_drain::Drainer;
use inplace_drain::decide::PodFacts;
use serde::{Deserialize, Serialize};

use super::DriverError;
use crate::os::driver_env::DriverEnv;

use crate::fsutil::{JournalError, read_journal, write_journal};

/// The journal's file name in the state dir.
const VERIFY_PODS_JOURNAL: &str = "verify-pods.json";

/// `<state-dir>/verify-pods.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodsBeforeDrain {
    /// The plan whose drain recorded them.
    #[serde(default)]
    pub plan: Option<String>,
    /// The pods Running and Ready before that drain.
    #[serde(default)]
    pub pods: Vec<RecordedPod>,
}

/// The journal's path in `state_dir`.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(VERIFY_PODS_JOURNAL)
}

/// The pods recorded before the drain of `plan`, or `None` when none were (the plan has no drain, or the agent
/// config had no `verify:` section when it drained).
pub(crate) fn load(state_dir: &Path, plan: &str) -> Result<Option<Vec<RecordedPod>>, JournalError> {
    let journal: PodsBeforeDrain = read_journal(
        &path(state_dir),
        "move it away: the node verification then does not wait for the pods",
    )?;
    Ok((journal.plan.as_deref() == Some(plan)).then_some(journal.pods))
}

/// Records `pods` for `plan` (the drain asks [`load`] first, and records only when it finds none).
pub(crate) fn save(
    state_dir: &Path,
    plan: &str,
    pods: Vec<RecordedPod>,
) -> Result<(), JournalError> {
    let journal = PodsBeforeDrain {
        plan: Some(plan.to_owned()),
        pods,
    };
    write_journal(&path(state_dir), &journal)
}

/// Most pods recorded before a drain (the rest are not verified; a node runs far fewer).
pub const MAX_VERIFY_PODS_RECORDED: usize = 1_000;

/// A pod Running and Ready before the drain, as the node verification remembers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The DaemonSet that owns it, when one does (its replacement has another name).
    #[serde(default)]
    pub daemon_set: Option<String>,
    /// The API mirror of a static pod.
    #[serde(default)]
    pub mirror: bool,
}

impl RecordedPod {
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether it belongs to the node, so that it must come back (a DaemonSet's pod, a static pod's mirror).
    pub(crate) fn of_the_node(&self) -> bool {
        self.daemon_set.is_some() || self.mirror
    }

    /// Whether `pod` (bound to the node now) is this one or what replaced it.
    pub(crate) fn matches(&self, pod: &PodFacts) -> bool {
        if pod.namespace != self.namespace || pod.deleting {
            return false;
        }
        match &self.daemon_set {
            Some(owner) => {
                pod.controller_kind.as_deref() == Some("DaemonSet")
                    && pod.controller_name.as_deref() == Some(owner.as_str())
            }
            None => pod.name == self.name,
        }
    }
}

/// The pods of `pods` (bound to the node before its drain) to record: those Running and Ready, at most
/// [`MAX_VERIFY_PODS_RECORDED`], in `namespace/name` order.
pub fn to_record(pods: &[PodFacts]) -> Vec<RecordedPod> {
    let mut recorded: Vec<RecordedPod> = pods
        .iter()
        .filter(|p| running_and_ready(p) && !p.deleting)
        .map(|p| RecordedPod {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            daemon_set: (p.controller_kind.as_deref() == Some("DaemonSet"))
                .then(|| p.controller_name.clone().unwrap_or_default()),
            mirror: p.mirror,
        })
        .collect();
    recorded.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    recorded.truncate(MAX_VERIFY_PODS_RECORDED);
    recorded
}

pub(crate) fn running_and_ready(pod: &PodFacts) -> bool {
    pod.phase.as_deref() == Some("Running") && pod.ready
}

/// Before drainNode evicts anything: records the pods Running and Ready on the node for the verification after
/// the last step of `plan`, when the agent config has `verify:` with the pods check on and the plan recorded none
/// yet (a resumed drain keeps its first record).
pub(crate) async fn note_pods_before_drain(
    env: &DriverEnv,
    plan: String,
    drainer: &Drainer,
) -> Result<(), DriverError> {
    if env
        .config
        .verify
        .as_ref()
        .is_none_or(|v| v.pods_ready_timeout_seconds == 0)
    {
        return Ok(());
    }
    let crashed = |source| DriverError::Crashed {
        what: "drainNode: recording the pods for the node verification crashed: ",
        source,
    };
    let (state_dir, id) = (env.state_dir.clone(), plan.clone());
    let known = tokio::task::spawn_blocking(move || load(&state_dir, &id))
        .await
        .map_err(crashed)??;
    if known.is_some() {
        return Ok(());
    }
    let listed = drainer
        .list_pods()
        .await
        .map_err(|source| DriverError::NodeApi {
            what: "drainNode: list the pods to verify after the update".to_owned(),
            source: Box::new(source),
            then: "; nothing was evicted",
        })?;
    let recorded = to_record(&listed);
    tracing::info!(plan = %plan, pods = recorded.len(), "pods Running and Ready before the drain recorded for the node verification");
    let state_dir = env.state_dir.clone();
    tokio::task::spawn_blocking(move || save(&state_dir, &plan, recorded))
        .await
        .map_err(crashed)??;
    Ok(())
}
