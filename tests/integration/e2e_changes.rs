//! A change proves itself before it spreads, end to end: real server and agent processes over TLS, CAPI's
//! calls decoded as capi-sim decodes them, Machines of two clusters under one paced registration
//! (`canary: 1`, `soak`). The canary runs alone while the others wait; the next starts only after the soak;
//! a canary that fails (its kubelet does not come back, the agent rolls it back) halts its change for every
//! Machine that has not started it, naming the failure and the release command, while another change goes on;
//! `inplace-updater change release` lets the held Machine go on; and the halt is in the store, so the server
//! restarted keeps it, as it keeps a soak. `inplace-updater status --changes` shows it all.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use inplace_updater::cmd::demo::Sandbox;
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use serde_json::{Value, json};

use crate::common::fleet::{AgentProcess, Capi, Setup, can_update_before, update_request};
use crate::common::{ServerProcess, binary, status_text};

const SETTLE: Duration = Duration::from_secs(90);
const SOAK_SECONDS: u64 = 5;

/// The setup with a second cluster's token (`default/edge-02`) beside edge-01's; returns its token file.
fn second_cluster(setup: &Setup) -> PathBuf {
    let scope = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-02".into(),
    };
    let token = create_token(&scope, None).unwrap();
    let mut lines = std::fs::read_to_string(&setup.tokens).unwrap();
    lines.push_str(&format!("{}\n", token.line));
    std::fs::write(&setup.tokens, lines).unwrap();
    let file = setup.dir.path().join("token-edge-02");
    std::fs::write(&file, &token.token).unwrap();
    file
}

/// A worker of `cluster` at v1.33.4 with its agent, scoped by `token_file`.
fn worker(
    setup: &Setup,
    server: &ServerProcess,
    name: &str,
    token_file: &std::path::Path,
) -> AgentProcess {
    let sandbox = Sandbox::create(&setup.dir.path().join(name), "v1.33.4", false).unwrap();
    AgentProcess::start(
        server,
        &setup.certs.paths.ca_cert,
        token_file,
        name,
        sandbox,
    )
}

/// UpdateMachine of worker `name` of `cluster` to v1.34.1 under the paced settings.
fn paced(name: &str, cluster: &str) -> Value {
    let mut request = update_request("update-machine-worker.json", name);
    for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
        if request["desired"][object].is_object() {
            request["desired"][object]["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] =
                json!(cluster);
        }
    }
    request["desired"]["machine"]["spec"]["clusterName"] = json!(cluster);
    request["settings"] = json!({"canary": "1", "soak": format!("{SOAK_SECONDS}s")});
    request
}

/// CanUpdateMachine for `request` from v1.33.4 (with its settings), answered in place as CAPI decides.
async fn judged(capi: &Capi, request: &Value) {
    let mut judged = can_update_before(request, "v1.33.4");
    judged["settings"] = request["settings"].clone();
    assert_eq!(
        capi.can_update_machine(&judged).await,
        capi_sim::CapiDecision::InPlace
    );
}

/// CAPI's calls until the update of `request` settles, which must be Done; the progress messages.
async fn done(capi: &Capi, request: &Value, agent: &AgentProcess) -> Vec<String> {
    let (outcome, messages) = capi.update_until_settled(request, SETTLE).await;
    assert_eq!(
        outcome,
        UpdateOutcome::Done,
        "{messages:?}\nagent log:\n{}",
        agent.log()
    );
    messages
}

fn message(outcome: &UpdateOutcome) -> &str {
    match outcome {
        UpdateOutcome::InProgress { message, .. } => message,
        other => panic!("not in progress: {other:?}"),
    }
}

fn upgraded(agent: &AgentProcess) -> bool {
    agent
        .sandbox
        .calls()
        .iter()
        .any(|c| c.starts_with("kubeadm upgrade node"))
}

