//! Agent self-upgrade end to end (issue 29), all real processes: a server handing out this build's
//! `inplace-agent`, and three nodes whose units are played by a supervisor thread that does what systemd does
//! with `inplace-updater-agent.service` (run the real `deploy/node/agent-start`, start it again after it exits).
//! The nodes start on an older build of the agent (the same program with other bytes, so another SHA-256). Two
//! upgrade and pass their trial; on the third, the new binary cannot start (the test breaks it as soon as it is
//! swapped in), so agent-start restores the previous one and the agent reports the failure. Upgrades run one at a
//! time (`--agent-upgrade-concurrency 1`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::Duration;

use common::fleet::{Setup, wait_until};
use common::unit::{NodeUnit, SELF_BINARY_ENV, agent_build, agent_builds, sha};
use inplace_agent::cli::DEPRECATED_BINARY_ENV;

const NODES: [&str; 3] = [
    "edge-01-md-0-worker-1",
    "edge-01-md-0-worker-2",
    "edge-01-md-0-worker-3",
];
/// The node whose new binary cannot start.
const BROKEN: &str = "edge-01-md-0-worker-3";

#[test]
fn a_fleet_on_an_older_agent_is_upgraded_one_at_a_time_and_a_binary_that_cannot_start_is_restored()
{
    let setup = Setup::new();
    let (agent, old, new_sha, old_sha) = agent_builds(setup.dir.path());
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
    let url = format!("https://127.0.0.1:{}", server.hooks.port());
    // The first node's agent.env is from before the rename: its own executable under the deprecated name.
    let nodes: Vec<NodeUnit> = NODES
        .iter()
        .map(|name| {
            let breaks = (*name == BROKEN).then(|| new_sha.clone());
            let binary_env = if *name == NODES[0] {
                DEPRECATED_BINARY_ENV
            } else {
                SELF_BINARY_ENV
            };
            NodeUnit::start_as(&setup, &url, name, &old, breaks, binary_env)
        })
        .collect();

    let mut most_upgrading = 0;
    let mut during = None;
    wait_until(
        "two agents on the new binary and the third restored",
        || {
            let status = common::status_text(server.health, &["--agents"]);
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
    let status = common::status_text(server.health, &["--agents"]);
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
    // The deprecated name still works, and the agent says it is deprecated.
    assert!(
        nodes[0]
            .log()
            .contains("INPLACE_UPDATER_AGENT_BINARY is deprecated"),
        "{}",
        nodes[0].log()
    );
    // Every upgraded agent restarted exactly once into its new binary (exit 75), then stayed.
    for node in &nodes[..2] {
        assert_eq!(node.exits_with(75), 1, "{}", node.name);
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

#[tokio::test]
async fn a_server_started_with_a_nodes_environment_serves_its_own_agent_and_says_why() {
    // A node's agent.env from before the rename sets the agent's own executable under the name `serve` read for
    // --agent-binary: the server must not hand out that file.
    let setup = Setup::new();
    let node_binary = setup.dir.path().join("node-inplace-agent");
    std::fs::write(
        &node_binary,
        b"#!/bin/sh\n# a node's agent, not this release's\n",
    )
    .unwrap();
    let args = setup.server_args("memory:");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = common::ServerProcess::start_env(
        &setup.certs.paths,
        &args,
        &[("INPLACE_UPDATER_AGENT_BINARY", &node_binary)],
    );
    let warning = server.wait_for_log("serve ignores it");
    assert!(
        warning.contains("INPLACE_UPDATER_SERVED_AGENT_BINARY"),
        "{warning}"
    );
    let client = common::Client::new(&setup.certs.paths.ca_cert, None, false);
    let token = format!("Bearer {}", setup.token.token);
    let reply = client
        .get_with(
            server.hooks,
            inplace_agent_api::BINARY_PATH,
            &[("authorization", &token)],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers["x-inplace-sha256"].to_str().unwrap(),
        sha(&agent_build()),
        "the inplace-agent beside the server, not the node's file"
    );
}
