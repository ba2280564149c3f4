//! Agent self-upgrade end to end (issue 29), all real processes: a server handing out this build's
//! `inplace-agent`, and three nodes whose units are played by a supervisor thread that does what systemd does
//! with `inplace-updater-agent.service` (run the real `deploy/node/agent-start`, start it again after it exits).
//! The nodes start on an older build of the agent (the same program with other bytes, so another SHA-256). Two
//! upgrade and pass their trial; on the third, the new binary cannot start (the test breaks it as soon as it is
//! swapped in), so agent-start restores the previous one and the agent reports the failure. Upgrades run one at a
//! time (`--agent-upgrade-concurrency 1`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fleet::{Setup, wait_until};
use inplace_updater::cmd::demo::Sandbox;
use sha2::{Digest as _, Sha256};

const NODES: [&str; 3] = [
    "edge-01-md-0-worker-1",
    "edge-01-md-0-worker-2",
    "edge-01-md-0-worker-3",
];
/// The node whose new binary cannot start.
const BROKEN: &str = "edge-01-md-0-worker-3";
/// Pause between two starts of a node's unit (systemd's RestartSec, shortened).
const RESTART_SEC: Duration = Duration::from_millis(300);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha(path: &Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

/// One node: its sandbox, its agent binary, and the supervisor thread playing its systemd unit.
struct Node {
    bin: PathBuf,
    stop: Arc<AtomicBool>,
    child: Arc<Mutex<Option<Child>>>,
    /// Exit codes of the unit's starts.
    exits: Arc<Mutex<Vec<Option<i32>>>>,
    _sandbox: Sandbox,
}

impl Node {
    fn start(setup: &Setup, server_port: u16, name: &str, old: &[u8], new_sha: String) -> Node {
        let dir = setup.dir.path().join(name);
        let sandbox = Sandbox::create(&dir, "v1.33.4", false).unwrap();
        let bin = dir.join("bin").join("inplace-agent");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(&bin, old).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.join("agent.log");
        let envs: Vec<(String, String)> = [
            (
                "INPLACE_UPDATER_AGENT_SERVER",
                format!("https://127.0.0.1:{server_port}"),
            ),
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
            ("INPLACE_UPDATER_AGENT_BINARY", bin.display().to_string()),
            ("INPLACE_UPDATER_AGENT_POLL_WAIT", "2".into()),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
        let node = Node {
            bin: bin.clone(),
            stop: Arc::default(),
            child: Arc::default(),
            exits: Arc::default(),
            _sandbox: sandbox,
        };
        let (stop, child, exits) = (node.stop.clone(), node.child.clone(), node.exits.clone());
        let breaks = name == BROKEN;
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
                // On this node the new binary cannot start: break it the moment it is swapped in.
                if breaks && sha(&bin) == new_sha {
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
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn status_agents(health: std::net::SocketAddr) -> String {
    let out = Command::new(common::binary())
        .args([
            "status",
            "--agents",
            "--server",
            &format!("http://{health}"),
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_fleet_on_an_older_agent_is_upgraded_one_at_a_time_and_a_binary_that_cannot_start_is_restored()
{
    let setup = Setup::new();
    let agent = common::binary().parent().unwrap().join("inplace-agent");
    assert!(
        agent.is_file(),
        "{} (cargo build --release builds it)",
        agent.display()
    );
    let new_sha = sha(&agent);
    // The older build: the same program with other bytes (an ELF ignores what follows its sections).
    let mut old = std::fs::read(&agent).unwrap();
    old.extend_from_slice(&[0u8; 4096]);
    let old_sha = hex(&Sha256::digest(&old));

    let store = format!("file:{}", setup.dir.path().join("data").display());
    let (server, _capi) = setup.serve(
        &store,
        &[
            "--agent-binary",
            &agent.display().to_string(),
            "--agent-upgrade-concurrency",
            "1",
        ],
    );
    let nodes: Vec<Node> = NODES
        .iter()
        .map(|name| Node::start(&setup, server.hooks.port(), name, &old, new_sha.clone()))
        .collect();

    let mut most_upgrading = 0;
    let mut during = None;
    wait_until(
        "two agents on the new binary and the third restored",
        || {
            let status = status_agents(server.health);
            let upgrading = status
                .lines()
                .filter(|l| l.contains("upgrading to"))
                .count();
            most_upgrading = most_upgrading.max(upgrading);
            if upgrading > 0 && during.is_none() {
                during = Some(status.clone());
            }
            let up = status.lines().filter(|l| l.contains("up to date")).count();
            up == 2
                && status
                    .lines()
                    .any(|l| l.contains(BROKEN) && l.contains("failed"))
        },
    );
    let status = status_agents(server.health);
    eprintln!(
        "status --agents during the rollout:\n{}\nafter it:\n{status}",
        during.unwrap_or_default()
    );
    assert!(
        most_upgrading <= 1,
        "--agent-upgrade-concurrency 1, but {most_upgrading} upgrading at once"
    );
    for (name, node) in NODES.iter().zip(&nodes) {
        let expected = if *name == BROKEN { &old_sha } else { &new_sha };
        assert_eq!(&sha(&node.bin), expected, "{name}'s binary");
        assert!(
            status
                .lines()
                .any(|l| l.contains(name) && l.contains("connected")),
            "{status}"
        );
    }
    let broken = status.lines().find(|l| l.contains(BROKEN)).unwrap();
    assert!(
        broken.contains("restored the previous agent binary"),
        "{broken}"
    );
    // The broken binary was started and failed before agent-start restored the previous one.
    let exits = nodes[2].exits.lock().unwrap().clone();
    assert!(exits.contains(&Some(126)), "{exits:?}");
    // Every upgraded agent restarted exactly once into its new binary (exit 75), then stayed.
    for node in &nodes[..2] {
        assert_eq!(
            node.exits
                .lock()
                .unwrap()
                .iter()
                .filter(|c| **c == Some(75))
                .count(),
            1
        );
    }
    let metrics = common::plain_get(server.metrics, "/metrics").unwrap().1;
    assert!(
        metrics.contains("inplace_updater_agent_upgrades_total{outcome=\"succeeded\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("inplace_updater_agent_upgrades_total{outcome=\"failed\"} 1"),
        "{metrics}"
    );
    // The failed agent is not offered the same binary again: it stays on the old one.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sha(&nodes[2].bin), old_sha);
}
