//! The request kinds `load hooks` drives, where each one's bodies come from, and which ceiling each is held
//! against: a hook that must record before it answers (a CanUpdate verdict, a first UpdateMachine's run)
//! against the durable ceiling, a hook that only reads against the parse (or constant) ceiling.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use inplace_updater::api::Hook;

use crate::payloads::{self, Renamed, UpdateTemplate};

/// Machines the "in progress" UpdateMachine row cycles through (each recorded once, then re-asked).
pub const STEADY_MACHINES: usize = 256;

/// Which ceiling a request kind is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Against {
    /// The `--ceiling` choice (parse by default): the hook only reads, or finds its record already stored.
    Read,
    /// The durable ceiling: parse, then one fsync'd small write through the same group commit.
    Durable,
}

/// Where a request kind's bodies come from.
pub enum Bodies {
    /// These, round robin.
    Cycle(Vec<Bytes>),
    /// A fixture renamed on every call: a Machine or MachineSet never seen before.
    Renamed(Renamed),
    /// UpdateMachine for a Machine never seen before (records a new run).
    Fresh(UpdateTemplate),
    /// UpdateMachine for one of `STEADY_MACHINES` already recorded (CAPI re-asking while in progress).
    Steady(Vec<Bytes>),
}

pub struct Workload {
    pub name: &'static str,
    pub path: String,
    pub bodies: Bodies,
    pub against: Against,
    next: AtomicUsize,
}

/// Names of fresh objects never repeat across runs and rounds.
static FRESH: AtomicUsize = AtomicUsize::new(0);

impl Workload {
    fn new(name: &'static str, hook: Hook, against: Against, bodies: Bodies) -> Workload {
        Workload {
            name,
            path: format!("{}?timeout=10s", hook.path()),
            bodies,
            against,
            next: AtomicUsize::new(0),
        }
    }

    pub fn body(&self) -> Bytes {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.bodies {
            Bodies::Cycle(bodies) | Bodies::Steady(bodies) => bodies[i % bodies.len()].clone(),
            Bodies::Renamed(renamed) => {
                let n = FRESH.fetch_add(1, Ordering::Relaxed);
                Bytes::from(renamed.body(&format!("fresh-{n:07}")))
            }
            Bodies::Fresh(template) => {
                let n = FRESH.fetch_add(1, Ordering::Relaxed);
                Bytes::from(template.body(&format!("fresh-{n:07}"), "edge-01"))
            }
        }
    }

    pub fn mean_body_kib(&self) -> f64 {
        let sizes: Vec<usize> = match &self.bodies {
            Bodies::Cycle(b) | Bodies::Steady(b) => b.iter().map(Bytes::len).collect(),
            Bodies::Renamed(r) => vec![r.body("fresh-0000000").len()],
            Bodies::Fresh(t) => vec![t.body("fresh-0000000", "edge-01").len()],
        };
        sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64 / 1024.0
    }
}

/// Every request kind, in the table's order.
pub fn all() -> anyhow::Result<Vec<Workload>> {
    let fixtures = |names: &[&str]| -> anyhow::Result<Vec<Bytes>> {
        names
            .iter()
            .map(|n| payloads::fixture(n).map(Bytes::from))
            .collect()
    };
    let steady = UpdateTemplate::worker()?;
    let steady_bodies = (0..STEADY_MACHINES)
        .map(|i| Bytes::from(steady.body(&format!("steady-{i:04}"), "edge-01")))
        .collect();
    Ok(vec![
        Workload::new(
            "Discovery (the fixed cost of a call)",
            Hook::Discovery,
            Against::Read,
            Bodies::Cycle(fixtures(&["discovery-request.json"])?),
        ),
        Workload::new(
            "CanUpdateMachine, a new Machine each call (records its verdict)",
            Hook::CanUpdateMachine,
            Against::Durable,
            Bodies::Renamed(Renamed::machine("can-update-machine-kcp-version.json")?),
        ),
        Workload::new(
            "CanUpdateMachine, one Machine asked again (its verdict stored)",
            Hook::CanUpdateMachine,
            Against::Durable,
            Bodies::Cycle(fixtures(&["can-update-machine-kcp-version.json"])?),
        ),
        Workload::new(
            "CanUpdateMachineSet, a new MachineSet each call (records its verdict)",
            Hook::CanUpdateMachineSet,
            Against::Durable,
            Bodies::Renamed(Renamed::machine_set("can-update-machineset-md.json")?),
        ),
        Workload::new(
            "CanUpdateMachineSet, one MachineSet asked again (its verdict stored)",
            Hook::CanUpdateMachineSet,
            Against::Durable,
            Bodies::Cycle(fixtures(&["can-update-machineset-md.json"])?),
        ),
        Workload::new(
            "UpdateMachine, new run each call",
            Hook::UpdateMachine,
            Against::Durable,
            Bodies::Fresh(UpdateTemplate::worker()?),
        ),
        Workload::new(
            "UpdateMachine, run in progress",
            Hook::UpdateMachine,
            Against::Read,
            Bodies::Steady(steady_bodies),
        ),
        Workload::new(
            "CanUpdateMachine worst case (200×10 KiB files, 20 changed)",
            Hook::CanUpdateMachine,
            Against::Durable,
            Bodies::Cycle(vec![Bytes::from(payloads::worst_can_update_machine()?)]),
        ),
    ])
}
