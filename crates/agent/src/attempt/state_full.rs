//! A full state dir (issue 43.7). A write to the state dir — `state.json`, a plan body, a snapshot an undo
//! needs — that finds no room on its filesystem is neither an interruption nor the step's end: the step (or
//! undo, or plan) waits. It tells the server `state dir full: N bytes free at PATH` in a `running` report sent at
//! once (the outbox holds only what is on disk, and is not flushed meanwhile), tries the write again every
//! [`STATE_FULL_RECHECK`], and goes on by itself once it succeeds, saying so. The wait is bounded by
//! [`STATE_FULL_WAIT`]: past it the step or undo fails, naming the disk. A shutdown ends the wait at once.

use std::path::Path;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, Plan, StepReport};
use tokio::time::Instant;

use crate::attempt::host::StepHost;
use crate::fsutil::free_bytes;
use crate::shutdown::Shutdown;
use crate::state::{LocalStepRecord, LocalStepStatus, StateError, StateStore, report_for};

/// Longest a step, an undo or a plan waits for room in a full state dir before it fails naming the disk: time
/// for an operator, told by the Machine's message, to free space.
pub const STATE_FULL_WAIT: Duration = Duration::from_secs(60 * 60);
/// How often a write that found the state dir full is tried again while it waits (a failed write of a few
/// kilobytes: cheap).
pub const STATE_FULL_RECHECK: Duration = Duration::from_millis(500);

/// Whether an error text (a driver's, which keeps only text) names an out-of-space write: the `io::Error`
/// display of `ENOSPC` or `EDQUOT`.
pub(crate) fn says_no_space(text: &str) -> bool {
    use rustix::io::Errno;
    [Errno::NOSPC, Errno::DQUOT]
        .iter()
        .any(|e| text.contains(&format!("(os error {})", e.raw_os_error())))
}

/// Whether a step's (or undo's) failure `message` is its driver's own write to state dir `dir` (a journal, a
/// snapshot, a download) that found no room: not the step's failure, but the same full disk a save can hit.
pub(crate) fn driver_found_no_room(message: &str, dir: &Path) -> bool {
    says_no_space(message) && message.contains(&dir.display().to_string())
}

/// [`StateError::Full`] for state dir `dir` from a failed write's text.
pub(crate) fn full(dir: &Path, detail: String) -> StateError {
    StateError::Full {
        dir: dir.display().to_string(),
        free_bytes: free_bytes(dir).unwrap_or(0),
        detail,
    }
}

/// How a wait for room ended.
pub(crate) enum Waited {
    /// The write went through (at once, or after a wait).
    Saved,
    /// The agent is shutting down: nothing more is written.
    ShuttingDown,
    /// The state dir stayed full for [`STATE_FULL_WAIT`]: the message names the disk.
    GaveUp(String),
    /// Another error than a full disk.
    Failed(StateError),
}

/// One wait for room in the state dir, before recording `what` (`the step's start`).
pub(crate) struct SpaceWait<'a, R> {
    what: &'a str,
    /// The `running` report telling the server a message, for the step or undo that waits (`None`: nothing to
    /// tell it about).
    report: &'a R,
    since: Option<Instant>,
    told: bool,
}

impl<'a, R> SpaceWait<'a, R>
where
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    pub fn new(what: &'a str, report: &'a R) -> Self {
        Self {
            what,
            report,
            since: None,
            told: false,
        }
    }

    /// One round of the wait after `full` (a [`StateError::Full`]): the first says why (log and report, the
    /// report sent again each round until the server got it), then it sleeps [`STATE_FULL_RECHECK`]. `Err` ends
    /// the wait.
    pub async fn round<H: StepHost + Send>(
        &mut self,
        host: &mut H,
        shutdown: &mut Shutdown,
        full: &StateError,
    ) -> Result<(), Waited> {
        let first = self.since.is_none();
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= STATE_FULL_WAIT {
            return Err(Waited::GaveUp(format!(
                "{full}: no room to record {} for {} s",
                self.what,
                STATE_FULL_WAIT.as_secs()
            )));
        }
        if first {
            tracing::warn!(error = %full, waiting_s = STATE_FULL_WAIT.as_secs(), "cannot record {}: the state dir is full; waiting for room", self.what);
        }
        if !self.told {
            let message = format!(
                "{full}; waiting up to {} s for room to record {}",
                STATE_FULL_WAIT.as_secs(),
                self.what
            );
            self.told = match (self.report)(host.store(), &message) {
                Some(report) => host.send_report(report).await,
                None => true,
            };
        }
        tokio::select! {
            () = tokio::time::sleep(STATE_FULL_RECHECK) => Ok(()),
            () = &mut *shutdown => Err(Waited::ShuttingDown),
        }
    }

    /// After the write went through: when it had waited, says so (log and report).
    pub async fn over<H: StepHost + Send>(&self, host: &mut H) {
        let Some(since) = self.since else {
            return;
        };
        let seconds = since.elapsed().as_secs();
        tracing::info!(
            waited_s = seconds,
            "room in the state dir again: recorded {}; going on",
            self.what
        );
        let message = format!(
            "the state dir was full for {seconds} s; recorded {} once there was room, going on",
            self.what
        );
        if let Some(report) = (self.report)(host.store(), &message) {
            host.send_report(report).await;
        }
    }
}

