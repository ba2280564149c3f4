//! The operator's view of a rollout: every recorded run with its Machine, cluster, current step and message,
//! every Machine whose UpdateMachine was refused (no CanUpdate answer accepted its desired state), and the
//! retention sweep that deletes finished runs once they are older than the retention period.

use serde::{Deserialize, Serialize};

use super::Fleet;
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::hold::hold_for;
use crate::dispatch::floor::keys::{REFUSALS_PREFIX, UPDATES_PREFIX, machine_key};
use crate::dispatch::floor::records::{MachineRecord, RefusalRecord};
use crate::dispatch::floor::run::{RunOutcome, UpdateRecord};
use inplace_agent_api::RollbackState;
use inplace_core::knobs::CANCEL_ANNOTATION;

/// Where a run is, for `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StatusState {
    /// Recorded, no step started.
    Waiting,
    /// A step is running or pending.
    InProgress,
    /// Done.
    Done,
    /// A step failed (and, when the agent rolled back, the rollback failed: the node is left cordoned).
    Failed,
    /// A step failed and the agent is undoing the steps before it.
    RollingBack,
    /// A step failed and the agent undid the run and verified the node as it was before.
    RolledBack,
    /// Held by an operator pause (or another hold): no new step starts.
    Paused,
    /// Cancelled by an operator.
    Cancelled,
    /// Replaced by a newer desired state before it finished.
    Superseded,
    /// UpdateMachine refused a desired state no CanUpdate answer accepted in place (nothing was run).
    Refused,
}

/// One row of `inplace-updater status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusRow {
    /// `namespace/name` of the Machine.
    pub machine: String,
    /// Its cluster.
    pub cluster: String,
    /// The run id (first 12 characters are enough to tell runs apart).
    pub run: String,
    /// Where it is.
    pub state: StatusState,
    /// `step i/n: description` of the first unfinished (or the failed) step.
    pub step: String,
    /// The last message of that step (agent message, exit code, stderr tail excerpt).
    pub message: String,
    /// When the run was recorded (Unix ms).
    pub created_ms: u64,
    /// When it ended (Unix ms).
    pub finished_ms: Option<u64>,
}

impl Fleet {
    /// The Machine record of `run`'s Machine when `run` is its current run (else `None`: superseded).
    async fn record_running(
        &self,
        run: &UpdateRecord,
    ) -> Result<Option<MachineRecord>, DispatchError> {
        Ok(self
            .floor
            .db
            .value::<MachineRecord>(&machine_key(&run.plan.machine))
            .await?
            .filter(|record| record.run_id == run.plan.id))
    }

