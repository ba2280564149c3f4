//! Misconfigured agents say what is wrong and how to fix it, each kind of mistake in its own log line: an
//! unknown CA, a certificate name mismatch, the health port, the metrics port, some other plain-HTTP port, an
//! expired, a revoked and an unknown token. A network outage is not a mistake: the agent retries it with
//! back-off, at WARN, and connects when the server is back. Real server and agent processes, real TLS.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ServerProcess, WAIT, binary, certs};
use inplace_updater::cmd::demo::Sandbox;
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use serde_json::Value;

/// One agent process logging JSON to a file.
struct Agent {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(dir: &Path, name: &str, server: &str, ca: &Path, token: &str, extra: &[&str]) -> Self {
        let sandbox = Sandbox::create(&dir.join(name), "v1.33.4", false).unwrap();
        let token_file = dir.join(name).join("token");
        std::fs::write(&token_file, token).unwrap();
        let log = dir.join(name).join("agent.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args(["--log-format", "json", "agent", "--server", server])
            .arg("--ca-file")
            .arg(ca)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--machine", &format!("default/{name}")])
            .arg("--config")
            .arg(&sandbox.config)
            .arg("--state-dir")
            .arg(&sandbox.state_dir)
            .arg("--root")
            .arg(&sandbox.root)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self {
            name: name.into(),
            child,
            log,
        }
    }

    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn with_message(&self, message: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["fields"]["message"] == message)
            .collect()
    }

    /// Waits for `count` records with this message and returns them.
    fn wait_for(&self, message: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self.with_message(message);
            if found.len() >= count {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no {count}x {message:?}; log: {:#?}",
                self.name,
                self.records()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain-HTTP service that answers 404 to anything (a port that is not ours).
fn plain_http_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
            );
        }
    });
    port
}

const UNKNOWN_CA: &str = "tls: the server's certificate is not signed by the CA in --ca-file";
const NAME_MISMATCH: &str = "tls: the server's certificate is not valid for the name in --server";
const HEALTH_PORT: &str =
    "protocol: --server points at the inplace-updater health port, not the hook port";
const METRICS_PORT: &str =
    "protocol: --server points at the inplace-updater metrics port, not the hook port";
const PLAIN_HTTP: &str =
    "protocol: --server points at a plain-HTTP port; the agent API is HTTPS only";
const EXPIRED: &str = "auth: the server refused the token: it has expired";
const REVOKED: &str = "auth: the server refused the token: it was revoked";
const UNKNOWN_TOKEN: &str =
    "auth: the server refused the token: it is not in the server's token file";
const NETWORK: &str = "network: server unreachable; retrying";
const CONNECTED: &str = "connected to the server";

