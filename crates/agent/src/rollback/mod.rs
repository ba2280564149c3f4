//! The rollback phase (issue 28): when a step fails (after its own retries) and the server's `onFailure` for
//! the plan is `rollback` (or absent), the agent undoes the failed step, then the succeeded ones in reverse
//! order back to the last point of no return (`StepKind::undo()` is `NoReturn`), instead of stopping.
//!
//! The rollback is written into `state.json` in the same save as the step's failure ([`start`]), and each
//! undo is recorded `running` (attempt counted) before it starts and `succeeded`/`failed` after, like a
//! forward step: both follow the step-attempt protocol (`attempt/protocol.rs`). So a SIGKILL, SIGTERM or reboot anywhere resumes the rollback at the undo it was in (undos
//! converge, so running one again is safe), and the failed forward step never runs again. An undo that
//! fails, or is interrupted [`MAX_STEP_ATTEMPTS`] times, ends the rollback `failed`. A step whose kind has no
//! undo recorded ends it `failed` too, naming the step. After the last undo the rollback is not over: the
//! node is verified and the plan's cordon lifted (`rollback/verify.rs`), and only then is it `rolledBack`.
//!
//! On a control-plane Machine the undo of a step whose kind disturbs a control plane (the step-kind table's
//! `preflight`: an osImage undo reboots the node) first waits for the same control-plane preflight as the
//! step, before its first effect, at most [`UNDO_PREFLIGHT_WAIT`] and never past the step's timeout; the
//! rollback's message says what it waits for. Meanwhile nothing of the undo runs; at the bound the undo
//! fails unbegun and the rollback ends `failed`, the node left as it is (cordoned). An undo that began is never
//! held back, like a step.

pub(crate) mod reports;
pub(crate) mod verify;

pub(crate) use reports::finished_undo_reports;
use reports::{record_undo_progress, record_undo_wait, undo_report, undo_waiting};
use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, OnFailure, Plan, RollbackState, Step, StepKind, StepReport,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::attempt::MAX_STEP_ATTEMPTS;
use crate::attempt::host::StepHost;
use crate::attempt::protocol::{self, Attempt};
use crate::attempt::state_full::EntryOf;
use crate::drivers::{DriverOutcome, ProgressRecorder, StepResult, UndoContext, execute_undo};
use crate::preflight::UNDO_PREFLIGHT_WAIT;
use crate::shutdown::Shutdown;
use crate::state::rollback_record::{RollbackRecord, undo_order};
use crate::state::{LocalStepStatus, PlanRecord, SequenceProgress, StateError, StateStore};

/// Starts the rollback of `record` after step `failed` failed, unless `onFailure` is `hold` or one is
/// already under way. The caller saves (in the same write as the failure).
pub(crate) fn start(plan: &Plan, record: &mut PlanRecord, failed: usize) {
    if record.on_failure == Some(OnFailure::Hold)
        || record.rollback.is_some()
        || failed >= plan.steps.len()
    {
        return;
    }
    let order = undo_order(plan, &record.steps, failed);
    tracing::warn!(plan = %plan.id, step = failed, undo = ?order.order, stopped_at = ?order.stopped_at, "step failed: rolling back");
    let drained = plan
        .steps
        .iter()
        .zip(&record.steps)
        .any(|(step, local)| step.action.step_kind() == StepKind::DrainNode && local.began());
    record.rollback = Some(RollbackRecord::new(failed as u32, order, drained));
}

/// Takes the server's `onFailure` from a poll answer that carried a plan or a hold (absent there: roll
/// back) into the current plan's record, saved when it changed.
pub(crate) fn note_on_failure(store: &mut StateStore, on_failure: Option<OnFailure>) {
    let Some(record) = store.state.current.as_mut() else {
        return;
    };
    if record.on_failure == on_failure {
        return;
    }
    record.on_failure = on_failure;
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save the onFailure setting; it holds in memory");
    }
}

/// Runs the next part of the current plan's rollback, if one is under way: an undo, else the verification or
/// the uncordon (`rollback/verify.rs`). `None` when there is nothing to run; `Break` means shutdown was requested.
pub(crate) async fn run_next<H: StepHost + Send>(
    host: &mut H,
    shutdown: &mut Shutdown,
) -> Option<ControlFlow<()>> {
    if pending(host.store()) {
        Some(run_undo(host, shutdown).await)
    } else if crate::rollback::verify::pending(host.store()) {
        Some(crate::rollback::verify::run_finish(host, shutdown).await)
    } else {
        None
    }
}

/// Whether the current plan has an undo to run.
pub(crate) fn pending(store: &StateStore) -> bool {
    store.rollback().is_some_and(|r| r.next_undo().is_some())
}

