//! The inventory report: agent version, kubelet/kubeadm versions and the container runtime's (through the
//! configured commands), boot id and hostname, all read under `--root`.

use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, InventoryReport, PlanProgress, RuntimeVersions, truncate_tail,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::runtime::{COMPONENTS, VersionCommands};
use crate::fsutil::read_optional;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::run_command;
use crate::sequence::template::{Vars, expand};

/// Each inventory command gets this long.
pub const INVENTORY_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest value kept per inventory field.
const MAX_FACT_BYTES: usize = 256;

/// The version of this agent build.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Reads the boot id (`reboot.bootIdFile` under the root, `/proc/sys/kernel/random/boot_id` by default: it
/// changes on every boot), the one the reboot steps compare.
pub(crate) fn boot_id(env: &DriverEnv) -> Option<String> {
    read_fact(env, &env.config.reboot.boot_id_file)
}

pub(crate) fn read_fact(env: &DriverEnv, node_path: &str) -> Option<String> {
    let path = env.fs.path(node_path).ok()?;
    let bytes = read_optional(&path, crate::limits::MAX_NODE_FACT_BYTES)
        .ok()
        .flatten()?;
    let text = String::from_utf8_lossy(&bytes);
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| truncate_tail(line, MAX_FACT_BYTES).to_owned())
}

async fn command_fact(env: &DriverEnv, argv: &[String]) -> Option<String> {
    let (_never, mut cancel) = watch::channel(false);
    let deadline = Instant::now() + INVENTORY_COMMAND_TIMEOUT;
    let output = run_command(argv, &env.command_env, deadline, &mut cancel).await;
    if !output.success() {
        return None;
    }
    let line = output.first_line()?;
    Some(truncate_tail(line, MAX_FACT_BYTES).to_owned())
}

/// Gathers the report.
pub(crate) async fn gather(
    env: &DriverEnv,
    agent: AgentIdentity,
    current: Option<PlanProgress>,
    facts: inplace_agent_api::AgentFacts,
) -> InventoryReport {
    let inventory = &env.config.inventory;
    InventoryReport {
        agent,
        agent_version: AGENT_VERSION.to_owned(),
        kubelet_version: command_fact(env, &inventory.kubelet_version).await,
        kubeadm_version: command_fact(env, &inventory.kubeadm_version).await,
        boot_id: boot_id(env),
        hostname: read_fact(env, "/proc/sys/kernel/hostname")
            .or_else(|| read_fact(env, "/etc/hostname")),
        current,
        facts: Some(facts),
        runtime: Some(runtime_versions(env).await),
    }
}

/// The container runtime's versions, through `runtime.versions` (their defaults without a `runtime:` section).
async fn runtime_versions(env: &DriverEnv) -> RuntimeVersions {
    let defaults = VersionCommands::default();
    let commands = env
        .config
        .runtime
        .as_ref()
        .map_or(&defaults, |r| &r.versions);
    let vars = Vars::root_only(&env.fs.root().display().to_string());
    let mut versions = [None, None, None];
    for (slot, name) in versions.iter_mut().zip(COMPONENTS) {
        let argv: Option<Vec<String>> = commands
            .of(name)
            .iter()
            .map(|a| expand(a, &vars).ok())
            .collect();
        if let Some(argv) = argv {
            *slot = command_fact(env, &argv).await;
        }
    }
    let [containerd, runc, cni_plugins] = versions;
    RuntimeVersions {
        containerd,
        runc,
        cni_plugins,
    }
}