    /// Every recorded run, newest first within each cluster.
    pub async fn status(&self) -> Result<Vec<StatusRow>, DispatchError> {
        let store = self.floor.db.store();
        let mut rows = Vec::new();
        for entry in store.list(UPDATES_PREFIX).await? {
            let Ok(run) = serde_json::from_slice::<UpdateRecord>(&entry.value) else {
                continue;
            };
            let record = self.record_running(&run).await?;
            let current = record.is_some();
            let now = self.floor.now_ms();
            let hold = record.as_ref().and_then(|r| hold_for(r, &run, now));
            let total = run.plan.steps.len();
            let (state, index) = match run.outcome() {
                RunOutcome::Done => (StatusState::Done, None),
                RunOutcome::Failed { index } => match run.rollback.as_ref().map(|r| r.state) {
                    Some(RollbackState::RolledBack) => (StatusState::RolledBack, Some(index)),
                    _ => (StatusState::Failed, Some(index)),
                },
                RunOutcome::RollingBack { index } => (StatusState::RollingBack, Some(index)),
                RunOutcome::Cancelled { .. } => (StatusState::Cancelled, None),
                _ if !current => (StatusState::Superseded, None),
                _ if hold.is_some() => (StatusState::Paused, None),
                RunOutcome::Waiting => (StatusState::Waiting, Some(0)),
                RunOutcome::InProgress { index } => (StatusState::InProgress, Some(index)),
            };
            let (step, message) = match index.and_then(|i| run.plan.steps.get(i).map(|s| (i, s))) {
                Some((i, step)) => {
                    let record = &run.steps[i];
                    let mut message = record.message.clone().unwrap_or_default();
                    if let Some(code) = record.exit_code {
                        message = format!("exit {code}; {message}");
                    }
                    if let Some(rollback) = &run.rollback {
                        message = format!("{message}; {}", rollback.summary());
                    }
                    (
                        format!("step {}/{total}: {}", i + 1, step.description),
                        message,
                    )
                }
                None if run.cancelled.is_none() && hold.is_none() => {
                    (format!("{total} steps"), String::new())
                }
                None => {
                    let done = run.succeeded_steps();
                    let message = match (&run.cancelled, &hold) {
                        (Some(c), _) => format!(
                            "cancelled by operator ({}={}) after step {} of {total}",
                            CANCEL_ANNOTATION, c.value, c.after_steps
                        ),
                        (None, Some(hold)) if run.held.as_ref() == Some(hold) => {
                            format!("{hold} after step {done} of {total}")
                        }
                        (None, Some(hold)) => {
                            format!("{hold}; the running step finishes first")
                        }
                        (None, None) => String::new(),
                    };
                    // `paused` and `cancelled` rows show how far the run got.
                    (format!("{done}/{total} steps done"), message)
                }
            };
            rows.push(StatusRow {
                machine: run.plan.machine.to_string(),
                cluster: run.plan.cluster.clone(),
                run: run.plan.id.chars().take(12).collect(),
                state,
                step,
                message,
                created_ms: run.created_ms,
                finished_ms: run.finished_ms,
            });
        }
        rows.extend(self.refusal_rows().await?);
        rows.sort_by(|a, b| {
            a.cluster
                .cmp(&b.cluster)
                .then(b.created_ms.cmp(&a.created_ms))
        });
        Ok(rows)
    }

    /// A row per Machine whose last UpdateMachine was refused and that has no run recorded since.
    async fn refusal_rows(&self) -> Result<Vec<StatusRow>, DispatchError> {
        let mut rows = Vec::new();
        for entry in self.floor.db.store().list(REFUSALS_PREFIX).await? {
            let Ok(refusal) = serde_json::from_slice::<RefusalRecord>(&entry.value) else {
                continue;
            };
            let ran_since = self
                .floor
                .db
                .value::<MachineRecord>(&machine_key(&refusal.machine))
                .await?
                .is_some_and(|record| record.since_ms >= refusal.first_ms);
            if ran_since {
                continue;
            }
            rows.push(StatusRow {
                machine: refusal.machine.to_string(),
                cluster: refusal.cluster,
                run: String::new(),
                state: StatusState::Refused,
                step: refusal.reason.as_str().to_owned(),
                message: refusal.message,
                created_ms: refusal.first_ms,
                finished_ms: None,
            });
        }
        Ok(rows)
    }

    /// Deletes runs that finished (or were superseded) longer ago than the retention period and are not any
    /// Machine's current run. Returns how many were deleted.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let now = self.floor.now_ms();
        let horizon = now.saturating_sub(self.floor.config.retention.as_millis() as u64);
        let store = self.floor.db.store();
        let mut deleted = 0;
        for entry in store.list(UPDATES_PREFIX).await? {
            let Ok(run) = serde_json::from_slice::<UpdateRecord>(&entry.value) else {
                continue;
            };
            let ended = run.finished_ms.unwrap_or(run.created_ms);
            if ended > horizon {
                continue;
            }
            // The current run stays: it is what UpdateMachine answers from (one per Machine, bounded).
            if self.record_running(&run).await?.is_some() {
                continue;
            }
            if self.floor.db.delete_as_listed(&entry).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}
