//! The rollback phase (issue 28): when a step fails (after its own retries) and the server's `onFailure` for
//! the plan is `rollback` (or absent), the agent undoes the failed step, then the succeeded ones in reverse
//! order back to the last point of no return (`StepKind::undo()` is `NoReturn`), instead of stopping.
//!
//! The rollback is written into `state.json` in the same save as the step's failure ([`start`]), and each
//! undo is recorded `running` (attempt counted) before it starts and `succeeded`/`failed` after, like a
//! forward step. So a SIGKILL, SIGTERM or reboot anywhere resumes the rollback at the undo it was in (undos
//! converge, so running one again is safe), and the failed forward step never runs again. An undo that
//! fails, or is interrupted [`MAX_STEP_ATTEMPTS`] times, ends the rollback `failed`. A step whose kind has no
//! undo in this agent yet (the package installs) ends it `failed` too, naming the step.

use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, MESSAGE_MAX_BYTES, OnFailure, Plan, RollbackProgress, RollbackState, Undo,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::drivers::{DriverOutcome, ProgressRecorder, StepResult, UndoContext, execute_undo};
use crate::executor::{MAX_STEP_ATTEMPTS, StepHost, drive, write_progress};
use crate::shutdown::{Shutdown, pause};
use crate::state::{
    LocalStepRecord, LocalStepStatus, PlanRecord, SequenceProgress, StateStore, report_for,
    truncate_head,
};

/// A rollback of the current plan: the steps to undo, in order, and how each undo went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackRecord {
    /// The step whose failure started it.
    pub failed_step: u32,
    /// The steps to undo, in order: the failed one (when its kind is undone), then the succeeded ones in
    /// reverse, back to the last point of no return.
    pub order: Vec<u32>,
    /// One record per entry of `order`: the undo's status, attempts and outcome.
    pub undos: Vec<LocalStepRecord>,
    /// Where it is.
    pub state: RollbackState,
    /// For operators (bounded by `MESSAGE_MAX_BYTES`).
    pub message: String,
}

impl RollbackRecord {
    /// A rollback of the steps `order` after `failed_step` failed (rolled back already when there is
    /// nothing to undo).
    pub fn new(failed_step: u32, order: Vec<u32>) -> Self {
        let undos = order.iter().map(|_| LocalStepRecord::pending()).collect();
        let mut record = Self {
            failed_step,
            order,
            undos,
            state: RollbackState::RollingBack,
            message: String::new(),
        };
        if record.order.is_empty() {
            record.finish_rolled_back();
        }
        record
    }

    /// The position in `order` of the next undo to run, while rolling back.
    pub fn next_undo(&self) -> Option<usize> {
        if self.state != RollbackState::RollingBack {
            return None;
        }
        self.undos.iter().position(|u| {
            matches!(
                u.status,
                LocalStepStatus::Pending | LocalStepStatus::Running
            )
        })
    }

    /// How many undos succeeded.
    pub fn undone(&self) -> u32 {
        self.undos
            .iter()
            .filter(|u| u.status == LocalStepStatus::Succeeded)
            .count() as u32
    }

    /// Every undo succeeded: rolled back.
    pub fn finish_rolled_back(&mut self) {
        self.state = RollbackState::RolledBack;
        let steps: Vec<String> = self.order.iter().map(|i| (i + 1).to_string()).collect();
        self.message = if steps.is_empty() {
            "nothing to undo".to_owned()
        } else {
            format!(
                "rolled back steps {}: files restored byte-equal; node not verified and not uncordoned by this \
                 agent yet",
                steps.join(", ")
            )
        };
    }

    /// An undo failed (`message` says which and why): the rollback ends failed, the node left cordoned.
    pub fn finish_failed(&mut self, message: &str) {
        self.state = RollbackState::Failed;
        let text = format!("{message}; node left cordoned");
        self.message = truncate_head(&text, MESSAGE_MAX_BYTES).to_owned();
    }

    /// The summary sent with polls and inventory.
    pub fn progress(&self) -> RollbackProgress {
        RollbackProgress {
            state: self.state,
            failed_step: self.failed_step,
            undone: self.undone(),
            message: self.message.clone(),
        }
    }
}

/// The steps a failure of step `failed` undoes, in order: the failed one when its kind is undone (it may
/// have changed things), then the succeeded ones before it in reverse, stopping at the last point of no
/// return. Kinds that leave nothing to undo (the drain's cordon, waits) are passed over.
pub(crate) fn undo_order(plan: &Plan, steps: &[LocalStepRecord], failed: usize) -> Vec<u32> {
    let kind = |i: usize| plan.steps[i].action.step_kind().undo();
    let mut order = Vec::new();
    // A step that failed before it began (its record could not be taken) changed nothing.
    if kind(failed) == Undo::Restores && steps.get(failed).is_some_and(LocalStepRecord::began) {
        order.push(failed as u32);
    }
    for i in (0..failed.min(steps.len())).rev() {
        if steps[i].status != LocalStepStatus::Succeeded {
            continue;
        }
        match kind(i) {
            Undo::NoReturn => break,
            Undo::Restores => order.push(i as u32),
            Undo::Nothing => {}
        }
    }
    order
}

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
    tracing::warn!(plan = %plan.id, step = failed, undo = ?order, "step failed: rolling back");
    record.rollback = Some(RollbackRecord::new(failed as u32, order));
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

