//! Prometheus metrics: hook calls by hook and status, latency histograms, verdicts, TLS reloads, panics,
//! UpdateMachine calls refused because no CanUpdate answer accepted their desired state; plus the fleet and
//! store metrics of [`crate::observe`], `build_info`, and the unprefixed `process_*` metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::api::Hook;
use crate::observe::{FleetMetrics, ManagementMetrics, ProcessCollector, StoreMetrics};

/// Labels of `hook_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Hook name, e.g. `CanUpdateMachine`.
    pub hook: &'static str,
    /// `Success`, `Failure`, or an HTTP-level refusal such as `Unauthorized`.
    pub status: &'static str,
}

/// Labels of `hook_verdicts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    /// Hook name.
    pub hook: &'static str,
    /// e.g. `in-place`, `rollout`, `refused`, `bad-request`, `in-progress`, `done`, `failed`.
    pub verdict: &'static str,
}

/// Labels carrying only the hook name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// Hook name.
    pub hook: &'static str,
}

/// Labels of `unjudged_updates_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `changed-after-judgement`, `not-in-place` or `no-verdict`.
    pub reason: &'static str,
}

/// Labels of `tls_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `error`.
    pub result: &'static str,
}

fn new_histogram() -> Histogram {
    // 0.25 ms .. ~16 s: the fast path is sub-millisecond, the ceiling is CAPI's 30 s maximum timeout.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 17))
}

/// Every metric the server exports, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The standard `process_*` metrics, which carry no prefix.
    process: Registry,
    /// Updates, steps and agents.
    pub fleet: FleetMetrics,
    /// Store latency (handed to the [`crate::observe::InstrumentedStore`] wrapping `--store`).
    pub store: StoreMetrics,
    /// The management-cluster client: failed calls, guards held.
    pub management: ManagementMetrics,
    /// The Events on Machines: sent and dropped.
    pub events: crate::mgmt::events::metrics::EventMetrics,
    /// Hook calls by hook and status.
    pub calls: Family<CallLabels, Counter>,
    /// Hook verdicts by hook and verdict.
    pub verdicts: Family<VerdictLabels, Counter>,
    /// Hook latency in seconds.
    pub duration: Family<HookLabels, Histogram, fn() -> Histogram>,
    /// Answers our own self-check caught before CAPI could mis-read them (always a bug).
    pub self_check_failures: Counter,
    /// Handler panics turned into Failure answers (always a bug).
    pub panics: Counter,
    /// Certificate reloads by result.
    pub tls_reloads: Family<ResultLabels, Counter>,
    /// Hook calls being answered right now.
    pub in_flight: Gauge,
    /// UpdateMachine calls refused for want of a CanUpdate verdict covering their desired state, by reason.
    pub unjudged_updates: Family<ReasonLabels, Counter>,
    /// CanUpdateMachine, CanUpdateMachineSet and UpdateMachine calls answered since start (discovery excluded:
    /// CAPI calls it whatever the namespaces). Zero is what `status` turns into a namespace-selector hint.
    decision_calls: AtomicU64,
    /// Whether this server has answered a Discovery call (the first is logged at info, the rest at debug).
    discovered: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric under the `inplace_updater` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("inplace_updater");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register("hook_calls", "Hook calls by hook and status", calls.clone());
        let verdicts = Family::<VerdictLabels, Counter>::default();
        registry.register(
            "hook_verdicts",
            "Hook answers by hook and verdict",
            verdicts.clone(),
        );
        let duration = Family::<HookLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            new_histogram as fn() -> Histogram,
        );
        registry.register(
            "hook_duration_seconds",
            "Time to answer a hook call",
            duration.clone(),
        );
        let self_check_failures = Counter::default();
        registry.register(
            "self_check_failures",
            "Patches the self-check refused to send (a bug: please report)",
            self_check_failures.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "handler_panics",
            "Handler panics answered as Failure (a bug: please report)",
            panics.clone(),
        );
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tls_reloads",
            "Serving certificate reloads by result",
            tls_reloads.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "hook_calls_in_flight",
            "Hook calls being answered right now",
            in_flight.clone(),
        );
        let fleet = FleetMetrics::new();
        fleet.register(&mut registry);
        let store = StoreMetrics::new();
        store.register(&mut registry);
        let management = ManagementMetrics::default();
        management.register(&mut registry);
        let events = crate::mgmt::events::metrics::EventMetrics::new();
        events.register(&mut registry);
        registry.register(
            "build",
            "The running version: always 1, the facts are its labels",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("os", std::env::consts::OS),
                ("arch", std::env::consts::ARCH),
            ]),
        );
        registry.register_collector(Box::new(crate::observe::logs::LogCollector));
        let mut process = Registry::default();
        process.register_collector(Box::new(ProcessCollector::new()));
        let unjudged_updates = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "unjudged_updates",
            "UpdateMachine calls refused because no CanUpdate answer accepted their desired state in place, by reason",
            unjudged_updates.clone(),
        );
        // Every reason shows from the start (at 0), so an alert on an increase needs no prior refusal.
        for reason in crate::dispatch::RefusalReason::ALL {
            let _ = unjudged_updates.get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            });
        }
        Self {
            process,
            fleet,
            store,
            management,
            events,
            unjudged_updates,
            decision_calls: AtomicU64::new(0),
            discovered: AtomicBool::new(false),
            in_flight,
            registry,
            calls,
            verdicts,
            duration,
            self_check_failures,
            panics,
            tls_reloads,
        }
    }

    /// Records one answered hook call.
    pub fn record_call(
        &self,
        hook: &'static str,
        status: &'static str,
        verdict: &'static str,
        seconds: f64,
    ) {
        self.calls.get_or_create(&CallLabels { hook, status }).inc();
        if hook != Hook::Discovery.name() {
            self.decision_calls.fetch_add(1, Ordering::Relaxed);
        }
        self.verdicts
            .get_or_create(&VerdictLabels { hook, verdict })
            .inc();
        self.duration
            .get_or_create(&HookLabels { hook })
            .observe(seconds);
        if hook == "UpdateMachine"
            && let Some(reason) = crate::dispatch::RefusalReason::ALL
                .into_iter()
                .find(|reason| reason.as_str() == verdict)
        {
            self.unjudged_updates
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .inc();
        }
    }

    /// Whether a Discovery call was answered before this one (marks it answered).
    pub fn discovered_before(&self) -> bool {
        self.discovered.swap(true, Ordering::Relaxed)
    }

    /// CanUpdateMachine, CanUpdateMachineSet and UpdateMachine calls answered since the process started.
    pub fn decision_calls(&self) -> u64 {
        self.decision_calls.load(Ordering::Relaxed)
    }

    /// The registry in Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an error here would be a prometheus-client bug.
        let encoded = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry)
            .and_then(|()| {
                prometheus_client::encoding::text::encode_registry(&mut text, &self.process)
            })
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text));
        if encoded.is_err() {
            text.clear();
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_logs_its_own_first_discovery() {
        // Two servers in one process (as the in-process tests start them): each has its own first call.
        let (one, two) = (Metrics::new(), Metrics::new());
        assert!(!one.discovered_before());
        assert!(one.discovered_before());
        assert!(!two.discovered_before(), "the other server's first call");
        assert!(two.discovered_before());
    }
}
