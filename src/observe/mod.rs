//! Observability that is not about one hook call: the fleet's metrics (updates by state, step durations and
//! failures, agents, refused agents), store latency through an instrumenting [`Store`](inplace_store::Store)
//! decorator, the standard `process_*` metrics read from `/proc`, and `build_info`. The hook metrics and the
//! registry that encodes everything live in [`crate::server::metrics`].

mod fleet;
pub mod logs;
mod management;
mod process;
mod store;

pub use fleet::{
    CHANGE_STATES, FleetMetrics, KindLabels, LiveFleet, OutcomeLabels, ROLLBACK_OUTCOMES,
    ReasonLabels, StateLabels, UPDATE_STATES,
};
pub use management::{MANAGEMENT_OPERATIONS, ManagementMetrics, OpLabels};
pub use process::ProcessCollector;
pub use store::{InstrumentedStore, STORE_OPERATIONS, StoreLabels, StoreMetrics, backend_name};
