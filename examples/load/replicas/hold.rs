//! Phase two: the connected fleet held with no work. Every agent waits in its long-poll on its replica, then
//! renews it; etcd counts the store's writes over the hold after `--settle-seconds` (the steady state), and
//! each replica reports the agents it heard from.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::setup::Fleet;
use super::{ReplicasArgs, TICK};
use crate::store_writes::{Counts, SteadyWrites};

/// The gauge each replica keeps of the agents it has heard from recently.
const AGENTS_CONNECTED_METRIC: &str = "inplace_updater_agents_connected";
/// Longest hold and settling time accepted from the command line, in seconds.
const MAX_HOLD_SECONDS: f64 = 600.0;

/// What the hold measured.
pub struct Held {
    /// etcd's own count of writes (puts and deletes) and reads over the steady-state window, and the window.
    pub steady: (Counts, Duration),
    /// Each replica's `agents_connected` gauge at the end of the hold, in replica order.
    pub gauges: Vec<f64>,
}

/// Holds the fleet for `--idle-seconds` (default: one poll cycle plus 5 s), failing if a child dies.
pub fn hold(fleet: &mut Fleet, args: &ReplicasArgs) -> anyhow::Result<Held> {
    let idle = Duration::from_secs_f64(
        args.idle_seconds
            .unwrap_or(f64::from(args.wait_seconds) + 5.0)
            .clamp(0.0, MAX_HOLD_SECONDS),
    );
    let settle =
        Duration::from_secs_f64(args.settle_seconds.clamp(0.0, MAX_HOLD_SECONDS)).min(idle);
    let held = Instant::now();
    let mut window = SteadyWrites::default();
    while held.elapsed() < idle {
        fleet.check_children()?;
        window.open_once_settled(&fleet.etcd, held.elapsed(), settle)?;
        std::thread::sleep(TICK);
    }
    let steady = window.close(&fleet.etcd)?;
    // Each replica's own count of the agents it heard from (within one long-poll plus grace).
    let gauges = fleet
        .replicas
        .iter()
        .map(|r| {
            r.metric(AGENTS_CONNECTED_METRIC, "")?
                .with_context(|| format!("no {AGENTS_CONNECTED_METRIC} in /metrics"))
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    Ok(Held { steady, gauges })
}