#[test]
fn each_agent_misconfiguration_has_its_own_line_with_the_fix() {
    let certs = certs();
    let strangers = common::certs();
    let dir = tempfile::tempdir().unwrap();
    let cluster = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    };
    let good = create_token(&cluster, None).unwrap();
    let expired = create_token(
        &cluster,
        Some(time::OffsetDateTime::now_utc() - time::Duration::hours(1)),
    )
    .unwrap();
    let revocable = create_token(&cluster, None).unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(
        &tokens,
        format!("{}\n{}\n{}\n", good.line, expired.line, revocable.line),
    )
    .unwrap();
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--agent-tokens",
            tokens.to_str().unwrap(),
            "--tls-reload-interval",
            "200ms",
        ],
    );
    let ca = &certs.paths.ca_cert;
    let hooks = format!("https://127.0.0.1:{}", server.hooks.port());
    let health = format!("https://127.0.0.1:{}", server.health.port());
    let metrics = format!("https://127.0.0.1:{}", server.metrics.port());
    let plain = format!("https://127.0.0.1:{}", plain_http_port());
    let start = |name: &str, url: &str, ca: &Path, token: &str, extra: &[&str]| {
        Agent::start(dir.path(), name, url, ca, token, extra)
    };

    let cases = [
        (
            start(
                "unknown-ca",
                &hooks,
                &strangers.paths.ca_cert,
                &good.token,
                &[],
            ),
            UNKNOWN_CA,
            "tls",
        ),
        (
            start(
                "name-mismatch",
                &hooks,
                ca,
                &good.token,
                &["--tls-server-name", "not-the-server.example"],
            ),
            NAME_MISMATCH,
            "tls",
        ),
        (
            start("health-port", &health, ca, &good.token, &[]),
            HEALTH_PORT,
            "protocol",
        ),
        (
            start("metrics-port", &metrics, ca, &good.token, &[]),
            METRICS_PORT,
            "protocol",
        ),
        (
            start("plain-http", &plain, ca, &good.token, &[]),
            PLAIN_HTTP,
            "protocol",
        ),
        (
            start("expired-token", &hooks, ca, &expired.token, &[]),
            EXPIRED,
            "auth",
        ),
        (
            start("unknown-token", &hooks, ca, "iu1_never-issued", &[]),
            UNKNOWN_TOKEN,
            "auth",
        ),
    ];
    // Revoked while it runs (short polls, so its next request comes soon after the revocation).
    let revoked = start(
        "revoked-token",
        &hooks,
        ca,
        &revocable.token,
        &["--poll-wait", "1"],
    );
    revoked.wait_for(CONNECTED, 1);
    std::fs::write(&tokens, format!("{}\n{}\n", good.line, expired.line)).unwrap();

    let all = [
        UNKNOWN_CA,
        NAME_MISMATCH,
        HEALTH_PORT,
        METRICS_PORT,
        PLAIN_HTTP,
        EXPIRED,
        REVOKED,
        UNKNOWN_TOKEN,
        NETWORK,
        CONNECTED,
    ];
    let revoked_case = (revoked, REVOKED, "auth");
    for (agent, expected, class) in cases.iter().chain(std::iter::once(&revoked_case)) {
        let record = agent.wait_for(expected, 1).remove(0);
        assert_eq!(record["level"], "ERROR", "{}: {record}", agent.name);
        assert_eq!(
            record["fields"]["class"], *class,
            "{}: {record}",
            agent.name
        );
        let fix = record["fields"]["fix"].as_str().unwrap();
        assert!(fix.len() > 20, "{}: a fix, not a shrug: {fix}", agent.name);
        assert!(
            record["fields"]["retry_in_ms"].as_u64().is_some(),
            "it keeps trying"
        );
        for other in all.iter().filter(|m| *m != expected && **m != CONNECTED) {
            assert!(
                agent.with_message(other).is_empty(),
                "{}: {other:?} is not its problem",
                agent.name
            );
        }
    }
    let unknown_ca = &cases[0].0;
    assert!(
        unknown_ca.with_message(CONNECTED).is_empty(),
        "never connected"
    );
}

#[test]
fn a_network_outage_is_retried_with_back_off_until_the_server_is_back() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let token = create_token(
        &AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        },
        None,
    )
    .unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, format!("{}\n", token.line)).unwrap();
    let port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    let agent = Agent::start(
        dir.path(),
        "outage",
        &format!("https://127.0.0.1:{port}"),
        &certs.paths.ca_cert,
        &token.token,
        &[],
    );
    let failures = agent.wait_for(NETWORK, 3);
    let delays: Vec<u64> = failures
        .iter()
        .map(|r| r["fields"]["retry_in_ms"].as_u64().unwrap())
        .collect();
    assert!(
        delays.windows(2).all(|w| w[0] <= w[1]) && delays[2] > delays[0],
        "back-off grows: {delays:?}"
    );
    assert!(failures.iter().all(|r| r["level"] == "WARN"));

    let listen = format!("127.0.0.1:{port}");
    let _server = ServerProcess::start_at(
        &certs.paths,
        &listen,
        &["--agent-tokens", tokens.to_str().unwrap()],
        None,
    );
    agent.wait_for(CONNECTED, 1);
    assert!(
        agent.records().iter().all(|r| r["level"] != "ERROR"),
        "an outage is no configuration error: {:#?}",
        agent.records()
    );
}
