//! The Events' own metrics: `inplace_updater_events_sent_total{reason}` (API writes that succeeded, by Event
//! reason) and `inplace_updater_events_dropped_total{reason}` (occurrences not sent, by why: a rate bound, the
//! queue, an API error, an eviction), all created at zero. `inplace-updater status` shows the dropped ones.

use std::collections::BTreeMap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::aggregate::Dropped;
use crate::dispatch::floor::outbox::Reason;

/// Labels of both counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventReasonLabels {
    /// An Event reason (sent) or a [`Dropped`] reason.
    pub reason: &'static str,
}

/// The counters, shared by the queue and the sender.
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    sent: Family<EventReasonLabels, Counter>,
    dropped: Family<EventReasonLabels, Counter>,
}

impl EventMetrics {
    /// Every series at zero.
    pub fn new() -> EventMetrics {
        let metrics = EventMetrics::default();
        for reason in Reason::ALL {
            drop(metrics.sent.get_or_create(&EventReasonLabels {
                reason: reason.as_str(),
            }));
        }
        for reason in Dropped::ALL {
            drop(metrics.dropped.get_or_create(&EventReasonLabels {
                reason: reason.as_str(),
            }));
        }
        metrics
    }

    /// Registers both counters (names get the registry's `inplace_updater` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "events_sent",
            "Kubernetes Events written to the management cluster (created, or a series count patched), by Event reason",
            self.sent.clone(),
        );
        registry.register(
            "events_dropped",
            "Occurrences of Machine Events not sent, by why: machine_rate, fleet_rate (the rate bounds), queue_full, \
             api_error, evicted",
            self.dropped.clone(),
        );
    }

    /// One write of an Event of `reason` succeeded.
    pub fn sent(&self, reason: Reason) {
        self.sent
            .get_or_create(&EventReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// `count` occurrences were dropped for `why`.
    pub fn dropped(&self, why: Dropped, count: u64) {
        self.dropped
            .get_or_create(&EventReasonLabels {
                reason: why.as_str(),
            })
            .inc_by(count);
    }

    /// The dropped counts by reason, for `status`.
    pub fn dropped_counts(&self) -> BTreeMap<String, u64> {
        Dropped::ALL
            .iter()
            .map(|why| {
                let count = self
                    .dropped
                    .get_or_create(&EventReasonLabels {
                        reason: why.as_str(),
                    })
                    .get();
                (why.as_str().to_owned(), count)
            })
            .collect()
    }

    /// The sent count, all reasons.
    pub fn sent_total(&self) -> u64 {
        Reason::ALL
            .iter()
            .map(|reason| {
                self.sent
                    .get_or_create(&EventReasonLabels {
                        reason: reason.as_str(),
                    })
                    .get()
            })
            .sum()
    }
}

/// What `GET /status/events` answers and `inplace-updater status` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventsStatus {
    /// Whether the server sends Events (it has a management cluster).
    pub on: bool,
    /// API writes made (Events created, series counts patched).
    pub sent: u64,
    /// Occurrences not sent, by why.
    pub dropped: BTreeMap<String, u64>,
}

impl EventsStatus {
    /// The status of `metrics`, sending or not.
    pub fn of(on: bool, metrics: &EventMetrics) -> EventsStatus {
        EventsStatus {
            on,
            sent: metrics.sent_total(),
            dropped: metrics.dropped_counts(),
        }
    }

    /// `events: 12 written to the management cluster; dropped: 3 (machine_rate 2, queue_full 1)`.
    pub fn status_line(&self) -> String {
        if !self.on {
            return "events: off (no management cluster: serve --management-kubeconfig or \
                    --management-in-cluster)"
                .into();
        }
        let total: u64 = self.dropped.values().sum();
        let dropped = if total == 0 {
            "none dropped".to_owned()
        } else {
            let parts: Vec<String> = self
                .dropped
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(why, n)| format!("{why} {n}"))
                .collect();
            format!("dropped {total} ({})", parts.join(", "))
        };
        format!(
            "events: {} written to the management cluster; {dropped}",
            self.sent
        )
    }
}
