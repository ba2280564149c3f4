//! Crash-safe local state in `--state-dir`: the current plan (`plan-<id>.json`), per-step
//! progress and undelivered reports (`state.json`), and the report a step's record becomes
//! (`report_for`). Every write is atomic (temp, fsync, rename,
//! fsync dir); an exclusive `flock` on `lock` keeps a second agent off the same directory.

pub(crate) mod error;
pub(crate) mod rollback_record;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use inplace_agent_api::{
    AgentIdentity, Hold, MESSAGE_MAX_BYTES, OnFailure, Plan, PlanProgress, PlanStatus,
    STDERR_TAIL_MAX_BYTES, StepReport, StepStatus, truncate_tail,
};
use serde::{Deserialize, Serialize};

use crate::clock::now_unix_ms;
use crate::drivers::{DriverOutcome, StepResult};
use crate::fsutil::{FileMeta, atomic_write, read_optional, remove_file};
use crate::limits::MAX_STATE_BYTES;
use crate::state::rollback_record::RollbackRecord;
use crate::undo::record::UndoRecord;

/// Version of the `state.json` layout.
const STATE_FORMAT: u32 = 1;
/// Most undelivered reports kept; past it the oldest `running` reports go first, then the oldest.
pub const MAX_OUTBOX: usize = 256;

pub(crate) use crate::sequence::progress::SequenceProgress;
pub use crate::state::error::StateError;

/// A step's local status. `Running` after a restart means "interrupted".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LocalStepStatus {
    /// Not started, or a clean shutdown stopped it ([`LocalStepRecord::began`] tells the two apart).
    Pending,
    /// Started and not finished.
    Running,
    /// Done.
    Succeeded,
    /// Failed: the plan stopped here.
    Failed,
}

/// Everything known about one step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalStepRecord {
    /// Status.
    pub status: LocalStepStatus,
    /// Attempts started so far.
    pub attempt: u32,
    /// Start of the latest attempt.
    pub started_at_unix_ms: Option<u64>,
    /// End of the step.
    pub finished_at_unix_ms: Option<u64>,
    /// Exit code of the command that ended it.
    pub exit_code: Option<i32>,
    /// Bounded stderr tail.
    pub stderr_tail: Option<String>,
    /// Outcome text.
    pub message: Option<String>,
    /// How far a Kubernetes version step's command sequence got (absent in files written by
    /// agents before it existed, and for other step kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<SequenceProgress>,
    /// What undoing this step needs, recorded (with its snapshots) before the step's first effect (absent:
    /// the kind is not undone, has no undo in this agent, or an older agent ran the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<UndoRecord>,
    /// It succeeded without an effect: its check found the target on the node before its first effect. A
    /// point of no return passed over is not crossed, so a rollback goes on past it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub passed_over: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl LocalStepRecord {
    pub(crate) fn pending() -> Self {
        Self {
            status: LocalStepStatus::Pending,
            attempt: 0,
            started_at_unix_ms: None,
            finished_at_unix_ms: None,
            exit_code: None,
            stderr_tail: None,
            message: None,
            progress: None,
            undo: None,
            passed_over: false,
        }
    }

    /// Records the start of an attempt (status `running`, the attempt counted, the last end cleared).
    pub(crate) fn begin_attempt(&mut self) {
        self.status = LocalStepStatus::Running;
        self.attempt += 1;
        self.started_at_unix_ms = Some(now_unix_ms());
        self.finished_at_unix_ms = None;
        self.exit_code = None;
        self.stderr_tail = None;
        self.message = None;
    }

    /// Records how the attempt ended (bounded stderr tail and message).
    pub(crate) fn end(&mut self, result: &StepResult) {
        self.status = if result.outcome == DriverOutcome::Succeeded {
            LocalStepStatus::Succeeded
        } else {
            LocalStepStatus::Failed
        };
        self.finished_at_unix_ms = Some(now_unix_ms());
        self.exit_code = result.exit_code;
        self.stderr_tail = result
            .stderr_tail
            .as_deref()
            .map(|t| truncate_tail(t, STDERR_TAIL_MAX_BYTES).to_owned());
        self.message = Some(truncate_head(&result.message, MESSAGE_MAX_BYTES).to_owned());
        self.passed_over = result.passed_over;
    }

    /// Whether an attempt of this step ever started: it was recorded `running` (durably, before
    /// its first effect) at least once. A crash leaves it `running`; a clean shutdown puts it back
    /// to `pending` but keeps `startedAtUnixMs`, which only a start sets — so this also holds for
    /// a `state.json` written by an older agent that was stopped mid-step. A step that began may
    /// have made some of its effects: it is never skipped by a `skipIf` check, and drivers redo
    /// their follow-up effects (service restarts).
    pub fn began(&self) -> bool {
        self.status == LocalStepStatus::Running
            || self.attempt > 0
            || self.started_at_unix_ms.is_some()
    }
}

