//! The swap and its trial, with the real `agent-start` (deploy/node) doing what the unit does at each start.
//! The "binaries" are shell scripts that print which one they are, so that running `agent-start` shows which
//! binary a node would come back on.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

const OLD: &[u8] = b"#!/bin/sh\necho old\n";
const NEW: &[u8] = b"#!/bin/sh\necho new\n";
/// A new binary that cannot even start.
const BROKEN: &[u8] = b"#!/bin/sh\nexit 3\n";

struct Node {
    _dir: tempfile::TempDir,
    bin: PathBuf,
    state: PathBuf,
    etc: PathBuf,
}

fn sha(bytes: &[u8]) -> String {
    sha256_hex(bytes)
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("inplace-agent");
    let state = dir.path().join("state");
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    for file in ["ca.crt", "token", "agent.yaml"] {
        std::fs::write(etc.join(file), "x").unwrap();
    }
    write_bin(&bin, OLD);
    Node {
        _dir: dir,
        bin,
        state,
        etc,
    }
}

fn write_bin(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn offer(bytes: &[u8]) -> AgentUpgrade {
    AgentUpgrade {
        version: "0.2.0".into(),
        sha256: sha(bytes),
        url: None,
    }
}

impl Node {
    fn me(&self) -> SelfBinary {
        SelfBinary::load(Some(self.bin.clone()), &self.state)
    }

    /// One start by the unit: the real agent-start, which ends by running the binary. Its stdout (`old`,
    /// `new`) or `None` when the binary failed to start.
    fn start(&self) -> Option<String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/node/agent-start");
        let out = Command::new("sh")
            .arg(script)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("INPLACE_UPDATER_AGENT_SERVER", "https://server.example")
            .env("INPLACE_UPDATER_AGENT_CA_FILE", self.etc.join("ca.crt"))
            .env("INPLACE_UPDATER_AGENT_TOKEN_FILE", self.etc.join("token"))
            .env("INPLACE_UPDATER_AGENT_CONFIG", self.etc.join("agent.yaml"))
            .env("INPLACE_UPDATER_AGENT_MACHINE", "default/m-1")
            .env("INPLACE_UPDATER_AGENT_STATE_DIR", &self.state)
            .env("INPLACE_UPDATER_AGENT_SELF_BINARY", &self.bin)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn binary(&self) -> Vec<u8> {
        std::fs::read(&self.bin).unwrap()
    }

    fn trial(&self) -> bool {
        self.state.join(TRIAL_FILE).exists()
    }
}

#[test]
fn the_swap_keeps_the_previous_binary_and_the_new_one_passes_its_trial() {
    let node = node();
    let old = node.me();
    assert_eq!(old.facts(None).sha256, Some(sha(OLD)));
    assert!(old.facts(None).self_upgrade);
    old.install(&offer(NEW), NEW).unwrap();
    assert_eq!(node.binary(), NEW);
    assert_eq!(
        std::fs::read(with_suffix(&node.bin, PREVIOUS_SUFFIX)).unwrap(),
        OLD
    );
    assert!(node.trial());

    // The unit starts agent-start, which runs the new binary and counts the start.
    assert_eq!(node.start().as_deref(), Some("new"));
    let trial = read_mark(&node.state.join(TRIAL_FILE)).unwrap();
    assert_eq!(trial["starts"], "1");
    assert_eq!(trial["target"], sha(NEW));

    let mut new = node.me();
    assert!(
        new.trial_deadline.is_some(),
        "the new binary knows it is on trial"
    );
    new.connected();
    assert!(!node.trial(), "reaching the server ends the trial");
    let told = new.facts(None).upgrade.unwrap();
    assert!(told.succeeded && told.target_sha256 == sha(NEW), "{told:?}");
    // Until the server has seen it, the outcome survives a restart.
    assert_eq!(node.me().facts(None).upgrade, Some(told.clone()));
    new.outcome_seen(Some(&told));
    assert_eq!(node.me().facts(None).upgrade, None);
    // Later starts run the new binary with no trial.
    assert_eq!(node.start().as_deref(), Some("new"));
}

#[test]
fn a_download_that_is_not_the_offered_binary_changes_nothing() {
    let node = node();
    let err = node.me().install(&offer(NEW), BROKEN).unwrap_err();
    assert!(err.to_string().contains(&sha(BROKEN)), "{err}");
    assert_eq!(node.binary(), OLD);
    assert!(!node.trial());
    assert!(!with_suffix(&node.bin, PREVIOUS_SUFFIX).exists());
}

#[test]
fn a_kill_at_any_instant_of_the_swap_comes_back_on_exactly_one_whole_binary() {
    for effects in 0..=3 {
        let node = node();
        node.me()
            .install_effects(&offer(NEW), NEW, effects)
            .unwrap();
        // The process is gone; the unit starts agent-start again.
        let ran = node.start();
        let binary = node.binary();
        let expected: (&[u8], &str) = if effects >= 3 {
            (NEW, "new")
        } else {
            (OLD, "old")
        };
        assert_eq!(binary, expected.0, "after {effects} effects");
        assert_eq!(ran.as_deref(), Some(expected.1), "after {effects} effects");
        let me = node.me();
        if effects >= 3 {
            assert!(
                me.trial_deadline.is_some(),
                "the new binary is on trial after {effects} effects"
            );
        } else {
            assert!(
                !node.trial(),
                "no trial is left behind for the old binary after {effects} effects"
            );
            assert_eq!(
                me.facts(None).upgrade,
                None,
                "nothing to report: the server offers it again"
            );
        }
    }
}

#[test]
fn a_new_binary_that_cannot_start_is_replaced_by_the_previous_one() {
    let node = node();
    node.me().install(&offer(BROKEN), BROKEN).unwrap();
    // Three starts of the broken binary (the unit restarts it), then agent-start restores the previous one.
    for _ in 0..3 {
        assert_eq!(node.start(), None);
        assert_eq!(node.binary(), BROKEN);
    }
    assert_eq!(node.start().as_deref(), Some("old"));
    assert_eq!(node.binary(), OLD);
    assert!(!node.trial());
    let told = node.me().facts(None).upgrade.unwrap();
    assert!(!told.succeeded);
    assert_eq!(told.target_sha256, sha(BROKEN));
    assert!(
        told.message.contains("restored the previous agent binary"),
        "{}",
        told.message
    );
}

#[test]
fn a_new_binary_that_does_not_reach_the_server_in_time_is_replaced() {
    let node = node();
    node.me().install(&offer(NEW), NEW).unwrap();
    // The trial's deadline has passed (the new binary started but never reached the server).
    let trial = node.state.join(TRIAL_FILE);
    let text = std::fs::read_to_string(&trial).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("deadline=") {
                "deadline=1".to_string()
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&trial, text).unwrap();
    assert!(node.me().trial_expired(), "the new binary exits by itself");
    assert_eq!(node.start().as_deref(), Some("old"));
    assert!(!node.me().facts(None).upgrade.unwrap().succeeded);
}

#[test]
fn agent_start_counts_the_starts_the_agent_documents() {
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/node/agent-start"
    ))
    .unwrap();
    assert!(script.contains(&format!(
        "AGENT_START_TRIAL_STARTS:-{AGENT_START_TRIAL_STARTS}"
    )));
    assert!(
        script.contains(TRIAL_FILE)
            && script.contains(OUTCOME_FILE)
            && script.contains(PREVIOUS_SUFFIX)
    );
}

#[test]
fn without_a_binary_path_the_agent_never_replaces_itself() {
    let node = node();
    let me = SelfBinary::load(None, &node.state);
    assert!(!me.facts(None).self_upgrade);
    assert!(!me.wants(&offer(NEW)));
    me.install(&offer(NEW), NEW).unwrap();
    assert_eq!(node.binary(), OLD);
}