/// Runs the next undo of the current plan's rollback. `Break` means shutdown was requested.
pub(crate) async fn run_undo<H: StepHost + Send>(
    host: &mut H,
    shutdown: &mut Shutdown,
) -> ControlFlow<()> {
    let identity = host.identity().clone();
    let env = host.env();
    let store = host.store();
    let plan = store.plan.clone();
    let Some(record) = store.state.current.as_mut() else {
        return ControlFlow::Continue(());
    };
    let Some(pos) = record.rollback.as_ref().and_then(RollbackRecord::next_undo) else {
        return ControlFlow::Continue(());
    };
    let Some(plan) = plan else {
        let attempt = UndoAttempt {
            identity,
            pos,
            step: None,
        };
        let result = StepResult::failed("the plan's body is lost: nothing can be undone");
        return protocol::end_refused(host, shutdown, &attempt, result).await;
    };
    let Some(rollback) = record.rollback.as_mut() else {
        return ControlFlow::Continue(());
    };
    let index = rollback.order[pos] as usize;
    let Some(step) = plan.steps.get(index).cloned() else {
        return ControlFlow::Continue(());
    };
    let kind = step.action.step_kind();
    let attempt = UndoAttempt {
        identity: identity.clone(),
        pos,
        step: Some(step.clone()),
    };
    let entry = &mut rollback.undos[pos];
    let interrupted = entry.status == LocalStepStatus::Running;
    let resumed = entry.began();
    let undo_record = record.steps[index].undo.clone();
    let refusal = if interrupted && entry.attempt >= MAX_STEP_ATTEMPTS {
        Some(format!(
            "undo interrupted {} times (agent restart or node reboot during it); not trying again",
            entry.attempt
        ))
    } else if undo_record.is_none() {
        Some(format!(
            "no undo was recorded for this {kind} step ({kind} has no undo in this agent yet, or an agent \
             without undos ran it)"
        ))
    } else {
        None
    };
    if let Some(message) = refusal {
        return protocol::end_refused(host, shutdown, &attempt, StepResult::failed(message)).await;
    }
    // On a control-plane Machine a disruptive step's undo waits for the same preflight as the step; an undo that
    // began is never held back (it may have made its effect: the reboot that rebooted the node).
    if !resumed && crate::preflight::needed(&plan, &step) {
        match preflight(host, &identity, pos, &plan.id, &step, shutdown).await {
            ControlFlow::Break(()) => return ControlFlow::Break(()),
            ControlFlow::Continue(Err(failed)) => {
                return protocol::end_refused(host, shutdown, &attempt, failed).await;
            }
            ControlFlow::Continue(Ok(())) => {}
        }
    }
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return ControlFlow::Continue(());
    };
    let Some(entry) = record.rollback.as_mut().and_then(|r| r.undos.get_mut(pos)) else {
        return ControlFlow::Continue(());
    };
    if interrupted {
        tracing::warn!(plan = %plan.id, step = index, attempt = entry.attempt, "undo was interrupted; running it again");
    }
    let progress = if resumed {
        entry.progress.clone()
    } else {
        None
    };
    match protocol::begin(host, shutdown, &attempt).await {
        ControlFlow::Break(()) => return ControlFlow::Break(()),
        ControlFlow::Continue(false) => return ControlFlow::Continue(()),
        ControlFlow::Continue(true) => {}
    }
    tracing::info!(plan = %plan.id, step = index, description = %step.description, %kind, "undo started");
    let (cancel_tx, cancel) = watch::channel(false);
    // An undo that runs a command sequence (the package steps) records its progress in the undo's record.
    let (progress_tx, progress_rx) = mpsc::channel(1);
    let ctx = UndoContext {
        plan_id: plan.id.clone(),
        index,
        step: step.clone(),
        progress,
        recorder: ProgressRecorder::new(progress_tx),
        record: undo_record,
        resumed,
        deadline: Instant::now() + Duration::from_secs(u64::from(step.timeout_seconds)),
        timeout_seconds: step.timeout_seconds,
        cancel,
    };
    let task = tokio::spawn(execute_undo(env, kind, ctx));
    protocol::cross(host, shutdown, &attempt, task, cancel_tx, progress_rx).await
}

/// A rollback's undo as the step-attempt protocol sees it: the undo at `pos` of the current plan's rollback,
/// of the plan's `step` (`None` when the plan's body is lost).
struct UndoAttempt {
    identity: AgentIdentity,
    pos: usize,
    step: Option<Step>,
}

impl Attempt for UndoAttempt {
    const NOUN: &'static str = "undo";
    const EVERY_END_WAITS_FOR_DISK: bool = false;
    const RETRIES_WHEN_WAIT_UNSAVED: bool = false;

    fn entry(&self) -> (EntryOf, usize) {
        (
            |store, pos| store.rollback_mut()?.undos.get_mut(pos),
            self.pos,
        )
    }

