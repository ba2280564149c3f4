//! The inplace-updater node agent.
//!
//! [`run`] pulls plans from the server over HTTPS (long-poll, outbound only), runs each step
//! through a node-local driver under `--root`, keeps crash-safe progress in `--state-dir`, and
//! reports every step's progress and result. The server never sends shell: a step is a declarative
//! desired state, and the only commands the agent runs are those of its own `--config` file.

mod agent;
pub mod artifact;
mod artifact_config;
mod backoff;
mod backup;
pub mod bootc_stand_in;
mod ca_update;
pub mod cli;
mod client;
mod clock;
mod command;
mod config;
mod diagnose;
mod download;
mod drive;
mod driver_config;
mod driver_env;
mod drivers;
mod executor;
mod fsutil;
mod hex;
mod inventory;
mod limits;
mod node_config;
mod node_sweep;
mod preflight;
mod reboot_config;
mod reboot_decide;
mod retry;
mod rollback;
mod rollback_record;
mod rollback_verify;
mod runtime_config;
mod self_upgrade;
mod sequence_command;
mod sequence_undo;
mod service_config;
mod shutdown;
mod state;
mod state_error;
mod state_full;
mod step_host;
mod sysext;
mod sysext_config;
mod sysext_images;
mod sysext_release;
mod template;
mod token_file;
mod undo_record;
mod unfinished;
mod upkeep;

use std::future::Future;

pub use agent::{AgentError, MIN_POLL_INTERVAL, REQUEST_TIMEOUT, STATE_LOCK_WAIT};
pub use artifact_config::{ARTIFACT_DIR, ARTIFACT_RETENTION};
pub use backoff::{BACKOFF_INITIAL, BACKOFF_MAX};
pub use backup::MAX_BACKUP_PLANS;
pub use ca_update::{CA_FETCH_TIMEOUT, CA_FILE_MODE, CA_RETRY_BACKOFF};
pub use client::{CONNECT_TIMEOUT, ClientError, POOL_IDLE_TIMEOUT, TransportKind};
pub use command::{
    KILL_GRACE, OUTPUT_DRAIN_TIMEOUT, SPAWN_BUSY_DELAY, SPAWN_BUSY_RETRIES, STDOUT_TAIL_MAX_BYTES,
};
pub use config::{AgentConfig, DEFAULT_STATE_DIR};
pub use diagnose::PROBE_TIMEOUT;
pub use download::DOWNLOAD_TIMEOUT;
pub use driver_config::{
    ArtifactsConfig, Check, CommandSequence, CommandSpec, ConfigError, ControlPlaneConfig,
    DriverConfig, EtcdConfig, InventoryConfig, KubeletConfig, KubernetesConfig, MAX_CONFIG_BYTES,
    MirrorConfig, NtpConfig, NtpFlavor, RecordCommand, RecordCondition, SequenceCommand,
    SysextConfig, UndoSequence,
};
pub use drivers::{
    CONTROL_PLANE_COMPONENTS, NODE_STEP_DEADLINE_GRACE, RUNNING_CHECK_TIMEOUT, driver_kinds,
    missing_undos, unconfigured_kinds, unconfigured_optional_kinds,
};
pub use executor::MAX_STEP_ATTEMPTS;
pub use inplace_agent_api as api;
pub use inventory::{AGENT_VERSION, INVENTORY_COMMAND_TIMEOUT};
pub use limits::*;
pub use node_config::{
    DEFAULT_EVICTION_RETRY_MILLIS, DEFAULT_NODE_KUBECONFIG, DEFAULT_NODE_POLL_MILLIS,
    MAX_NODE_INTERVAL_MILLIS, MIN_NODE_INTERVAL_MILLIS, NodeConfig,
};
pub use preflight::{
    DEFAULT_ETCD_CA_FILE, DEFAULT_ETCD_CERT_FILE, DEFAULT_ETCD_ENDPOINT, DEFAULT_ETCD_KEY_FILE,
    ETCD_REQUEST_TIMEOUT, MAX_ETCD_ANSWER_BYTES, NODE_LIST_TIMEOUT, PREFLIGHT_RECHECK,
    PREFLIGHT_WAIT, UNDO_PREFLIGHT_WAIT, control_plane_preflight,
};
pub use reboot_config::{
    DEFAULT_BOOT_ID_FILE, DEFAULT_REBOOT_COMMAND, DEFAULT_REBOOT_REQUIRED_FILE, OsImageConfig,
    RebootConfig, RebootRequired, RequiredCheck,
};
pub use retry::{MAX_RETRY_ATTEMPTS, MAX_RETRY_DELAY_SECONDS, RetryPolicy};
pub use rollback_verify::{
    KUBELET_BEFORE_TIMEOUT, ROLLBACK_UNCORDON_TIMEOUT_SECONDS, ROLLBACK_VERIFY_TIMEOUT_SECONDS,
};
pub use self_upgrade::{
    AGENT_START_TRIAL_STARTS, EXIT_RESTART, OUTCOME_FILE, PREVIOUS_SUFFIX, TRIAL_FILE,
    UPGRADE_RETRY_DELAY, UPGRADE_TRIAL,
};
pub use sequence_undo::{MAX_RECORD_VALUE_BYTES, MAX_RECORDS};
pub use state::{MAX_OUTBOX, StateError};
pub use state_full::{STATE_FULL_RECHECK, STATE_FULL_WAIT};
pub use sysext::{MAX_OS_RELEASE_BYTES, MAX_SYSEXT_OUTPUT_BYTES, SYSEXT_COMMAND_TIMEOUT};
pub use sysext_images::SYSEXT_IMAGE_RETENTION;

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
    let agent = agent::Agent::start(config).await?;
    Ok(agent.run(Box::pin(shutdown)).await)
}

#[cfg(test)]
mod tests;
