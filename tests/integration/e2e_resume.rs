//! An interrupted step runs to its end on resume, for every command of every Kubernetes sequence
//! (installKubeadm, kubeadmUpgradeApply, kubeadmUpgradeNode, installKubelet) of every shipped agent config.
//!
//! All real processes: the server, driven by UpdateMachine as CAPI drives it, and `inplace-updater agent`
//! processes running the shipped config text (only `path:` and the pins rewritten) against stand-ins that log
//! each command's start and end. Each case stops the agent at one point of one command — SIGKILL with the
//! command's process group, or SIGTERM — starts it again on the same state dir, and checks that the
//! interrupted command ran again and completed, every later command of the step ran exactly once, no earlier
//! one ran again, the rest of the plan followed in order, the node ended upgraded (kubelet restarted on the
//! new version after the install, packages held, kubeadm upgraded) and UpdateMachine answered done.
//! Cases run concurrently, one sandbox and state dir each.

use crate::common;
use crate::resume_node;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use common::fleet::{Capi, update_request};
use common::{Client, ServerProcess};
use resume_node::expect::{
    check_calls, check_end_state, inode, runs, sandbox_pins, sequence, targets, written_files,
};
use resume_node::{Node, Shipped};
use serde_json::json;

/// Bound on any single wait of a case (a failure bound; cases normally take a second or two).
const LIMIT: Duration = Duration::from_secs(120);
/// Cases in flight at once: enough to keep 2 cores busy without starving the agents' own deadlines.
const CONCURRENT_CASES: usize = 16;

/// Where the stand-in stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    /// Started, no effect yet: the instant after the previous command was recorded complete.
    Before,
    /// Part-way through its effect.
    Inside,
    /// Its effect done and its end logged, before it exits (so before the agent can record it).
    After,
}

/// How the agent is stopped there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGKILL to the agent and to the command's process group.
    Kill,
    /// SIGTERM to the agent only (systemd's stop with `KillMode=mixed`).
    Term,
    /// SIGKILL as above, then a reboot: services come back with what is installed.
    KillAndReboot,
}

#[derive(Clone, Debug)]
struct Case {
    config: usize,
    sequence: &'static str,
    command: usize,
    point: Point,
    stop: Stop,
}

/// An UpdateMachine request for `machine` in its own cluster (so a control plane gets `kubeadm upgrade apply`).
fn request(fixture: &str, machine: &str, cluster: &str) -> serde_json::Value {
    let mut request = update_request(fixture, machine);
    for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
        let labels = &mut request["desired"][object]["metadata"]["labels"];
        if labels.is_object() {
            labels["cluster.x-k8s.io/cluster-name"] = json!(cluster);
        }
    }
    request["desired"]["machine"]["spec"]["clusterName"] = json!(cluster);
    request
}

struct Env {
    configs: Vec<Shipped>,
    dir: tempfile::TempDir,
    server: ServerProcess,
    capi: Capi,
    ca: PathBuf,
}

fn cluster_of(id: usize) -> String {
    format!("resume-{id}")
}

