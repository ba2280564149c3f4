//! This replica's memory of refused agents, and the decisions it makes about each refusal: log it or not
//! (once per claim and reason per [`REFUSAL_LOG_INTERVAL`], within [`REFUSAL_LOG_LINES_PER_MINUTE`]), write it
//! to the store or not (once per claim per [`REFUSAL_PERSIST_INTERVAL`], sooner on a new reason, within
//! [`REFUSAL_WRITES_PER_MINUTE`]), bounded to [`MAX_TRACKED_REFUSALS`] claims. Pure: no I/O, no clock.

use std::collections::HashMap;

use inplace_agent_api::MachineRef;

use super::refused::{
    AgentRefusalRecord, Claim, MAX_TRACKED_REFUSALS, REFUSAL_LOG_INTERVAL,
    REFUSAL_LOG_LINES_PER_MINUTE, REFUSAL_PERSIST_INTERVAL, REFUSAL_WRITES_PER_MINUTE,
};
use crate::dispatch::upkeep::tokens::AgentRefusalReason;

/// A per-minute budget (also the poll's store-failure log lines', [`super::store_failures`]).
#[derive(Debug, Default)]
pub(super) struct Window {
    start_ms: u64,
    used: u32,
    refused: u64,
}

impl Window {
    /// Takes one unit of the budget; also returns how many were refused in the window that just ended.
    pub(super) fn take(&mut self, now: u64, limit: u32) -> (bool, Option<u64>) {
        let mut ended = None;
        if now.saturating_sub(self.start_ms) >= 60_000 {
            ended = (self.refused > 0).then_some(self.refused);
            *self = Window {
                start_ms: now,
                ..Window::default()
            };
        }
        if self.used < limit {
            self.used += 1;
            (true, ended)
        } else {
            self.refused += 1;
            (false, ended)
        }
    }
}

#[derive(Debug)]
struct Tracked {
    last: AgentRefusalRecord,
    /// When each reason was last logged (index: position in `AgentRefusalReason::ALL`; 0 = never).
    logged_ms: [u64; AgentRefusalReason::ALL.len()],
    persisted_ms: u64,
    persisted_reason: Option<AgentRefusalReason>,
}

/// What to do about one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// Log it.
    pub log: bool,
    /// Write it to the store.
    pub persist: bool,
    /// Lines left out by the global cap in the minute that just ended, to be summed up.
    pub unlogged: Option<u64>,
}

/// This replica's memory of refusals.
#[derive(Debug, Default)]
pub struct RefusalBook {
    claims: HashMap<Claim, Tracked>,
    lines: Window,
    writes: Window,
}

fn slot(reason: AgentRefusalReason) -> usize {
    AgentRefusalReason::ALL
        .iter()
        .position(|r| *r == reason)
        .unwrap_or_default()
}

impl RefusalBook {
    /// Notes a refusal and decides whether to log and persist it.
    pub fn note(&mut self, claim: &Claim, record: &AgentRefusalRecord, now: u64) -> Decision {
        if !self.claims.contains_key(claim) && self.claims.len() >= MAX_TRACKED_REFUSALS {
            let horizon = now.saturating_sub(REFUSAL_LOG_INTERVAL.as_millis() as u64);
            self.claims
                .retain(|_, tracked| tracked.last.at_ms >= horizon);
        }
        let tracked = if self.claims.len() < MAX_TRACKED_REFUSALS || self.claims.contains_key(claim)
        {
            let tracked = self.claims.entry(claim.clone()).or_insert(Tracked {
                last: record.clone(),
                logged_ms: [0; AgentRefusalReason::ALL.len()],
                persisted_ms: 0,
                persisted_reason: None,
            });
            tracked.last = record.clone();
            Some(tracked)
        } else {
            None
        };
        let index = slot(record.reason);
        let log_due = tracked.as_ref().is_none_or(|t| {
            t.logged_ms[index] == 0
                || now.saturating_sub(t.logged_ms[index]) >= REFUSAL_LOG_INTERVAL.as_millis() as u64
        });
        let persist_due = *claim != Claim::Unknown
            && tracked.as_ref().is_some_and(|t| {
                t.persisted_reason != Some(record.reason)
                    || now.saturating_sub(t.persisted_ms)
                        >= REFUSAL_PERSIST_INTERVAL.as_millis() as u64
            });
        let mut decision = Decision::default();
        if log_due {
            let (allowed, unlogged) = self.lines.take(now, REFUSAL_LOG_LINES_PER_MINUTE);
            decision.log = allowed;
            decision.unlogged = unlogged;
        }
        if persist_due {
            decision.persist = self.writes.take(now, REFUSAL_WRITES_PER_MINUTE).0;
        }
        if let Some(tracked) = self.claims.get_mut(claim) {
            if decision.log {
                tracked.logged_ms[index] = now;
            }
            if decision.persist {
                tracked.persisted_ms = now;
                tracked.persisted_reason = Some(record.reason);
            }
        }
        decision
    }

