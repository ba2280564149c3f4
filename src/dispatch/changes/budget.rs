//! The fleet-wide update budget: at most `--max-concurrent-updates` runs in progress at once across every
//! cluster and every replica, and at most N per value of a Machine label (`--max-concurrent-updates-per-label`).
//! A run in progress holds a slot of the store's counting semaphore ([`crate::dispatch::floor::slots`]): of pool
//! [`UPDATES_POOL`], and per label budget of pool `updates-by-<key digest>-<value digest>` ([`label_pool`]). The
//! holder is the Machine (`namespace/name`), so a Machine whose run is replaced by a run of a new desired state
//! keeps its slots. Every op belongs to the caller's own transaction: the slot is taken with the run record
//! (UpdateMachine), renewed with a step report and given back with the record that ends the run, so no
//! instant has one without the other; a hold also expires ([`hold_until`]) so a slot can never leak.
//! Pure decisions ([`decide_admission`], [`decide_end`], [`decide_renew`], [`decide_sweep`]) over every budget
//! pool as one listing loaded ([`load`]); the I/O is in [`super::budget_io`].

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_agent_api::Plan;
use inplace_store::{Store, TxnOp};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::config::{LabelBudget, UpdateBudget};
use crate::dispatch::floor::keys::SLOTS_PREFIX;
use crate::dispatch::floor::slots::{self, Pool, PoolView, Slot, SlotHold, Take, decide_take};
use crate::hex;

/// The pool of the fleet-wide budget (`slots/updates/<n>`).
pub const UPDATES_POOL: &str = "updates";
/// How much longer than the sum of its steps' timeouts a run's slot is held without a step report: covers the
/// wait for the agent to pick the run up, a rollback's undo steps and a reboot. Every step report renews the
/// hold, so only a run that makes no progress for that long loses its slot (it is never stopped: it only stops
/// counting against the budget).
pub const UPDATE_SLOT_MARGIN: Duration = Duration::from_secs(30 * 60);
/// Most holders a waiting answer names (the oldest first).
pub const BUDGET_HOLDERS_SHOWN: usize = 5;

/// Every budget pool's slots, as one listing of `slots/updates` read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetView {
    /// By pool name.
    pub pools: BTreeMap<String, PoolView>,
}

impl BudgetView {
    /// The pool `name`'s slots (none stored: an empty pool).
    pub fn pool(&self, name: &str) -> PoolView {
        self.pools.get(name).cloned().unwrap_or_default()
    }

    /// Live holds of the pool `name`, oldest first: (holder, taken at).
    pub fn holders(&self, name: &str, now_ms: u64) -> Vec<(String, u64)> {
        let mut holders: Vec<(String, u64)> = self
            .pools
            .get(name)
            .map(|pool| pool.slots.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|slot| slot.live(now_ms))
            .filter_map(|slot| slot.hold.as_ref())
            .map(|hold| (hold.holder.clone(), hold.taken_ms))
            .collect();
        holders.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        holders
    }

    /// Every stored slot `holder` holds (live or expired), with its pool.
    fn held_by<'a>(&'a self, holder: &'a str) -> impl Iterator<Item = (&'a str, &'a Slot)> + 'a {
        self.pools.iter().flat_map(move |(name, pool)| {
            pool.slots
                .iter()
                .filter(move |s| s.hold.as_ref().is_some_and(|h| h.holder == holder))
                .map(move |s| (name.as_str(), s))
        })
    }
}

/// The pool of the per-label budget `key` for the label value `value` (the empty value for a Machine without the
/// label): digests, so any label key and value make a valid key segment.
pub fn label_pool(key: &str, value: &str) -> String {
    let digest = |text: &str| hex(&Sha256::digest(text.as_bytes())[..8]);
    format!("{UPDATES_POOL}-by-{}-{}", digest(key), digest(value))
}

/// Whether a pool name is one of the budget's.
fn is_budget_pool(name: &str) -> bool {
    name == UPDATES_POOL || name.starts_with(&format!("{UPDATES_POOL}-by-"))
}

/// One pool a new run must get a slot of: its name, its limit and how a waiting answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// The pool.
    pub pool: String,
    /// Its limit.
    pub limit: u32,
    /// `a fleet-wide update slot`, `an update slot for topology.kubernetes.io/zone=a`.
    pub what: String,
}

