//! What an agent upgrade writes, once [`super::decide`] said to offer it or the agent told its outcome:
//! the agent's upgrade record and its slot of the fleet's upgrade pool ([`UPGRADE_POOL`], a store-backed counting
//! semaphore of `--agent-upgrade-concurrency` slots), as the ops of one transaction. Pure: the rollout loads
//! the record and the pool before ([`super::Rollout`]) and commits after; a conflict on any key writes nothing.
//!
//! And when the retention sweep may delete the record ([`sweepable`]).
//!
//! So at every instant the store holds an upgrading record exactly for the agents holding a slot: the offer takes
//! the slot with the record, the outcome gives it back with the record, and a holder that never reports loses it
//! when its hold expires, which is when its record counts as failed ([`UPGRADE_REPORT_DEADLINE_MS`]).

use inplace_agent_api::AgentFacts;
use inplace_store::{Precondition, TxnOp};

use super::decide::{UPGRADE_REPORT_DEADLINE_MS, UpgradeRecord, UpgradeState};
use super::release::AgentRelease;
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::db::Put;
use crate::dispatch::floor::slots::{Pool, PoolView, Take, decide_release, decide_take};

/// The slot pool agent upgrades take their turn from (`slots/agent-upgrades/<index>`).
pub const UPGRADE_POOL: &str = "agent-upgrades";

/// The agent's upgrade record as read: the record, and the condition a write of it needs.
pub type StoredRecord<'a> = Option<(&'a UpgradeRecord, Precondition)>;

/// The ops that offer `fresh` (an upgrading record, as of now) to `holder`, whose record (at `record_key`) is
/// `stored`: its slot
/// taken (or, already held, guarded) and the record written, unless it is upgrading to the same binary already.
/// `Ok(None)`: every slot is held by others. `Ok(Some(vec![]))`: it is upgrading and holds its slot; nothing
/// to write.
pub fn offer_ops(
    pool: &Pool,
    view: &PoolView,
    holder: &str,
    record_key: String,
    stored: StoredRecord,
    fresh: &UpgradeRecord,
) -> Result<Option<Vec<TxnOp>>, DispatchError> {
    let now = fresh.started_ms;
    let already = stored.filter(|(r, _)| {
        r.state == UpgradeState::Upgrading && r.target_sha256 == fresh.target_sha256
    });
    // The hold ends when the upgrade counts as failed: an offer said again does not make it longer.
    let started = already.map_or(now, |(r, _)| r.started_ms);
    let take = decide_take(
        pool,
        view,
        holder,
        now,
        started + UPGRADE_REPORT_DEADLINE_MS,
    )?;
    let slot = match take {
        Take::Full { .. } => return Ok(None),
        Take::Held(_) if already.is_some() => return Ok(Some(Vec::new())),
        Take::Held(op) | Take::Taken(op) => op,
    };
    let precondition = stored.map_or(Precondition::Absent, |(_, condition)| condition);
    // Upgrading already (a record from before the pool, or whose slot expired early): the record is written
    // again unchanged, as the guard that it did not change meanwhile.
    let record = already.map_or(fresh, |(r, _)| r);
    Ok(Some(vec![
        slot,
        Put::of(record_key, record, precondition)?.op(),
    ]))
}

/// The record after what the agent says now (`facts`, at `now_ms`) when it ends its upgrade in flight: succeeded
/// (it runs the target), failed (it says so, or the deadline passed); `None` when nothing ended.
pub fn ended(record: &UpgradeRecord, facts: &AgentFacts, now_ms: u64) -> Option<UpgradeRecord> {
    if record.state != UpgradeState::Upgrading {
        return None;
    }
    let mut next = record.clone();
    if facts.sha256.as_deref() == Some(record.target_sha256.as_str()) {
        next.state = UpgradeState::Succeeded;
    } else if let Some(outcome) = facts
        .upgrade
        .as_ref()
        .filter(|o| !o.succeeded && o.target_sha256 == record.target_sha256)
    {
        next.state = UpgradeState::Failed;
        next.message = Some(outcome.message.clone());
    } else if let Some(message) = record.failure_at(now_ms) {
        next.state = UpgradeState::Failed;
        next.message = Some(message);
    } else {
        return None;
    }
    next.ended_ms = Some(now_ms);
    Some(next)
}

/// The ops that end an upgrade: `next` (from [`ended`]) written if the record is as read, and every slot of
/// `holder` given back.
pub fn end_ops(
    pool: &Pool,
    view: &PoolView,
    holder: &str,
    record_key: String,
    next: &UpgradeRecord,
    condition: Precondition,
) -> Result<Vec<TxnOp>, DispatchError> {
    let mut ops = vec![Put::of(record_key, next, condition)?.op()];
    ops.extend(decide_release(pool, view, holder));
    Ok(ops)
}

/// Whether the retention sweep may delete `record` at `now_ms`, once everything older than `horizon_ms` may go:
/// never while in flight; a success once it ended before the horizon (without a record, an agent on the
/// release is up to date all the same); a failure only once it ended before the horizon and its binary is
/// not `release`'s any more (while it is, the failure stops the rollout and keeps the agent from the same
/// binary).
pub fn sweepable(
    record: &UpgradeRecord,
    release: Option<&AgentRelease>,
    now_ms: u64,
    horizon_ms: u64,
) -> bool {
    let ended = record
        .ended_ms
        .unwrap_or(record.started_ms + UPGRADE_REPORT_DEADLINE_MS);
    match record.state_at(now_ms) {
        UpgradeState::Upgrading => false,
        UpgradeState::Succeeded => ended <= horizon_ms,
        UpgradeState::Failed => {
            ended <= horizon_ms
                && release.is_some_and(|r| {
                    !r.binaries
                        .values()
                        .any(|b| b.sha256 == record.target_sha256)
                })
        }
    }
}

#[cfg(test)]
#[path = "writes_tests.rs"]
mod tests;