    /// Remembers a refusal under the Machine a provider id resolved to.
    pub fn remember(&mut self, machine: MachineRef, record: AgentRefusalRecord) {
        let claim = Claim::Machine(machine);
        if let Some(tracked) = self.claims.get_mut(&claim) {
            if tracked.last.at_ms <= record.at_ms {
                tracked.last = record;
            }
        } else if self.claims.len() < MAX_TRACKED_REFUSALS {
            self.claims.insert(
                claim,
                Tracked {
                    last: record,
                    logged_ms: [0; AgentRefusalReason::ALL.len()],
                    persisted_ms: 0,
                    persisted_reason: None,
                },
            );
        }
    }

    /// The last refusal of a Machine's claim, if this replica saw one.
    pub fn last_for(&self, machine: &MachineRef) -> Option<AgentRefusalRecord> {
        self.claims
            .get(&Claim::Machine(machine.clone()))
            .map(|t| t.last.clone())
    }

    /// Every remembered claim with its last refusal.
    pub fn all(&self) -> Vec<(Claim, AgentRefusalRecord)> {
        self.claims
            .iter()
            .map(|(claim, tracked)| (claim.clone(), tracked.last.clone()))
            .collect()
    }

    /// Forgets refusals older than `horizon` (Unix ms).
    pub fn forget_before(&mut self, horizon: u64) {
        self.claims
            .retain(|_, tracked| tracked.last.at_ms >= horizon);
    }
}

/// The newer of two refusals.
pub fn newer(
    a: Option<AgentRefusalRecord>,
    b: Option<AgentRefusalRecord>,
) -> Option<AgentRefusalRecord> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at_ms > a.at_ms { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use inplace_agent_api::AgentIdentity;

    use super::*;
    use crate::dispatch::agents::refused::MAX_CLAIM_CHARS;

    fn record(reason: AgentRefusalReason, at_ms: u64) -> AgentRefusalRecord {
        AgentRefusalRecord {
            reason,
            message: "m".into(),
            peer: None,
            at_ms,
        }
    }

    fn machine(name: &str) -> Claim {
        Claim::Machine(MachineRef::new("default", name))
    }

    #[test]
    fn each_claim_and_reason_is_logged_once_a_minute_and_persisted_once_a_minute() {
        let mut book = RefusalBook::default();
        let m = machine("m1");
        let expired = AgentRefusalReason::ExpiredToken;
        let first = book.note(&m, &record(expired, 1_000), 1_000);
        assert_eq!((first.log, first.persist), (true, true));
        let again = book.note(&m, &record(expired, 30_000), 30_000);
        assert_eq!(
            (again.log, again.persist),
            (false, false),
            "within the minute"
        );
        let other = book.note(&m, &record(AgentRefusalReason::OutOfScope, 31_000), 31_000);
        assert_eq!(
            (other.log, other.persist),
            (true, true),
            "a new reason is news at once"
        );
        let later = book.note(&m, &record(expired, 61_000), 61_000);
        assert!(later.log, "a minute after it was last logged");
        assert_eq!(
            book.last_for(&MachineRef::new("default", "m1"))
                .unwrap()
                .at_ms,
            61_000
        );
        let unknown = book.note(
            &Claim::Unknown,
            &record(AgentRefusalReason::MissingToken, 1),
            1,
        );
        assert!(
            unknown.log && !unknown.persist,
            "nothing to key a record by"
        );
    }

    #[test]
    fn global_caps_bound_lines_and_writes_and_report_what_was_left_out() {
        let mut book = RefusalBook::default();
        let reason = AgentRefusalReason::ExpiredToken;
        let mut logged = 0;
        let mut persisted = 0;
        for i in 0..(REFUSAL_LOG_LINES_PER_MINUTE + 50) {
            let decision = book.note(&machine(&format!("m{i}")), &record(reason, 10), 10);
            logged += u32::from(decision.log);
            persisted += u32::from(decision.persist);
        }
        assert_eq!(logged, REFUSAL_LOG_LINES_PER_MINUTE);
        assert_eq!(persisted, REFUSAL_WRITES_PER_MINUTE);
        let next = book.note(&machine("late"), &record(reason, 70_000), 70_000);
        assert!(next.log);
        assert_eq!(next.unlogged, Some(50));
    }

    #[test]
    fn claims_are_bounded_and_cleaned() {
        let claim = Claim::of(Some(&AgentIdentity::Machine(MachineRef::new(
            "default",
            format!("evil\nINFO forged line{}", "x".repeat(1000)),
        ))));
        let Claim::Machine(cleaned) = &claim else {
            panic!("{claim:?}")
        };
        assert!(!cleaned.name.contains('\n'));
        assert_eq!(cleaned.name.chars().count(), MAX_CLAIM_CHARS);
        let mut book = RefusalBook::default();
        for i in 0..MAX_TRACKED_REFUSALS + 10 {
            book.note(
                &machine_claim(i),
                &record(AgentRefusalReason::UnknownToken, 1),
                1,
            );
        }
        assert_eq!(book.claims.len(), MAX_TRACKED_REFUSALS);
        // A minute later the old claims make room for new ones.
        book.note(
            &machine("new"),
            &record(AgentRefusalReason::UnknownToken, 90_000),
            90_000,
        );
        assert!(book.last_for(&MachineRef::new("default", "new")).is_some());
        assert_eq!(book.claims.len(), 1);
    }

    fn machine_claim(i: usize) -> Claim {
        machine(&format!("m{i}"))
    }
}