/// The pools a run of a Machine with `labels` needs a slot of, fleet-wide first.
pub fn demands(budget: &UpdateBudget, labels: &BTreeMap<String, String>) -> Vec<Demand> {
    let total = budget.total.map(|limit| Demand {
        pool: UPDATES_POOL.to_owned(),
        limit,
        what: "a fleet-wide update slot".to_owned(),
    });
    let per_label = budget.per_label.iter().map(|LabelBudget { key, limit }| {
        let value = labels.get(key).map(String::as_str).unwrap_or_default();
        let shown = if value.is_empty() {
            format!("{key} unset")
        } else {
            format!("{key}={value}")
        };
        Demand {
            pool: label_pool(key, value),
            limit: *limit,
            what: format!("an update slot for {shown}"),
        }
    });
    total.into_iter().chain(per_label).collect()
}

/// When a hold taken or renewed at `now_ms` for a run of `plan` expires: every step's timeout plus
/// [`UPDATE_SLOT_MARGIN`].
pub fn hold_until(plan: &Plan, now_ms: u64) -> u64 {
    let steps: u64 = plan
        .steps
        .iter()
        .map(|s| u64::from(s.timeout_seconds))
        .sum();
    now_ms
        .saturating_add(steps.saturating_mul(1000))
        .saturating_add(UPDATE_SLOT_MARGIN.as_millis() as u64)
}

/// A new run waits: nothing is written, CAPI is answered in progress with this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// `waiting for a fleet-wide update slot: 2 of 2 runs in progress (default/a 4m, other/b 1m)`.
    pub message: String,
    /// When CAPI should ask again.
    pub retry_after_seconds: i32,
}

/// Whether a new run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// It starts: these ops (taking or keeping its slots) go in the transaction that records it.
    Admitted(Vec<TxnOp>),
    /// A pool is full: nothing is written.
    Wait(Waiting),
}

/// Whether `holder`'s new run (its slots held until `expires_ms`) starts, as seen in `view` at `now_ms`. A holder
/// that holds a live slot of a pool keeps it (the op moves its expiry); a pool whose every slot others hold makes
/// it wait, and the answer (to ask again after `retry_after_seconds`) names the oldest holders.
pub fn decide_admission(
    demands: &[Demand],
    view: &BudgetView,
    holder: &str,
    now_ms: u64,
    expires_ms: u64,
    retry_after_seconds: i32,
) -> Result<Admission, DispatchError> {
    let mut ops = Vec::with_capacity(demands.len());
    for demand in demands {
        let pool = Pool {
            name: &demand.pool,
            limit: demand.limit,
        };
        match decide_take(&pool, &view.pool(&demand.pool), holder, now_ms, expires_ms)? {
            Take::Held(op) | Take::Taken(op) => ops.push(op),
            Take::Full { held } => {
                return Ok(Admission::Wait(Waiting {
                    message: waiting_message(
                        demand,
                        held,
                        &view.holders(&demand.pool, now_ms),
                        now_ms,
                    ),
                    retry_after_seconds,
                }));
            }
        }
    }
    Ok(Admission::Admitted(ops))
}

/// `waiting for <what>: <held> of <limit> runs in progress (<holder> <for how long>, …)`.
fn waiting_message(demand: &Demand, held: u32, holders: &[(String, u64)], now_ms: u64) -> String {
    let mut shown: Vec<String> = holders
        .iter()
        .take(BUDGET_HOLDERS_SHOWN)
        .map(|(holder, taken)| format!("{holder} {}", since(now_ms, *taken)))
        .collect();
    if holders.len() > BUDGET_HOLDERS_SHOWN {
        shown.push(format!("{} more", holders.len() - BUDGET_HOLDERS_SHOWN));
    }
    format!(
        "waiting for {}: {held} of {} runs in progress ({})",
        demand.what,
        demand.limit,
        shown.join(", ")
    )
}

