//! The update budget's I/O, load → decide ([`super::budget`]) → the caller's transaction: whether UpdateMachine's
//! new run starts ([`Budget::admit`], whose ops join the transaction that records the run), a run record changed
//! together with its slots ([`Budget::update_run`]: renewed by a step report, given back by the record that ends
//! the run), the retention sweep of expired slots, `status` and the gauges this replica exports.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use inplace_agent_api::{MachineRef, Plan};
use inplace_store::{Precondition, TxnOp, Write};
use serde_json::Value;

use super::budget::{
    Admission, BudgetStatus, UPDATES_POOL, decide_admission, decide_end, decide_renew,
    decide_sweep, demands, hold_until, load,
};
use crate::dispatch::floor::config::RetryAfterMode;
use crate::dispatch::floor::db::{CAS_ATTEMPTS, Committed, Put};
use crate::dispatch::floor::keys::{machine_key, update_key};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::{RunOutcome, UpdateRecord};
use crate::dispatch::floor::{DispatchError, Floor};

/// How long a Machine answered "waiting for a slot" counts in this replica's waiting gauge without asking
/// again (CAPI asks again within `retryAfterSeconds`, at most 300 s).
pub const WAITING_FOR_SLOT_SEEN: Duration = Duration::from_secs(600);

/// The update budget of one replica: the store does the counting; this keeps what the gauges show.
pub struct Budget {
    floor: Floor,
    /// Machines answered "waiting for a slot", and when last.
    waiting: Mutex<HashMap<String, u64>>,
    /// Fleet-wide slots in use, as this replica last read them.
    in_use: AtomicU64,
}

impl Budget {
    /// The budget over `floor`, with the limits of its config.
    pub fn new(floor: Floor) -> Budget {
        Budget {
            floor,
            waiting: Mutex::new(HashMap::new()),
            in_use: AtomicU64::new(0),
        }
    }

    /// `retryAfterSeconds` of a waiting answer: the longest an in-progress answer says (a slot frees when a
    /// run ends, which takes minutes).
    fn retry_after_seconds(&self) -> i32 {
        let config = &self.floor.config;
        match config.retry_after {
            RetryAfterMode::Fixed => config.retry_after_seconds,
            RetryAfterMode::Adaptive => config.retry_after_max_seconds,
        }
    }

    /// Whether `machine`'s new run of `plan` starts: the ops taking (or keeping) its slots, for the transaction
    /// that records the run, or the waiting answer. `desired` is the desired Machine (its labels pick the
    /// per-label pools). Admitted without a read when no limit is set.
    pub async fn admit(
        &self,
        machine: &MachineRef,
        desired: &Value,
        plan: &Plan,
    ) -> Result<Admission, DispatchError> {
        let budget = &self.floor.config.budget;
        if !budget.limited() {
            return Ok(Admission::Admitted(Vec::new()));
        }
        let labels = labels_of(desired);
        let view = load(self.floor.db.store().as_ref()).await?;
        let now = self.floor.now_ms();
        let holder = machine.to_string();
        self.in_use.store(
            view.holders(UPDATES_POOL, now).len() as u64,
            Ordering::Relaxed,
        );
        let admission = decide_admission(
            &demands(budget, &labels),
            &view,
            &holder,
            now,
            hold_until(plan, now),
            self.retry_after_seconds(),
        )?;
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        match &admission {
            Admission::Admitted(_) => waiting.remove(&holder),
            Admission::Wait(_) => waiting.insert(holder, now),
        };
        Ok(admission)
    }

