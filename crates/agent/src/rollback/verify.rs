//! The end of a rollback (issue 28): once every undo succeeded, the Node is verified through the node API the
//! drain uses — Ready, at the kubelet version it had before the plan — and only then is the plan's own
//! cordon lifted. Otherwise the rollback ends `failed` and the node stays cordoned.
//!
//! The kubelet version "before" is read from the Node when the plan's first step begins
//! ([`note_kubelet_before`]) and kept in the plan's record. A rollback that stops at a point of no return
//! (`RollbackRecord::stopped_at`) restored the node to right after that step, not to before the plan: the
//! steps up to it stay done (a Kubernetes image switched before `kubeadm upgrade` stays merged, so the
//! kubelet the undos restart may be the new one), so it verifies the Node Ready without expecting the old
//! kubelet version; the message says whether the old version is back, or why it is not expected. The verification is a `waitNodeReady` and the
//! uncordon an `uncordonNode`, run through their drivers (so the uncordon is the journaled one: it lifts a
//! cordon only when this plan's drainNode made it, and a cordon an operator set stays). Both are safe to run
//! again, so a crash in either runs it again at the next start; [`MAX_STEP_ATTEMPTS`] interrupted tries end
//! the rollback `failed`.

use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{Plan, RollbackState, Step, StepAction, StepKind};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::attempt::MAX_STEP_ATTEMPTS;
use crate::attempt::drive::drive;
use crate::attempt::host::StepHost;
use crate::drivers::{DriverOutcome, ProgressRecorder, StepContext, execute, node_kubelet_version};
use crate::shutdown::{Shutdown, pause};
use crate::state::rollback_record::RollbackRecord;
use crate::state::{StateStore, truncate_head};

/// How long the verification waits for the Node to be Ready at its old kubelet version when the plan has no
/// `waitNodeReady` step whose timeout it can use.
pub const ROLLBACK_VERIFY_TIMEOUT_SECONDS: u32 = 300;
/// How long the uncordon at the end of a rollback may take.
pub const ROLLBACK_UNCORDON_TIMEOUT_SECONDS: u32 = 60;
/// How long reading the Node's kubelet version before the plan may take (the first step waits for it).
pub const KUBELET_BEFORE_TIMEOUT: Duration = Duration::from_secs(15);

/// Reads the Node's kubelet version into the plan's record before its first step begins (when the agent
/// config has `node:` and it is not read yet). A failure is logged and leaves it unknown: the rollback then
/// checks Ready only and says so.
pub(crate) async fn note_kubelet_before<H: StepHost>(host: &mut H) {
    let env = host.env();
    let store = host.store();
    let Some(record) = store.state.current.as_ref() else {
        return;
    };
    if env.config.node.is_none()
        || record.kubelet_before.is_some()
        || record.steps.iter().any(|s| s.began())
    {
        return;
    }
    let version = match tokio::time::timeout(KUBELET_BEFORE_TIMEOUT, node_kubelet_version(&env))
        .await
    {
        Ok(Ok(Some(version))) => version,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the Node's kubelet version before the plan; a rollback will not compare it");
            return;
        }
        Err(_) => {
            tracing::warn!(
                timeout_seconds = KUBELET_BEFORE_TIMEOUT.as_secs(),
                "reading the Node's kubelet version before the plan timed out; a rollback will not compare it"
            );
            return;
        }
    };
    if let Some(record) = store.state.current.as_mut() {
        record.kubelet_before = Some(version);
        if let Err(e) = store.save() {
            tracing::warn!(error = %e, "cannot save the kubelet version before the plan");
        }
    }
}

/// What is left of the current plan's rollback after its undos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Remaining {
    /// The Node is not verified yet.
    Verify,
    /// Verified; the plan's cordon is not lifted yet.
    Uncordon,
}

fn remaining(rollback: &RollbackRecord) -> Option<Remaining> {
    if rollback.state != RollbackState::RollingBack || rollback.next_undo().is_some() {
        return None;
    }
    Some(match rollback.verified {
        None => Remaining::Verify,
        Some(_) => Remaining::Uncordon,
    })
}

