//! The demo's agents as child processes: how one is started on its sandbox ([`AgentLaunch`]), and the fake
//! reboot of a sandbox whose agent asked for one ([`reboot_if_asked`]: the agent killed as a power cycle would,
//! a new boot id, the agent started again).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::Sandbox;
use super::setup::DemoError;
use super::setup::setup;

/// What an agent of the demo needs to start: this binary, the server, its CA and the token.
pub(super) struct AgentLaunch {
    pub(super) exe: PathBuf,
    pub(super) server: String,
    pub(super) ca_file: PathBuf,
    pub(super) token_file: PathBuf,
}

impl AgentLaunch {
    /// Starts the agent of Machine `default/<name>` on `sandbox`, its output appended to `<node dir>/agent.log`.
    pub(super) fn spawn(
        &self,
        name: &str,
        sandbox: &Sandbox,
        node_dir: &Path,
    ) -> Result<Child, DemoError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node_dir.join("agent.log"))
            .map_err(setup("agent log"))?;
        Command::new(&self.exe)
            .args([
                "agent",
                "--server",
                &self.server,
                "--tls-server-name",
                "localhost",
            ])
            .arg("--ca-file")
            .arg(&self.ca_file)
            .arg("--token-file")
            .arg(&self.token_file)
            .args(["--machine", &format!("default/{name}")])
            .arg("--config")
            .arg(&sandbox.config)
            .arg("--state-dir")
            .arg(&sandbox.state_dir)
            .arg("--root")
            .arg(&sandbox.root)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(setup("agent log"))?)
            .stderr(log)
            .spawn()
            .map_err(setup("starting an agent"))
    }
}

/// The machine under `agent` reboots when its agent asked (the sandbox's `systemctl reboot`): the agent is
/// killed as a power cycle would, the sandbox boots (a new boot id, the staged OS image), and the agent starts
/// again. Returns the line to print, when it rebooted.
pub(super) fn reboot_if_asked(
    launch: &AgentLaunch,
    name: &str,
    sandbox: &Sandbox,
    agent: &mut Child,
) -> Result<Option<String>, DemoError> {
    if !sandbox.reboot_requested() {
        return Ok(None);
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let before = sandbox.boot_id();
    let after = sandbox.boot().map_err(setup("rebooting a sandbox"))?;
    let node_dir = sandbox.root.parent().unwrap_or(&sandbox.root);
    *agent = launch.spawn(name, sandbox, node_dir)?;
    Ok(Some(format!(
        "the machine reboots (boot id {} → {}), booted {}; its agent starts again",
        before.get(..8).unwrap_or(&before),
        after.get(..8).unwrap_or(&after),
        sandbox.os_image()
    )))
}
