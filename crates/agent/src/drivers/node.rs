//! The node steps, over the workload cluster's API with the node's own kubelet kubeconfig
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

use inplace_drain::{DrainOptions, Drainer, client_from_kubeconfig};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{DriverEnv, DriverOutcome, StepContext, StepResult, blocking_value};
use crate::fsutil::{read_journal, remove_file, write_journal};
use crate::inventory::read_fact;

/// The cordon journal's file name in the state dir.
const CORDON_JOURNAL: &str = "cordon.json";
/// How long past the step deadline an API call may still finish (its own timeout is
/// `inplace_drain::drainer::MAX_REQUEST_TIMEOUT`); the drainer ends its waits at the deadline.
pub const NODE_STEP_DEADLINE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CordonJournal {
    /// The plan whose drainNode step cordoned the node.
    #[serde(default)]
    cordoned_by_plan: Option<String>,
}

async fn load_journal(ctx: &StepContext, env: &DriverEnv) -> Result<CordonJournal, StepResult> {
    let path = env.state_dir.join(CORDON_JOURNAL);
    blocking_value(ctx, move || {
        read_journal(&path, "move it away to forget which plan cordoned the node")
    })
    .await
}

async fn save_journal(
    ctx: &StepContext,
    env: &DriverEnv,
    journal: Option<CordonJournal>,
) -> Result<(), StepResult> {
    let path = env.state_dir.join(CORDON_JOURNAL);
    blocking_value(ctx, move || match journal {
        Some(journal) => write_journal(&path, &journal),
        None => remove_file(&path).map(|_| ()).map_err(|e| e.to_string()),
    })
    .await
}

/// The drainer of this node, or the failure naming the missing setting.
async fn drainer(env: &DriverEnv, kind: &str) -> Result<Drainer, StepResult> {
    let Some(node) = &env.config.node else {
        return Err(StepResult::failed(format!(
            "{kind} needs the `node:` section of the agent config (node.kubeconfig, node.name)"
        )));
    };
    let path = env.fs.path(&node.kubeconfig).map_err(StepResult::failed)?;
    let name = node
        .name
        .clone()
        .or_else(|| read_fact(env, "/proc/sys/kernel/hostname"))
        .or_else(|| read_fact(env, "/etc/hostname"))
        .ok_or_else(|| {
            StepResult::failed(format!(
                "{kind}: node.name is not set and no host name is readable under --root"
            ))
        })?;
    let client = client_from_kubeconfig(&path)
        .await
        .map_err(|e| StepResult::failed(format!("{kind}: node.kubeconfig: {e}")))?;
    Ok(Drainer::new(client, name, node.timing()))
}

fn interrupted() -> StepResult {
    StepResult {
        outcome: DriverOutcome::Interrupted,
        ..StepResult::failed("stopped: agent shutting down")
    }
}

/// Runs `work`, forwarding each text from `texts` as the running step's message, until it ends,
/// the agent shuts down (`None`), or the deadline's grace passed.
async fn drive<T>(
    ctx: &mut StepContext,
    mut texts: watch::Receiver<String>,
    work: impl Future<Output = T>,
) -> Result<T, StepResult> {
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
                return Err(StepResult::failed(format!(
                    "timed out: step timeout of {timeout_seconds} s reached"
                )));
            }
        }
    }
}

