//! What the node steps share (their drivers: `drain_node`, `wait_node_ready`, `uncordon_node`): the
//! workload cluster's API with the node's own kubelet kubeconfig
//! (`node:` in the agent config): drainNode cordons and drains, waitNodeReady waits for Ready and
//! the kubelet version, uncordonNode undoes the cordon — only one this plan made.
//!
//! `<state-dir>/cordon.json` names the plan that cordoned the node. drainNode writes it (fsynced,
//! renamed into place) BEFORE its cordon patch, and only when the node is not cordoned yet: a node
//! an operator cordoned is never recorded, so it stays cordoned. uncordonNode uncordons only when
//! the journal names its plan, and clears the record AFTER the uncordon succeeded. A drainNode that
//! finds the node cordoned by an EARLIER plan (a drain that failed and left it cordoned, a cancelled
//! or replaced run) takes that cordon over: the journal then names the new plan, which uncordons. A restart at
//! any point resumes the step; a resumed drain or uncordon that finds the node already in the
//! wanted state does not patch it again, so the node is cordoned once and uncordoned once (the
//! uncordon is a merge patch setting `spec.unschedulable` to null, as `kubectl uncordon` does).

use std::future::Future;
use std::time::Duration;

use inplace_drain::{DrainError, Drainer, client_from_kubeconfig};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::driver::blocking_value;
use super::error::DriverError;
use super::step::StepContext;
use crate::config::DriverConfig;
use crate::fsutil::{read_journal, remove_file, write_journal};
use crate::os::driver_env::DriverEnv;
use crate::os::inventory::read_fact;

/// The cordon journal's file name in the state dir.
const CORDON_JOURNAL: &str = "cordon.json";
/// How long past the step deadline an API call may still finish (its own timeout is
/// `inplace_drain::drainer::MAX_REQUEST_TIMEOUT`); the drainer ends its waits at the deadline.
pub const NODE_STEP_DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// `<state-dir>/cordon.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CordonJournal {
    /// The plan whose drainNode step cordoned the node.
    #[serde(default)]
    pub cordoned_by_plan: Option<String>,
}

/// Reads the cordon journal.
pub(super) async fn load_journal(
    ctx: &StepContext,
    env: &DriverEnv,
) -> Result<CordonJournal, DriverError> {
    let path = env.state_dir.join(CORDON_JOURNAL);
    blocking_value(ctx, move || {
        Ok(read_journal(
            &path,
            "move it away to forget which plan cordoned the node",
        )?)
    })
    .await
}

/// Writes the cordon journal (`None` removes it).
pub(super) async fn save_journal(
    ctx: &StepContext,
    env: &DriverEnv,
    journal: Option<CordonJournal>,
) -> Result<(), DriverError> {
    let path = env.state_dir.join(CORDON_JOURNAL);
    blocking_value(ctx, move || match journal {
        Some(journal) => Ok(write_journal(&path, &journal)?),
        None => Ok(remove_file(&path).map(|_| ())?),
    })
    .await
}

/// Why `config` cannot run the node steps: they need its `node:` section.
pub(super) fn unconfigured(config: &DriverConfig) -> Option<String> {
    config.node.is_none().then(|| "node".to_owned())
}

/// This node's name: `node.name`, else the host name under `--root`.
pub(crate) fn node_name(env: &DriverEnv) -> Option<String> {
    env.config
        .node
        .as_ref()
        .and_then(|node| node.name.clone())
        .or_else(|| read_fact(env, "/proc/sys/kernel/hostname"))
        .or_else(|| read_fact(env, "/etc/hostname"))
}

/// The drainer of this node, or the failure naming the missing setting.
pub(crate) async fn drainer(env: &DriverEnv, kind: &str) -> Result<Drainer, DriverError> {
    let Some(node) = &env.config.node else {
        return Err(DriverError::refused(format!(
            "{kind} needs the `node:` section of the agent config (node.kubeconfig, node.name)"
        )));
    };
    let path = env.fs.path(&node.kubeconfig)?;
    let name = node_name(env).ok_or_else(|| {
        DriverError::refused(format!(
            "{kind}: node.name is not set and no host name is readable under --root"
        ))
    })?;
    let client = client_from_kubeconfig(&path)
        .await
        .map_err(|source| node_api(&format!("{kind}: node.kubeconfig"), source, ""))?;
    Ok(Drainer::new(client, name, node.timing()))
}

/// The Node's kubelet version through the node API (`None` without one); the error says why it is unknown.
pub(crate) async fn node_kubelet_version(env: &DriverEnv) -> Result<Option<String>, DriverError> {
    let drainer = drainer(env, "rollback").await?;
    drainer
        .kubelet_version()
        .await
        .map_err(|source| node_api("rollback", source, ""))
}

fn interrupted() -> DriverError {
    DriverError::Interrupted("stopped: agent shutting down".to_owned())
}

/// Runs `work`, forwarding each text from `texts` as the running step's message, until it ends,
/// the agent shuts down (`None`), or the deadline's grace passed.
pub(crate) async fn drive<T>(
    ctx: &mut StepContext,
    mut texts: watch::Receiver<String>,
    work: impl Future<Output = T>,
) -> Result<T, DriverError> {
    let progress = ctx.progress.clone().unwrap_or_default();
    let give_up = ctx.deadline + NODE_STEP_DEADLINE_GRACE;
    let timeout_seconds = ctx.step.timeout_seconds;
    let cancel = &mut ctx.cancel;
    let cancelled = async move {
        if cancel.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(work, cancelled);
    loop {
        tokio::select! {
            value = &mut work => return Ok(value),
            () = &mut cancelled => return Err(interrupted()),
            Ok(()) = texts.changed() => {
                let text = texts.borrow_and_update().clone();
                ctx.recorder.record_with_message(progress.clone(), Some(text)).await;
            }
            () = tokio::time::sleep_until(give_up) => {
                return Err(DriverError::TimedOut { seconds: timeout_seconds });
            }
        }
    }
}

/// A failure of the node API during `what`, leaving `then`.
pub(super) fn node_api(what: &str, source: DrainError, then: &'static str) -> DriverError {
    DriverError::NodeApi {
        what: what.to_owned(),
        source: Box::new(source),
        then,
    }
}
