//! Node-local drivers: one per step kind, behind the [`Driver`] trait, found through one registry
//! (`registry.rs`). Each converges the node to the step's desired state and is idempotent — a step
//! whose desired state already holds is a no-op success.
//!
//! A new step kind's driver is its own file here plus one line in `registry.rs`. Shared pieces: the
//! step and its result (`step.rs`), the trait and the deadline-bound blocking helpers (`driver.rs`),
//! and the "write a file, journal the owed restart, restart the service" protocol (`restart.rs`).

mod attempts;
mod drain_node;
mod driver;
mod etcd;
mod files;
mod kubelet;
mod kubernetes;
mod node;
mod ntp;
mod prepared;
mod registry;
mod restart;
mod ssh;
mod step;
mod uncordon_node;
mod wait_node_ready;

use std::sync::Arc;

use inplace_agent_api::{StepKind, validate_action};

use crate::driver_config::DriverConfig;

pub(crate) use crate::driver_env::DriverEnv;
pub use node::NODE_STEP_DEADLINE_GRACE;
use registry::driver_for;
pub(crate) use step::{DriverOutcome, ProgressRecorder, ProgressUpdate, StepContext, StepResult};

/// Runs one step through its kind's driver (after validating its action).
pub(crate) async fn execute(env: Arc<DriverEnv>, ctx: StepContext) -> StepResult {
    if let Err(reason) = validate_action(&ctx.step.action) {
        return StepResult::failed(format!("invalid {} step: {reason}", ctx.step.action.kind()));
    }
    match driver_for(ctx.step.action.step_kind()) {
        Some(driver) => driver.run(env, ctx).await,
        None => StepResult::failed("step kind not supported by this agent"),
    }
}

/// The step kinds this agent has a driver for, in registry order.
pub fn driver_kinds() -> Vec<StepKind> {
    registry::all().iter().map(|driver| driver.kind()).collect()
}

/// The kinds whose driver cannot run with `config`, each with the missing `--config` key(s).
pub fn unconfigured_kinds(config: &DriverConfig) -> Vec<(StepKind, String)> {
    registry::all()
        .iter()
        .filter_map(|driver| Some((driver.kind(), driver.unconfigured(config)?)))
        .collect()
}
