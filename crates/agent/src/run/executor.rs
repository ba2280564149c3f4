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
//! The rollback runs the same preflight before such a step's undo (`crate::preflight::check_step`, from `rollback/mod.rs`).
//!
//! A write to the state dir that finds no room does not burn the step: its start, its progress and its end
//! wait for room (`attempt/state_full.rs`), and a driver that stopped on a full state dir runs again, resumed, once there
//! is room — the attempt not counted.
//!
//! The plan's last step includes the node verification (`crate::verify`, when the agent config has `verify:`):
//! it succeeds only once the node passed it, so an interruption during it resumes the step and verifies again.
//!
//! Beginning the attempt, driving it and putting its end on disk is the step-attempt protocol
//! (`attempt/protocol.rs`), which the rollback's undos follow too; this module says what a step's record and
//! report are. The executor knows the agent only through [`StepHost`] (`attempt/host.rs`; the pull loop implements it): it depends on the
//! state and the drivers, and nothing depends on it but the pull loop.

use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, MESSAGE_MAX_BYTES, PlanStatus, StepAction, StepReport};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::attempt::MAX_STEP_ATTEMPTS;
use crate::attempt::drive::write_progress;
use crate::attempt::host::StepHost;
use crate::attempt::protocol::{self, Attempt};
use crate::attempt::state_full::{self, EntryOf, SpaceWait, Waited};
use crate::drivers::{
    DriverOutcome, ProgressRecorder, ProgressUpdate, RecordContext, StepContext, StepResult,
    execute, record_undo,
};
use crate::preflight::PREFLIGHT_WAIT;
use crate::shutdown::Shutdown;
use crate::state::{
    LocalStepStatus, SequenceProgress, StateError, StateStore, report_for, truncate_head,
};
use crate::verify::Verification;

/// Runs step `index` of the current plan. `Break` means shutdown was requested.
pub(crate) async fn run_step<H: StepHost + Send>(
    host: &mut H,
    index: usize,
    shutdown: &mut Shutdown,
) -> ControlFlow<()> {
    let identity = host.identity().clone();
    let env = host.env();
    let attempt = StepAttempt {
        identity: identity.clone(),
        index,
    };
    let waiting = |store: &StateStore, message: &str| attempt.waiting(store, message);
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
                    return protocol::end_durably(host, shutdown, &attempt, failed).await;
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
                Err(e) if e.is_no_space() => match wait
                    .round(
                        host,
                        shutdown,
                        &state_full::full(&env.state_dir, e.to_string()),
                    )
                    .await
                {
                    Ok(()) => continue,
                    Err(Waited::ShuttingDown) => return ControlFlow::Break(()),
                    Err(Waited::GaveUp(e)) => e,
                    Err(Waited::Failed(e)) => e.to_string(),
                    Err(Waited::Saved) => continue,
                },
                Err(e) => e.to_string(),
            };
            let failed = StepResult::failed(format!(
                "cannot record what undoing the step needs (nothing was changed): {cause}"
            ));
            return protocol::end_durably(host, shutdown, &attempt, failed).await;
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
        return protocol::end_durably(host, shutdown, &attempt, failed).await;
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
    match protocol::begin(host, shutdown, &attempt).await {
        ControlFlow::Break(()) => return ControlFlow::Break(()),
        ControlFlow::Continue(false) => return ControlFlow::Continue(()),
        ControlFlow::Continue(true) => {}
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
    // The plan's last step ends only once the node passed its verification (`crate::verify`).
    let verification = Verification::after(&env, &ctx, index + 1 == plan.steps.len());
    let task = tokio::spawn(async move {
        let ended = execute(env, ctx).await;
        match verification {
            Some(verification) => verification.run(ended).await,
            None => ended,
        }
    });
    protocol::cross(host, shutdown, &attempt, task, cancel_tx, progress_rx).await
}

/// A plan's step as the step-attempt protocol sees it: step `index` of the current plan.
struct StepAttempt {
    identity: AgentIdentity,
    index: usize,
}

impl Attempt for StepAttempt {
    const NOUN: &'static str = "step";
    const EVERY_END_WAITS_FOR_DISK: bool = true;
    const RETRIES_WHEN_WAIT_UNSAVED: bool = true;

    fn entry(&self) -> (EntryOf, usize) {
        (
            |store, index| store.state.current.as_mut()?.steps.get_mut(index),
            self.index,
        )
    }

    fn report(&self, store: &StateStore) -> Option<StepReport> {
        let record = store.state.current.as_ref()?;
        let step = record.steps.get(self.index)?;
        Some(report_for(
            &self.identity,
            &record.plan_id,
            self.index,
            step,
        ))
    }

    fn waiting(&self, store: &StateStore, message: &str) -> Option<StepReport> {
        waiting_report(&self.identity, store, self.index, message)
    }

    fn progress(
        &self,
        store: &mut StateStore,
        progress: SequenceProgress,
        message: Option<String>,
    ) -> Result<(), StateError> {
        record_progress(store, &self.identity, self.index, progress, message)
    }

    fn end<H: StepHost>(&self, host: &mut H, result: StepResult) -> Result<(), StateError> {
        finish(host, &self.identity, self.index, result)
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
