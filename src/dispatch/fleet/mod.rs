//! The fleet wing: what operators see of every Machine and what dispatch learns from all of them — the census
//! of each Machine's current update (kept from the change feed, for `inplace_updater_updates{state}` and the
//! stalled-update gauges), `status` and the retention sweep of finished runs, the step metrics, and the step
//! durations learned from agents' reports that pace adaptive `retryAfterSeconds`.

mod census;
pub mod pace;
mod status;

use std::sync::{Mutex, MutexGuard, PoisonError};

use inplace_agent_api::{MachineRef, StepKind};

pub use census::UpdateState;
pub use census::follow::{CENSUS_READS_IN_FLIGHT, CENSUS_RETRY};
pub use status::{StatusRow, StatusState};

use super::floor::Floor;
use crate::observe::{FleetMetrics, ReasonLabels};

/// The fleet wing.
pub struct Fleet {
    floor: Floor,
    metrics: FleetMetrics,
    census: Mutex<census::Census>,
    /// Step durations learned from the steps this replica saw succeed (for adaptive `retryAfterSeconds`).
    durations: Mutex<pace::StepDurations>,
}

impl Fleet {
    /// The wing over `floor`, recording into `metrics`; every refusal reason's series exists from the start
    /// (a rate over a series that appears with its first refusal misses that refusal).
    pub fn new(floor: Floor, metrics: FleetMetrics, refusal_reasons: &[&'static str]) -> Fleet {
        for reason in refusal_reasons {
            drop(
                metrics
                    .auth_failures
                    .get_or_create(&ReasonLabels { reason }),
            );
        }
        Fleet {
            floor,
            metrics,
            census: Mutex::default(),
            durations: Mutex::default(),
        }
    }

    /// The metrics it records into.
    pub fn metrics(&self) -> &FleetMetrics {
        &self.metrics
    }

    /// Counts a step that ended after `millis` (as the agent measured it), and learns its duration when it
    /// succeeded.
    pub fn step_finished(&self, kind: StepKind, millis: Option<u64>, failed: bool) {
        self.metrics
            .step_finished(kind.wire(), millis.map(|ms| ms as f64 / 1000.0), failed);
        if let (false, Some(ms)) = (failed, millis) {
            self.learning().learn(kind, ms);
        }
    }

    /// Counts a rollback that ended (`rolled_back`: the node verified as before; else left cordoned).
    pub fn rollback_ended(&self, rolled_back: bool) {
        self.metrics.rollback_ended(rolled_back);
    }

    /// Counts one refused agent request.
    pub fn agent_refused(&self, reason: &'static str) {
        self.metrics
            .auth_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The step durations learned so far (a copy: a small fixed table).
    pub fn durations(&self) -> pace::StepDurations {
        self.learning().clone()
    }

    fn learning(&self) -> MutexGuard<'_, pace::StepDurations> {
        self.durations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The oldest last progress among recorded or running updates (Unix ms).
    pub fn unfinished_update_oldest_progress_ms(&self) -> Option<u64> {
        self.census().oldest_progress()
    }

    /// The oldest last contact among agents that recorded updates wait for (Unix ms); `contact` is what this
    /// replica knows of each agent beyond its record (its own memory, every replica's presence).
    pub fn waited_agent_oldest_contact_ms(
        &self,
        contact: impl Fn(&MachineRef) -> Option<u64>,
    ) -> Option<u64> {
        self.census().oldest_waited_contact(contact)
    }
}
