//! What operators do to a change and see of it: halt it, release it (from a halt or the brake), promote it
//! past its canaries and soaks — each a compare-and-swap on the change record, so every replica agrees and a
//! restart keeps it — and the listing `inplace-updater status --changes` prints. The transitions are pure
//! ([`apply`]).

use inplace_store::Entry;
use serde::{Deserialize, Serialize};

use super::Changes;
use super::decide::{fold, halted_message};
use super::identity::ChangeId;
use super::record::{ChangeRecord, Halt};
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::keys::{CHANGES_PREFIX, change_key};
use crate::observe::{CHANGE_STATES, StateLabels};

/// An operator's control of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Hold every Machine that has not started it.
    Halt,
    /// Lift a halt or the brake; the brake counts only failures after this, and failed canaries leave their
    /// places to the next Machines.
    Release,
    /// Past its canaries and soaks: every Machine may start it (the budget and gates still apply).
    Promote,
}

/// `record` after `control` at `now_ms`; `None` when it changes nothing.
pub fn apply(record: &ChangeRecord, control: Control, now_ms: u64) -> Option<ChangeRecord> {
    let mut next = record.clone();
    match control {
        Control::Halt if next.halted.is_none() => next.halted = Some(Halt::Operator { ms: now_ms }),
        Control::Release if next.halted.is_some() => {
            next.halted = None;
            next.released_failures = next.failed;
            next.canaries.retain(|c| c.failed.is_none());
        }
        Control::Promote if !next.promoted => next.promoted = true,
        _ => return None,
    }
    Some(next)
}

/// One change as `status --changes` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRow {
    /// Its id (what `inplace-updater change` takes).
    pub id: String,
    /// What it moves.
    pub label: String,
    /// Canaries: each Machine and where it is (`default/a done`, `default/b running`, `default/c failed`).
    pub canaries: Vec<String>,
    /// Machines that finished it.
    pub done: u64,
    /// Machines running it.
    pub running: usize,
    /// Machines whose run failed.
    pub failed: u64,
    /// `proving` (in its canaries), `open`, `promoted` or `halted`.
    pub state: String,
    /// Why it is halted (with the release command), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The last failing gate's words, when one failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_gate_failure: Option<String>,
}

impl ChangeRow {
    /// The row of a stored record.
    pub fn of(record: &ChangeRecord) -> ChangeRow {
        let state = if record.halted.is_some() {
            "halted"
        } else if record.promoted {
            "promoted"
        } else if record.in_canary() {
            "proving"
        } else {
            "open"
        };
        ChangeRow {
            id: ChangeId::from_label(record.label.clone()).id,
            label: record.label.clone(),
            canaries: record
                .canaries
                .iter()
                .map(|c| {
                    let at = match (&c.failed, c.done_ms) {
                        (Some(_), _) => "failed",
                        (None, Some(_)) => "done",
                        (None, None) => "running",
                    };
                    format!("{} {at}", c.member.machine)
                })
                .collect(),
            done: record.done,
            running: record.running.len(),
            failed: record.failed,
            state: state.to_owned(),
            held: record.halted.as_ref().map(|h| halted_message(record, h)),
            last_gate_failure: record.gate_failed.as_ref().map(|(_, m)| m.clone()),
        }
    }
}

impl Changes {
    /// Applies `control` to change `id` (compare-and-swap); `Ok(None)` when no such change is recorded.
    pub async fn control(
        &self,
        id: &str,
        control: Control,
    ) -> Result<Option<ChangeRecord>, DispatchError> {
        if !crate::dispatch::floor::keys::valid_segment(id) {
            return Err(DispatchError::BadRequest(format!(
                "{id:?} is not a change id (24 hex digits, as `status --changes` lists them)"
            )));
        }
        let now = self.floor.now_ms();
        self.floor
            .db
            .update(&change_key(id), |current: Option<&ChangeRecord>| {
                Ok(current.and_then(|r| apply(r, control, now)))
            })
            .await
    }

    /// Every recorded change, newest first, with the ends of its running Machines' runs folded in as the next
    /// UpdateMachine would (read only: the record is written by that call).
    pub async fn list(&self) -> Result<Vec<ChangeRow>, DispatchError> {
        let mut rows: Vec<(u64, ChangeRow)> = self
            .folded(self.floor.now_ms())
            .await?
            .into_iter()
            .map(|(_, record)| (record.first_ms, ChangeRow::of(&record)))
            .collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.0));
        for state in CHANGE_STATES {
            let count = rows.iter().filter(|(_, row)| row.state == state).count();
            self.gauges
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        Ok(rows.into_iter().map(|(_, row)| row).collect())
    }

    /// Deletes the changes nobody runs and nothing happened to for longer than the retention period, unless
    /// halted (how the running Machines' runs ended is folded in first, as the listing does). Returns how many.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let now = self.floor.now_ms();
        let horizon = now.saturating_sub(self.floor.config.retention.as_millis() as u64);
        let mut deleted = 0;
        for (entry, record) in self.folded(now).await? {
            if record.sweepable(horizon) && self.floor.db.delete_as_listed(&entry).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Every change record as listed (one that does not decode is passed over), with how its running
    /// Machines' runs ended folded in at `now`, as the next UpdateMachine would (read only).
    async fn folded(&self, now: u64) -> Result<Vec<(Entry, ChangeRecord)>, DispatchError> {
        let mut records = Vec::new();
        for entry in self.floor.db.store().list(CHANGES_PREFIX).await? {
            let Ok(record) =
                crate::dispatch::floor::db::decode::<ChangeRecord>(&entry.key, &entry.value)
            else {
                continue;
            };
            let ends = self.ends(&record.running).await?;
            records.push((entry, fold(record, &ends, now)));
        }
        Ok(records)
    }
}
