//! One reconcile of one Machine's remediation guard: load (its record, current run, guard record) → [`decide`]
//! → commit the guard record → the call to the management cluster → commit what was seen → release the run's
//! start once its guard is settled; and what a change of the record says (its Event and log line). When and how
//! many Machines are reconciled is the loop's (`guards/mod.rs`).

use std::sync::Arc;

use inplace_agent_api::MachineRef;
use inplace_core::settings::REMEDIATION_GUARD_PAST_DEADLINE_SETTING;
use inplace_store::Precondition;

use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::db::{CAS_ATTEMPTS, Committed, Put};
use crate::dispatch::floor::guard::{
    GuardRecord, GuardWant, LiftReason, SKIP_REMEDIATION_ANNOTATION,
};
use crate::dispatch::floor::keys::{guard_key, machine_key, update_key};
use crate::dispatch::floor::outbox::{MachineEvent, Reason};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::UpdateRecord;
use crate::dispatch::floor::run_view::RunView;

use super::{Applied, Guards, Need, decide, lock_set, need, release_gate};

/// What a reconcile of one Machine left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// The guard record afterwards.
    pub guard: Option<GuardRecord>,
    /// Whether the run still waits for its guard.
    pub pending: bool,
}

impl Guards {
    /// One reconcile of `machine` (see the module docs), never overlapping another of the same Machine.
    pub async fn reconcile(&self, machine: &MachineRef) -> Result<Reconciled, DispatchError> {
        let lock = {
            let mut locks = lock_set(&self.reconciling);
            locks.entry(machine.clone()).or_default().clone()
        };
        let held = lock.lock().await;
        let reconciled = self.reconcile_alone(machine).await;
        drop(held);
        let mut locks = lock_set(&self.reconciling);
        // Ours and the map's: nobody else waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(machine);
        }
        reconciled
    }

    async fn reconcile_alone(&self, machine: &MachineRef) -> Result<Reconciled, DispatchError> {
        let db = &self.floor.db;
        let mut guard = None;
        for attempt in 0..=CAS_ATTEMPTS {
            if attempt == CAS_ATTEMPTS {
                return Err(DispatchError::Contention(guard_key(machine)));
            }
            let record = db.value::<MachineRecord>(&machine_key(machine)).await?;
            let run_id = record.as_ref().map(|r| r.run_id.clone());
            let run = match &run_id {
                Some(id) => db.value::<RunView>(&update_key(machine, id)).await?,
                None => None,
            };
            let current = db.read::<GuardRecord>(&guard_key(machine)).await?;
            let before = current.as_ref().map(|(g, _)| said(g));
            let now = self.floor.now_ms();
            let next = decide(
                machine,
                run_id.as_deref(),
                run.as_ref(),
                current.as_ref().map(|(g, _)| g),
                now,
                kept_past_deadline(run.as_ref()),
            );
            let Some(next) = next else {
                guard = current.map(|(g, _)| g);
                break;
            };
            let precondition = current.as_ref().map_or(Precondition::Absent, |(_, e)| {
                Precondition::Revision(e.revision)
            });
            let put = Put::of(guard_key(machine), &next, precondition)?;
            if db.commit(vec![put]).await? == Committed::Done {
                log_change(machine, &next);
                if before != Some(said(&next)) {
                    let uid = record.as_ref().and_then(|r| r.uid.as_deref());
                    self.floor.outbox.post(guard_event(machine, uid, &next));
                }
                guard = Some(next);
                break;
            }
        }
        let mut failed = false;
        if let Some(record) = guard.clone().filter(|g| !g.applied) {
            match self.target.apply(machine, &record).await {
                Ok(applied) => {
                    guard = self
                        .seen_applied(machine, &record, applied)
                        .await?
                        .or(guard);
                }
                Err(_) => failed = true,
            }
        }
        let pending = self.release(machine, guard.as_ref(), failed).await?;
        let mut set = self.pending();
        if pending {
            set.insert(machine.clone());
        } else {
            set.remove(machine);
        }
        Ok(Reconciled { guard, pending })
    }

    /// Records that the Machine now matches `record` (if the record is still as applied).
    async fn seen_applied(
        &self,
        machine: &MachineRef,
        record: &GuardRecord,
        applied: Applied,
    ) -> Result<Option<GuardRecord>, DispatchError> {
        let now = self.floor.now_ms();
        self.floor
            .db
            .update::<GuardRecord, _>(&guard_key(machine), |current| {
                Ok(current
                    .filter(|c| c.run_id == record.run_id && c.want == record.want && !c.applied)
                    .map(|c| GuardRecord {
                        applied: true,
                        operator_value: applied.operator_value && c.want == GuardWant::On,
                        updated_ms: now,
                        ..c.clone()
                    }))
            })
            .await
    }

    /// Lets the Machine's run start when its guard is settled (or setting it `failed`); whether it still waits.
    async fn release(
        &self,
        machine: &MachineRef,
        guard: Option<&GuardRecord>,
        failed: bool,
    ) -> Result<bool, DispatchError> {
        let db = &self.floor.db;
        let Some(record) = db.value::<MachineRecord>(&machine_key(machine)).await? else {
            return Ok(false);
        };
        let key = update_key(machine, &record.run_id);
        let mut waits = false;
        db.update::<UpdateRecord, _>(&key, |run| {
            let Some(run) = run.filter(|r| r.guard_pending.is_some()) else {
                waits = false;
                return Ok(None);
            };
            let view = RunView::of(run);
            let keep = kept_past_deadline(Some(&view));
            let not_needed = matches!(need(Some(&view), self.floor.now_ms(), keep), Need::Off(_));
            if release_gate(run.guard_pending.as_deref(), guard, failed || not_needed) {
                waits = false;
                let mut next = run.clone();
                next.guard_pending = None;
                if failed {
                    tracing::warn!(machine = %machine, run = %next.plan.id, "remediation guard not set (the management cluster's API failed): the update goes on unguarded; retrying");
                }
                return Ok(Some(next));
            }
            waits = true;
            Ok(None)
        })
        .await?;
        Ok(waits)
    }
}

