//! Retry end to end, all real processes over TLS: an operator's `inplace-updater.dev/retry` annotation starts
//! a fresh run of a failed update once the node is fixed (once per value; ignored, and said so, on a run
//! that did not fail), and the agent's automatic retries of a `retryable` command (attempts visible while
//! they happen; exhausted attempts named in the Failure).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::Duration;

use capi_sim::UpdateOutcome;
use common::fleet::{AgentProcess, Capi, Setup, update_request};
use common::{Client, ServerProcess};
use inplace_updater::cmd::demo::Sandbox;
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);
const FIRST: &str = "edge-01-control-plane-aaaaa";
const SECOND: &str = "edge-01-control-plane-bbbbb";

fn with_retry(request: &Value, value: &str) -> Value {
    let mut request = request.clone();
    request["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/retry"] =
        json!(value);
    request
}

/// `inplace-updater status` (with `--agents`: the agents) as an operator runs it against the health port.
fn operator_view(server: &ServerProcess, agents: bool) -> String {
    let mut command = std::process::Command::new(common::binary());
    command.arg("status");
    if agents {
        command.arg("--agents");
    }
    let output = command
        .arg("--server")
        .arg(format!("http://{}", server.health))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    // Printed so `--nocapture` shows what the operator sees at each point.
    eprintln!(
        "$ inplace-updater status{}\n{text}",
        if agents { " --agents" } else { "" }
    );
    text
}

/// The `status` row of a Machine's newest run (rows are newest first within a cluster).
fn newest_row<'a>(status: &'a str, machine: &str) -> &'a str {
    status
        .lines()
        .find(|line| line.contains(&format!("default/{machine}")))
        .unwrap_or_else(|| panic!("no row for {machine}:\n{status}"))
}

