//! Node drain for the inplace-updater agent: cordon, evict the node's pods through the Eviction
//! API (PodDisruptionBudgets honoured), wait for them to go, wait for the node to be Ready at a
//! kubelet version, uncordon. It talks to the workload cluster's API server with the node's own
//! kubelet credentials (see SECURITY.md). [`decide`] holds the decisions without I/O; [`drainer`]
//! does the calls; `fake` (feature `test-support`) is a TLS fake of those calls for tests.

pub mod decide;
pub mod drainer;
mod evict;
mod ready;

pub use decide::DrainOptions;
pub use drainer::{DrainError, DrainSummary, Drainer, Timing, client_from_kubeconfig};
pub use evict::keys;
pub use ready::{CONTROL_PLANE_LABEL, MAX_CONTROL_PLANE_NODES, boot_gap, ready_gaps};
#[cfg(feature = "test-support")]
pub mod fake;