/// Whether run `run`'s guard stays on past a step's deadline: the setting it was recorded with.
fn kept_past_deadline(run: Option<&RunView>) -> bool {
    run.is_some_and(|r| r.guard_kept_past_deadline)
}

/// What a guard record says to operators: a change of it is an Event.
fn said(record: &GuardRecord) -> (GuardWant, Option<LiftReason>, bool) {
    (record.want, record.lifted, record.kept_past_deadline)
}

/// The Event on the Machine when its guard is set, kept past a deadline, or lifted.
fn guard_event(machine: &MachineRef, uid: Option<&str>, record: &GuardRecord) -> MachineEvent {
    let (reason, note) = match (record.want, record.lifted) {
        (GuardWant::On, _) if record.kept_past_deadline => (
            Reason::RemediationGuardKept,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION}={} kept past the step's deadline by setting \
                 {REMEDIATION_GUARD_PAST_DEADLINE_SETTING}=keep: the node has not come back; remediation \
                 stays off until the run moves on or ends",
                record.value
            ),
        ),
        (GuardWant::On, _) => (
            Reason::RemediationGuardSet,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION}={} while run {} can take the node down",
                record.value, record.run_id
            ),
        ),
        (GuardWant::Off, Some(LiftReason::Deadline)) => (
            Reason::RemediationGuardExpired,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION} lifted at the step's deadline so remediation can act: the \
                 node has not come back"
            ),
        ),
        (GuardWant::Off, lifted) => (
            Reason::RemediationGuardLifted,
            format!(
                "{SKIP_REMEDIATION_ANNOTATION} lifted: {}",
                lifted.map_or("the run needs it no more", LiftReason::as_str)
            ),
        ),
    };
    MachineEvent::new(machine, uid, reason, note)
}

fn log_change(machine: &MachineRef, record: &GuardRecord) {
    match (record.want, record.lifted) {
        (GuardWant::On, _) => {
            tracing::info!(machine = %machine, run = %record.run_id, value = %record.value, "remediation guard: setting skip-remediation on the Machine")
        }
        (GuardWant::Off, reason) => {
            tracing::info!(machine = %machine, run = %record.run_id, reason = reason.map_or("", |r| r.as_str()), "remediation guard: lifting skip-remediation from the Machine")
        }
    }
}
