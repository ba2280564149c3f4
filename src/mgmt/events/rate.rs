//! The rate bounds on Events: a token bucket per Machine and one for the fleet, as client-go's spam filter
//! bounds each object's Events (a burst, then a slow refill). Pure: the clock is passed in.

use std::collections::HashMap;

use inplace_agent_api::MachineRef;

/// Events one Machine may start at once (client-go's spam filter allows 25 per object).
pub const MACHINE_EVENT_BURST: u32 = 25;
/// How often one Machine gets back the right to one more new Event once its burst is spent (client-go's spam
/// filter: one per 5 minutes).
pub const MACHINE_EVENT_REFILL: std::time::Duration = std::time::Duration::from_secs(300);
/// API writes (new Events and series updates) this process may make at once, fleet-wide.
pub const FLEET_EVENT_BURST: u32 = 500;
/// API writes per second this process sustains fleet-wide once its burst is spent.
pub const FLEET_EVENTS_PER_SECOND: u32 = 20;

/// A token bucket: `capacity` tokens, one more every `refill_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    capacity: u32,
    refill_ms: u64,
    tokens: f64,
    at_ms: u64,
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub fn full(capacity: u32, refill_ms: u64, now_ms: u64) -> Bucket {
        Bucket {
            capacity,
            refill_ms: refill_ms.max(1),
            tokens: f64::from(capacity),
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let gained = now_ms.saturating_sub(self.at_ms) as f64 / self.refill_ms as f64;
        self.tokens = (self.tokens + gained).min(f64::from(self.capacity));
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Whether a token is free at `now_ms` (one is taken when it is).
    pub fn take(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full at `now_ms` (then it is no different from a new one).
    pub fn is_full(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        self.tokens >= f64::from(self.capacity)
    }
}

/// Which bound refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// The Machine's own bucket is empty.
    Machine,
    /// The fleet's bucket is empty.
    Fleet,
}

/// The per-Machine buckets and the fleet's.
#[derive(Debug, Clone)]
pub struct Rates {
    machines: HashMap<MachineRef, Bucket>,
    fleet: Bucket,
}

impl Rates {
    /// Every bucket full at `now_ms`.
    pub fn new(now_ms: u64) -> Rates {
        Rates {
            machines: HashMap::new(),
            fleet: Bucket::full(
                FLEET_EVENT_BURST,
                1000 / u64::from(FLEET_EVENTS_PER_SECOND.max(1)),
                now_ms,
            ),
        }
    }

    fn machine_bucket(now_ms: u64) -> Bucket {
        Bucket::full(
            MACHINE_EVENT_BURST,
            MACHINE_EVENT_REFILL.as_millis() as u64,
            now_ms,
        )
    }

    /// A new Event on `machine` at `now_ms`: takes a token of its bucket and of the fleet's, or neither.
    pub fn new_event(&mut self, machine: &MachineRef, now_ms: u64) -> Result<(), Limited> {
        let bucket = self
            .machines
            .entry(machine.clone())
            .or_insert_with(|| Self::machine_bucket(now_ms));
        let mut probe = *bucket;
        if !probe.take(now_ms) {
            *bucket = probe;
            return Err(Limited::Machine);
        }
        if !self.fleet.take(now_ms) {
            return Err(Limited::Fleet);
        }
        *bucket = probe;
        Ok(())
    }

    /// A series update at `now_ms`: it only takes a token of the fleet's bucket (the Machine's Event exists).
    pub fn series_update(&mut self, now_ms: u64) -> Result<(), Limited> {
        if self.fleet.take(now_ms) {
            Ok(())
        } else {
            Err(Limited::Fleet)
        }
    }

    /// Forgets the Machines whose bucket refilled (a full bucket is a new one): the map holds only Machines
    /// that spent tokens within the last burst's refill time.
    pub fn prune(&mut self, now_ms: u64) {
        self.machines.retain(|_, bucket| !bucket.is_full(now_ms));
    }

    /// How many Machines have a bucket in memory.
    pub fn machines_tracked(&self) -> usize {
        self.machines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_one_per_refill() {
        let mut bucket = Bucket::full(3, 1000, 0);
        assert_eq!((0..5).filter(|_| bucket.take(0)).count(), 3);
        assert!(!bucket.take(999));
        assert!(bucket.take(1000));
        assert!(!bucket.take(1500));
        assert!(bucket.is_full(10_000));
    }

    #[test]
    fn a_machine_spends_its_own_burst_without_touching_another() {
        let (a, b) = (MachineRef::new("ns", "a"), MachineRef::new("ns", "b"));
        let mut rates = Rates::new(0);
        for _ in 0..MACHINE_EVENT_BURST {
            assert_eq!(rates.new_event(&a, 0), Ok(()));
        }
        assert_eq!(rates.new_event(&a, 0), Err(Limited::Machine));
        assert_eq!(rates.new_event(&b, 0), Ok(()));
        let later = MACHINE_EVENT_REFILL.as_millis() as u64;
        assert_eq!(rates.new_event(&a, later), Ok(()));
        rates.prune(later * u64::from(MACHINE_EVENT_BURST) + later);
        assert_eq!(rates.machines_tracked(), 0);
    }

    #[test]
    fn the_fleet_bound_holds_across_machines_and_a_refused_event_costs_the_machine_nothing() {
        let mut rates = Rates::new(0);
        let mut sent = 0;
        for i in 0..(FLEET_EVENT_BURST + 50) {
            if rates
                .new_event(&MachineRef::new("ns", format!("m{i}")), 0)
                .is_ok()
            {
                sent += 1;
            }
        }
        assert_eq!(sent, FLEET_EVENT_BURST);
        let m = MachineRef::new("ns", "m0");
        for _ in 0..MACHINE_EVENT_BURST * 2 {
            assert_eq!(rates.new_event(&m, 0), Err(Limited::Fleet));
        }
        // One second later the fleet has FLEET_EVENTS_PER_SECOND more, and m0 still has its burst but one.
        let mut later = 0;
        for _ in 0..FLEET_EVENTS_PER_SECOND + 5 {
            if rates.new_event(&m, 1000).is_ok() {
                later += 1;
            }
        }
        assert_eq!(later, FLEET_EVENTS_PER_SECOND.min(MACHINE_EVENT_BURST - 1));
        assert_eq!(rates.series_update(1000), Err(Limited::Fleet));
    }
}