/// Whether the current plan's rollback has only its verification or uncordon left.
pub(crate) fn pending(store: &StateStore) -> bool {
    store.rollback().and_then(remaining).is_some()
}

/// The synthetic step of `what` for the plan `plan`; the verification expects the kubelet version `expected`.
fn step_for(plan: &Plan, what: Remaining, expected: Option<String>) -> Step {
    let index = plan.steps.len() as u32;
    match what {
        Remaining::Verify => Step {
            index,
            description: "rollback: verify the node".to_owned(),
            timeout_seconds: plan
                .steps
                .iter()
                .find(|s| s.action.step_kind() == StepKind::WaitNodeReady)
                .map_or(ROLLBACK_VERIFY_TIMEOUT_SECONDS, |s| s.timeout_seconds),
            action: StepAction::WaitNodeReady {
                kubelet_version: expected,
            },
        },
        Remaining::Uncordon => Step {
            index,
            description: "rollback: uncordon the node".to_owned(),
            timeout_seconds: ROLLBACK_UNCORDON_TIMEOUT_SECONDS,
            action: StepAction::UncordonNode,
        },
    }
}

/// Runs what is left after the undos: the verification, then the uncordon. `Break` means shutdown.
pub(crate) async fn run_finish<H: StepHost + Send>(
    host: &mut H,
    shutdown: &mut Shutdown,
) -> ControlFlow<()> {
    let env = host.env();
    let store = host.store();
    let Some(plan) = store.plan.clone() else {
        end(
            host,
            Err("the plan's body is lost: the node cannot be verified".into()),
        );
        return ControlFlow::Continue(());
    };
    let Some(record) = store.state.current.as_mut() else {
        return ControlFlow::Continue(());
    };
    let kubelet_before = record.kubelet_before.clone();
    let Some(rollback) = record.rollback.as_mut() else {
        return ControlFlow::Continue(());
    };
    let stopped_at = rollback.stopped_at.and_then(|i| plan.steps.get(i as usize));
    let expected = match stopped_at {
        Some(_) => None,
        None => kubelet_before.clone(),
    };
    let Some(what) = remaining(rollback) else {
        return ControlFlow::Continue(());
    };
    if env.config.node.is_none() {
        let note =
            "node not verified and no cordon to lift: the agent config has no `node:` section";
        end(host, Ok(note.to_owned()));
        return ControlFlow::Continue(());
    }
    if rollback.finish_attempts >= MAX_STEP_ATTEMPTS {
        let message = format!(
            "the rollback's verification was interrupted {} times (agent restart or node reboot during it)",
            rollback.finish_attempts
        );
        end(host, Err(message));
        return ControlFlow::Continue(());
    }
    rollback.finish_attempts += 1;
    if let Err(e) = store.save() {
        // A save that failed (a full state dir) is not an interruption: the try is not counted.
        if let Some(rollback) = store.rollback_mut() {
            rollback.finish_attempts = rollback.finish_attempts.saturating_sub(1);
        }
        tracing::error!(error = %e, "cannot record the verification's start; retrying later");
        return if pause(host.next_delay(), shutdown).await {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        };
    }
    let step = step_for(&plan, what, expected);
    tracing::info!(plan = %plan.id, step = %step.description, "rollback: undos done");
    let (cancel_tx, cancel) = watch::channel(false);
    let (progress_tx, progress_rx) = mpsc::channel(1);
    let ctx = StepContext {
        plan_id: plan.id.clone(),
        deadline: Instant::now() + Duration::from_secs(u64::from(step.timeout_seconds)),
        step,
        resumed: false,
        progress: None,
        recorder: ProgressRecorder::new(progress_tx),
        cancel,
        drained: false,
    };
    let task = tokio::spawn(execute(env, ctx));
    let (result, stopping) = drive(
        host,
        task,
        cancel_tx,
        progress_rx,
        shutdown,
        |store, _, message| show_progress(store, message),
        // The verification has no report of its own to say a wait for room in: it waits silently.
        &|_: &StateStore, _: &str| None,
    )
    .await;
    match (result.outcome, what) {
        (DriverOutcome::Interrupted, _) => {
            if let Some(rollback) = host.store().rollback_mut() {
                rollback.finish_attempts = rollback.finish_attempts.saturating_sub(1);
            }
            if let Err(e) = host.store().save() {
                tracing::error!(error = %e, "cannot save state at shutdown");
            }
            return ControlFlow::Break(());
        }
        (DriverOutcome::Succeeded, Remaining::Verify) => {
            // Stopped at a point of no return, the old kubelet may be back all the same (a package undo
            // reinstalls it): then it is said as for a whole rollback.
            let back = match (stopped_at, &kubelet_before) {
                (Some(_), Some(before)) => kubelet_now(&host.env()).await.as_ref() == Some(before),
                _ => false,
            };
            let verified = match (stopped_at, &kubelet_before) {
                (Some(point), before) if !back => format!(
                    "{} (the rollback stopped at step {} ({}), a point of no return: the steps up to it stay \
                     done, so the kubelet version before the plan{} is not expected back)",
                    result.message,
                    point.index + 1,
                    point.description,
                    before
                        .as_deref()
                        .map(|v| format!(", {v},"))
                        .unwrap_or_default()
                ),
                (_, Some(_)) => format!("{}, the kubelet version it had before", result.message),
                (_, None) => format!(
                    "{} (its kubelet version before the plan was not known: not compared)",
                    result.message
                ),
            };
            if let Some(rollback) = host.store().rollback_mut() {
                rollback.verified = Some(verified);
                rollback.finish_attempts = 0;
            }
            if let Err(e) = host.store().save() {
                tracing::error!(error = %e, "cannot record the verification");
            }
        }
        (DriverOutcome::Succeeded, Remaining::Uncordon) => end(host, Ok(result.message)),
        (DriverOutcome::Failed, Remaining::Verify) => end(
            host,
            Err(format!(
                "the node did not pass the verification: {}",
                result.message
            )),
        ),
        (DriverOutcome::Failed, Remaining::Uncordon) => {
            end(host, Err(format!("uncordon failed: {}", result.message)))
        }
    }
    if stopping {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// The Node's kubelet version now, when it can be read within [`KUBELET_BEFORE_TIMEOUT`].
async fn kubelet_now(env: &crate::os::driver_env::DriverEnv) -> Option<String> {
    match tokio::time::timeout(KUBELET_BEFORE_TIMEOUT, node_kubelet_version(env)).await {
        Ok(Ok(version)) => version,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the Node's kubelet version after the rollback");
            None
        }
        Err(_) => None,
    }
}

/// The verification's progress ("waiting for node …: not Ready") becomes the rollback's message.
fn show_progress(
    store: &mut StateStore,
    message: Option<String>,
) -> Result<(), crate::state::StateError> {
    let (Some(message), Some(rollback)) = (message, store.rollback_mut()) else {
        return Ok(());
    };
    rollback.message = truncate_head(
        &format!("undone; verifying: {message}"),
        inplace_agent_api::MESSAGE_MAX_BYTES,
    )
    .to_owned();
    store.save()
}

/// Ends the rollback: `Ok(note)` rolled back (the note says what the node is now), `Err(why)` failed with the
/// node left cordoned.
fn end<H: StepHost>(host: &mut H, outcome: Result<String, String>) {
    host.step_boundary();
    let store = host.store();
    let Some(rollback) = store.rollback_mut() else {
        return;
    };
    match outcome {
        Ok(note) => {
            let verified = rollback.verified.take().unwrap_or_default();
            let text = if verified.is_empty() {
                note
            } else {
                format!("{verified}; {note}")
            };
            rollback.finish_rolled_back(&text);
        }
        Err(why) => rollback.finish_failed(&why),
    }
    tracing::info!(state = ?rollback.state, message = %rollback.message, "rollback ended");
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save the rollback's end");
    }
    host.plan_ended();
}