    /// Read-modify-write of `machine`'s run `run_id` by compare-and-swap, as [`crate::dispatch::floor::Db::update`],
    /// with its slots in the same transaction: when the change ends the Machine's current run, every budget slot
    /// the Machine holds is given back; otherwise, with `renew` (a step report) and a limit set, its holds are
    /// renewed. Returns the run as stored afterwards.
    pub async fn update_run<F>(
        &self,
        machine: &MachineRef,
        run_id: &str,
        renew: bool,
        mut change: F,
    ) -> Result<Option<UpdateRecord>, DispatchError>
    where
        F: FnMut(Option<&UpdateRecord>) -> Result<Option<UpdateRecord>, DispatchError>,
    {
        let key = update_key(machine, run_id);
        let db = &self.floor.db;
        let holder = machine.to_string();
        for _ in 0..CAS_ATTEMPTS {
            let current = db.read::<UpdateRecord>(&key).await?;
            let precondition = match &current {
                None => Precondition::Absent,
                Some((_, entry)) => Precondition::Revision(entry.revision),
            };
            let before = current.as_ref().map(|(run, _)| ended(&run.outcome()));
            let Some(next) = change(current.as_ref().map(|(run, _)| run))? else {
                return Ok(current.map(|(run, _)| run));
            };
            let mut ops: Vec<TxnOp> = vec![Put::of(key.clone(), &next, precondition)?.op()];
            let ends = ended(&next.outcome()) && before != Some(true);
            if ends || (renew && self.floor.config.budget.limited()) {
                let view = load(db.store().as_ref()).await?;
                let now = self.floor.now_ms();
                if !ends {
                    ops.extend(decide_renew(
                        &view,
                        &holder,
                        now,
                        hold_until(&next.plan, now),
                    )?);
                } else if db
                    .value::<MachineRecord>(&machine_key(machine))
                    .await?
                    .is_some_and(|record| record.run_id == run_id)
                {
                    // A superseded run's end gives back nothing: its Machine's slots are its current run's.
                    ops.extend(decide_end(&view, &holder));
                }
            }
            if db.commit_ops(ops).await? == Committed::Done {
                return Ok(Some(next));
            }
        }
        Err(DispatchError::Contention(key))
    }

    /// Deletes the budget slots that are free (expired or unreadable), each only if it is as read. Returns how many.
    pub async fn sweep(&self) -> Result<usize, DispatchError> {
        let store = self.floor.db.store();
        let view = load(store.as_ref()).await?;
        let mut freed = 0;
        for op in decide_sweep(&view, self.floor.now_ms()) {
            if let Write::Done(_) = store.delete(&op.key, op.precondition).await? {
                freed += 1;
            }
        }
        Ok(freed)
    }

    /// The budget as `status` shows it: the limits of this server, the slots in the store.
    pub async fn status(&self) -> Result<BudgetStatus, DispatchError> {
        let view = load(self.floor.db.store().as_ref()).await?;
        let now = self.floor.now_ms();
        let holders = view.holders(UPDATES_POOL, now);
        self.in_use.store(holders.len() as u64, Ordering::Relaxed);
        let budget = &self.floor.config.budget;
        let label_slots = view
            .pools
            .iter()
            .filter(|(name, _)| name.as_str() != UPDATES_POOL)
            .map(|(_, pool)| pool.held(now))
            .sum();
        Ok(BudgetStatus {
            limit: budget.total,
            holders,
            per_label: budget
                .per_label
                .iter()
                .map(|l| format!("{}={}", l.key, l.limit))
                .collect(),
            label_slots,
            waiting: self.waiting_count(),
            limits_unknown: false,
        })
    }

    /// Machines this replica answered "waiting for a slot" within [`WAITING_FOR_SLOT_SEEN`] (and not admitted
    /// since).
    pub fn waiting_count(&self) -> usize {
        let horizon = self
            .floor
            .now_ms()
            .saturating_sub(WAITING_FOR_SLOT_SEEN.as_millis() as u64);
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, at| *at >= horizon);
        waiting.len()
    }

    /// Fleet-wide slots in use, as this replica last read them.
    pub fn slots_in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }
}

/// Whether a run in this state has ended (it holds no slot any more): done, failed (its rollback over), or
/// cancelled.
fn ended(outcome: &RunOutcome) -> bool {
    matches!(
        outcome,
        RunOutcome::Done | RunOutcome::Failed { .. } | RunOutcome::Cancelled { .. }
    )
}

/// The desired Machine's labels (`metadata.labels`; string values only).
fn labels_of(desired: &Value) -> BTreeMap<String, String> {
    desired
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}
