//! What an operator sees, end to end with real processes over TLS: refused agents (one per reason) in the
//! server's log, in `/metrics`, in `status --agents` (text and JSON) and in UpdateMachine's "waiting for agent"
//! message; and a step that fails on a real agent counted, timed and logged, with the fleet, store, build and
//! process metrics read from the `/metrics` text of the real server.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use common::fleet::{AgentProcess, Capi, Setup, update_request};
use common::{Client, ServerProcess, WAIT, binary, plain_get};
use inplace_agent_api::{MachineRef, POLL_PATH};
use inplace_updater::cmd::demo::Sandbox;
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);

/// The server of `setup` on an in-memory store, and CAPI calling it.
fn start(setup: &Setup, extra: &[&str]) -> (ServerProcess, Capi) {
    let mut args = setup.server_args("memory:");
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ServerProcess::start(&setup.certs.paths, &args);
    let capi = Capi {
        client: Client::new(&setup.certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };
    (server, capi)
}

fn metrics(server: &ServerProcess) -> String {
    plain_get(server.metrics, "/metrics").unwrap().1
}

/// The value of one series (`name{labels}` exactly as exported).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn status(server: &ServerProcess, extra: &[&str]) -> String {
    let output = Command::new(binary())
        .args(["status", "--agents", "--server"])
        .arg(format!("http://{}", server.health))
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

fn agent_rows(server: &ServerProcess) -> Vec<Value> {
    serde_json::from_str(&status(server, &["--output", "json"])).unwrap()
}

fn row<'a>(rows: &'a [Value], machine: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["machine"] == machine)
        .unwrap_or_else(|| panic!("no row for {machine}: {rows:#?}"))
}

/// The server's JSON log lines whose message is `message`.
fn lines(server: &ServerProcess, message: &str) -> Vec<Value> {
    server
        .logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == message)
        .collect()
}

async fn waiting_message(capi: &Capi, request: &Value) -> String {
    match capi.update_machine(request).await {
        UpdateOutcome::InProgress { message, .. } => message,
        other => panic!("not in progress: {other:?}"),
    }
}

async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn wait_for_agent_line(agent: &AgentProcess, needle: &str) {
    common::fleet::wait_until(&format!("agent log line {needle:?}"), || {
        agent.log().contains(needle)
    });
}

