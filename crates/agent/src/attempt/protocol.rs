//! The step-attempt protocol, one for a plan's step (`run/executor.rs`) and for a rollback's undo
//! (`rollback/`): begin the attempt (counted, its `running` report queued, both saved — waiting for room in a
//! full state dir — before anything else), cross the step boundary (the next step needs the server's "no hold"
//! again), drive the driver's task to its end, and put that end on disk. A shutdown, a state dir without room
//! and a failed save end an attempt the same way whichever kind it is; the kinds say only what differs
//! ([`Attempt`]: which record, which report, what the end writes).

use std::ops::ControlFlow;

use inplace_agent_api::StepReport;
use tokio::sync::{mpsc, watch};

use crate::attempt::drive::drive;
use crate::attempt::host::StepHost;
use crate::attempt::state_full::{
    EntryOf, Waited, driver_found_no_room, end_on_disk, save_waiting, uncounted_until_room,
};
use crate::drivers::{DriverOutcome, ProgressUpdate, StepResult};
use crate::sequence::progress::SequenceProgress;
use crate::shutdown::{Shutdown, pause};
use crate::state::{LocalStepStatus, StateError, StateStore};

/// One kind of attempt, a plan's step or a rollback's undo: what the protocol needs to know of it.
pub(crate) trait Attempt: Sync {
    /// What is attempted, as the messages name it: `step` or `undo`.
    const NOUN: &'static str;
    /// Whether an end its driver did not produce (the attempt refused, not started, or given up waiting for
    /// room) waits for room to reach the disk like the driver's end (a step), or is saved only if it can be (an
    /// undo: the rollback's next round finds it).
    const EVERY_END_WAITS_FOR_DISK: bool;
    /// Whether an attempt whose driver found the state dir full, and whose wait for room could not be saved,
    /// pauses and runs again later (a step) or ends with its driver's failure (an undo).
    const RETRIES_WHEN_WAIT_UNSAVED: bool;

    /// Where the attempt's record is in the state, and its position.
    fn entry(&self) -> (EntryOf, usize);
    /// The report of the attempt's record as it is now (queued when it begins).
    fn report(&self, store: &StateStore) -> Option<StepReport>;
    /// The `running` report saying `message` while the attempt waits for room in the state dir.
    fn waiting(&self, store: &StateStore, message: &str) -> Option<StepReport>;
    /// Writes a command sequence's progress (and a new message, reported as `running`) into the attempt's
    /// record; `Ok` once it is on disk.
    fn progress(
        &self,
        store: &mut StateStore,
        progress: SequenceProgress,
        message: Option<String>,
    ) -> Result<(), StateError>;
    /// Records the attempt's end and queues its report; whether the record is on disk.
    fn end<H: StepHost>(&self, host: &mut H, result: StepResult) -> Result<(), StateError>;
}

/// Begins `attempt`: counts it, queues its report and saves both (waiting for room in a full state dir), then
/// crosses the step boundary. `Continue(true)` when it began; `Continue(false)` when it did not and the caller
/// goes on (it ended, or it is tried again later); `Break` on shutdown. An attempt that could not be put on disk
/// never began: its record and the outbox go back to what they were, the attempt not counted.
pub(crate) async fn begin<H, A>(
    host: &mut H,
    shutdown: &mut Shutdown,
    attempt: &A,
) -> ControlFlow<(), bool>
where
    H: StepHost + Send,
    A: Attempt,
{
    let (entry_of, at) = attempt.entry();
    let store = host.store();
    let outbox = store.state.outbox.clone();
    let Some(entry) = entry_of(store, at) else {
        return ControlFlow::Continue(false);
    };
    let unbegun = entry.clone();
    entry.begin_attempt();
    if let Some(report) = attempt.report(store) {
        store.enqueue(report);
    }
    let waiting = |store: &StateStore, message: &str| attempt.waiting(store, message);
    let what = format!("the {}'s start", A::NOUN);
    let saved = save_waiting(host, shutdown, &what, &waiting).await;
    // Each step needs a fresh "no hold" from the server before the next one starts.
    host.step_boundary();
    if !matches!(saved, Waited::Saved) {
        let store = host.store();
        if let Some(entry) = entry_of(store, at) {
            *entry = unbegun;
        }
        store.state.outbox = outbox;
    }
    match saved {
        Waited::Saved => ControlFlow::Continue(true),
        Waited::ShuttingDown => ControlFlow::Break(()),
        Waited::GaveUp(message) => {
            let failed = StepResult::failed(format!("{message}; the {} did not start", A::NOUN));
            not_begun(end_refused(host, shutdown, attempt, failed).await)
        }
        Waited::Failed(e) => {
            // Without a durable "running" record a crash could lose the attempt count and the fact that it
            // began: do not start.
            tracing::error!(error = %e, "cannot record {what}; retrying later");
            not_begun(later(host, shutdown).await)
        }
    }
}