/// drainNode: record + cordon (unless already cordoned), then drain within the step timeout.
pub(crate) async fn drain(
    env: &DriverEnv,
    ctx: &mut StepContext,
    options: DrainOptions,
) -> StepResult {
    let drainer = match drainer(env, "drainNode").await {
        Ok(d) => d,
        Err(failure) => return failure,
    };
    let (tx, rx) = watch::channel(String::new());
    let node = drainer.node().to_owned();
    let cordon = async {
        let cordoned = drainer.is_cordoned().await?;
        Ok::<_, inplace_drain::DrainError>(cordoned)
    };
    let already = match drive(ctx, rx.clone(), cordon).await {
        Ok(Ok(cordoned)) => cordoned,
        Ok(Err(e)) => return StepResult::failed(format!("drainNode: {e}")),
        Err(stop) => return stop,
    };
    let journal = match load_journal(ctx, env).await {
        Ok(j) => j,
        Err(failure) => return failure,
    };
    let ours = journal.cordoned_by_plan.as_deref() == Some(ctx.plan_id.as_str());
    let cordon_note = if already && ours {
        "cordoned by this plan"
    } else if already && journal.cordoned_by_plan.is_some() {
        // An earlier plan's drain cordoned the node and never uncordoned it (its drain failed and left the
        // node cordoned, or it was cancelled or replaced). The cordon is still the updater's, not an
        // operator's: this plan takes it over and uncordons at its end, or it would stay cordoned for ever.
        let record = CordonJournal {
            cordoned_by_plan: Some(ctx.plan_id.clone()),
        };
        if let Err(failure) = save_journal(ctx, env, Some(record)).await {
            return failure;
        }
        tracing::info!(node = %node, plan = %ctx.plan_id, "cordon of an earlier plan taken over");
        "cordoned by an earlier plan of this agent; this plan uncordons it"
    } else if already {
        "it was cordoned before this plan and stays cordoned after it"
    } else {
        let record = CordonJournal {
            cordoned_by_plan: Some(ctx.plan_id.clone()),
        };
        if let Err(failure) = save_journal(ctx, env, Some(record)).await {
            return failure;
        }
        match drive(ctx, rx.clone(), drainer.cordon()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return StepResult::failed(format!("drainNode: cordon: {e}")),
            Err(stop) => return stop,
        }
        tracing::info!(node = %node, plan = %ctx.plan_id, "node cordoned");
        "cordoned by this plan"
    };
    let deadline = ctx.deadline;
    let mut report = move |text: String| {
        let _ = tx.send(text);
    };
    match drive(ctx, rx, drainer.drain(options, deadline, &mut report)).await {
        Ok(Ok(summary)) => StepResult::ok(format!(
            "drained {node} ({cordon_note}): {} pod(s) evicted{}",
            summary.evicted.len(),
            if summary.gone.is_empty() {
                String::new()
            } else {
                format!(", {} already gone", summary.gone.len())
            }
        )),
        Ok(Err(e)) => StepResult::failed(format!("drainNode: {e}; the node stays cordoned")),
        Err(stop) => stop,
    }
}

/// waitNodeReady: Ready=True and, when given, the kubelet version, within the step timeout.
pub(crate) async fn wait_ready(
    env: &DriverEnv,
    ctx: &mut StepContext,
    kubelet_version: Option<String>,
) -> StepResult {
    let drainer = match drainer(env, "waitNodeReady").await {
        Ok(d) => d,
        Err(failure) => return failure,
    };
    let (tx, rx) = watch::channel(String::new());
    let deadline = ctx.deadline;
    let mut report = move |text: String| {
        let _ = tx.send(text);
    };
    let work = drainer.wait_node_ready(kubelet_version.as_deref(), deadline, &mut report);
    match drive(ctx, rx, work).await {
        Ok(Ok(message)) => StepResult::ok(message),
        Ok(Err(e)) => StepResult::failed(format!("waitNodeReady: {e}")),
        Err(stop) => stop,
    }
}

/// uncordonNode: only when this plan's drainNode cordoned the node; the record goes after.
pub(crate) async fn uncordon(env: &DriverEnv, ctx: &mut StepContext) -> StepResult {
    let journal = match load_journal(ctx, env).await {
        Ok(j) => j,
        Err(failure) => return failure,
    };
    if journal.cordoned_by_plan.as_deref() != Some(ctx.plan_id.as_str()) {
        return StepResult::ok(
            "node not cordoned by this plan: left as it is (an operator's cordon stays)",
        );
    }
    let drainer = match drainer(env, "uncordonNode").await {
        Ok(d) => d,
        Err(failure) => return failure,
    };
    let (_tx, rx) = watch::channel(String::new());
    let work = async {
        // A resumed step whose uncordon went through already does not patch again.
        if drainer.is_cordoned().await? {
            drainer.uncordon().await?;
        }
        Ok::<_, inplace_drain::DrainError>(())
    };
    match drive(ctx, rx, work).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return StepResult::failed(format!("uncordonNode: {e}")),
        Err(stop) => return stop,
    }
    tracing::info!(node = %drainer.node(), plan = %ctx.plan_id, "node uncordoned");
    if let Err(failure) = save_journal(ctx, env, None).await {
        return failure;
    }
    StepResult::ok(format!("uncordoned {}", drainer.node()))
}
