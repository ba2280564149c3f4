//! Node-local drivers: one per step kind, behind the [`driver::Driver`] trait, listed once in
//! [`DRIVERS`] (the registry) and looked up by kind. A driver's failure is a [`DriverError`] (`error.rs`),
//! whose text is the step's reported message. Each converges the node to the step's desired
//! state and is idempotent — a step whose desired state already holds is a no-op success.
//!
//! A new step kind's driver is its own file here, its `mod` line and its line in [`DRIVERS`]. Shared
//! pieces: the step and its result (`step.rs`), the trait and the deadline-bound blocking helpers
//! (`driver.rs`), and the "write a file, journal the owed restart, restart the service" protocol
//! (`restart.rs`).

mod attempts;
mod container_runtime;
mod drain_node;
mod driver;
mod error;
mod etcd;
mod fetch_command;
mod files;
mod kubelet;
mod kubernetes;
mod kubernetes_running;
mod kubernetes_undo;
mod node;
mod ntp;
mod os_image;
pub(crate) mod pods_before_drain;
mod prepared;
mod reboot;
mod restart;
mod sequence_run;
mod ssh;
mod step;
mod uncordon_node;
mod undo;
pub(crate) mod unfinished;
mod wait_node_ready;

use std::path::Path;
use std::sync::Arc;

use inplace_agent_api::{StepKind, Undo, validate_action};

use crate::config::{ConfigError, DriverConfig, Section};
pub(crate) use crate::os::driver_env::DriverEnv;
use driver::Driver;
pub(crate) use error::DriverError;
pub use kubernetes_running::{CONTROL_PLANE_COMPONENTS, RUNNING_CHECK_TIMEOUT};
pub use node::NODE_STEP_DEADLINE_GRACE;
pub(crate) use node::{drainer, drive as drive_node, node_kubelet_version, node_name};
pub(crate) use step::{DriverOutcome, ProgressRecorder, ProgressUpdate, StepContext, StepResult};
pub(crate) use undo::{RecordContext, UndoContext, UndoRecord, prune as prune_undo_snapshots};

/// The registry: every driver of this agent, one per step kind.
const DRIVERS: &[&dyn Driver] = &[
    &files::Files,
    &ssh::SshKeys,
    &ntp::Ntp,
    &etcd::EtcdImage,
    &kubelet::KubeletArgs,
    &kubernetes::KubernetesVersion(StepKind::InstallKubeadm),
    &kubernetes::KubernetesVersion(StepKind::KubeadmUpgrade),
    &kubernetes::KubernetesVersion(StepKind::InstallKubelet),
    &container_runtime::ContainerRuntime,
    &drain_node::DrainNode,
    &wait_node_ready::WaitNodeReady,
    &uncordon_node::UncordonNode,
    &reboot::Reboot,
    &os_image::OsImage,
];

/// The driver of `kind`; `None` for a kind this agent has no driver for.
fn driver_for(kind: StepKind) -> Option<&'static dyn Driver> {
    DRIVERS.iter().copied().find(|driver| driver.kind() == kind)
}

/// Runs one step through its kind's driver (after validating its action).
pub(crate) async fn execute(env: Arc<DriverEnv>, ctx: StepContext) -> StepResult {
    if let Err(reason) = validate_action(&ctx.step.action) {
        return StepResult::failed(format!("invalid {} step: {reason}", ctx.step.action.kind()));
    }
    match driver_for(ctx.step.action.step_kind()) {
        Some(driver) => driver.run(env, ctx).await.into(),
        None => StepResult::failed("step kind not supported by this agent"),
    }
}

/// What the undo of the step of `ctx` needs, taken now, before its first effect: the driver's own record
/// (commands it runs), or snapshots of the places it names. `None` when its kind is not undone, its driver has
/// no undo yet, or the step is invalid (it then fails before any effect).
pub(crate) async fn record_undo(
    env: Arc<DriverEnv>,
    ctx: RecordContext,
) -> Result<Option<UndoRecord>, DriverError> {
    let action = ctx.step.action.clone();
    let kind = action.step_kind();
    if kind.undo() != Undo::Restores || validate_action(&action).is_err() {
        return Ok(None);
    }
    let Some(driver) = driver_for(kind) else {
        return Ok(None);
    };
    let (plan_id, index) = (ctx.plan_id.clone(), ctx.index);
    if let Some(record) = driver.record(env.clone(), ctx) {
        return record.await;
    }
    tokio::task::spawn_blocking(move || match driver.undo_places(&env, &action)? {
        Some(places) => undo::take(&env, &plan_id, index, places).map(Some),
        None => Ok(None),
    })
    .await
    .unwrap_or_else(|source| {
        Err(DriverError::Crashed {
            what: "crashed: ",
            source,
        })
    })
}

/// Undoes a step of `kind` through its driver.
pub(crate) async fn execute_undo(
    env: Arc<DriverEnv>,
    kind: StepKind,
    ctx: UndoContext,
) -> StepResult {
    match driver_for(kind) {
        Some(driver) => driver.undo(env, ctx).await.into(),
        None => StepResult::failed("step kind not supported by this agent"),
    }
}

/// The step kinds this agent has a driver for, in registry order.
pub fn driver_kinds() -> Vec<StepKind> {
    DRIVERS.iter().map(|driver| driver.kind()).collect()
}

/// The `--config` sections the drivers declare, in registry order.
fn declared_sections() -> Vec<Section> {
    DRIVERS
        .iter()
        .filter_map(|driver| driver.section())
        .collect()
}

/// The config file as this agent's drivers read it: here, where the drivers are known, so the config module
/// imports none of them.
impl DriverConfig {
    /// Reads and checks a config file, the drivers' own sections with it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_declaring(path, &declared_sections())
    }

    /// Parses and checks YAML text, the drivers' own sections with it.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        Self::from_yaml_declaring(text, &declared_sections())
    }
}

/// The kinds every node must run whose driver cannot run with `config`, each with the missing `--config`
/// key(s). The optional kinds (osImage) are not among them: see [`unconfigured_optional_kinds`].
pub fn unconfigured_kinds(config: &DriverConfig) -> Vec<(StepKind, String)> {
    unconfigured(config, false)
}

/// The optional kinds (only some nodes can run them: osImage) that `config` does not set up, each with the
/// missing key(s): such a node refuses their steps before any effect.
pub fn unconfigured_optional_kinds(config: &DriverConfig) -> Vec<(StepKind, String)> {
    unconfigured(config, true)
}

fn unconfigured(config: &DriverConfig, optional: bool) -> Vec<(StepKind, String)> {
    DRIVERS
        .iter()
        .filter(|driver| driver.optional() == optional)
        .filter_map(|driver| Some((driver.kind(), driver.unconfigured(config)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn one_driver_per_kind() {
        let kinds: BTreeSet<StepKind> = driver_kinds().into_iter().collect();
        assert_eq!(kinds.len(), DRIVERS.len(), "two drivers share a kind");
        assert!(!kinds.contains(&StepKind::Unsupported));
        assert_eq!(
            driver_for(StepKind::Ntp).map(|driver| driver.kind()),
            Some(StepKind::Ntp)
        );
        assert!(driver_for(StepKind::Unsupported).is_none());
    }
}
