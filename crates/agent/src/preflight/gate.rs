//! Where the executor runs the preflight: before a step's first attempt, as a task of its own driven like a
//! step (reports delivered, its waiting message written to the step's record and reported as running, a
//! shutdown stopping it), with the step still never begun.

use std::ops::ControlFlow;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, Step};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::PREFLIGHT_WAIT;
use crate::drivers::{DriverOutcome, ProgressRecorder, StepContext, StepResult};
use crate::executor::{StepHost, drive, write_progress};
use crate::shutdown::Shutdown;
use crate::state::{StateStore, report_for};

/// Runs the preflight of step `index` (`step`) of plan `plan_id`: `Continue(Ok)` when the step may start,
/// `Continue(Err)` with the step's failure, `Break` when the agent shuts down (the step stays never begun).
pub(crate) async fn gate<H: StepHost + Send>(
    host: &mut H,
    plan_id: &str,
    index: usize,
    step: &Step,
    shutdown: &mut Shutdown,
) -> ControlFlow<(), Result<(), StepResult>> {
    let identity: AgentIdentity = host.identity().clone();
    let now = Instant::now();
    let deadline =
        (now + PREFLIGHT_WAIT).min(now + Duration::from_secs(u64::from(step.timeout_seconds)));
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
    };
    tracing::info!(plan = %plan_id, step = index, "control-plane preflight");
    let task = tokio::spawn(super::run(host.env(), ctx));
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