/// The report describing `record`.
pub(crate) fn report_for(
    agent: &AgentIdentity,
    plan_id: &str,
    index: usize,
    record: &LocalStepRecord,
) -> StepReport {
    let status = match record.status {
        LocalStepStatus::Succeeded => StepStatus::Succeeded,
        LocalStepStatus::Failed => StepStatus::Failed,
        LocalStepStatus::Pending | LocalStepStatus::Running => StepStatus::Running,
    };
    StepReport {
        agent: agent.clone(),
        plan_id: plan_id.to_owned(),
        step_index: index as u32,
        status,
        attempt: record.attempt.max(1),
        started_at_unix_ms: record.started_at_unix_ms,
        finished_at_unix_ms: record.finished_at_unix_ms,
        exit_code: record.exit_code,
        stderr_tail: record.stderr_tail.clone(),
        message: record.message.clone(),
        undo: false,
        rollback: None,
    }
}

/// Progress of the current plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanRecord {
    /// The plan id.
    pub plan_id: String,
    /// One record per step.
    pub steps: Vec<LocalStepRecord>,
    /// The server's hold on this plan, as last acked to us: no step starts while it is set (a step
    /// that already began still finishes). Saved in the same write that drops the acked report, so a
    /// crash cannot lose a hold the server counts as delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// What to do when a step fails, as the server last said with a plan or hold (absent: roll back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// The rollback, once a step failed under `rollback`: written in the same save as the failure, so a
    /// crash anywhere after resumes it and the failed step never runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackRecord>,
    /// The Node's kubelet version when the plan's first step began (read through the node API): what a
    /// rollback verifies the node is back at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_before: Option<String>,
}

/// The first at most `max` bytes of `text`, cut on a character boundary.
pub(crate) fn truncate_head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl PlanRecord {
    /// Overall status: failed if any step failed, succeeded if all did, else running.
    pub fn status(&self) -> PlanStatus {
        if self
            .steps
            .iter()
            .any(|s| s.status == LocalStepStatus::Failed)
        {
            PlanStatus::Failed
        } else if self
            .steps
            .iter()
            .all(|s| s.status == LocalStepStatus::Succeeded)
        {
            PlanStatus::Succeeded
        } else {
            PlanStatus::Running
        }
    }

    /// The first step not finished, while the plan is running.
    pub fn next_step(&self) -> Option<usize> {
        if self.status() != PlanStatus::Running {
            return None;
        }
        self.steps.iter().position(|s| {
            matches!(
                s.status,
                LocalStepStatus::Pending | LocalStepStatus::Running
            )
        })
    }

    /// The summary sent with polls.
    pub fn progress(&self) -> PlanProgress {
        let count = |status| self.steps.iter().filter(|s| s.status == status).count() as u32;
        PlanProgress {
            plan_id: self.plan_id.clone(),
            status: self.status(),
            succeeded_steps: count(LocalStepStatus::Succeeded),
            total_steps: self.steps.len() as u32,
            failed_step: self
                .steps
                .iter()
                .position(|s| s.status == LocalStepStatus::Failed)
                .map(|i| i as u32),
            hold: self.hold.clone(),
            rollback: self.rollback.as_ref().map(RollbackRecord::progress),
        }
    }
}

/// The content of `state.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalState {
    /// Layout version.
    pub format: u32,
    /// The current plan's progress.
    pub current: Option<PlanRecord>,
    /// Reports not yet acknowledged by the server, oldest first.
    pub outbox: Vec<StepReport>,
}

impl Default for LocalState {
    fn default() -> Self {
        Self {
            format: STATE_FORMAT,
            current: None,
            outbox: Vec::new(),
        }
    }
}

/// The open, locked state dir.
pub struct StateStore {
    dir: PathBuf,
    _lock: File,
    /// Progress and outbox (save after changing).
    pub state: LocalState,
    /// The current plan's body, when held (it can be missing after disk trouble; the server
    /// then sends it again because the agent reports the plan as running).
    pub plan: Option<Plan>,
    /// The last save of `state.json` failed: memory is ahead of the disk.
    unsaved: bool,
}

fn io_err(context: &str, path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError::Io(format!("{context} {}: {e}", path.display()))
}

