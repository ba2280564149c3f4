//! Runs one step of the current plan with crash-safe bookkeeping: the step is recorded
//! `running` (attempt counted, fsynced) before it starts and `succeeded`/`failed` after, and a
//! report is queued at both points. Reports are delivered while the step runs. A Kubernetes
//! version step's progress (commands completed) is written to its record after each command.
//!
//! A step that began and did not finish — found `running` at start-up (crash, reboot, SIGKILL) or
//! put back to `pending` by a clean shutdown — is resumed, never skipped: its driver is told
//! (`resumed`) so that no "already done" check is trusted, the command sequences continue at the
//! first command not recorded complete, and the converging drivers redo their follow-up effects
//! (service restarts). Failing instead would leave the node half-changed for an operator to
//! repair by hand. A step interrupted [`MAX_STEP_ATTEMPTS`] times (e.g. one that keeps crashing
//! the node) fails instead. An attempt stopped by a clean shutdown is not counted.
//!
//! On a control-plane Machine, a step whose kind disturbs a control plane first waits for the control-plane
//! preflight (`crate::preflight`), before its first attempt only: a failed preflight fails the step unbegun.
//! The rollback runs the same preflight before such a step's undo ([`preflight`], from `rollback.rs`).

//!
//! The executor knows the agent only through [`StepHost`] (the pull loop implements it): it depends on the
//! state and the drivers, and nothing depends on it but the pull loop.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, MESSAGE_MAX_BYTES, PlanStatus, Step, StepAction, StepReport,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::command::KILL_GRACE;
use crate::driver_env::DriverEnv;
use crate::drivers::{
    DriverOutcome, ProgressRecorder, ProgressUpdate, RecordContext, StepContext, StepResult,
    execute, record_undo,
};
use crate::preflight::PREFLIGHT_WAIT;
use crate::shutdown::{Shutdown, pause};
use crate::state::{
    LocalStepRecord, LocalStepStatus, PlanRecord, SequenceProgress, StateStore, report_for,
    truncate_head,
};

/// Attempts after which a step that keeps being interrupted is failed.
pub const MAX_STEP_ATTEMPTS: u32 = 3;

/// What running a step needs from the agent around it.
pub(crate) trait StepHost {
    /// The state dir: the current plan, its progress, the outbox.
    fn store(&mut self) -> &mut StateStore;
    /// Who this agent is (reports name it).
    fn identity(&self) -> &AgentIdentity;
    /// The drivers' environment.
    fn env(&self) -> Arc<DriverEnv>;
    /// A step started or ended: the next one starts only after a fresh "no hold" from the server.
    fn step_boundary(&mut self);
    /// The plan ended: the inventory is due.
    fn plan_ended(&mut self);
    /// The next back-off delay after a failure.
    fn next_delay(&mut self) -> Duration;
    /// When queued reports may next be delivered (a failed delivery backs off).
    fn reports_due_at(&self) -> Instant;
    /// Delivers queued reports; a failure sets the next due time a back-off delay away.
    fn deliver_reports(&mut self) -> impl Future<Output = ()> + Send;
}