/// The change id `status --changes --output json` lists for `label`.
fn change_id(server: &ServerProcess, label: &str) -> String {
    let rows: Value = serde_json::from_str(&status_text(
        server.health,
        &["--changes", "--output", "json"],
    ))
    .unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no change {label} in {rows}"))["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_goes_alone_and_the_next_machine_waits_for_its_soak() {
    let setup = Setup::new();
    let edge_02 = second_cluster(&setup);
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let (server, capi) = setup.serve(&store, &[]);
    let a = worker(&setup, &server, "edge-01-md-0-a", &setup.token_file);
    let b = worker(&setup, &server, "edge-02-md-0-b", &edge_02);

    // The canary (the first to ask) starts; the Machine of the other cluster waits for it.
    let canary = paced("edge-01-md-0-a", "edge-01");
    judged(&capi, &canary).await;
    let started = capi.update_machine(&canary).await;
    assert!(!message(&started).contains("change"), "{started:?}");
    let other = paced("edge-02-md-0-b", "edge-02");
    judged(&capi, &other).await;
    let waits = capi.update_machine(&other).await;
    assert_eq!(
        message(&waits),
        "waiting for change v1.34.1 to prove itself on its canaries: default/edge-01-md-0-a running",
        "{waits:?}"
    );
    done(&capi, &canary, &a).await;
    let canary_done = Instant::now();
    assert!(
        !upgraded(&b),
        "the second Machine ran nothing while the canary ran"
    );

    // After the canary: the soak. The server killed while the change soaks and started again keeps it: the
    // second Machine is told the same end, and runs only after it.
    let soaking = capi.update_machine(&other).await;
    let soak_message = message(&soaking).to_owned();
    assert!(
        soak_message.contains("to soak until")
            && soak_message.contains("after default/edge-01-md-0-a finished"),
        "{soaking:?}"
    );
    let mut server = server;
    server.kill9();
    let listen = server.hooks.to_string();
    let args = setup.server_args(&store);
    let server = ServerProcess::start_at(
        &setup.certs.paths,
        &listen,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    let again = capi.update_machine(&other).await;
    if canary_done.elapsed() < Duration::from_secs(SOAK_SECONDS - 1) {
        assert_eq!(message(&again), soak_message, "the soak survives a restart");
    }
    done(&capi, &other, &b).await;
    assert!(
        canary_done.elapsed() >= Duration::from_secs(SOAK_SECONDS - 1),
        "the second Machine finished {:?} after the canary, within the soak",
        canary_done.elapsed()
    );
    let table = status_text(server.health, &["--changes"]);
    assert!(
        table.lines().any(|l| l.contains(" v1.34.1 ")
            && l.contains(" open ")
            && l.contains("default/edge-01-md-0-a done")),
        "{table}"
    );
}

/// A files-only change for worker `name` of `cluster`: it stays at v1.33.4 and gets `/etc/edge-banner`.
fn files_only(name: &str, cluster: &str) -> (Value, Value) {
    let mut request = paced(name, cluster);
    request["desired"]["machine"]["spec"]["version"] = json!("v1.33.4");
    let files =
        json!([{"path": "/etc/edge-banner", "content": "edge fleet\n", "permissions": "0644"}]);
    request["desired"]["bootstrapConfig"]["spec"]["files"] = files;
    let mut judged = can_update_before(&request, "v1.33.4");
    judged["settings"] = request["settings"].clone();
    judged["current"]["bootstrapConfig"]["spec"]["files"] = json!([]);
    (request, judged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_halts_its_change_across_a_restart_until_an_operator_releases_it() {
    let setup = Setup::new();
    let edge_02 = second_cluster(&setup);
    let data = setup.dir.path().join("data");
    let store = format!("file:{}", data.display());
    let (mut server, capi) = setup.serve(&store, &[]);
    let a = worker(&setup, &server, "edge-01-md-0-a", &setup.token_file);
    let b = worker(&setup, &server, "edge-02-md-0-b", &edge_02);
    let c = worker(&setup, &server, "edge-02-md-0-c", &edge_02);
    a.sandbox.fail_kubelet_restart(true).unwrap();

    // The canary's kubelet does not come back: its agent rolls it back and the run fails.
    let canary = paced("edge-01-md-0-a", "edge-01");
    judged(&capi, &canary).await;
    let (failed, messages) = capi.update_until_settled(&canary, SETTLE).await;
    assert!(
        matches!(failed, UpdateOutcome::Failed { .. }),
        "{failed:?} {messages:?}"
    );
    let id = change_id(&server, "v1.34.1");

    // Every Machine that has not started the change is held, told why and how to release it.
    let other = paced("edge-02-md-0-b", "edge-02");
    judged(&capi, &other).await;
    let held = capi.update_machine(&other).await;
    let said = message(&held);
    assert!(
        said.starts_with(
            "change v1.34.1 is halted by the failure brake after 1 failed Machine(s) (bound 1): \
                          default/edge-01-md-0-a: step "
        ) && said.ends_with(&format!(
            "Release it with `inplace-updater change release {id}`"
        )),
        "{said}"
    );
    // Another change is not held by this one's brake.
    let (request, judged_files) = files_only("edge-02-md-0-c", "edge-02");
    assert_eq!(
        capi.can_update_machine(&judged_files).await,
        capi_sim::CapiDecision::InPlace
    );
    done(&capi, &request, &c).await;
    assert!(!upgraded(&b), "the held Machine ran nothing");
    let table = status_text(server.health, &["--changes"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&id) && l.contains(" halted ")),
        "{table}"
    );
    assert!(table.contains("default/edge-01-md-0-a failed"), "{table}");
    // Listing the changes counted them: the halted one is on the metrics port (what InPlaceChangeHalted reads).
    let (ok, metrics) = curl(&[&format!("http://{}/metrics", server.metrics)]);
    assert!(ok);
    assert!(
        metrics
            .lines()
            .any(|l| l == "inplace_updater_changes{state=\"halted\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("changes"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The server stops: the brake is in the store. The operator releases it there, and the server started
    // again lets the held Machine take the canary's place.
    server.kill9();
    let out = Command::new(binary())
        .args(["change", "release", &id, "--store", &store])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("change {id} (v1.34.1): proving\n")
    );
    let listen = server.hooks.to_string();
    let args = setup.server_args(&store);
    server = ServerProcess::start_at(
        &setup.certs.paths,
        &listen,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    done(&capi, &other, &b).await;
    assert!(upgraded(&b));
    let rows = status_text(server.health, &["--changes"]);
    assert!(
        rows.lines()
            .any(|l| l.starts_with(&id) && l.contains("default/edge-02-md-0-b done")),
        "{rows}"
    );
}

/// A real Alertmanager on a free loopback port (Debian's prometheus-alertmanager), ready.
struct Alertmanager {
    url: String,
    _dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "-m", "5"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn alertmanager() -> Alertmanager {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &config,
        "route: {receiver: blackhole}\nreceivers: [{name: blackhole}]\n",
    )
    .unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let child = Command::new("/usr/bin/prometheus-alertmanager")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .args(["--cluster.listen-address=", "--log.level=warn"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prometheus-alertmanager (scripts/install-deps installs it)");
    let url = format!("http://{addr}");
    crate::common::fleet::wait_until("alertmanager ready", || {
        curl(&["-f", &format!("{url}/-/ready")]).0
    });
    Alertmanager {
        url,
        _dir: dir,
        child,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_holds_the_change_and_its_end_lets_the_canary_start() {
    let am = alertmanager();
    let setup = Setup::new();
    let gates = setup.dir.path().join("gates.yaml");
    std::fs::write(
        &gates,
        format!(
            "gates:\n  - name: critical\n    alertmanager:\n      url: {}\n      matchers: ['severity=\"critical\"', 'cluster=\"{{{{cluster}}}}\"']\n",
            am.url
        ),
    )
    .unwrap();
    let gates_arg = gates.display().to_string();
    let (server, capi) = setup.serve("memory:", &["--gates-file", &gates_arg]);
    let a = worker(&setup, &server, "edge-01-md-0-a", &setup.token_file);
    let alert = |ends: &str| {
        format!(
            r#"[{{"labels":{{"alertname":"StorageDegraded","severity":"critical","cluster":"edge-01"}},"endsAt":"{ends}"}}]"#
        )
    };
    let post = |body: String| {
        let (ok, out) = curl(&[
            "-f",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
            &format!("{}/api/v2/alerts", am.url),
        ]);
        assert!(ok, "{out}");
    };
    post(alert("2099-01-01T00:00:00Z"));

    let mut canary = paced("edge-01-md-0-a", "edge-01");
    canary["settings"] = json!({"canary": "1", "healthGates": "critical"});
    judged(&capi, &canary).await;
    let held = capi.update_machine(&canary).await;
    assert_eq!(
        message(&held),
        format!(
            "change v1.34.1 is held by its health gates: gate critical (alertmanager {}): 1 alert active: \
             StorageDegraded{{cluster=\"edge-01\",severity=\"critical\"}}",
            am.url
        ),
        "{held:?}"
    );
    assert!(!upgraded(&a), "a held change starts nothing");

    // The alert ends: the next call records the canary's run and it runs to the end.
    post(alert("2000-01-01T00:00:00Z"));
    done(&capi, &canary, &a).await;
    assert!(upgraded(&a));
    let rows = status_text(server.health, &["--changes"]);
    assert!(
        rows.contains("last held by a gate: gate critical (alertmanager"),
        "{rows}"
    );
}

/// An unreachable Prometheus holds the change (an unreachable gate fails, said so), and so does a gate the
/// gates file does not define; neither records a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_prometheus_and_an_undefined_gate_hold_the_change_and_say_why() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let setup = Setup::new();
    let gates = setup.dir.path().join("gates.yaml");
    std::fs::write(
        &gates,
        format!(
            "gates:\n  - name: storage\n    prometheus:\n      url: {url}\n      query: 'site_storage_degraded{{node=\"{{{{node}}}}\"}} > 0'\n      timeoutSeconds: 2\n"
        ),
    )
    .unwrap();
    let gates_arg = gates.display().to_string();
    let (server, capi) = setup.serve("memory:", &["--gates-file", &gates_arg]);

    let mut request = paced("edge-01-md-0-a", "edge-01");
    request["settings"] = json!({"canary": "1", "healthGates": "storage"});
    judged(&capi, &request).await;
    let held = capi.update_machine(&request).await;
    let said = message(&held);
    assert!(
        said.starts_with(&format!(
            "change v1.34.1 is held by its health gates: gate storage (prometheus {url}): unreachable: "
        )),
        "{said}"
    );
    assert!(
        matches!(held, UpdateOutcome::InProgress { retry_after_seconds, .. } if retry_after_seconds > 0),
        "{held:?}"
    );

    let mut request = paced("edge-01-md-0-b", "edge-01");
    request["settings"] = json!({"canary": "1", "healthGates": "capacity"});
    judged(&capi, &request).await;
    let held = capi.update_machine(&request).await;
    assert_eq!(
        message(&held),
        "change v1.34.1 is held by its health gates: gate capacity: not defined in the server's gates file \
         (--gates-file)"
    );
    let rows = status_text(server.health, &["--changes"]);
    assert!(rows.contains("v1.34.1"), "{rows}");
    assert!(
        !rows.contains("default/edge-01-md-0-a"),
        "no canary started: {rows}"
    );
}
