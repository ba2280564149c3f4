//! Quiet looks: what this replica's last look found for a Machine whose agent had nothing to do (no plan to
//! hand, and its summary of its own run, if it sent one, changed nothing), kept in memory so the agent's next
//! poll reads nothing from the store. An idle fleet's polls are its store's steadiest reads: each agent polls
//! every 30 s, and each poll looked at the Machine's record and its run and folded in the agent's summary —
//! one store read for a Machine never updated, four for one updated before (about 3 300 to 13 300 reads a
//! second at 100 000 agents, with nothing being updated).
//!
//! What keeps a kept look true is the store's change feed, which carries every write of a Machine's record or
//! of one of its runs, by any replica:
//! - every such change forgets the Machine here before its polls are woken ([`super::Agents::changed`]), and a
//!   gap in the feed (lagged, reconnected) forgets every Machine;
//! - a look is kept only when no change of its Machine arrived since before its first read: the ticket
//!   [`QuietLooks::ticket`] hands out is gone once one has;
//! - nothing is kept while the feed is not followed ([`QuietLooks::follow`]).
//!
//! Why the agent's summary can be skipped: folding a summary with no hold to confirm into a run is a function
//! of the two alone (the clock only stamps a run's end, which is a change). The same summary against the same
//! run changes nothing again. A summary that confirms a hold is never kept: the hold it must match moves with
//! the clock (maintenance windows).
//!
//! Bounds: a kept look answers for at most [`QUIET_LOOK_TTL`] (a belt over the feed), and a replica keeps at
//! most [`QUIET_LOOKS_MAX`] Machines (then it starts over: the next polls read the store once each).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use inplace_agent_api::{MachineRef, PlanProgress};

/// How long a kept look answers an agent's polls without a store read, even though the change feed said
/// nothing about its Machine. Ten minutes: twenty polls of an idle agent.
pub const QUIET_LOOK_TTL: Duration = Duration::from_secs(600);

/// Most Machines whose quiet look one replica keeps. A replica serving a third of 100 000 agents keeps about
/// 33 000; past this bound the book starts over (a burst of one store read per agent, as before it was kept).
pub const QUIET_LOOKS_MAX: usize = 200_000;

/// What a look found for a Machine whose agent had nothing to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Quiet {
    /// The cluster of the Machine's record, which scope checks read (`None`: it has no record).
    pub cluster: Option<String>,
    /// The summary the agent sent with that look (`None`: none), already folded in with nothing changed.
    pub absorbed: Option<PlanProgress>,
    /// When the look read the store (Unix ms).
    pub at_ms: u64,
}

impl Quiet {
    /// Whether a look that found no plan, after folding in `absorbed` with no write, may be kept: not when the
    /// summary confirms a hold (the hold it must match depends on the clock).
    pub fn worth_keeping(absorbed: Option<&PlanProgress>) -> bool {
        absorbed.is_none_or(|progress| progress.hold.is_none())
    }

    /// Whether this look answers a poll whose agent sends `current`, at `now_ms`: the same summary as it
    /// absorbed, within [`QUIET_LOOK_TTL`].
    pub fn answers(&self, current: Option<&PlanProgress>, now_ms: u64) -> bool {
        let ttl = u64::try_from(QUIET_LOOK_TTL.as_millis()).unwrap_or(u64::MAX);
        now_ms.saturating_sub(self.at_ms) < ttl && self.absorbed.as_ref() == current
    }
}

/// A Machine's place in the book.
#[derive(Debug)]
enum Slot {
    /// A look started reading the store with this ticket.
    Reading(u64),
    /// A kept look.
    Kept(Quiet),
}

/// The ticket a look takes before its first store read; its result is kept only if the ticket is still the
/// Machine's when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Debug, Default)]
struct Book {
    slots: HashMap<MachineRef, Slot>,
    next: u64,
}