/// Aborts the step task when the agent's own future is dropped, so nothing outlives the agent.
struct AbortOnDrop(tokio::task::JoinHandle<StepResult>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Event {
    Finished(StepResult),
    Shutdown,
    Flushed,
    Progress,
}

/// Runs step `index` of the current plan. `Break` means shutdown was requested.
pub(crate) async fn run_step<H: StepHost + Send>(
    host: &mut H,
    index: usize,
    shutdown: &mut Shutdown,
) -> ControlFlow<()> {
    let identity = host.identity().clone();
    let env = host.env();
    let Some(plan) = host.store().plan.clone() else {
        return ControlFlow::Continue(());
    };
    let Some(step) = plan.steps.get(index).cloned() else {
        return ControlFlow::Continue(());
    };
    let Some(began) = host
        .store()
        .state
        .current
        .as_ref()
        .and_then(|r| r.steps.get(index))
        .map(|s| s.began())
    else {
        return ControlFlow::Continue(());
    };
    // What the undo needs is recorded before the first effect; a step that began keeps its first record
    // (its own writes since must never be taken for the state before it).
    let undo = if began {
        None
    } else {
        // A control-plane Machine's disruptive step waits for a control plane that can afford it; a step
        // that began is never held back (it may have made its effect: see `preflight`).
        if crate::preflight::needed(&plan, &step) {
            let wait = PREFLIGHT_WAIT.min(Duration::from_secs(u64::from(step.timeout_seconds)));
            // Only the message: the step keeps no progress of its preflight.
            let record = |store: &mut StateStore, _progress, message| {
                write_progress(
                    store,
                    None,
                    message,
                    |record| record.steps.get_mut(index),
                    |plan_id, step| report_for(&identity, plan_id, index, step),
                )
            };
            match preflight(host, &plan.id, &step, wait, shutdown, record).await {
                ControlFlow::Break(()) => return ControlFlow::Break(()),
                ControlFlow::Continue(Err(failed)) => {
                    finish(host, &identity, index, failed);
                    return ControlFlow::Continue(());
                }
                ControlFlow::Continue(Ok(())) => {}
            }
        }
        crate::rollback_verify::note_kubelet_before(host).await;
        let (_cancel_tx, cancel) = watch::channel(false);
        let ctx = RecordContext {
            plan_id: plan.id.clone(),
            index,
            step: step.clone(),
            deadline: Instant::now() + Duration::from_secs(u64::from(step.timeout_seconds)),
            cancel,
        };
        // A shutdown here leaves the step never begun: its record is taken again at the next start.
        let recorded = tokio::select! {
            recorded = record_undo(env.clone(), ctx) => recorded,
            () = &mut *shutdown => return ControlFlow::Break(()),
        };
        match recorded {
            Ok(undo) => undo,
            Err(e) => {
                let message =
                    format!("cannot record what undoing the step needs (nothing was changed): {e}");
                finish(host, &identity, index, StepResult::failed(message));
                return ControlFlow::Continue(());
            }
        }
    };
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return ControlFlow::Continue(());
    };
    let step_record = &mut record.steps[index];
    if !began {
        step_record.undo = undo;
    }
    let interrupted = step_record.status == LocalStepStatus::Running;
    let resumed = step_record.began();
    if interrupted && step_record.attempt >= MAX_STEP_ATTEMPTS {
        let message = format!(
            "step interrupted {} times (agent restart or node reboot during the step); not trying again",
            step_record.attempt
        );
        finish(host, &identity, index, StepResult::failed(message));
        return ControlFlow::Continue(());
    }
    if interrupted {
        tracing::warn!(plan = %plan.id, step = index, attempt = step_record.attempt, "step was interrupted; resuming it");
    } else if resumed {
        tracing::info!(plan = %plan.id, step = index, "step was stopped by a shutdown; resuming it");
    }
    let progress = if resumed {
        step_record.progress.clone()
    } else {
        None
    };
    step_record.begin_attempt();
    let report = report_for(&identity, &plan.id, index, step_record);
    store.enqueue(report);
    let saved = store.save();
    // Each step needs a fresh "no hold" from the server before the next one starts.
    host.step_boundary();
    if let Err(e) = saved {
        // Without a durable "running" record a crash could lose the attempt count and the
        // fact that the step began: do not start.
        tracing::error!(error = %e, "cannot record step start; retrying later");
        return if pause(host.next_delay(), shutdown).await {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        };
    }
    tracing::info!(plan = %plan.id, step = index, description = %step.description, kind = step.action.kind(), "step started");

    let (cancel_tx, cancel_rx) = watch::channel(false);
    let (progress_tx, progress_rx) = mpsc::channel::<ProgressUpdate>(1);
    let drained = plan
        .steps
        .iter()
        .take(index)
        .any(|s| matches!(s.action, StepAction::DrainNode { .. }));
    let ctx = StepContext {
        plan_id: plan.id.clone(),
        deadline: Instant::now() + Duration::from_secs(u64::from(step.timeout_seconds)),
        step,
        resumed,
        progress,
        recorder: ProgressRecorder::new(progress_tx),
        cancel: cancel_rx,
        drained,
    };
    let task = tokio::spawn(execute(env, ctx));
    let record = |store: &mut StateStore, progress, message| {
        record_progress(store, &identity, index, progress, message)
    };
    let (result, stopping) = drive(host, task, cancel_tx, progress_rx, shutdown, record).await;
    if result.outcome == DriverOutcome::Interrupted {
        interrupted_by_shutdown(host.store(), index);
        return ControlFlow::Break(());
    }
    finish(host, &identity, index, result);
    if stopping {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// Runs the control-plane preflight of `step` of plan `plan_id`, waiting at most `wait`: `Continue(Ok)` when
/// the step (or its undo) may start, `Continue(Err)` with its failure, `Break` when the agent shuts down (it
/// stays never begun). A task of its own driven like a step (reports delivered), before the step's or the
/// undo's first effect; `record` writes each waiting message where the step's or the undo's record keeps it,
/// and queues its report.
pub(crate) async fn preflight<H: StepHost + Send>(
    host: &mut H,
    plan_id: &str,
    step: &Step,
    wait: Duration,
    shutdown: &mut Shutdown,
    record: impl FnMut(&mut StateStore, SequenceProgress, Option<String>) -> bool,
) -> ControlFlow<(), Result<(), StepResult>> {
    let index = step.index;
    let deadline = Instant::now() + wait;
    let (cancel_tx, cancel) = watch::channel(false);
    let (progress_tx, progress_rx) = mpsc::channel(1);
    let ctx = StepContext {
        plan_id: plan_id.to_owned(),
        step: step.clone(),
        deadline,
        resumed: false,
        progress: None,
        recorder: ProgressRecorder::new(progress_tx),
        cancel,
        drained: false,
    };
    tracing::info!(plan = %plan_id, step = index, "control-plane preflight");
    let task = tokio::spawn(crate::preflight::run(host.env(), ctx));
    let (result, stopping) = drive(host, task, cancel_tx, progress_rx, shutdown, record).await;
    if stopping || result.outcome == DriverOutcome::Interrupted {
        return ControlFlow::Break(());
    }
    match result.outcome {
        DriverOutcome::Succeeded => {
            tracing::info!(plan = %plan_id, step = index, message = %result.message, "control-plane preflight passed");
            ControlFlow::Continue(Ok(()))
        }
        _ => ControlFlow::Continue(Err(result)),
    }
}

/// Awaits a step's (or an undo's) task while delivering reports and writing its progress with `record`. On
/// shutdown the task is cancelled (the driver kills its process group: TERM, then KILL after
/// `KILL_GRACE`) and awaited up to three grace periods; a command that completed meanwhile still gets its
/// progress recorded. Returns the result and whether shutdown was requested.
pub(crate) async fn drive<H: StepHost + Send>(
    host: &mut H,
    task: tokio::task::JoinHandle<StepResult>,
    cancel_tx: watch::Sender<bool>,
    mut progress_rx: mpsc::Receiver<ProgressUpdate>,
    shutdown: &mut Shutdown,
    mut record: impl FnMut(&mut StateStore, SequenceProgress, Option<String>) -> bool,
) -> (StepResult, bool) {
    let mut task = AbortOnDrop(task);
    let join = |r: Result<StepResult, tokio::task::JoinError>| {
        r.unwrap_or_else(|e| StepResult::failed(format!("step crashed: {e}")))
    };
    loop {
        let flush_at = host.reports_due_at();
        let have_reports = !host.store().state.outbox.is_empty();
        let event = tokio::select! {
            r = &mut task.0 => Event::Finished(join(r)),
            Some((progress, message, ack)) = progress_rx.recv() => {
                let _ = ack.send(record(host.store(), progress, message));
                Event::Progress
            }
            () = &mut *shutdown => Event::Shutdown,
            () = async {
                tokio::time::sleep_until(flush_at).await;
                host.deliver_reports().await;
            }, if have_reports => Event::Flushed,
        };
        match event {
            Event::Finished(result) => return (result, false),
            Event::Flushed | Event::Progress => {}
            Event::Shutdown => {
                let _ = cancel_tx.send(true);
                let limit = Instant::now() + KILL_GRACE * 3;
                loop {
                    tokio::select! {
                        r = &mut task.0 => return (join(r), true),
                        Some((progress, message, ack)) = progress_rx.recv() => {
                            let _ = ack.send(record(host.store(), progress, message));
                        }
                        () = tokio::time::sleep_until(limit) => {
                            task.0.abort();
                            return (StepResult::shutting_down(), true);
                        }
                    }
                }
            }
        }
    }
}

/// Writes a sequence's progress (and a new message, reported as `running`) into the step's
/// record; true once it is on disk.
fn record_progress(
    store: &mut StateStore,
    identity: &AgentIdentity,
    index: usize,
    progress: SequenceProgress,
    message: Option<String>,
) -> bool {
    write_progress(
        store,
        Some(progress),
        message,
        |record| record.steps.get_mut(index),
        |plan_id, step| report_for(identity, plan_id, index, step),
    )
}

/// Writes a sequence's progress (when given) into the record `entry` finds in the current plan's (a step's,
/// or an undo's); a new message replaces its message and queues `report` of it (`running`). True once it is
/// on disk.
pub(crate) fn write_progress(
    store: &mut StateStore,
    progress: Option<SequenceProgress>,
    message: Option<String>,
    entry: impl FnOnce(&mut PlanRecord) -> Option<&mut LocalStepRecord>,
    report: impl FnOnce(&str, &LocalStepRecord) -> StepReport,
) -> bool {
    let Some(record) = store.state.current.as_mut() else {
        return false;
    };
    let plan_id = record.plan_id.clone();
    let Some(step) = entry(record) else {
        return false;
    };
    if progress.is_some() {
        step.progress = progress;
    }
    if let Some(message) = message {
        step.message = Some(truncate_head(&message, MESSAGE_MAX_BYTES).to_owned());
        let report = report(&plan_id, step);
        store.enqueue(report);
    }
    match store.save() {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "cannot record the sequence's progress");
            false
        }
    }
}

