//! A counting semaphore in the store, shared by every replica: a named pool of at most `limit` slots, one key per
//! slot (`slots/<pool>/<index>`), each naming its holder and when its hold expires, so the slot of a holder that
//! never comes back is free again once the hold expires. Taking and giving back a slot are ops of the caller's
//! own transaction: the slot and what it paces are written in one atomic commit, so no instant has one without
//! the other, and two replicas that both see a free slot cannot both take it (the op is a compare-and-swap on
//! that key). The decisions are pure ([`decide_take`], [`decide_release`], [`decide_sweep`]) over the pool as
//! loaded ([`load`]).

use inplace_store::{Precondition, Revision, Store, TxnOp};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::db::Put;
use super::error::DispatchError;
use super::keys::{SLOTS_PREFIX, slot_key};

/// Largest pool a limit may ask for: the decisions walk every index up to the limit.
pub const MAX_SLOTS: u32 = 10_000;

/// A pool: its name (a key segment) and how many holders it admits at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool<'a> {
    /// The pool's name, e.g. `agent-upgrades`.
    pub name: &'a str,
    /// Most live holders at once (at most [`MAX_SLOTS`]).
    pub limit: u32,
}

/// One slot's record: who holds it and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotHold {
    /// The holder (for agent upgrades, the Machine `namespace/name`).
    pub holder: String,
    /// When it was taken (Unix ms).
    pub taken_ms: u64,
    /// When the hold expires and the slot is free again, given back or not (Unix ms).
    pub expires_ms: u64,
}

/// One stored slot of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its index in the pool.
    pub index: u32,
    /// Its hold; `None` when the record is unreadable (it then counts as free).
    pub hold: Option<SlotHold>,
    /// The revision it was read at.
    pub revision: Revision,
}

impl Slot {
    /// Whether it is held at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.hold.as_ref().is_some_and(|h| h.expires_ms > now_ms)
    }
}

/// A pool's slots as read from the store (only the slots that exist; a missing index is free).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolView {
    /// The stored slots, by index.
    pub slots: Vec<Slot>,
}

impl PoolView {
    /// How many slots are held at `now_ms` by anyone but `holder`.
    pub fn held_by_others(&self, holder: &str, now_ms: u64) -> u32 {
        let others = self
            .slots
            .iter()
            .filter(|s| s.live(now_ms) && s.hold.as_ref().is_none_or(|h| h.holder != holder));
        u32::try_from(others.count()).unwrap_or(u32::MAX)
    }

    /// How many slots are held at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u32 {
        u32::try_from(self.slots.iter().filter(|s| s.live(now_ms)).count()).unwrap_or(u32::MAX)
    }

    /// The live slot `holder` holds, if any.
    fn of(&self, holder: &str, now_ms: u64) -> Option<&Slot> {
        self.slots
            .iter()
            .find(|s| s.live(now_ms) && s.hold.as_ref().is_some_and(|h| h.holder == holder))
    }
}

/// What taking a slot comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// The holder holds a live slot already; the op writes it again with the new expiry, so the caller's
    /// transaction fails if the slot changed hands since it was read.
    Held(TxnOp),
    /// A free slot: the op takes it (create, or replace an expired or unreadable hold, by compare-and-swap).
    Taken(TxnOp),
    /// Every slot is held by others.
    Full {
        /// How many are held.
        held: u32,
    },
}

/// Takes a slot of `pool` for `holder` until `expires_ms` (or moves the expiry of the one it holds), as seen in
/// `view` at `now_ms`. The free slot it picks
/// is the first at or after a place fixed by the holder's name, so replicas taking slots for different holders
/// at once seldom race for the same key.
pub fn decide_take(
    pool: &Pool,
    view: &PoolView,
    holder: &str,
    now_ms: u64,
    expires_ms: u64,
) -> Result<Take, DispatchError> {
    if let Some(slot) = view.of(holder, now_ms) {
        let hold = SlotHold {
            holder: holder.to_owned(),
            taken_ms: slot.hold.as_ref().map_or(now_ms, |h| h.taken_ms),
            expires_ms,
        };
        return Ok(Take::Held(put(
            pool,
            slot.index,
            &hold,
            Precondition::Revision(slot.revision),
        )?));
    }
    let limit = pool.limit.min(MAX_SLOTS);
    let held = view.held_by_others(holder, now_ms);
    if held >= limit {
        return Ok(Take::Full { held });
    }
    let start = start_index(holder, limit);
    let free = (0..limit).map(|i| (start + i) % limit).find_map(|index| {
        match view.slots.iter().find(|s| s.index == index) {
            None => Some((index, Precondition::Absent)),
            Some(slot) if !slot.live(now_ms) => {
                Some((index, Precondition::Revision(slot.revision)))
            }
            Some(_) => None,
        }
    });
    // Fewer live holders than the limit but no free index below it: holds at indexes above a lowered limit.
    let Some((index, precondition)) = free else {
        return Ok(Take::Full { held });
    };
    let hold = SlotHold {
        holder: holder.to_owned(),
        taken_ms: now_ms,
        expires_ms,
    };
    Ok(Take::Taken(put(pool, index, &hold, precondition)?))
}

/// Gives back every slot of `pool` that `holder` holds (live or expired): deletes, each conditional on the slot
/// being as read, for the caller's transaction.
pub fn decide_release(pool: &Pool, view: &PoolView, holder: &str) -> Vec<TxnOp> {
    view.slots
        .iter()
        .filter(|s| s.hold.as_ref().is_some_and(|h| h.holder == holder))
        .map(|s| {
            TxnOp::delete(
                slot_key(pool.name, s.index),
                Precondition::Revision(s.revision),
            )
        })
        .collect()
}

/// The slots of `pool` the retention sweep deletes at `now_ms`: expired and unreadable ones (free either way).
pub fn decide_sweep(pool: &Pool, view: &PoolView, now_ms: u64) -> Vec<TxnOp> {
    view.slots
        .iter()
        .filter(|s| !s.live(now_ms))
        .map(|s| {
            TxnOp::delete(
                slot_key(pool.name, s.index),
                Precondition::Revision(s.revision),
            )
        })
        .collect()
}

/// Reads every stored slot of the pool `name` (one listing of its prefix).
pub async fn load(store: &dyn Store, name: &str) -> Result<PoolView, DispatchError> {
    let prefix = format!("{SLOTS_PREFIX}{name}/");
    let mut slots = Vec::new();
    for entry in store.list(&prefix).await? {
        let Some(index) = entry
            .key
            .strip_prefix(&prefix)
            .and_then(|i| i.parse::<u32>().ok())
        else {
            continue;
        };
        slots.push(Slot {
            index,
            hold: serde_json::from_slice(&entry.value).ok(),
            revision: entry.revision,
        });
    }
    Ok(PoolView { slots })
}

fn put(
    pool: &Pool,
    index: u32,
    hold: &SlotHold,
    precondition: Precondition,
) -> Result<TxnOp, DispatchError> {
    Ok(Put::of(slot_key(pool.name, index), hold, precondition)?.op())
}

/// Where `holder`'s search for a free slot starts: a digest of its name, modulo the limit.
fn start_index(holder: &str, limit: u32) -> u32 {
    let digest = Sha256::digest(holder.as_bytes());
    let word = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    word % limit.max(1)
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
