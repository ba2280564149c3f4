//! What every simulated agent writes and the scenario reads: the swarm's counters and per-agent instants.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// What every agent writes and the scenario reads. Instants are nanoseconds since `epoch`, plus one, so 0
/// means "not yet".
pub struct Shared {
    pub epoch: Instant,
    pub update_sent: Vec<AtomicU64>,
    pub plan_received: Vec<AtomicU64>,
    pub step_started: Vec<AtomicU64>,
    /// When the agent's report of its last step's success was acknowledged.
    pub last_step_acked: Vec<AtomicU64>,
    /// When the agent's outstanding poll was sent (0: none outstanding).
    pub poll_since: Vec<AtomicU64>,
    pub connected: AtomicUsize,
    pub first_polls: AtomicUsize,
    pub idle_polls: AtomicU64,
    pub longest_idle_poll_ns: AtomicU64,
    pub errors: AtomicU64,
    pub reconnects: AtomicU64,
    pub plans_without_work: AtomicU64,
    /// Polls answered with another status than 200, by status (a subset of `errors`).
    pub refusals: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    /// Failed requests and connects by the replica (index in the agents' [`Route`]) they went to (`errors`
    /// split; refusals are counted with their replica too).
    pub errors_by_replica: std::sync::Mutex<std::collections::BTreeMap<usize, u64>>,
    /// When the agent's last new connection after a failure was first answered (its inventory report
    /// acknowledged), and by which replica: overwritten at every such reconnect.
    pub served_again: Vec<AtomicU64>,
    pub served_by: Vec<AtomicUsize>,
    pub stop: CancellationToken,
}

impl Shared {
    pub fn new(agents: usize) -> Shared {
        let slots = || (0..agents).map(|_| AtomicU64::new(0)).collect();
        Shared {
            epoch: Instant::now(),
            update_sent: slots(),
            plan_received: slots(),
            step_started: slots(),
            last_step_acked: slots(),
            poll_since: slots(),
            connected: AtomicUsize::new(0),
            first_polls: AtomicUsize::new(0),
            idle_polls: AtomicU64::new(0),
            longest_idle_poll_ns: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            plans_without_work: AtomicU64::new(0),
            refusals: std::sync::Mutex::default(),
            errors_by_replica: std::sync::Mutex::default(),
            served_again: slots(),
            served_by: (0..agents).map(|_| AtomicUsize::new(0)).collect(),
            stop: CancellationToken::new(),
        }
    }

    pub fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    pub fn now(&self) -> u64 {
        self.stamp(Instant::now())
    }

    /// Sets a slot once.
    pub fn mark(&self, slots: &[AtomicU64], index: usize) {
        let _ = slots[index].compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// `to - from` of two slots, when both are set.
    pub fn between(from: &AtomicU64, to: &AtomicU64) -> Option<Duration> {
        let (a, b) = (from.load(Ordering::Acquire), to.load(Ordering::Acquire));
        (a != 0 && b != 0).then(|| Duration::from_nanos(b.saturating_sub(a)))
    }

    /// Counts a failed request or connect to replica `replica`.
    pub fn failed(&self, replica: usize) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut by) = self.errors_by_replica.lock() {
            *by.entry(replica).or_default() += 1;
        }
    }

    /// How long the oldest outstanding poll has been waiting.
    pub fn oldest_poll(&self) -> Duration {
        let now = self.now();
        let oldest = self
            .poll_since
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&s| s != 0)
            .min();
        oldest.map_or(Duration::ZERO, |s| {
            Duration::from_nanos(now.saturating_sub(s))
        })
    }
}
