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
//! A write to the state dir that finds no room does not burn the step: its start, its progress and its end
//! wait for room (`state_full`), and a driver that stopped on a full state dir runs again, resumed, once there
//! is room — the attempt not counted.
//!
//! The executor knows the agent only through [`StepHost`] (`step_host.rs`; the pull loop implements it): it depends on the
//! state and the drivers, and nothing depends on it but the pull loop.

use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MESSAGE_MAX_BYTES, PlanStatus, StepAction, StepReport};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::attempt::MAX_STEP_ATTEMPTS;
use crate::attempt::drive::{drive, write_progress};
use crate::attempt::host::StepHost;
use crate::attempt::state_full::{
    self, SpaceWait, Waited, save_waiting, says_no_space, uncounted_until_room,
};
use crate::drivers::{
    DriverOutcome, ProgressRecorder, ProgressUpdate, RecordContext, StepContext, StepResult,
    execute, record_undo,
};
use crate::preflight::PREFLIGHT_WAIT;
use crate::shutdown::{Shutdown, pause};
use crate::state::{
    LocalStepStatus, SequenceProgress, StateError, StateStore, report_for, truncate_head,
};

/// Runs step `index` of the current plan. `Break` means shutdown was requested.
pub(crate) async fn run_step<H: StepHost + Send>(
    host: &mut H,
    index: usize,
    shutdown: &mut Shutdown,
) -> ControlFlow<()> {
    let identity = host.identity().clone();
    let env = host.env();
    let waiting =
        |store: &StateStore, message: &str| waiting_report(&identity, store, index, message);
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
            match crate::preflight::check_step(
                host, &plan.id, &step, wait, shutdown, record, &waiting,
            )
            .await
            {
                ControlFlow::Break(()) => return ControlFlow::Break(()),
                ControlFlow::Continue(Err(failed)) => {
                    return finish_durably(host, shutdown, &identity, index, failed).await;
                }
                ControlFlow::Continue(Ok(())) => {}
            }
        }
        crate::rollback::verify::note_kubelet_before(host).await;
        let mut wait = SpaceWait::new("what undoing the step needs", &waiting);
        loop {
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
            let cause = match recorded {
                Ok(undo) => {
                    wait.over(host).await;
                    break undo;
                }
                // Its snapshots go to the state dir: a full one is waited out like a save.
                Err(e) if says_no_space(&e) => match wait
                    .round(host, shutdown, &state_full::full(&env.state_dir, e))
                    .await
                {
                    Ok(()) => continue,
                    Err(Waited::ShuttingDown) => return ControlFlow::Break(()),
                    Err(Waited::GaveUp(e)) => e,
                    Err(Waited::Failed(e)) => e.to_string(),
                    Err(Waited::Saved) => continue,
                },
                Err(e) => e,
            };
            let failed = StepResult::failed(format!(
                "cannot record what undoing the step needs (nothing was changed): {cause}"
            ));
            return finish_durably(host, shutdown, &identity, index, failed).await;
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
        let failed = StepResult::failed(format!(
            "step interrupted {} times (agent restart or node reboot during the step); not trying again",
            step_record.attempt
        ));
        return finish_durably(host, shutdown, &identity, index, failed).await;
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
    // What the record and the outbox go back to when the start cannot be put on disk: this attempt then never
    // began, and is not counted.
    let unbegun = (step_record.clone(), store.state.outbox.clone());
    step_record.begin_attempt();
    let report = report_for(&identity, &plan.id, index, step_record);
    store.enqueue(report);
    let saved = save_waiting(host, shutdown, "the step's start", &waiting).await;
    // Each step needs a fresh "no hold" from the server before the next one starts.
    host.step_boundary();
    if !matches!(saved, Waited::Saved) {
        let store = host.store();
        if let Some(record) = store.state.current.as_mut() {
            record.steps[index] = unbegun.0;
        }
        store.state.outbox = unbegun.1;
    }
    match saved {
        Waited::Saved => {}
        Waited::ShuttingDown => return ControlFlow::Break(()),
        Waited::GaveUp(message) => {
            let failed = StepResult::failed(format!("{message}; the step did not start"));
            return finish_durably(host, shutdown, &identity, index, failed).await;
        }
        Waited::Failed(e) => {
            // Without a durable "running" record a crash could lose the attempt count and the
            // fact that the step began: do not start.
            tracing::error!(error = %e, "cannot record step start; retrying later");
            return if pause(host.next_delay(), shutdown).await {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            };
        }
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
    let state_dir = env.state_dir.clone();
    let task = tokio::spawn(execute(env, ctx));
    let record = |store: &mut StateStore, progress, message| {
        record_progress(store, &identity, index, progress, message)
    };
    let (result, stopping) = drive(
        host,
        task,
        cancel_tx,
        progress_rx,
        shutdown,
        record,
        &waiting,
    )
    .await;
    if result.outcome == DriverOutcome::Interrupted {
        interrupted_by_shutdown(host.store(), index);
        return ControlFlow::Break(());
    }
    if stopping {
        // The end is recorded if it can be; a full state dir is not waited for on the way out.
        let _ = finish(host, &identity, index, result);
        return ControlFlow::Break(());
    }
    if result.outcome == DriverOutcome::Failed
        && state_full::driver_found_no_room(&result.message, &state_dir)
    {
        return rerun_after_room(host, shutdown, &identity, index, result).await;
    }
    finish_durably(host, shutdown, &identity, index, result).await
}

/// Step `index` stopped because its driver found the state dir full (`result`): not the step's failure. The
/// attempt is not counted and, once there is room, the step runs again, resumed. A state dir that stays full
/// fails it, naming the disk.
async fn rerun_after_room<H: StepHost + Send>(
    host: &mut H,
    shutdown: &mut Shutdown,
    identity: &AgentIdentity,
    index: usize,
    result: StepResult,
) -> ControlFlow<()> {
    let env = host.env();
    let waiting =
        |store: &StateStore, message: &str| waiting_report(identity, store, index, message);
    let step: state_full::EntryOf =
        |store, index| store.state.current.as_mut()?.steps.get_mut(index);
    let cause = result.message;
    let waited = uncounted_until_room(
        host,
        shutdown,
        &env.state_dir,
        cause,
        &waiting,
        (step, index),
    )
    .await;
    match waited {
        Waited::Saved => ControlFlow::Continue(()),
        Waited::ShuttingDown => ControlFlow::Break(()),
        Waited::GaveUp(message) => {
            finish_durably(host, shutdown, identity, index, StepResult::failed(message)).await
        }
        Waited::Failed(e) => {
            tracing::error!(error = %e, "cannot record that the step waits for room; retrying later");
            if pause(host.next_delay(), shutdown).await {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
}

/// The `running` report of step `index` of the current plan saying `message` (a wait for room in the state
/// dir): the step's record as it is, as running.
fn waiting_report(
    identity: &AgentIdentity,
    store: &StateStore,
    index: usize,
    message: &str,
) -> Option<StepReport> {
    let record = store.state.current.as_ref()?;
    let mut step = record.steps.get(index)?.clone();
    step.status = LocalStepStatus::Running;
    step.finished_at_unix_ms = None;
    step.exit_code = None;
    step.stderr_tail = None;
    step.message = Some(truncate_head(message, MESSAGE_MAX_BYTES).to_owned());
    Some(report_for(identity, &record.plan_id, index, &step))
}

/// Writes a sequence's progress (and a new message, reported as `running`) into the step's
/// record; `Ok` once it is on disk.
fn record_progress(
    store: &mut StateStore,
    identity: &AgentIdentity,
    index: usize,
    progress: SequenceProgress,
    message: Option<String>,
) -> Result<(), StateError> {
    write_progress(
        store,
        Some(progress),
        message,
        |record| record.steps.get_mut(index),
        |plan_id, step| report_for(identity, plan_id, index, step),
    )
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

/// [`finish`], then, when the state dir was full, waits for room to put the end on disk before anything
/// else happens (the report of the end is delivered only then). `Break` means shutdown was requested.
async fn finish_durably<H: StepHost + Send>(
    host: &mut H,
    shutdown: &mut Shutdown,
    identity: &AgentIdentity,
    index: usize,
    result: StepResult,
) -> ControlFlow<()> {
    let saved = finish(host, identity, index, result);
    let waiting =
        |store: &StateStore, message: &str| waiting_report(identity, store, index, message);
    state_full::end_on_disk(host, shutdown, "the step's end", &waiting, saved).await
}

/// Records a step's end, queues its report, and notes the plan's end; answers whether the record is on disk.
fn finish<H: StepHost>(
    host: &mut H,
    identity: &AgentIdentity,
    index: usize,
    result: StepResult,
) -> Result<(), StateError> {
    host.step_boundary();
    let store = host.store();
    let Some(record) = store.state.current.as_mut() else {
        return Ok(());
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
    if let Err(e) = &saved
        && !matches!(e, StateError::Full { .. })
    {
        tracing::error!(error = %e, "cannot save step result");
    }
    saved
}