fn upgrades(agent: &AgentProcess) -> usize {
    agent
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.starts_with("kubeadm upgrade apply v1.34.1"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_restarts_a_failed_update_once_after_the_node_is_fixed() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubeadm(true).unwrap();

    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        message.ends_with(&format!(
            "to run it again once the cause is fixed: kubectl annotate machine -n default {FIRST} \
             inplace-updater.dev/retry=$(date +%s) --overwrite"
        )),
        "{message}"
    );
    assert_eq!(upgrades(&agent), 1);
    // What the operator sees: the failed run with its step and exit, and the agent still connected.
    let failed = operator_view(&server, false);
    let row = newest_row(&failed, FIRST);
    // Failed, then undone back to the start (issue 28): the agent's shipped behaviour on a failure.
    assert!(
        row.contains("rolled-back") && row.contains("exit"),
        "{failed}"
    );
    let agents = operator_view(&server, true);
    assert!(
        newest_row(&agents, FIRST)
            .split_whitespace()
            .any(|word| word == "connected"),
        "{agents}"
    );

    // The operator fixes the node, then annotates the Machine; CAPI passes the annotation on its next call.
    agent.sandbox.fail_kubeadm(false).unwrap();
    let retry = with_retry(&request, "1764780000");
    let (outcome, messages) = capi.update_until_settled(&retry, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert_eq!(
        upgrades(&agent),
        2,
        "the fresh run ran the failed step again"
    );
    let retried = operator_view(&server, false);
    assert!(newest_row(&retried, FIRST).contains("done"), "{retried}");

    // The same value again starts nothing.
    assert_eq!(capi.update_machine(&retry).await, UpdateOutcome::Done);
    assert_eq!(upgrades(&agent), 2);

    // A retry value on a Machine whose run did not fail (it waits for its agent) is ignored, and said so.
    capi.kcp_judges(SECOND).await;
    let second = update_request("update-machine-kcp.json", SECOND);
    let waiting = capi.update_machine(&second).await;
    assert!(
        matches!(&waiting, UpdateOutcome::InProgress { message, .. } if message.starts_with("waiting for agent")),
        "{waiting:?}"
    );
    let ignored = capi.update_machine(&with_retry(&second, "7")).await;
    let UpdateOutcome::InProgress { message, .. } = &ignored else {
        panic!("{ignored:?}")
    };
    assert!(
        message.starts_with("waiting for agent")
            && message.ends_with(
                "(inplace-updater.dev/retry=\"7\" ignored: a retry only restarts a failed run, and this one has not failed)"
            ),
        "{message}"
    );
}

/// `fetch` fails with exit 100 until it has been called `<root>/fetch-failures` + 1 times.
const FETCH: &str = "#!/bin/sh\necho \"fetch $*\" >> \"$INPLACE_ROOT/calls.log\"\n\
n=$(grep -c '^fetch' \"$INPLACE_ROOT/calls.log\")\n\
[ \"$n\" -gt \"$(cat \"$INPLACE_ROOT/fetch-failures\")\" ] || { echo 'E: mirror unreachable' >&2; exit 100; }\n";

/// A sandbox whose `kubeadm upgrade` sequences first run a retryable `fetch` that fails `failures` times.
fn flaky_node(setup: &Setup, server: &ServerProcess, name: &str, failures: u32) -> AgentProcess {
    use std::os::unix::fs::PermissionsExt as _;
    let sandbox = Sandbox::create(&setup.dir.path().join(name), "v1.33.4", true).unwrap();
    let retry = "    retry: {attempts: 3, initialDelaySeconds: 1, maxDelaySeconds: 1}\n    commands:\n      - run: [fetch, images]\n        retryable: true\n";
    // The sandbox's config (AGENT_CONFIG plus its node: section), with the kubeadm upgrades made retryable.
    let shipped = std::fs::read_to_string(&sandbox.config).unwrap();
    let config = shipped
        .replace(
            "  kubeadmUpgradeApply:\n    commands:\n",
            &format!("  kubeadmUpgradeApply:\n{retry}"),
        )
        .replace(
            "  kubeadmUpgradeNode:\n    commands:\n",
            &format!("  kubeadmUpgradeNode:\n{retry}"),
        );
    assert_ne!(config, shipped);
    std::fs::write(&sandbox.config, config).unwrap();
    let fetch = sandbox.root.join("bin/fetch");
    std::fs::write(&fetch, FETCH).unwrap();
    std::fs::set_permissions(&fetch, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(sandbox.path("/fetch-failures"), failures.to_string()).unwrap();
    AgentProcess::start(
        server,
        &setup.certs.paths.ca_cert,
        &setup.token_file,
        name,
        sandbox,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_retries_a_retryable_command_and_names_exhausted_attempts() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let flaky = flaky_node(&setup, &server, FIRST, 2);
    let broken = flaky_node(&setup, &server, SECOND, 5);

    // Fails twice, succeeds at attempt 3/3: the update is done, the attempts were visible meanwhile.
    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert!(
        messages
            .iter()
            .any(|m| m.contains("(attempt 2/3 of `fetch images` after exit 100, in 1 s)")),
        "{messages:?}"
    );
    let fetches = flaky
        .sandbox
        .calls()
        .iter()
        .filter(|c| *c == "fetch images")
        .count();
    assert_eq!(fetches, 3);

    // Fails five times with three attempts: the Failure names the attempts.
    capi.kcp_judges(SECOND).await;
    let request = update_request("update-machine-kcp.json", SECOND);
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?} {messages:?}")
    };
    assert!(
        message.contains("`fetch images` exited with 100 (attempt 3/3; no attempts left)")
            && message.contains("E: mirror unreachable"),
        "{message}"
    );
    let fetches = broken
        .sandbox
        .calls()
        .iter()
        .filter(|c| *c == "fetch images")
        .count();
    assert_eq!(fetches, 3);
}

/// `inplace-updater retry NAMESPACE/NAME --store URL`, with `args` after it.
fn retry_cli(store: &str, machine: &str, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(common::binary())
        .args(["retry", machine, "--store", store])
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_command_starts_a_fresh_run_from_the_store() {
    let setup = Setup::new();
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let args = setup.server_args(&store);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = ServerProcess::start(&setup.certs.paths, &args);
    let capi = Capi {
        client: Client::new(&setup.certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };
    let mut agent = setup.agent(&server, FIRST, true);
    agent.sandbox.fail_kubeadm(true).unwrap();
    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let (outcome, _) = capi.update_until_settled(&request, SETTLE).await;
    assert!(
        matches!(outcome, UpdateOutcome::Failed { .. }),
        "{outcome:?}"
    );
    agent.kill();
    agent.sandbox.fail_kubeadm(false).unwrap();

    // The embedded store is the server's while it runs: stop it, then write the retry.
    server.signal("TERM");
    server.wait_exit(Duration::from_secs(15));
    let machine = format!("default/{FIRST}");
    let (ok, stdout, stderr) = retry_cli(&store, &machine, &[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "{machine}: a fresh run of the failed update started (run "
        )),
        "{stdout}"
    );
    // Nothing more to retry: the fresh run has not failed; a value used before does nothing either.
    let (ok, _, stderr) = retry_cli(&store, &machine, &["--value", "again"]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "{machine}: nothing to retry: its current update has not failed (waiting for its agent)"
        )),
        "{stderr}"
    );
    let (ok, _, stderr) = retry_cli(&store, &machine, &["--value", "again"]);
    assert!(!ok);
    assert!(
        stderr.contains("was used before; pass a new --value"),
        "{stderr}"
    );
    let (ok, _, stderr) = retry_cli(&store, "default/nobody", &[]);
    assert!(!ok);
    assert!(
        stderr.contains("default/nobody: no update is recorded for this Machine"),
        "{stderr}"
    );

    // The server answers from the fresh run, and the node's agent runs it to the end.
    let server = ServerProcess::start(&setup.certs.paths, &args);
    let capi = Capi {
        client: Client::new(&setup.certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };
    let _agent = AgentProcess::start(
        &server,
        &setup.certs.paths.ca_cert,
        &setup.token_file,
        FIRST,
        Sandbox::create(&setup.dir.path().join("fixed"), "v1.33.4", true).unwrap(),
    );
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
}
