//! The management-cluster client's metrics: `inplace_updater_management_errors_total{op}` (every failed call to
//! the management cluster's API, by operation: the hook it served answered as without the client) and
//! `inplace_updater_remediation_guards` (skip-remediation guards the store says are held).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The operations on the management cluster's API, as the `op` label spells them.
pub const MANAGEMENT_OPERATIONS: [&str; 4] = [
    "machine-get",
    "machine-patch",
    "event-create",
    "event-patch",
];

/// Labels of `management_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// One of [`MANAGEMENT_OPERATIONS`].
    pub op: &'static str,
}

/// The management-cluster metrics; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ManagementMetrics {
    /// Failed calls by operation.
    pub errors: Family<OpLabels, Counter>,
    /// Skip-remediation guards held (as the store records them).
    pub guards: Gauge,
}

impl ManagementMetrics {
    /// Registers both, every operation shown from the start (at 0).
    pub fn register(&self, registry: &mut Registry) {
        for op in MANAGEMENT_OPERATIONS {
            let _ = self.errors.get_or_create(&OpLabels { op });
        }
        registry.register(
            "management_errors",
            "Failed calls to the management cluster's API, by operation (hooks answered as without the client)",
            self.errors.clone(),
        );
        registry.register(
            "remediation_guards",
            "Machines whose skip-remediation guard the updater holds (recorded in the store)",
            self.guards.clone(),
        );
    }
}
