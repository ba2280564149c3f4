//! The inplace-updater node agent.
//!
//! [`run`] pulls plans from the server over HTTPS (long-poll, outbound only), runs each step
//! through a node-local driver under `--root`, keeps crash-safe progress in `--state-dir`, and
//! reports every step's progress and result. The server never sends shell: a step is a declarative
//! desired state, and the only commands the agent runs are those of its own `--config` file.

mod attempt;
mod backoff;
pub mod cli;
mod clock;
mod config;
mod drivers;
mod fsutil;
mod hex;
mod limits;
mod net;
mod os;
mod preflight;
mod retry;
mod rollback;
mod run;
mod sequence;
mod shutdown;
mod state;
mod undo;
mod upkeep;
mod verify;

pub mod artifact;
pub use os::bootc_stand_in;

use std::future::Future;

pub use attempt::MAX_STEP_ATTEMPTS;
pub use attempt::state_full::{STATE_FULL_RECHECK, STATE_FULL_WAIT};
pub use backoff::{BACKOFF_INITIAL, BACKOFF_MAX, Backoff};
pub use config::agent::{AgentConfig, DEFAULT_STATE_DIR};
pub use config::artifact::{ARTIFACT_DIR, ARTIFACT_RETENTION};
pub use config::node::{
    DEFAULT_EVICTION_RETRY_MILLIS, DEFAULT_NODE_KUBECONFIG, DEFAULT_NODE_POLL_MILLIS,
    MAX_NODE_INTERVAL_MILLIS, MIN_NODE_INTERVAL_MILLIS, NodeConfig,
};
pub use config::reboot::{
    DEFAULT_BOOT_ID_FILE, DEFAULT_REBOOT_COMMAND, DEFAULT_REBOOT_REQUIRED_FILE, OsImageConfig,
    RebootConfig, RebootRequired, RequiredCheck,
};
pub use config::verify::{
    DEFAULT_PODS_READY_TIMEOUT_SECONDS, DEFAULT_VERIFY_COMMAND_TIMEOUT_SECONDS,
    DEFAULT_VERIFY_RETRIES, DEFAULT_VERIFY_RETRY_DELAY_SECONDS, MAX_PODS_READY_TIMEOUT_SECONDS,
    MAX_VERIFY_COMMAND_TIMEOUT_SECONDS, MAX_VERIFY_COMMANDS, MAX_VERIFY_RETRIES,
    MAX_VERIFY_RETRY_DELAY_SECONDS,
};
pub use config::{
    ArtifactsConfig, Check, CommandSequence, CommandSpec, ConfigError, ControlPlaneConfig,
    DriverConfig, EtcdConfig, InventoryConfig, KubeletConfig, KubernetesConfig, MAX_CONFIG_BYTES,
    MirrorConfig, NtpConfig, NtpFlavor, RecordCommand, RecordCondition, SequenceCommand,
    SysextConfig, UndoSequence, VerifyCommand, VerifyConfig, missing_undos,
};
pub use config::{
    DEFAULT_ETCD_CA_FILE, DEFAULT_ETCD_CERT_FILE, DEFAULT_ETCD_ENDPOINT, DEFAULT_ETCD_KEY_FILE,
};
pub use drivers::pods_before_drain::MAX_VERIFY_PODS_RECORDED;
pub use drivers::{
    CONTROL_PLANE_COMPONENTS, NODE_STEP_DEADLINE_GRACE, RUNNING_CHECK_TIMEOUT, driver_kinds,
    unconfigured_kinds, unconfigured_optional_kinds,
};
pub use inplace_agent_api as api;
pub use limits::*;
pub use net::client::{CONNECT_TIMEOUT, ClientError, POOL_IDLE_TIMEOUT, TransportKind};
pub use net::diagnose::PROBE_TIMEOUT;
pub use os::inventory::{AGENT_VERSION, INVENTORY_COMMAND_TIMEOUT};
pub use os::sysext::images::SYSEXT_IMAGE_RETENTION;
pub use os::sysext::{MAX_OS_RELEASE_BYTES, MAX_SYSEXT_OUTPUT_BYTES, SYSEXT_COMMAND_TIMEOUT};
pub use preflight::{
    ETCD_REQUEST_TIMEOUT, MAX_ETCD_ANSWER_BYTES, NODE_LIST_TIMEOUT, PREFLIGHT_RECHECK,
    PREFLIGHT_WAIT, UNDO_PREFLIGHT_WAIT, control_plane_preflight,
};
pub use retry::{MAX_RETRY_ATTEMPTS, MAX_RETRY_DELAY_SECONDS, RetryPolicy};
pub use rollback::verify::{
    KUBELET_BEFORE_TIMEOUT, ROLLBACK_UNCORDON_TIMEOUT_SECONDS, ROLLBACK_VERIFY_TIMEOUT_SECONDS,
};
pub use run::agent::{AgentError, MIN_POLL_INTERVAL, REQUEST_TIMEOUT, STATE_LOCK_WAIT};
pub use sequence::process::{
    KILL_GRACE, OUTPUT_DRAIN_TIMEOUT, SPAWN_BUSY_DELAY, SPAWN_BUSY_RETRIES, STDOUT_TAIL_MAX_BYTES,
};
pub use sequence::undo::{MAX_RECORD_VALUE_BYTES, MAX_RECORDS};
pub use state::{MAX_OUTBOX, StateError};
pub use undo::backup::MAX_BACKUP_PLANS;
pub use upkeep::ca_update::{CA_FETCH_TIMEOUT, CA_FILE_MODE, CA_RETRY_BACKOFF};
pub use upkeep::download::DOWNLOAD_TIMEOUT;
pub use upkeep::self_upgrade::{
    AGENT_START_TRIAL_STARTS, EXIT_RESTART, OUTCOME_FILE, PREVIOUS_SUFFIX, TRIAL_FILE,
    UPGRADE_RETRY_DELAY, UPGRADE_TRIAL,
};

/// How a running agent stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `shutdown` completed.
    Shutdown,
    /// It replaced its own binary: the caller exits with [`EXIT_RESTART`] so that the unit starts the new one.
    Restart,
}

/// Runs the agent until `shutdown` completes. Returns an error only when it cannot start (bad
/// `--config`, or none while [`AgentConfig::require_kubernetes_steps`], state dir locked or corrupt, bad
/// server URL or CA file, missing root); once running, network and server errors are retried with back-off
/// (each failed attempt logged as one line saying what kind of failure it is and how to fix it), and step
/// failures are reported, never returned.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Stopped, AgentError> {
    let agent = run::agent::Agent::start(config).await?;
    Ok(agent.run(Box::pin(shutdown)).await)
}

#[cfg(test)]
mod tests;