/// This replica's quiet looks.
#[derive(Debug, Default)]
pub struct QuietLooks {
    book: Mutex<Book>,
    /// Whether the change feed is followed (nothing is kept otherwise).
    following: AtomicBool,
}

impl QuietLooks {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The change feed is followed from now on (`true`), or no longer (`false`: everything kept is forgotten).
    pub fn follow(&self, following: bool) {
        self.following.store(following, Ordering::SeqCst);
        if !following {
            self.forget_all();
        }
    }

    /// The kept look that answers a poll of `machine`'s agent sending `current` at `now_ms`.
    pub fn kept(
        &self,
        machine: &MachineRef,
        current: Option<&PlanProgress>,
        now_ms: u64,
    ) -> Option<Quiet> {
        match self.book().slots.get(machine) {
            Some(Slot::Kept(quiet)) if quiet.answers(current, now_ms) => Some(quiet.clone()),
            _ => None,
        }
    }

    /// A ticket for a look of `machine` about to read the store (`None`: the feed is not followed, nothing
    /// will be kept). Taken before the first read, so a change that lands after it is seen as such.
    pub fn ticket(&self, machine: &MachineRef) -> Option<Ticket> {
        if !self.following.load(Ordering::SeqCst) {
            return None;
        }
        let mut book = self.book();
        book.next += 1;
        let ticket = book.next;
        if book.slots.len() >= QUIET_LOOKS_MAX && !book.slots.contains_key(machine) {
            book.slots.clear();
        }
        book.slots.insert(machine.clone(), Slot::Reading(ticket));
        Some(Ticket(ticket))
    }

    /// Keeps `quiet` for `machine` if `ticket` is still its own: no change of the Machine arrived since it was
    /// taken (and no later look took another). Returns whether it was kept.
    pub fn keep(&self, machine: &MachineRef, ticket: Ticket, quiet: Quiet) -> bool {
        let mut book = self.book();
        match book.slots.get_mut(machine) {
            Some(slot) if matches!(*slot, Slot::Reading(t) if t == ticket.0) => {
                *slot = Slot::Kept(quiet);
                true
            }
            _ => false,
        }
    }

    /// `machine`'s record or one of its runs changed: its next look reads the store.
    pub fn forget(&self, machine: &MachineRef) {
        self.book().slots.remove(machine);
    }

    /// Anything may have changed (a gap in the feed): every next look reads the store.
    pub fn forget_all(&self) {
        self.book().slots.clear();
    }

    /// How many Machines have a kept look.
    pub fn len(&self) -> usize {
        self.book()
            .slots
            .values()
            .filter(|slot| matches!(slot, Slot::Kept(_)))
            .count()
    }

    /// Whether no look is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use inplace_agent_api::{Hold, HoldReason, PlanStatus};

    use super::*;

    fn machine(name: &str) -> MachineRef {
        MachineRef::new("default", name)
    }

    fn progress(plan: &str) -> PlanProgress {
        PlanProgress {
            plan_id: plan.into(),
            status: PlanStatus::Succeeded,
            succeeded_steps: 2,
            total_steps: 2,
            failed_step: None,
            hold: None,
            rollback: None,
        }
    }

    fn quiet(absorbed: Option<PlanProgress>, at_ms: u64) -> Quiet {
        Quiet {
            cluster: None,
            absorbed,
            at_ms,
        }
    }

    fn followed() -> QuietLooks {
        let looks = QuietLooks::default();
        looks.follow(true);
        looks
    }