/// Starts one server for `cases` (a cluster-scoped token each) and runs them, at most
/// [`CONCURRENT_CASES`] at a time. Panics listing every failed case.
async fn run_cases(cases: Vec<Case>) {
    let started = Instant::now();
    let configs = Shipped::all();
    let certs = common::certs();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut lines = String::new();
    for id in 0..cases.len() {
        let scope = inplace_updater::dispatch::AgentScope::Cluster {
            namespace: "default".into(),
            cluster: cluster_of(id),
        };
        let token =
            inplace_updater::dispatch::upkeep::tokens::create_token(&scope, None).expect("token");
        std::fs::write(dir.path().join(format!("token-{id}")), &token.token).expect("token");
        lines.push_str(&token.line);
        lines.push('\n');
    }
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, lines).expect("tokens");
    let tokens = tokens.display().to_string();
    let args = ["--agent-tokens", &tokens, "--retry-after-seconds", "1"];
    let server = ServerProcess::start(&certs.paths, &args);
    let capi = Capi {
        client: Client::new(&certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };
    let env = Arc::new(Env {
        configs,
        dir,
        server,
        capi,
        ca: certs.paths.ca_cert.clone(),
    });
    let total = cases.len();
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CASES));
    let mut tasks = Vec::new();
    for (id, case) in cases.into_iter().enumerate() {
        let (env, slots) = (env.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = slots.acquire().await.expect("semaphore");
            let shown = format!("{case:?} in {}", env.configs[case.config].file);
            run_case(&env, id, case).await;
            shown
        }));
    }
    let mut failures = Vec::new();
    for task in tasks {
        if let Err(error) = task.await {
            let message = error
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                })
                .unwrap_or_else(|| "cancelled".into());
            failures.push(message);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    println!(
        "{total} cases passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

async fn wait_for(what: &str, node: &Node, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\ncalls:\n{}\nagent log:\n{}",
            node.calls(),
            node.agent_log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn run_case(env: &Env, id: usize, case: Case) {
    let shipped = &env.configs[case.config];
    let worker = case.sequence == "kubeadmUpgradeNode";
    let machine = format!("{}-{}", cluster_of(id), if worker { "md" } else { "cp" });
    let fixture = if worker {
        "update-machine-worker.json"
    } else {
        "update-machine-kcp.json"
    };
    let case_dir = env.dir.path().join(format!("case-{id}"));
    let mut node = Node::create(
        &case_dir,
        shipped,
        &format!("https://127.0.0.1:{}", env.server.hooks.port()),
        &env.ca,
        &env.dir.path().join(format!("token-{id}")),
        &machine,
    );
    let root = node.root.display().to_string();
    let seq = sequence(shipped, case.sequence).expect("sequence");
    let target = runs(
        &seq.commands,
        Some(case.sequence),
        &root,
        &sandbox_pins(shipped),
    )
    .into_iter()
    .find(|e| e.index == case.command)
    .expect("a run command");
    let point = match case.point {
        Point::Before => "before",
        Point::Inside => "inside",
        Point::After => "after",
    };
    std::fs::write(node.path("/trap"), format!("{point} {}\n", target.argv)).expect("trap");
    let update = request(fixture, &machine, &cluster_of(id));
    env.capi.judges(&update).await;

    node.start();
    assert!(
        !matches!(
            env.capi.update_machine(&update).await,
            UpdateOutcome::Failed { .. }
        ),
        "UpdateMachine refused the case's request"
    );
    wait_for("the trap to catch the agent", &node, || {
        node.calls().contains("\nblocked ") || node.calls().starts_with("blocked ")
    })
    .await;
    let files: Vec<(PathBuf, Option<u64>)> = written_files(shipped)
        .iter()
        .map(|p| (node.path(p), inode(&node.path(p))))
        .collect();
    match case.stop {
        Stop::Kill => node.kill().await,
        Stop::KillAndReboot => {
            node.kill().await;
            node.reboot();
        }
        Stop::Term => {
            node.terminate().await;
            assert!(
                node.agent_log().contains("step stopped by shutdown"),
                "{}",
                node.agent_log()
            );
        }
    }
    std::fs::remove_file(node.path("/trap")).expect("untrap");
    node.start();
    wait_for("the plan to finish", &node, || {
        node.agent_log().contains("plan finished")
    })
    .await;
    let (outcome, _) = env.capi.update_until_settled(&update, LIMIT).await;
    node.kill().await;
    let context = format!(
        "{case:?} in {}\ncalls:\n{}\nagent log:\n{}",
        shipped.file,
        node.calls(),
        node.agent_log()
    );
    assert_eq!(outcome, UpdateOutcome::Done, "{context}");
    check_calls(
        shipped,
        &node,
        (case.sequence, case.command),
        &root,
        &context,
    );
    check_end_state(shipped, &node, &files, &context);
    // Whichever command the agent was stopped in, the drain around the kubelet upgrade cordoned the node once and
    // the resumed plan uncordoned it exactly once.
    assert_eq!(
        node.kube.unschedulable_patches(),
        [Some(true), None],
        "{context}"
    );
    // Removing the sandbox while other cases run: directory removal is slow on some disks and would
    // otherwise all come at the end. Best effort: a command the agent had just started (an inventory
    // check) may still be writing; whatever is left goes with the temp dir.
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(case_dir)).await;
}

/// Every target × the given ways to stop.
fn matrix(ways: &[(Point, Stop)], filter: impl Fn(&Shipped, &str) -> bool) -> Vec<Case> {
    let configs = Shipped::all();
    let targets = targets(&configs);
    assert!(
        targets.len() >= 40,
        "every shipped command is a target: {targets:?}"
    );
    targets
        .into_iter()
        .filter(|(c, key, _)| filter(&configs[*c], key))
        .flat_map(|(config, sequence, command)| {
            ways.iter().map(move |&(point, stop)| Case {
                config,
                sequence,
                command,
                point,
                stop,
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_every_command_of_every_shipped_sequence_resumes_it_to_the_end() {
    run_cases(matrix(&[(Point::Inside, Stop::Kill)], |_, _| true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_a_command_made_its_effect_but_before_it_was_recorded_runs_it_again_and_the_rest_once()
 {
    run_cases(matrix(&[(Point::After, Stop::Kill)], |_, _| true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_inside_every_command_resumes_the_step_and_skip_if_is_not_consulted() {
    run_cases(matrix(&[(Point::Inside, Stop::Term)], |_, _| true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_around_any_install_kubelet_command_still_ends_on_the_new_kubelet() {
    let ways = [
        (Point::Before, Stop::KillAndReboot),
        (Point::After, Stop::KillAndReboot),
    ];
    run_cases(matrix(&ways, |_, key| key == "installKubelet")).await;
}
