//! A node whose `inplace-updater-agent.service` is played by a supervisor thread doing what systemd does with it:
//! run the real `deploy/node/agent-start`, and start it again after it exits (`Restart=always`). The agent
//! replaces its own executable when the server offers another one, as on a real node (self-upgrade, issue 29).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_updater::cmd::demo::Sandbox;
use sha2::{Digest as _, Sha256};

use super::fleet::Setup;

/// Pause between two starts of a node's unit (systemd's RestartSec, shortened).
pub const RESTART_SEC: Duration = Duration::from_millis(300);

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha(path: &Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

/// The agent's own executable, as agent.env names it.
pub const SELF_BINARY_ENV: &str = "INPLACE_UPDATER_AGENT_SELF_BINARY";

/// The `inplace-agent` this build made: the one a server hands out by default.
pub fn agent_build() -> PathBuf {
    let agent = super::binary().parent().unwrap().join("inplace-agent");
    assert!(
        agent.is_file(),
        "{} (cargo build --release builds it)",
        agent.display()
    );
    agent
}

/// [`agent_build`] and an older build of it: the same program with other bytes (an ELF ignores what follows its
/// sections), written to `dir`. Returns (new, old, their digests).
pub fn agent_builds(dir: &Path) -> (PathBuf, PathBuf, String, String) {
    let agent = agent_build();
    let mut old = std::fs::read(&agent).unwrap();
    old.extend_from_slice(&[0u8; 4096]);
    let old_path = dir.join("inplace-agent-old");
    std::fs::write(&old_path, &old).unwrap();
    (
        agent.clone(),
        old_path,
        sha(&agent),
        hex(&Sha256::digest(&old)),
    )
}

/// One node: its sandbox, its agent binary, and the supervisor thread playing its unit.
pub struct NodeUnit {
    pub name: String,
    pub bin: PathBuf,
    pub sandbox: Sandbox,
    stop: Arc<AtomicBool>,
    child: Arc<Mutex<Option<Child>>>,
    /// Exit codes of the unit's starts.
    pub exits: Arc<Mutex<Vec<Option<i32>>>>,
}

impl NodeUnit {
    /// The node `name` of `setup`'s cluster, its agent (starting as `old`, hard-linked when it can be) polling
    /// `server_url`. With `breaks: Some(sha)`, the binary with that digest cannot start on this node: the test
    /// breaks it the moment it is swapped in.
    pub fn start(
        setup: &Setup,
        server_url: &str,
        name: &str,
        old: &Path,
        breaks: Option<String>,
    ) -> NodeUnit {
        Self::start_as(setup, server_url, name, old, breaks, SELF_BINARY_ENV)
    }

    /// [`NodeUnit::start`] with the agent's own executable set under `binary_env` (a node's agent.env from
    /// before a rename).
    pub fn start_as(
        setup: &Setup,
        server_url: &str,
        name: &str,
        old: &Path,
        breaks: Option<String>,
        binary_env: &str,
    ) -> NodeUnit {
        let dir = setup.dir.path().join(name);
        let sandbox = Sandbox::create(&dir, "v1.33.4", false).unwrap();
        let bin = dir.join("bin").join("inplace-agent");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        if std::fs::hard_link(old, &bin).is_err() {
            std::fs::copy(old, &bin).unwrap();
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.join("agent.log");
        let envs: Vec<(String, String)> = [
            ("INPLACE_UPDATER_AGENT_SERVER", server_url.to_string()),
            (
                "INPLACE_UPDATER_AGENT_CA_FILE",
                setup.certs.paths.ca_cert.display().to_string(),
            ),
            (
                "INPLACE_UPDATER_AGENT_TOKEN_FILE",
                setup.token_file.display().to_string(),
            ),
            (
                "INPLACE_UPDATER_AGENT_CONFIG",
                sandbox.config.display().to_string(),
            ),
            (
                "INPLACE_UPDATER_AGENT_STATE_DIR",
                sandbox.state_dir.display().to_string(),
            ),
            (
                "INPLACE_UPDATER_AGENT_ROOT",
                sandbox.root.display().to_string(),
            ),
            ("INPLACE_UPDATER_AGENT_MACHINE", format!("default/{name}")),
            (binary_env, bin.display().to_string()),
            ("INPLACE_UPDATER_AGENT_POLL_WAIT", "2".into()),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
        let node = NodeUnit {
            name: name.to_string(),
            bin: bin.clone(),
            sandbox,
            stop: Arc::default(),
            child: Arc::default(),
            exits: Arc::default(),
        };
        let (stop, child, exits) = (node.stop.clone(), node.child.clone(), node.exits.clone());
        std::thread::spawn(move || {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/node/agent-start");
            while !stop.load(Ordering::SeqCst) {
                let out = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap();
                let spawned = Command::new("sh")
                    .arg(script)
                    .envs(envs.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(out.try_clone().unwrap())
                    .stderr(out)
                    .spawn()
                    .unwrap();
                *child.lock().unwrap() = Some(spawned);
                let code = loop {
                    let mut guard = child.lock().unwrap();
                    let Some(running) = guard.as_mut() else {
                        return;
                    };
                    if let Some(status) = running.try_wait().unwrap() {
                        break status.code();
                    }
                    drop(guard);
                    std::thread::sleep(Duration::from_millis(50));
                };
                exits.lock().unwrap().push(code);
                if breaks.as_deref().is_some_and(|bad| sha(&bin) == bad) {
                    std::fs::write(
                        &bin,
                        b"#!/bin/sh\necho 'cannot execute binary file' >&2\nexit 126\n",
                    )
                    .unwrap();
                }
                std::thread::sleep(RESTART_SEC);
            }
        });
        node
    }

    /// The agent's self-upgrade trial file: present from just before the swap until the new binary reached the
    /// server.
    pub fn trial_file(&self) -> PathBuf {
        self.sandbox.state_dir.join("agent-upgrade.trial")
    }

    pub fn log(&self) -> String {
        let log = self.sandbox.root.parent().unwrap().join("agent.log");
        std::fs::read_to_string(log).unwrap_or_default()
    }

    /// How many starts of the unit ended with `code`.
    pub fn exits_with(&self, code: i32) -> usize {
        self.exits
            .lock()
            .unwrap()
            .iter()
            .filter(|c| **c == Some(code))
            .count()
    }
}

impl Drop for NodeUnit {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