    fn report(&self, store: &StateStore) -> Option<StepReport> {
        let record = store.state.current.as_ref()?;
        let rollback = record.rollback.as_ref()?;
        let index = *rollback.order.get(self.pos)? as usize;
        let entry = rollback.undos.get(self.pos)?;
        let mut report = undo_report(&self.identity, &record.plan_id, index, entry);
        report.rollback = Some(rollback.progress());
        Some(report)
    }

    fn waiting(&self, store: &StateStore, message: &str) -> Option<StepReport> {
        undo_waiting(&self.identity, store, self.pos, message)
    }

    fn progress(
        &self,
        store: &mut StateStore,
        progress: SequenceProgress,
        message: Option<String>,
    ) -> Result<(), StateError> {
        record_undo_progress(store, &self.identity, self.pos, progress, message)
    }

    fn end<H: StepHost>(&self, host: &mut H, result: StepResult) -> Result<(), StateError> {
        end_undo(host, &self.identity, self.pos, self.step.as_ref(), result)
    }
}

/// The control-plane preflight of the undo at `pos` (of `step`, plan `plan_id`), before its first effect: it
/// waits at most [`UNDO_PREFLIGHT_WAIT`] (never past the step's timeout), each waiting message the undo's and
/// the rollback's ("undo of step 3 (…): waiting for the control plane: …"), reported with the rollback's
/// summary. `Continue(Err)` is the undo's failure (nothing of it done); `Break` a shutdown (the undo stays
/// never begun: the next start checks again).
async fn preflight<H: StepHost + Send>(
    host: &mut H,
    identity: &AgentIdentity,
    pos: usize,
    plan_id: &str,
    step: &inplace_agent_api::Step,
    shutdown: &mut Shutdown,
) -> ControlFlow<(), Result<(), StepResult>> {
    let wait = UNDO_PREFLIGHT_WAIT.min(Duration::from_secs(u64::from(step.timeout_seconds)));
    let index = step.index as usize;
    let what = format!("undo of step {} ({})", index + 1, step.description);
    let record = |store: &mut StateStore, _progress, message: Option<String>| {
        let Some(message) = message else {
            return Ok(());
        };
        record_undo_wait(store, identity, pos, &format!("{what}: {message}"))
    };
    let waiting = |store: &StateStore, message: &str| undo_waiting(identity, store, pos, message);
    let flow =
        crate::preflight::check_step(host, plan_id, step, wait, shutdown, record, &waiting).await;
    if let ControlFlow::Continue(Ok(())) = flow
        && let Some(rollback) = host.store().rollback_mut()
    {
        // The waiting is over: the undo's start (reported next, with the summary) says the rest.
        rollback.message.clear();
    }
    flow
}

/// Records an undo's end and queues its report; a failure ends the rollback `failed`, after the last success
/// the verification comes (`rollback/verify.rs`). `step` is the plan's step (`None` when the plan body is lost).
/// Answers whether the record is on disk.
fn end_undo<H: StepHost>(
    host: &mut H,
    identity: &AgentIdentity,
    pos: usize,
    step: Option<&inplace_agent_api::Step>,
    result: StepResult,
) -> Result<(), StateError> {
    host.step_boundary();
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return Ok(());
    };
    let plan_id = record.plan_id.clone();
    let Some(rollback) = record.rollback.as_mut() else {
        return Ok(());
    };
    let index = rollback.order[pos] as usize;
    let entry = &mut rollback.undos[pos];
    let succeeded = result.outcome == DriverOutcome::Succeeded;
    entry.end(&result);
    entry.attempt = entry.attempt.max(1);
    let mut report = undo_report(identity, &plan_id, index, entry);
    if succeeded {
        tracing::info!(plan = %plan_id, step = index, message = %result.message, "undo succeeded");
        if rollback.next_undo().is_none() {
            rollback.message = "undone; verifying the node".to_owned();
        }
    } else {
        let description = step.map_or("", |s| s.description.as_str());
        let message = format!(
            "undo of step {} ({description}) failed: {}",
            index + 1,
            result.message
        );
        tracing::error!(plan = %plan_id, step = index, %message, "rollback failed");
        rollback.finish_failed(&message);
    }
    let ended = rollback.state != RollbackState::RollingBack;
    if ended {
        tracing::info!(plan = %plan_id, state = ?rollback.state, message = %rollback.message, "rollback ended");
    }
    report.rollback = Some(rollback.progress());
    store.enqueue(report);
    let saved = store.save();
    if let Err(e) = &saved
        && !matches!(e, StateError::Full { .. })
    {
        tracing::error!(error = %e, "cannot save the undo's result");
    }
    if ended {
        host.plan_ended();
    }
    saved
}
