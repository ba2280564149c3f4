//! Driving a step's (or an undo's, or the rollback's verification's) task to its end: while it runs, queued
//! reports are delivered and the progress its driver records is written to `state.json` — a write that finds
//! the state dir full waits for room before the driver goes on (`state_full`) — and a shutdown cancels it
//! within three kill grace periods.

use inplace_agent_api::{MESSAGE_MAX_BYTES, StepReport};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::attempt::host::StepHost;
use crate::attempt::state_full::{Waited, save_waiting};
use crate::drivers::{ProgressUpdate, StepResult};
use crate::sequence::process::KILL_GRACE;
use crate::shutdown::Shutdown;
use crate::state::{
    LocalStepRecord, PlanRecord, SequenceProgress, StateError, StateStore, truncate_head,
};

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
    Progress(Result<(), StateError>, oneshot::Sender<bool>),
}

/// Awaits a step's (or an undo's) task while delivering reports and writing its progress with `record`; a
/// progress write that finds the state dir full waits for room (`state_full`, telling the server with
/// `waiting`) before the driver goes on. On shutdown the task is cancelled (the driver kills its process group:
/// TERM, then KILL after `KILL_GRACE`) and awaited up to three grace periods; a command that completed
/// meanwhile still gets its progress recorded. Returns the result and whether shutdown was requested.
pub(crate) async fn drive<H, R>(
    host: &mut H,
    task: tokio::task::JoinHandle<StepResult>,
    cancel_tx: watch::Sender<bool>,
    mut progress_rx: mpsc::Receiver<ProgressUpdate>,
    shutdown: &mut Shutdown,
    mut record: impl FnMut(&mut StateStore, SequenceProgress, Option<String>) -> Result<(), StateError>,
    waiting: &R,
) -> (StepResult, bool)
where
    H: StepHost + Send,
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    let mut task = AbortOnDrop(task);
    loop {
        let flush_at = host.reports_due_at();
        let have_reports = !host.store().state.outbox.is_empty();
        let event = tokio::select! {
            r = &mut task.0 => Event::Finished(join(r)),
            Some((progress, message, ack)) = progress_rx.recv() => {
                Event::Progress(record(host.store(), progress, message), ack)
            }
            () = &mut *shutdown => Event::Shutdown,
            () = async {
                tokio::time::sleep_until(flush_at).await;
                host.deliver_reports().await;
            }, if have_reports => Event::Flushed,
        };
        match event {
            Event::Finished(result) => return (result, false),
            Event::Flushed => {}
            Event::Progress(Ok(()), ack) => {
                let _ = ack.send(true);
            }
            Event::Progress(Err(full @ StateError::Full { .. }), ack) => {
                let waited = save_waiting(host, shutdown, "the progress of the commands", waiting);
                let saved = match waited.await {
                    Waited::Saved => true,
                    Waited::ShuttingDown => {
                        let _ = ack.send(false);
                        return stop(host, task, cancel_tx, progress_rx, record).await;
                    }
                    Waited::GaveUp(message) => {
                        tracing::error!(%message, "the sequence's progress is not on disk; going on");
                        false
                    }
                    Waited::Failed(e) => {
                        tracing::error!(error = %e, first = %full, "cannot record the sequence's progress");
                        false
                    }
                };
                let _ = ack.send(saved);
            }
            Event::Progress(Err(e), ack) => {
                tracing::error!(error = %e, "cannot record the sequence's progress");
                let _ = ack.send(false);
            }
            Event::Shutdown => return stop(host, task, cancel_tx, progress_rx, record).await,
        }
    }
}

fn join(r: Result<StepResult, tokio::task::JoinError>) -> StepResult {
    r.unwrap_or_else(|e| StepResult::failed(format!("step crashed: {e}")))
}

/// The shutdown half of [`drive`]: cancels the task and awaits it up to three grace periods, recording the
/// progress it still makes (without waiting for room).
async fn stop<H: StepHost + Send>(
    host: &mut H,
    mut task: AbortOnDrop,
    cancel_tx: watch::Sender<bool>,
    mut progress_rx: mpsc::Receiver<ProgressUpdate>,
    mut record: impl FnMut(&mut StateStore, SequenceProgress, Option<String>) -> Result<(), StateError>,
) -> (StepResult, bool) {
    let _ = cancel_tx.send(true);
    let limit = Instant::now() + KILL_GRACE * 3;
    loop {
        tokio::select! {
            r = &mut task.0 => return (join(r), true),
            Some((progress, message, ack)) = progress_rx.recv() => {
                let _ = ack.send(record(host.store(), progress, message).is_ok());
            }
            () = tokio::time::sleep_until(limit) => {
                task.0.abort();
                return (StepResult::shutting_down(), true);
            }
        }
    }
}

/// Writes a sequence's progress (when given) into the record `entry` finds in the current plan's (a step's,
/// or an undo's); a new message replaces its message and queues `report` of it (`running`). `Ok` once it is
/// on disk.
pub(crate) fn write_progress(
    store: &mut StateStore,
    progress: Option<SequenceProgress>,
    message: Option<String>,
    entry: impl FnOnce(&mut PlanRecord) -> Option<&mut LocalStepRecord>,
    report: impl FnOnce(&str, &LocalStepRecord) -> StepReport,
) -> Result<(), StateError> {
    let gone = || StateError::Io("the record to write progress into is gone".into());
    let Some(record) = store.state.current.as_mut() else {
        return Err(gone());
    };
    let plan_id = record.plan_id.clone();
    let Some(step) = entry(record) else {
        return Err(gone());
    };
    if progress.is_some() {
        step.progress = progress;
    }
    if let Some(message) = message {
        step.message = Some(truncate_head(&message, MESSAGE_MAX_BYTES).to_owned());
        let report = report(&plan_id, step);
        store.enqueue(report);
    }
    store.save()
}