/// Saves `state.json`, waiting for room in a full state dir (see the module docs) before recording `what`.
pub(crate) async fn save_waiting<H, R>(
    host: &mut H,
    shutdown: &mut Shutdown,
    what: &str,
    report: &R,
) -> Waited
where
    H: StepHost + Send,
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    let mut wait = SpaceWait::new(what, report);
    loop {
        match host.store().save() {
            Ok(()) => {
                wait.over(host).await;
                return Waited::Saved;
            }
            Err(full @ StateError::Full { .. }) => {
                if let Err(end) = wait.round(host, shutdown, &full).await {
                    return end;
                }
            }
            Err(e) => return Waited::Failed(e),
        }
    }
}

/// After a step's or undo's end (`what`) was recorded in memory, `saved` telling whether it reached the disk:
/// when the state dir was full, waits for room to put it there before anything else happens (its report is
/// delivered only then), telling the server with `report`. `Break` means shutdown was requested.
pub(crate) async fn end_on_disk<H, R>(
    host: &mut H,
    shutdown: &mut Shutdown,
    what: &str,
    report: &R,
    saved: Result<(), StateError>,
) -> std::ops::ControlFlow<()>
where
    H: StepHost + Send,
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    if let Err(StateError::Full { .. }) = saved {
        match save_waiting(host, shutdown, what, report).await {
            Waited::Saved => {}
            Waited::ShuttingDown => return std::ops::ControlFlow::Break(()),
            Waited::GaveUp(message) => {
                tracing::error!(%message, "{what} is not on disk; after a restart it runs again")
            }
            Waited::Failed(e) => tracing::error!(error = %e, "cannot save {what}"),
        }
    }
    std::ops::ControlFlow::Continue(())
}

/// Finds a step's or an undo's record in the state by its position.
pub(crate) type EntryOf = fn(&mut StateStore, usize) -> Option<&mut LocalStepRecord>;

/// After a driver found state dir `dir` full (`cause`, see [`driver_found_no_room`]): the step's (or undo's)
/// record that `entry` finds at `at` is put back to pending, this attempt not counted, and the agent waits, as
/// [`save_waiting`] does, until the filesystem has more room than it had then and `state.json` saves — then
/// the caller runs it again (resumed). When the wait ends otherwise the record is as it was.
pub(crate) async fn uncounted_until_room<H, R>(
    host: &mut H,
    shutdown: &mut Shutdown,
    dir: &Path,
    cause: String,
    report: &R,
    (entry, at): (EntryOf, usize),
) -> Waited
where
    H: StepHost + Send,
    R: Fn(&StateStore, &str) -> Option<StepReport> + Sync,
{
    let counted = entry(host.store(), at).map(|e| (e.status, e.attempt));
    if let Some(e) = entry(host.store(), at) {
        e.status = LocalStepStatus::Pending;
        e.attempt = e.attempt.saturating_sub(1);
    }
    let full = full(dir, cause);
    let free_then = free_bytes(dir).unwrap_or(0);
    let mut wait = SpaceWait::new("what the step keeps in the state dir", report);
    let waited = loop {
        if let Err(end) = wait.round(host, shutdown, &full).await {
            break end;
        }
        if free_bytes(dir).unwrap_or(0) <= free_then {
            continue;
        }
        match host.store().save() {
            Ok(()) => {
                wait.over(host).await;
                return Waited::Saved;
            }
            Err(StateError::Full { .. }) => {}
            Err(e) => break Waited::Failed(e),
        }
    };
    if let (Some((status, attempt)), Some(e)) = (counted, entry(host.store(), at)) {
        (e.status, e.attempt) = (status, attempt);
    }
    waited
}

/// For an offered `plan` that a full state dir keeps from being stored: its first step's `running` report
/// saying why, from the error and how long the plan has waited (the agent takes the plan again at a later poll).
pub(crate) fn plan_waiting_report(
    identity: &AgentIdentity,
    plan: &Plan,
) -> Option<impl FnOnce(&StateError, Duration) -> StepReport + use<>> {
    let first = plan.steps.first()?;
    let mut record = LocalStepRecord::pending();
    record.status = LocalStepStatus::Running;
    let mut report = report_for(identity, &plan.id, first.index as usize, &record);
    Some(move |full: &StateError, waited: Duration| {
        report.message = Some(format!(
            "{full}; the plan is stored once there is room (waiting for {} s)",
            waited.as_secs()
        ));
        report
    })
}