/// A clean shutdown stopped the step: it goes back to pending, the attempt not counted. Its
/// start time and progress stay, so the next start resumes it (see `LocalStepRecord::began`).
fn interrupted_by_shutdown(store: &mut StateStore, index: usize) {
    if let Some(record) = store.state.current.as_mut() {
        let step = &mut record.steps[index];
        step.status = LocalStepStatus::Pending;
        step.attempt = step.attempt.saturating_sub(1);
    }
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save state at shutdown");
    }
    tracing::info!(
        step = index,
        "step stopped by shutdown; it runs again at the next start"
    );
}

/// Records a step's end, queues its report, and notes the plan's end.
fn finish<H: StepHost>(host: &mut H, identity: &AgentIdentity, index: usize, result: StepResult) {
    host.step_boundary();
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return;
    };
    let plan_id = record.plan_id.clone();
    let step = &mut record.steps[index];
    let failed = result.outcome != DriverOutcome::Succeeded;
    step.end(&result);
    let mut report = report_for(identity, &plan_id, index, step);
    match step.status {
        LocalStepStatus::Succeeded => {
            tracing::info!(plan = %plan_id, step = index, message = %result.message, "step succeeded")
        }
        _ => {
            tracing::error!(plan = %plan_id, step = index, message = %result.message, exit_code = ?result.exit_code, "step failed")
        }
    }
    // The rollback is recorded in the same write as the failure: a crash after it resumes the rollback.
    if failed && let Some(plan) = store.plan.as_ref() {
        crate::rollback::start(plan, record, index);
        report.rollback = record.rollback.as_ref().map(|r| r.progress());
    }
    let status = record.status();
    store.enqueue(report);
    let saved = store.save();
    if status != PlanStatus::Running {
        tracing::info!(plan = %plan_id, ?status, "plan finished");
        host.plan_ended();
    }
    if let Err(e) = saved {
        tracing::error!(error = %e, "cannot save step result");
    }
}