/// Whether the current plan has an undo to run.
pub(crate) fn pending(store: &StateStore) -> bool {
    store
        .state
        .current
        .as_ref()
        .and_then(|r| r.rollback.as_ref())
        .is_some_and(|r| r.next_undo().is_some())
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
        let result = StepResult::failed("the plan's body is lost: nothing can be undone");
        end_undo(host, &identity, pos, None, result);
        return ControlFlow::Continue(());
    };
    let Some(rollback) = record.rollback.as_mut() else {
        return ControlFlow::Continue(());
    };
    let index = rollback.order[pos] as usize;
    let Some(step) = plan.steps.get(index).cloned() else {
        return ControlFlow::Continue(());
    };
    let kind = step.action.step_kind();
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
        end_undo(
            host,
            &identity,
            pos,
            Some(&step),
            StepResult::failed(message),
        );
        return ControlFlow::Continue(());
    }
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
    entry.begin_attempt();
    let report = undo_report(&identity, &plan.id, index, entry);
    store.enqueue(report);
    let saved = store.save();
    host.step_boundary();
    if let Err(e) = saved {
        tracing::error!(error = %e, "cannot record the undo's start; retrying later");
        return if pause(host.next_delay(), shutdown).await {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        };
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
    let record = |store: &mut StateStore, progress, message| {
        record_undo_progress(store, &identity, pos, progress, message)
    };
    let (result, stopping) = drive(host, task, cancel_tx, progress_rx, shutdown, record).await;
    if result.outcome == DriverOutcome::Interrupted {
        undo_interrupted_by_shutdown(host.store(), pos);
        return ControlFlow::Break(());
    }
    end_undo(host, &identity, pos, Some(&step), result);
    if stopping {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// Writes an undo sequence's progress (and a new message, reported as a `running` undo) into the undo's
/// record; true once it is on disk.
fn record_undo_progress(
    store: &mut StateStore,
    identity: &AgentIdentity,
    pos: usize,
    progress: SequenceProgress,
    message: Option<String>,
) -> bool {
    let index = store
        .state
        .current
        .as_ref()
        .and_then(|r| r.rollback.as_ref()?.order.get(pos).copied())
        .unwrap_or_default() as usize;
    let report =
        |plan_id: &str, undo: &LocalStepRecord| undo_report(identity, plan_id, index, undo);
    write_progress(
        store,
        progress,
        message,
        |record| record.rollback.as_mut()?.undos.get_mut(pos),
        report,
    )
}

/// The report of an undo's record.
fn undo_report(
    identity: &AgentIdentity,
    plan_id: &str,
    index: usize,
    entry: &LocalStepRecord,
) -> inplace_agent_api::StepReport {
    let mut report = report_for(identity, plan_id, index, entry);
    report.undo = true;
    report
}

/// The reports of every finished undo of `record`'s rollback (sent again when the server missed them).
pub(crate) fn finished_undo_reports(
    identity: &AgentIdentity,
    record: &PlanRecord,
) -> Vec<inplace_agent_api::StepReport> {
    let Some(rollback) = &record.rollback else {
        return Vec::new();
    };
    rollback
        .order
        .iter()
        .zip(&rollback.undos)
        .filter(|(_, u)| {
            matches!(
                u.status,
                LocalStepStatus::Succeeded | LocalStepStatus::Failed
            )
        })
        .map(|(&i, u)| undo_report(identity, &record.plan_id, i as usize, u))
        .collect()
}

/// A clean shutdown stopped the undo: back to pending, the attempt not counted.
fn undo_interrupted_by_shutdown(store: &mut StateStore, pos: usize) {
    if let Some(entry) = store
        .state
        .current
        .as_mut()
        .and_then(|r| r.rollback.as_mut())
        .and_then(|r| r.undos.get_mut(pos))
    {
        entry.status = LocalStepStatus::Pending;
        entry.attempt = entry.attempt.saturating_sub(1);
    }
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save state at shutdown");
    }
    tracing::info!(
        undo = pos,
        "undo stopped by shutdown; it runs again at the next start"
    );
}

/// Records an undo's end and queues its report; a failure ends the rollback `failed`, the last success ends
/// it rolled back. `step` is the plan's step (`None` when the plan body is lost).
fn end_undo<H: StepHost>(
    host: &mut H,
    identity: &AgentIdentity,
    pos: usize,
    step: Option<&inplace_agent_api::Step>,
    result: StepResult,
) {
    host.step_boundary();
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return;
    };
    let plan_id = record.plan_id.clone();
    let Some(rollback) = record.rollback.as_mut() else {
        return;
    };
    let index = rollback.order[pos] as usize;
    let entry = &mut rollback.undos[pos];
    let succeeded = result.outcome == DriverOutcome::Succeeded;
    entry.end(&result);
    entry.attempt = entry.attempt.max(1);
    let report = undo_report(identity, &plan_id, index, entry);
    if succeeded {
        tracing::info!(plan = %plan_id, step = index, message = %result.message, "undo succeeded");
        if rollback.next_undo().is_none() {
            rollback.finish_rolled_back();
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
    store.enqueue(report);
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save the undo's result");
    }
    if ended {
        host.plan_ended();
    }
}
