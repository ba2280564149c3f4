//! The fleet's metrics. Counters and histograms are updated where things happen (a step report, a refused
//! agent); the gauges are computed: `updates{state}` by dispatch's census, which follows the store's change feed
//! (see the fleet wing of dispatch), and the agent gauges at scrape time from what this replica knows ([`LiveFleet`]).
//! No series carries a Machine: label values come from small fixed sets, so 30 000 agents cost no more series
//! than three.

use std::sync::{Arc, OnceLock, Weak};

use inplace_agent_api::StepKind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The states `inplace_updater_updates{state}` counts (each Machine's current run). `paused`: held by an
/// operator pause and its agent confirmed it stopped; `cancelled`: ended by an operator cancel;
/// `rolling-back`, `rolled-back`, `rollback-failed`: a step failed and the agent is undoing the run, undid it
/// (node verified as before), or could not (node left cordoned).
pub const UPDATE_STATES: [&str; 9] = [
    "recorded",
    "running",
    "done",
    "failed",
    "paused",
    "cancelled",
    "rolling-back",
    "rolled-back",
    "rollback-failed",
];

/// The states `inplace_updater_changes{state}` counts (each change of a paced registration): `proving` (in its
/// canaries), `open`, `promoted` (past its canaries and soaks by an operator), `halted` (the failure brake or an
/// operator).
pub const CHANGE_STATES: [&str; 4] = ["proving", "open", "promoted", "halted"];

/// The outcomes `inplace_updater_rollbacks_total{outcome}` counts: the node undone and verified, or not (left
/// cordoned).
pub const ROLLBACK_OUTCOMES: [&str; 2] = ["rolled-back", "failed"];

/// The outcomes `inplace_updater_agent_upgrades_total{outcome}` counts: the agent runs the new binary, or it
/// restored its previous one (or never came back).
pub const AGENT_UPGRADE_OUTCOMES: [&str; 2] = ["succeeded", "failed"];

/// Labels of `rollbacks` and `agent_upgrades`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// One of [`ROLLBACK_OUTCOMES`] or [`AGENT_UPGRADE_OUTCOMES`].
    pub outcome: &'static str,
}

/// Labels of the step metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The step kind, e.g. `kubeadmUpgrade`.
    pub kind: &'static str,
}

/// Labels of `agent_auth_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the agent was refused, e.g. `expired-token`.
    pub reason: &'static str,
}

/// Labels of `updates`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// One of [`UPDATE_STATES`].
    pub state: &'static str,
}

/// What this replica knows right now about agents and unfinished updates, read at each scrape.
pub trait LiveFleet: Send + Sync + 'static {
    /// Agents with a request to this replica within one long-poll plus its grace.
    fn agents_connected(&self) -> usize;
    /// The oldest last contact (Unix ms) among the agents that recorded updates wait for (the update's
    /// recording time for an agent never seen); `None` when no update waits for its agent.
    fn waited_agent_oldest_contact_ms(&self) -> Option<u64>;
    /// The oldest last progress (Unix ms: recording, or a step's start or end) among recorded or running
    /// updates; `None` when none is unfinished.
    fn unfinished_update_oldest_progress_ms(&self) -> Option<u64>;
    /// Fleet-wide update budget slots in use, as this replica last read them from the store.
    fn update_slots_in_use(&self) -> u64;
    /// Machines this replica lately answered "waiting for an update slot" (and has not admitted since).
    fn machines_waiting_for_update_slot(&self) -> usize;
}

fn step_histogram() -> Histogram {
    // 0.1 s .. ~55 min: a file write takes milliseconds, `kubeadm upgrade` may take up to its 30 min timeout.
    Histogram::new(exponential_buckets(0.1, 2.0, 16))
}

/// The fleet's metrics; cheap to clone (every handle shares its series).
#[derive(Clone, Debug)]
pub struct FleetMetrics {
    /// Duration of finished steps (as the agent measured them), by kind.
    pub step_duration: Family<KindLabels, Histogram, fn() -> Histogram>,
    /// Failed steps, by kind.
    pub step_failures: Family<KindLabels, Counter>,
    /// Refused agent requests, by reason.
    pub auth_failures: Family<ReasonLabels, Counter>,
    /// Rollbacks that ended, by outcome.
    pub rollbacks: Family<OutcomeLabels, Counter>,
    /// Agent self-upgrades that ended, by outcome.
    pub agent_upgrades: Family<OutcomeLabels, Counter>,
    /// Machines whose current update is in each state.
    pub updates: Family<StateLabels, Gauge>,
    /// Changes of paced registrations in each state.
    pub changes: Family<StateLabels, Gauge>,
    live: Arc<OnceLock<Weak<dyn LiveFleet>>>,
}