    #[test]
    fn a_kept_look_answers_the_same_summary_until_its_time_is_up() {
        let looks = followed();
        let m = machine("m-1");
        let ticket = looks.ticket(&m).unwrap();
        assert!(looks.keep(&m, ticket, quiet(Some(progress("p-1")), 1_000)));
        assert!(looks.kept(&m, Some(&progress("p-1")), 1_000).is_some());
        let ttl = QUIET_LOOK_TTL.as_millis() as u64;
        assert!(
            looks
                .kept(&m, Some(&progress("p-1")), 1_000 + ttl - 1)
                .is_some()
        );
        assert!(
            looks
                .kept(&m, Some(&progress("p-1")), 1_000 + ttl)
                .is_none(),
            "past its TTL the look reads the store again"
        );
        assert!(
            looks.kept(&m, Some(&progress("p-2")), 1_000).is_none(),
            "another summary was never folded in"
        );
        assert!(
            looks.kept(&m, None, 1_000).is_none(),
            "no summary is another poll"
        );
        let mut running = progress("p-1");
        running.status = PlanStatus::Running;
        assert!(looks.kept(&m, Some(&running), 1_000).is_none());
    }

    #[test]
    fn a_change_that_lands_during_the_reads_keeps_nothing() {
        let looks = followed();
        let m = machine("m-1");
        let ticket = looks.ticket(&m).unwrap();
        looks.forget(&m);
        assert!(!looks.keep(&m, ticket, quiet(None, 1)));
        assert!(looks.kept(&m, None, 1).is_none());

        let ticket = looks.ticket(&m).unwrap();
        looks.forget_all();
        assert!(
            !looks.keep(&m, ticket, quiet(None, 1)),
            "a gap in the feed voids every ticket"
        );

        let older = looks.ticket(&m).unwrap();
        let newer = looks.ticket(&m).unwrap();
        assert!(
            !looks.keep(&m, older, quiet(None, 1)),
            "a later look's ticket replaces an earlier one"
        );
        assert!(looks.keep(&m, newer, quiet(None, 1)));
        assert_eq!(looks.len(), 1);
    }

    #[test]
    fn a_change_forgets_a_kept_look_and_only_that_machines() {
        let looks = followed();
        for name in ["m-1", "m-2"] {
            let ticket = looks.ticket(&machine(name)).unwrap();
            assert!(looks.keep(&machine(name), ticket, quiet(None, 1)));
        }
        looks.forget(&machine("m-1"));
        assert!(looks.kept(&machine("m-1"), None, 1).is_none());
        assert!(looks.kept(&machine("m-2"), None, 1).is_some());
        looks.forget_all();
        assert!(looks.is_empty());
    }

    #[test]
    fn nothing_is_kept_while_the_feed_is_not_followed() {
        let looks = QuietLooks::default();
        assert!(looks.ticket(&machine("m-1")).is_none());
        looks.follow(true);
        let ticket = looks.ticket(&machine("m-1")).unwrap();
        assert!(looks.keep(&machine("m-1"), ticket, quiet(None, 1)));
        looks.follow(false);
        assert!(
            looks.is_empty(),
            "the feed stopped: what it kept true is forgotten"
        );
        assert!(looks.ticket(&machine("m-1")).is_none());
    }

    #[test]
    fn a_summary_confirming_a_hold_is_not_worth_keeping() {
        assert!(Quiet::worth_keeping(None));
        assert!(Quiet::worth_keeping(Some(&progress("p-1"))));
        let mut holding = progress("p-1");
        holding.hold = Some(Hold {
            plan_id: "p-1".into(),
            reason: HoldReason::Paused { by: "ops".into() },
        });
        assert!(!Quiet::worth_keeping(Some(&holding)));
    }

    #[test]
    fn a_full_book_starts_over() {
        let looks = followed();
        for i in 0..QUIET_LOOKS_MAX {
            let m = machine(&format!("m-{i}"));
            let ticket = looks.ticket(&m).unwrap();
            looks.keep(&m, ticket, quiet(None, 1));
        }
        assert_eq!(looks.len(), QUIET_LOOKS_MAX);
        let last = machine("one-more");
        let ticket = looks.ticket(&last).unwrap();
        assert!(looks.keep(&last, ticket, quiet(None, 1)));
        assert_eq!(looks.len(), 1, "the book started over for the new Machine");
    }
}