/// How long ago, shortly: `45s`, `4m`, `2h`.
fn since(now_ms: u64, then_ms: u64) -> String {
    match now_ms.saturating_sub(then_ms) / 1000 {
        s @ 0..=119 => format!("{s}s"),
        s @ 120..=7199 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// The ops that give back every budget slot `holder` holds, live or expired (its run ended): deletes, each
/// conditional on the slot being as read.
pub fn decide_end(view: &BudgetView, holder: &str) -> Vec<TxnOp> {
    view.held_by(holder)
        .map(|(pool, slot)| {
            TxnOp::delete(
                crate::dispatch::floor::keys::slot_key(pool, slot.index),
                inplace_store::Precondition::Revision(slot.revision),
            )
        })
        .collect()
}

/// The ops that move the expiry of every live budget slot `holder` holds to `expires_ms` (a step report showed
/// its run is alive).
pub fn decide_renew(
    view: &BudgetView,
    holder: &str,
    now_ms: u64,
    expires_ms: u64,
) -> Result<Vec<TxnOp>, DispatchError> {
    let mut ops = Vec::new();
    for (name, slot) in view.held_by(holder).filter(|(_, s)| s.live(now_ms)) {
        let hold = SlotHold {
            holder: holder.to_owned(),
            taken_ms: slot.hold.as_ref().map_or(now_ms, |h| h.taken_ms),
            expires_ms,
        };
        let key = crate::dispatch::floor::keys::slot_key(name, slot.index);
        let precondition = inplace_store::Precondition::Revision(slot.revision);
        ops.push(crate::dispatch::floor::db::Put::of(key, &hold, precondition)?.op());
    }
    Ok(ops)
}

/// The budget slots the retention sweep deletes at `now_ms`: expired and unreadable ones, of every pool.
pub fn decide_sweep(view: &BudgetView, now_ms: u64) -> Vec<TxnOp> {
    view.pools
        .iter()
        .flat_map(|(name, pool)| {
            let pool_ref = Pool { name, limit: 0 };
            slots::decide_sweep(&pool_ref, pool, now_ms)
        })
        .collect()
}

/// Reads every budget pool with one listing of `slots/updates`.
pub async fn load(store: &dyn Store) -> Result<BudgetView, DispatchError> {
    let prefix = format!("{SLOTS_PREFIX}{UPDATES_POOL}");
    let mut view = BudgetView::default();
    for entry in store.list(&prefix).await? {
        let Some((pool, index)) = entry
            .key
            .strip_prefix(SLOTS_PREFIX)
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        let (Ok(index), true) = (index.parse::<u32>(), is_budget_pool(pool)) else {
            continue;
        };
        view.pools
            .entry(pool.to_owned())
            .or_default()
            .slots
            .push(Slot {
                index,
                hold: serde_json::from_slice(&entry.value).ok(),
                revision: entry.revision,
            });
    }
    Ok(view)
}

/// The budget as `status` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    /// `--max-concurrent-updates` of the server that answered (`None`: unlimited, or read from a store).
    pub limit: Option<u32>,
    /// Runs holding a fleet-wide slot: (Machine, taken at, Unix ms), oldest first.
    pub holders: Vec<(String, u64)>,
    /// Per-label budgets of that server: `key=N`.
    pub per_label: Vec<String>,
    /// Live slots held in per-label pools.
    pub label_slots: u32,
    /// Machines this replica answered "waiting for a slot" lately.
    pub waiting: usize,
    /// Read straight from a store (`status --store`): the limits are the servers' flags, not known here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub limits_unknown: bool,
}

impl BudgetStatus {
    /// One line for `status`.
    pub fn status_line(&self, now_ms: u64) -> String {
        let holders: Vec<String> = self
            .holders
            .iter()
            .map(|(holder, taken)| format!("{holder} {}", since(now_ms, *taken)))
            .collect();
        let used = self.holders.len();
        let mut line = match self.limit {
            _ if self.limits_unknown => format!(
                "update budget (limits: the servers' --max-concurrent-updates): {used} slots in use"
            ),
            Some(limit) => format!("update budget: {used} of {limit} slots in use"),
            None if self.per_label.is_empty() => {
                format!(
                    "update budget: unlimited (no --max-concurrent-updates); {used} slots in use"
                )
            }
            None => format!("update budget: no fleet-wide limit; {used} slots in use"),
        };
        if !holders.is_empty() {
            line.push_str(&format!(" ({})", holders.join(", ")));
        }
        if !self.per_label.is_empty() {
            line.push_str(&format!(
                "; per label {}: {} slots in use",
                self.per_label.join(", "),
                self.label_slots
            ));
        }
        // Who waits is known only to the replicas CAPI asks.
        if !self.limits_unknown {
            line.push_str(&format!("; {} Machines waiting for a slot", self.waiting));
        }
        line
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