/// Drives the begun `attempt`'s task (cancelled through `cancel`, its progress written by [`Attempt::progress`]) to its end
/// and puts that end on disk. A shutdown that interrupted it leaves it pending, the attempt not counted; a
/// driver that stopped because the state dir is full runs again once there is room, the attempt not counted.
/// `Break` means shutdown was requested.
pub(crate) async fn cross<H, A>(
    host: &mut H,
    shutdown: &mut Shutdown,
    attempt: &A,
    task: tokio::task::JoinHandle<StepResult>,
    cancel: watch::Sender<bool>,
    progress: mpsc::Receiver<ProgressUpdate>,
) -> ControlFlow<()>
where
    H: StepHost + Send,
    A: Attempt,
{
    let state_dir = host.env().state_dir.clone();
    let waiting = |store: &StateStore, message: &str| attempt.waiting(store, message);
    let record =
        |store: &mut StateStore, progress, message| attempt.progress(store, progress, message);
    let (result, stopping) = drive(host, task, cancel, progress, shutdown, record, &waiting).await;
    if result.outcome == DriverOutcome::Interrupted {
        interrupted_by_shutdown(host.store(), attempt);
        return ControlFlow::Break(());
    }
    if stopping {
        // The end is recorded if it can be; a full state dir is not waited for on the way out.
        let _ = attempt.end(host, result);
        return ControlFlow::Break(());
    }
    if result.outcome == DriverOutcome::Failed && driver_found_no_room(&result.message, &state_dir)
    {
        // The driver's own write to the state dir found no room: not the attempt's failure.
        let cause = result.message.clone();
        let entry = attempt.entry();
        match uncounted_until_room(host, shutdown, &state_dir, cause, &waiting, entry).await {
            Waited::Saved => return ControlFlow::Continue(()),
            Waited::ShuttingDown => return ControlFlow::Break(()),
            Waited::GaveUp(message) => {
                return end_refused(host, shutdown, attempt, StepResult::failed(message)).await;
            }
            Waited::Failed(e) if A::RETRIES_WHEN_WAIT_UNSAVED => {
                tracing::error!(error = %e, "cannot record that the {} waits for room; retrying later", A::NOUN);
                return later(host, shutdown).await;
            }
            Waited::Failed(_) => {}
        }
    }
    end_durably(host, shutdown, attempt, result).await
}

/// Records `attempt`'s end, then, when the state dir was full, waits for room to put it on disk before anything
/// else happens (the report of the end is delivered only then). `Break` means shutdown was requested.
pub(crate) async fn end_durably<H, A>(
    host: &mut H,
    shutdown: &mut Shutdown,
    attempt: &A,
    result: StepResult,
) -> ControlFlow<()>
where
    H: StepHost + Send,
    A: Attempt,
{
    let saved = attempt.end(host, result);
    let waiting = |store: &StateStore, message: &str| attempt.waiting(store, message);
    let what = format!("the {}'s end", A::NOUN);
    end_on_disk(host, shutdown, &what, &waiting, saved).await
}

/// Ends `attempt` with a result its driver did not produce (refused, not started, given up waiting for room),
/// as [`Attempt::EVERY_END_WAITS_FOR_DISK`] says.
pub(crate) async fn end_refused<H, A>(
    host: &mut H,
    shutdown: &mut Shutdown,
    attempt: &A,
    result: StepResult,
) -> ControlFlow<()>
where
    H: StepHost + Send,
    A: Attempt,
{
    if A::EVERY_END_WAITS_FOR_DISK {
        end_durably(host, shutdown, attempt, result).await
    } else {
        let _ = attempt.end(host, result);
        ControlFlow::Continue(())
    }
}

/// A clean shutdown stopped the attempt: back to pending, the attempt not counted. Its start time and progress
/// stay, so the next start resumes it (see `LocalStepRecord::began`).
fn interrupted_by_shutdown<A: Attempt>(store: &mut StateStore, attempt: &A) {
    let (entry_of, at) = attempt.entry();
    if let Some(entry) = entry_of(store, at) {
        entry.status = LocalStepStatus::Pending;
        entry.attempt = entry.attempt.saturating_sub(1);
    }
    if let Err(e) = store.save() {
        tracing::error!(error = %e, "cannot save state at shutdown");
    }
    tracing::info!(
        at,
        "{} stopped by shutdown; it runs again at the next start",
        A::NOUN
    );
}

/// Pauses for the host's next back-off delay: `Break` when shutdown came first.
async fn later<H: StepHost + Send>(host: &mut H, shutdown: &mut Shutdown) -> ControlFlow<()> {
    if pause(host.next_delay(), shutdown).await {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    }
}

/// The answer of [`begin`] when the attempt did not begin and the caller goes on after `flow`.
fn not_begun(flow: ControlFlow<()>) -> ControlFlow<(), bool> {
    match flow {
        ControlFlow::Break(()) => ControlFlow::Break(()),
        ControlFlow::Continue(()) => ControlFlow::Continue(false),
    }
}