fn poll_body(name: &str) -> Vec<u8> {
    json!({"agent": {"machine": {"namespace": "default", "name": name}}, "waitSeconds": 0})
        .to_string()
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_agents_show_in_logs_metrics_status_and_the_update_message() {
    let started = Instant::now();
    let setup = Setup::new();
    let cluster = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    };
    let expired = create_token(
        &cluster,
        Some(time::OffsetDateTime::now_utc() - time::Duration::hours(1)),
    )
    .unwrap();
    let revocable = create_token(&cluster, None).unwrap();
    let elsewhere = create_token(
        &AgentScope::Machine(MachineRef::new("default", "someone-else")),
        None,
    )
    .unwrap();
    let token_lines = |with_revocable: bool| {
        let mut text = format!(
            "{}\n{}\n{}\n",
            setup.token.line, expired.line, elsewhere.line
        );
        if with_revocable {
            text.push_str(&format!("{}\n", revocable.line));
        }
        text
    };
    std::fs::write(&setup.tokens, token_lines(true)).unwrap();
    let (server, capi) = start(&setup, &["--tls-reload-interval", "200ms"]);
    let ca = &setup.certs.paths.ca_cert;

    // An update waits for its agent, which holds an expired token.
    const WORKER: &str = "edge-01-md-0-x7k2p-observe";
    let request = update_request("update-machine-worker.json", WORKER);
    capi.judges(&request).await;
    let message = waiting_message(&capi, &request).await;
    assert!(message.contains("(last seen: never)"), "{message}");
    let token_file = setup.dir.path().join("worker-token");
    std::fs::write(&token_file, &expired.token).unwrap();
    let sandbox = Sandbox::create(&setup.dir.path().join(WORKER), "v1.33.4", false).unwrap();
    let agent = AgentProcess::start(&server, ca, &token_file, WORKER, sandbox);
    let mut message = String::new();
    eventually(
        "UpdateMachine to say why the agent is missing",
        async || {
            message = waiting_message(&capi, &request).await;
            message.contains("refused")
        },
    )
    .await;
    let expected = format!("waiting for agent on default/{WORKER} (last seen: never; refused ");
    assert!(
        message.starts_with(&expected) && message.contains("s ago: token expired); "),
        "{message}"
    );
    wait_for_agent_line(&agent, "auth: the server refused the token: it has expired");

    // Every other reason, each claiming a Machine of its own.
    let client = Client::new(ca, None, true);
    let post = async |name: &str, token: Option<&str>| {
        let header = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = header
            .iter()
            .map(|h| ("authorization", h.as_str()))
            .collect();
        client
            .request_with(server.hooks, POLL_PATH, poll_body(name), &headers)
            .await
            .unwrap()
    };
    assert_eq!(post("probe-missing", None).await.status, 401);
    assert_eq!(
        post("probe-unknown", Some("iu1_never-issued")).await.status,
        401
    );
    assert_eq!(
        post("probe-scope", Some(&elsewhere.token)).await.status,
        403
    );
    assert_eq!(
        post("probe-revoked", Some(&revocable.token)).await.status,
        200
    );
    std::fs::write(&setup.tokens, token_lines(false)).unwrap();
    eventually("the revoked token to be refused as revoked", async || {
        let reply = post("probe-revoked", Some(&revocable.token)).await;
        reply.status == 401 && String::from_utf8_lossy(&reply.body).contains("revoked")
    })
    .await;

    // Counted by reason; the agent's retries too.
    let expired_series = "inplace_updater_agent_auth_failures_total{reason=\"expired-token\"}";
    eventually("the agent to be refused twice", async || {
        sample(&metrics(&server), expired_series) >= Some(2.0)
    })
    .await;
    let text = metrics(&server);
    for reason in [
        "missing-token",
        "unknown-token",
        "revoked-token",
        "out-of-scope",
    ] {
        let series = format!("inplace_updater_agent_auth_failures_total{{reason=\"{reason}\"}}");
        assert!(sample(&text, &series) >= Some(1.0), "{series}: {text}");
    }

    // One WARN line per claimed Machine and reason per minute, with the claim, the peer and the fix.
    let refused = lines(&server, "agent refused");
    let claimed = |machine: &str, reason: &str| {
        refused
            .iter()
            .filter(|l| l["fields"]["machine"] == machine && l["fields"]["reason"] == reason)
            .count()
    };
    let within_a_minute = started.elapsed() < Duration::from_secs(60);
    let worker = format!("default/{WORKER}");
    assert!(
        claimed(&worker, "expired-token") == 1 || !within_a_minute,
        "{refused:#?}"
    );
    for (machine, reason) in [
        ("default/probe-missing", "missing-token"),
        ("default/probe-unknown", "unknown-token"),
        ("default/probe-scope", "out-of-scope"),
        ("default/probe-revoked", "revoked-token"),
    ] {
        assert_eq!(claimed(machine, reason), 1, "{machine}: {refused:#?}");
    }
    for line in &refused {
        assert_eq!(line["level"], "WARN");
        assert!(
            line["fields"]["peer"]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.1:")
        );
        assert!(!line["fields"]["fix"].as_str().unwrap().is_empty());
    }

    // status --agents, as text and as JSON.
    let text = status(&server, &[]);
    let worker_line = text.lines().find(|l| l.starts_with(&worker)).unwrap();
    assert!(
        worker_line.contains("disconnected")
            && worker_line.contains("never")
            && worker_line.contains("expired-token")
            && worker_line.contains("from 127.0.0.1:"),
        "{text}"
    );
    let rows = agent_rows(&server);
    let worker_row = row(&rows, &worker);
    assert_eq!(worker_row["lastRefusal"]["reason"], "expired-token");
    assert_eq!(worker_row["connected"], false);
    assert!(worker_row.get("lastSeenMs").is_none());
    assert_eq!(
        row(&rows, "default/probe-scope")["lastRefusal"]["reason"],
        "out-of-scope"
    );
    let revoked_row = row(&rows, "default/probe-revoked");
    assert_eq!(revoked_row["lastRefusal"]["reason"], "revoked-token");
    assert_eq!(
        revoked_row["connected"], true,
        "it got through before it was revoked"
    );

    // The node gets a good token: the agent connects, the update runs, the refusal is history.
    std::fs::write(&token_file, &setup.token.token).unwrap();
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    wait_for_agent_line(&agent, "connected to the server");
    let rows = agent_rows(&server);
    let worker_row = row(&rows, &worker);
    assert_eq!(worker_row["connected"], true, "{worker_row}");
    assert_eq!(
        worker_row["agentVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let logs = server.logs().join("\n") + &agent.log();
    for token in [
        &setup.token.token,
        &expired.token,
        &revocable.token,
        &elsewhere.token,
    ] {
        assert!(!logs.contains(token.as_str()), "a token reached the logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_is_counted_timed_and_logged() {
    let setup = Setup::new();
    let (server, capi) = start(&setup, &[]);
    let ca = &setup.certs.paths.ca_cert;
    let count = |text: &str, state: &str| {
        sample(
            text,
            &format!("inplace_updater_updates{{state=\"{state}\"}}"),
        )
    };

    const NODE: &str = "edge-01-control-plane-observe";
    let request = update_request("update-machine-kcp.json", NODE);
    capi.judges(&request).await;
    waiting_message(&capi, &request).await;
    eventually("the recorded update to be counted", async || {
        count(&metrics(&server), "recorded") == Some(1.0)
    })
    .await;
    let text = metrics(&server);
    for gauge in [
        "inplace_updater_agent_last_seen_timestamp_seconds",
        "inplace_updater_update_stalled_since_timestamp_seconds",
    ] {
        let value = sample(&text, gauge).unwrap_or_else(|| panic!("{gauge}: {text}"));
        assert!(
            value > 1.7e9,
            "{gauge} is a Unix time, the update's recording: {value}"
        );
    }

    let sandbox = Sandbox::create(&setup.dir.path().join(NODE), "v1.33.4", true).unwrap();
    sandbox.fail_kubeadm(true).unwrap();
    let agent = AgentProcess::start(&server, ca, &setup.token_file, NODE, sandbox);
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?} after {messages:?}")
    };
    assert!(message.contains("kubeadm"), "{message}");

    // The agent undid the run (the default onFailure), so the failed update counts as rolled back.
    eventually("the failed update to be counted", async || {
        let text = metrics(&server);
        count(&text, "rolled-back") == Some(1.0)
            && sample(&text, "inplace_updater_agents_connected") == Some(1.0)
    })
    .await;
    let text = metrics(&server);
    for state in [
        "recorded",
        "running",
        "done",
        "failed",
        "paused",
        "cancelled",
        "rolling-back",
        "rollback-failed",
    ] {
        assert_eq!(count(&text, state), Some(0.0), "{state}: {text}");
    }
    let rollbacks = |outcome: &str| {
        sample(
            &text,
            &format!("inplace_updater_rollbacks_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        (rollbacks("rolled-back"), rollbacks("failed")),
        (Some(1.0), Some(0.0)),
        "{text}"
    );
    let kind = |name: &str, kind: &str| sample(&text, &format!("{name}{{kind=\"{kind}\"}}"));
    assert_eq!(
        kind("inplace_updater_step_failures_total", "kubeadmUpgrade"),
        Some(1.0)
    );
    assert_eq!(
        kind(
            "inplace_updater_step_duration_seconds_count",
            "kubeadmUpgrade"
        ),
        Some(1.0)
    );
    assert_eq!(
        kind(
            "inplace_updater_step_duration_seconds_count",
            "installKubeadm"
        ),
        Some(1.0),
        "the step before it succeeded and was timed"
    );
    assert_eq!(
        kind("inplace_updater_step_failures_total", "installKubeadm"),
        Some(0.0)
    );
    assert!(
        sample(
            &text,
            "inplace_updater_update_stalled_since_timestamp_seconds"
        )
        .is_none(),
        "nothing is unfinished: {text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("inplace_updater_build_info{")
                && l.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
                && l.ends_with("} 1")),
        "{text}"
    );
    for process in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(sample(&text, process) > Some(0.0), "{process}: {text}");
    }
    // In clock ticks of 10 ms: a server this young may not have used one yet.
    assert!(
        sample(&text, "process_cpu_seconds_total") >= Some(0.0),
        "{text}"
    );
    for op in ["get", "put", "list"] {
        let series = format!(
            "inplace_updater_store_operation_duration_seconds_count{{op=\"{op}\",backend=\"memory\"}}"
        );
        assert!(sample(&text, &series) > Some(0.0), "{series}: {text}");
    }
    assert!(
        sample(
            &text,
            "inplace_updater_hook_calls_total{hook=\"UpdateMachine\",status=\"Failure\"}"
        ) >= Some(1.0)
    );

    // Logged loud enough: the failed step at ERROR, the Failure answer at WARN.
    let failed = lines(&server, "step failed; the update stops here");
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["level"], "ERROR");
    assert_eq!(failed[0]["fields"]["kind"], "kubeadmUpgrade");
    assert_eq!(failed[0]["fields"]["machine"], format!("default/{NODE}"));
    // The answer reached CAPI before its log line reached the file (the server's log writer does not block).
    eventually("the Failure answer logged at WARN", async || {
        lines(&server, "hook call")
            .iter()
            .any(|l| l["fields"]["status"] == "Failure" && l["level"] == "WARN")
    })
    .await;
    let answers = lines(&server, "hook call");
    assert!(
        answers
            .iter()
            .all(|l| l["fields"]["status"] != "Failure" || l["level"] == "WARN")
    );

    let rows = agent_rows(&server);
    let node = row(&rows, &format!("default/{NODE}"));
    assert_eq!(node["connected"], true, "{node}");
    assert!(node.get("lastRefusal").is_none());
    assert!(agent.log().contains("step failed"));
}