impl StateStore {
    /// Opens (creating, mode 0700) and locks `dir`, and loads what is there.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_err("create", dir, e))?;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_err("open", &lock_path, e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| StateError::Locked(dir.display().to_string()))?;
        let state_path = dir.join("state.json");
        let state = match read_optional(&state_path, MAX_STATE_BYTES)
            .map_err(|e| StateError::Io(e.to_string()))?
        {
            None => LocalState::default(),
            Some(bytes) => {
                serde_json::from_slice::<LocalState>(&bytes).map_err(|e| StateError::Corrupt {
                    path: state_path.display().to_string(),
                    reason: e.to_string(),
                })?
            }
        };
        if state.format != STATE_FORMAT {
            return Err(StateError::Corrupt {
                path: state_path.display().to_string(),
                reason: format!("format {} is not {STATE_FORMAT}", state.format),
            });
        }
        let mut store = Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            state,
            plan: None,
            unsaved: false,
        };
        store.plan = store.load_plan_body();
        Ok(store)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn plan_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("plan-{id}.json"))
    }

    fn load_plan_body(&self) -> Option<Plan> {
        let record = self.state.current.as_ref()?;
        let path = self.plan_path(&record.plan_id);
        let bytes = read_optional(&path, MAX_STATE_BYTES).ok().flatten()?;
        let plan: Plan = match serde_json::from_slice(&bytes) {
            Ok(plan) => plan,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "plan file unreadable; waiting for the server to send the plan again");
                return None;
            }
        };
        (plan.id == record.plan_id && plan.steps.len() == record.steps.len()).then_some(plan)
    }

    /// Whether the last save failed (memory is ahead of the disk).
    pub(crate) fn unsaved(&self) -> bool {
        self.unsaved
    }

    /// Writes `state.json` atomically.
    pub fn save(&mut self) -> Result<(), StateError> {
        let saved = self.write_state();
        self.unsaved = saved.is_err();
        saved
    }

    fn write_state(&self) -> Result<(), StateError> {
        let path = self.dir.join("state.json");
        let bytes = serde_json::to_vec(&self.state).map_err(|e| io_err("encode", &path, e))?;
        atomic_write(
            &path,
            &bytes,
            FileMeta {
                mode: 0o600,
                owner: None,
            },
        )
        .map_err(|e| StateError::of_write(&self.dir, e))
    }

    /// The current plan's rollback, once one started.
    pub(crate) fn rollback(&self) -> Option<&RollbackRecord> {
        self.state.current.as_ref()?.rollback.as_ref()
    }

    /// [`StateStore::rollback`], to change.
    pub(crate) fn rollback_mut(&mut self) -> Option<&mut RollbackRecord> {
        self.state.current.as_mut()?.rollback.as_mut()
    }

    /// Makes `plan` the current plan: body first, then progress (all steps pending), then the
    /// old body is removed. A crash in between leaves the old plan current.
    pub fn adopt(&mut self, plan: Plan) -> Result<(), StateError> {
        let path = self.plan_path(&plan.id);
        let bytes = serde_json::to_vec(&plan).map_err(|e| io_err("encode", &path, e))?;
        atomic_write(
            &path,
            &bytes,
            FileMeta {
                mode: 0o600,
                owner: None,
            },
        )
        .map_err(|e| StateError::of_write(&self.dir, e))?;
        let same_id = self
            .state
            .current
            .as_ref()
            .is_some_and(|c| c.plan_id == plan.id);
        let old = self.state.current.as_ref().map(|c| c.plan_id.clone());
        if !same_id {
            let before = self.state.current.take();
            self.state.current = Some(PlanRecord {
                plan_id: plan.id.clone(),
                steps: plan
                    .steps
                    .iter()
                    .map(|_| LocalStepRecord::pending())
                    .collect(),
                hold: None,
                on_failure: None,
                rollback: None,
                kubelet_before: None,
            });
            if let Err(e) = self.save() {
                // Not taken: the old plan stays current, in memory as on disk.
                self.state.current = before;
                return Err(e);
            }
        }
        if let Some(old) = old.filter(|old| *old != plan.id) {
            let _ = remove_file(&self.plan_path(&old));
        }
        self.plan = Some(plan);
        Ok(())
    }

    /// Queues a report (bounded by [`MAX_OUTBOX`]); the caller saves.
    pub fn enqueue(&mut self, report: StepReport) {
        let outbox = &mut self.state.outbox;
        // A newer report for the same step and attempt supersedes an undelivered one.
        outbox.retain(|r| {
            !(r.plan_id == report.plan_id
                && r.step_index == report.step_index
                && r.undo == report.undo
                && r.attempt == report.attempt
                && r.status == StepStatus::Running)
        });
        outbox.push(report);
        while outbox.len() > MAX_OUTBOX {
            let victim = outbox
                .iter()
                .position(|r| r.status == StepStatus::Running)
                .unwrap_or(0);
            outbox.remove(victim);
        }
    }
}