impl Default for FleetMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl FleetMetrics {
    /// Every series created at zero, not yet registered anywhere.
    pub fn new() -> Self {
        let metrics = Self {
            step_duration: Family::new_with_constructor(step_histogram as fn() -> Histogram),
            step_failures: Family::default(),
            auth_failures: Family::default(),
            rollbacks: Family::default(),
            agent_upgrades: Family::default(),
            updates: Family::default(),
            changes: Family::default(),
            live: Arc::new(OnceLock::new()),
        };
        // Every kind of the table, so every series exists from the first scrape (a rate over a series that
        // appears with its first failure misses that failure).
        for kind in StepKind::ALL.map(StepKind::wire) {
            drop(metrics.step_duration.get_or_create(&KindLabels { kind }));
            drop(metrics.step_failures.get_or_create(&KindLabels { kind }));
        }
        for outcome in ROLLBACK_OUTCOMES {
            drop(metrics.rollbacks.get_or_create(&OutcomeLabels { outcome }));
        }
        for outcome in AGENT_UPGRADE_OUTCOMES {
            drop(
                metrics
                    .agent_upgrades
                    .get_or_create(&OutcomeLabels { outcome }),
            );
        }
        for state in UPDATE_STATES {
            drop(metrics.updates.get_or_create(&StateLabels { state }));
        }
        for state in CHANGE_STATES {
            drop(metrics.changes.get_or_create(&StateLabels { state }));
        }
        metrics
    }

    /// Registers every series (names get the registry's `inplace_updater` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "updates",
            "Machines whose current in-place update is in each state (from the store, every replica sees all)",
            self.updates.clone(),
        );
        registry.register(
            "changes",
            "Changes of paced registrations in each state (proving, open, promoted, halted), from the store every minute",
            self.changes.clone(),
        );
        registry.register(
            "step_duration_seconds",
            "Duration of finished update steps as the agent measured them, by step kind",
            self.step_duration.clone(),
        );
        registry.register(
            "step_failures",
            "Failed update steps, by step kind",
            self.step_failures.clone(),
        );
        registry.register(
            "rollbacks",
            "Rollbacks of failed updates that ended, by outcome (rolled-back: node verified as before; failed: node \
             left cordoned), counted by the replica that saw the end",
            self.rollbacks.clone(),
        );
        registry.register(
            "agent_upgrades",
            "Agent self-upgrades that ended, by outcome (succeeded: the agent runs the new binary; failed: it \
             restored the previous one or never came back), counted by the replica that saw the end",
            self.agent_upgrades.clone(),
        );
        registry.register(
            "agent_auth_failures",
            "Refused agent requests, by reason",
            self.auth_failures.clone(),
        );
        registry.register_collector(Box::new(LiveCollector(self.live.clone())));
    }

    /// Where the scrape-time gauges come from (the dispatcher); the first call wins.
    pub fn attach(&self, live: Weak<dyn LiveFleet>) {
        let _ = self.live.set(live);
    }

    /// Records one rollback that ended.
    pub fn rollback_ended(&self, rolled_back: bool) {
        let outcome = ROLLBACK_OUTCOMES[usize::from(!rolled_back)];
        self.rollbacks
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Records one agent self-upgrade that ended.
    pub fn agent_upgrade_ended(&self, succeeded: bool) {
        let outcome = AGENT_UPGRADE_OUTCOMES[usize::from(!succeeded)];
        self.agent_upgrades
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Records one finished step.
    pub fn step_finished(&self, kind: &'static str, seconds: Option<f64>, failed: bool) {
        let labels = KindLabels { kind };
        if let Some(seconds) = seconds {
            self.step_duration.get_or_create(&labels).observe(seconds);
        }
        if failed {
            self.step_failures.get_or_create(&labels).inc();
        }
    }
}

/// Encodes the [`LiveFleet`] gauges at scrape time.
struct LiveCollector(Arc<OnceLock<Weak<dyn LiveFleet>>>);

impl std::fmt::Debug for LiveCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveCollector")
    }
}

fn gauge<N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: prometheus_client::encoding::EncodeMetric,
{
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

impl Collector for LiveCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let live = self.0.get().and_then(Weak::upgrade);
        let connected = live.as_ref().map_or(0, |l| l.agents_connected());
        gauge(
            &mut encoder,
            "agents_connected",
            "Agents with a request to this replica within one long-poll plus its grace (sum over replicas)",
            connected as i64,
        )?;
        let Some(live) = live else { return Ok(()) };
        gauge(
            &mut encoder,
            "update_budget_slots_in_use",
            "Fleet-wide update budget slots held by runs in progress, as this replica last read the store (--max-concurrent-updates)",
            live.update_slots_in_use() as i64,
        )?;
        gauge(
            &mut encoder,
            "update_budget_waiting_machines",
            "Machines this replica answered 'waiting for an update slot' lately and has not admitted since (sum over replicas may count a Machine twice)",
            live.machines_waiting_for_update_slot() as i64,
        )?;
        if let Some(ms) = live.waited_agent_oldest_contact_ms() {
            gauge(
                &mut encoder,
                "agent_last_seen_timestamp_seconds",
                "Oldest last contact among the agents that recorded updates wait for (the update's recording time for an agent never seen); absent when none waits",
                ms as f64 / 1000.0,
            )?;
        }
        if let Some(ms) = live.unfinished_update_oldest_progress_ms() {
            gauge(
                &mut encoder,
                "update_stalled_since_timestamp_seconds",
                "Oldest last progress (recording, or a step's start or end) among recorded or running updates; absent when none is unfinished",
                ms as f64 / 1000.0,
            )?;
        }
        Ok(())
    }
}
