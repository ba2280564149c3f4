//! The remediation guard end to end around nodes that go down, all real processes over TLS: the server with
//! `--management-kubeconfig` pointing at the fake management API (the RBAC the shipped components grant,
//! Machines' resourceVersion preconditions, events.k8s.io), worker agents on sandboxed roots, and a
//! CAPI-faithful caller (capi-sim decodes every answer as CAPI's Go code does).
//!
//! - An OS image update reboots the node: the guard is on the Machine before the drain's first cordon, still on
//!   while the machine is down, and removed only after the agent, started again on the new boot, verified the
//!   Node Ready there (the reboot is simulated as e2e_reboot does: the agent SIGKILLed when it asks for the
//!   reboot, the sandbox booted with a new boot id, the agent started again).
//! - A node that never returns (its agent SIGKILLed mid-drain and never started again): at the drain step's
//!   deadline — the Machine's own `nodeDrainTimeoutSeconds`, shortened here as an operator would — the guard is
//!   lifted, and the UpdateMachine message and a `RemediationGuardExpired` Event say so; under the setting
//!   `remediationGuardPastDeadline: keep` it stays, and the message and a `RemediationGuardKept` Event say that.
//! - The server SIGKILLed while a guard is set, in the run's last step that can take the node down (the wait for
//!   the node Ready): the agent goes on alone and ends that step; the server started again (same store, same
//!   address) removes the guard; an operator's own value on another Machine updated alongside is never touched.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::collections::BTreeMap;
use std::time::Instant;

use capi_sim::{CapiDecision, UpdateOutcome};
use inplace_drain::fake::management::FakeManagementApi;
use inplace_drain::fake::{FakePdb, FakePod, PdbBlock};
use inplace_updater::cmd::demo::scenario::Scenario;
use serde_json::{Value, json};

use crate::common::fleet::{AgentProcess, Capi, Setup, update_request, wait_until};
use crate::common::{self, Client, ServerProcess};
use crate::e2e_rollout::{SETTLE, WORKERS};

const SKIP: &str = "cluster.x-k8s.io/skip-remediation";
/// The image the OS image update switches to.
const NEXT_IMAGE: &str = "registry.example/node-os:2.0";
/// The drain step's deadline of the never-returning node: its Machine's `nodeDrainTimeoutSeconds`.
const DRAIN_TIMEOUT_SECONDS: u64 = 5;

fn management() -> FakeManagementApi {
    let components = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/clusterctl/runtime-extension-components.yaml");
    FakeManagementApi::start(&components).unwrap()
}

fn annotation(management: &FakeManagementApi, name: &str) -> Option<String> {
    management
        .annotations("default", name)
        .unwrap()
        .get(SKIP)
        .cloned()
}

/// The Events on Machine `name`, in creation order: (reason, note).
fn events(management: &FakeManagementApi, name: &str) -> Vec<(String, String)> {
    management
        .events()
        .iter()
        .filter(|e| e["regarding"]["name"] == name)
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_owned(),
                e["note"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The reasons of the guard's own Events on Machine `name`, in order.
fn guard_reasons(management: &FakeManagementApi, name: &str) -> Vec<String> {
    events(management, name)
        .into_iter()
        .map(|(reason, _)| reason)
        .filter(|r| r.starts_with("RemediationGuard"))
        .collect()
}

/// The worker MachineSet question and an UpdateMachine request of `name`, both through `shape`.
fn worker_requests(name: &str, shape: impl Fn(Value) -> Value) -> (Value, Value) {
    let question: Value =
        serde_json::from_slice(&common::fixture("can-update-machineset-md.json")).unwrap();
    (
        shape(question),
        shape(update_request("update-machine-worker.json", name)),
    )
}

/// `request` without the null objects [`Scenario::request`] leaves where a side has no such object (CAPI sends
/// none).
fn without_nulls(mut request: Value) -> Value {
    for side in ["current", "desired"] {
        if let Some(objects) = request[side].as_object_mut() {
            objects.retain(|_, object| !object.is_null());
        }
    }
    request
}

/// A server on a file store in `setup` with the management client, and its CAPI caller.
fn serve(setup: &Setup, management: &FakeManagementApi) -> (ServerProcess, Capi, Vec<String>) {
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let mut args = setup.server_args(&store);
    args.extend([
        "--management-kubeconfig".to_owned(),
        management.kubeconfig_path().display().to_string(),
    ]);
    let server = ServerProcess::start(
        &setup.certs.paths,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let capi = Capi {
        client: Client::new(&setup.certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };
    (server, capi, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_os_image_reboot_is_guarded_from_before_the_drain_until_the_node_is_ready_on_its_new_boot()
 {
    let name = WORKERS[0];
    let management = management();
    management.add_machine("default", name, &BTreeMap::new());
    let setup = Setup::new();
    let (server, capi, _) = serve(&setup, &management);
    let mut agent = setup.agent(&server, name, false);
    let image = Scenario::OsImage(NEXT_IMAGE.to_owned());
    let (question, request) = worker_requests(name, |r| without_nulls(image.request(r)));
    assert_eq!(
        capi.can_update_machine_set(&question).await,
        CapiDecision::InPlace
    );

    let started = Instant::now();
    let mut down: Option<(Option<String>, String, Instant)> = None;
    let outcome = loop {
        let outcome = capi.update_machine(&request).await;
        if !matches!(outcome, UpdateOutcome::InProgress { .. }) {
            break outcome;
        }
        if down.is_none() && agent.sandbox.reboot_requested() {
            // The machine goes down: what the Machine carries now is what a MachineHealthCheck sees during
            // the reboot.
            let guard = annotation(&management, name);
            agent.kill();
            let before = agent.sandbox.boot_id();
            agent.sandbox.boot().unwrap();
            down = Some((guard, before, Instant::now()));
            agent.restart();
        }
        assert!(started.elapsed() < SETTLE, "not done: {outcome:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(outcome, UpdateOutcome::Done, "{}", agent.log());
    let (guard_while_down, boot_before, booted_at) = down.expect("the node rebooted");
    assert_ne!(agent.sandbox.boot_id(), boot_before, "a new boot");
    assert_eq!(agent.sandbox.os_image(), NEXT_IMAGE);
    assert_eq!(agent.sandbox.reboots(), 1);

    let patches = management.machine_patches();
    assert_eq!(patches.len(), 2, "set once, removed once: {patches:?}");
    let value = patches[0].after.get(SKIP).cloned().unwrap();
    assert!(value.starts_with("inplace-updater:"), "{value}");
    assert_eq!(
        guard_while_down.as_deref(),
        Some(value.as_str()),
        "on the Machine while the machine was down"
    );
    let cordoned = agent.sandbox.kube.first_cordon_at().expect("drained");
    assert!(
        patches[0].at < cordoned,
        "set before the drain's first cordon"
    );
    assert_eq!(patches[1].before.get(SKIP), Some(&value));
    assert!(!patches[1].after.contains_key(SKIP));
    assert!(
        patches[1].at > booted_at,
        "removed only once the agent on the new boot verified the node"
    );
    assert_eq!(annotation(&management, name), None);
    assert_eq!(
        guard_reasons(&management, name),
        ["RemediationGuardSet", "RemediationGuardLifted"]
    );
    drop(server);
}

/// A worker upgrade (it drains) of Machine `name` whose drain cannot end (a PodDisruptionBudget refuses every
/// eviction) and whose agent dies mid-drain, never to return; the drain step's deadline is `nodeDrainTimeout`
/// seconds. Returns the fake, the answer past the deadline and the guard's value.
async fn a_node_that_never_returns(
    name: &str,
    settings: Value,
) -> (FakeManagementApi, String, String) {
    let management = management();
    management.add_machine("default", name, &BTreeMap::new());
    let setup = Setup::new();
    let (server, capi, _) = serve(&setup, &management);
    let mut agent = setup.agent(&server, name, false);
    let kube = &agent.sandbox.kube;
    kube.add_pod(FakePod::new("default", "db-0").label("app", "db"));
    kube.add_pdb(FakePdb {
        namespace: "default".into(),
        name: "db".into(),
        match_labels: BTreeMap::from([("app".to_owned(), "db".to_owned())]),
        block: PdbBlock::UntilReleased,
    });
    let (question, request) = worker_requests(name, |mut r| {
        for spec in [
            "/desired/machine/spec",
            "/desired/machineSet/spec/template/spec",
        ] {
            if let Some(spec) = r.pointer_mut(spec) {
                spec["deletion"]["nodeDrainTimeoutSeconds"] = json!(DRAIN_TIMEOUT_SECONDS);
            }
        }
        r["settings"] = settings.clone();
        r
    });
    assert_eq!(
        capi.can_update_machine_set(&question).await,
        CapiDecision::InPlace
    );
    // The server has the drain step's start (the agent's report of the PDB it waits on): the agent dies.
    let mut said = Vec::new();
    while !said
        .last()
        .is_some_and(|m: &String| m.contains("waiting on PDB default/db"))
    {
        match capi.update_machine(&request).await {
            UpdateOutcome::InProgress { message, .. } => said.push(message),
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    agent.kill();
    let value = annotation(&management, name).expect("guarded before the cordon");
    let kept = settings["remediationGuardPastDeadline"] == "keep";
    let reason = if kept {
        "RemediationGuardKept"
    } else {
        "RemediationGuardExpired"
    };
    // The loop looks at held guards every GUARD_RECONCILE_INTERVAL: the Event comes within one.
    wait_until_async(&format!("the {reason} Event"), || {
        events(&management, name).iter().any(|(r, _)| r == reason)
    })
    .await;
    let message = match capi.update_machine(&request).await {
        UpdateOutcome::InProgress { message, .. } => message,
        other => panic!("{other:?}"),
    };
    assert!(
        said.iter().all(|m| !m.contains("remediation guard")),
        "{said:?}"
    );
    drop(server);
    (management, message, value)
}

/// [`wait_until`] without blocking the runtime's thread for long: the fake answers on it.
async fn wait_until_async(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + std::time::Duration::from_secs(40);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_never_returns_is_unguarded_at_its_steps_deadline() {
    let name = WORKERS[0];
    let (management, message, value) = a_node_that_never_returns(name, json!({})).await;
    assert_eq!(annotation(&management, name), None, "remediation may act");
    assert!(
        message.ends_with(
            " (remediation guard lifted at the step's deadline so remediation can act: a MachineHealthCheck \
             may replace the Machine now)"
        ),
        "{message}"
    );
    let expired: Vec<_> = events(&management, name)
        .into_iter()
        .filter(|(r, _)| r == "RemediationGuardExpired")
        .collect();
    assert_eq!(expired.len(), 1, "{expired:?}");
    assert!(
        expired[0]
            .1
            .contains("lifted at the step's deadline so remediation can act"),
        "{expired:?}"
    );
    let patches = management.machine_patches();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[1].before.get(SKIP), Some(&value));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_never_returns_stays_guarded_past_its_deadline_when_the_setting_keeps_it() {
    let name = WORKERS[1];
    let settings = json!({"remediationGuardPastDeadline": "keep"});
    let (management, message, value) = a_node_that_never_returns(name, settings).await;
    assert_eq!(annotation(&management, name), Some(value), "kept");
    assert!(
        message.ends_with(
            " (remediation guard kept past the step's deadline by setting remediationGuardPastDeadline=keep: \
             no MachineHealthCheck replaces the Machine until the run moves on or ends)"
        ),
        "{message}"
    );
    assert_eq!(
        guard_reasons(&management, name),
        ["RemediationGuardSet", "RemediationGuardKept"]
    );
    assert_eq!(management.machine_patches().len(), 1, "set, never lifted");
}

/// How many steps the agent's log says it ended (`step succeeded`).
fn steps_succeeded(agent: &AgentProcess) -> usize {
    agent
        .log()
        .lines()
        .filter(|l| l.contains("step succeeded"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guard_set_when_the_server_was_killed_is_removed_after_it_restarts_and_an_operators_is_kept()
 {
    let (guarded, operator) = (WORKERS[0], WORKERS[1]);
    let management = management();
    management.add_machine("default", guarded, &BTreeMap::new());
    let operators = BTreeMap::from([(SKIP.to_owned(), "ops:ticket-9".to_owned())]);
    management.add_machine("default", operator, &operators);
    let setup = Setup::new();
    let (mut server, capi, args) = serve(&setup, &management);
    let listen = server.hooks.to_string();
    let agents: Vec<AgentProcess> = [guarded, operator]
        .iter()
        .map(|name| setup.agent(&server, name, false))
        .collect();
    // The nodes are not Ready until the test says so: each run stops in its last step that can take the node
    // down (the wait for the node), with the guard set.
    for agent in &agents {
        agent.sandbox.kube.set_ready(false);
    }
    let (question, _) = worker_requests(guarded, |r| r);
    assert_eq!(
        capi.can_update_machine_set(&question).await,
        CapiDecision::InPlace
    );
    let requests: Vec<Value> = [guarded, operator]
        .iter()
        .map(|name| update_request("update-machine-worker.json", name))
        .collect();
    let waiting = |agent: &AgentProcess| {
        agent
            .log()
            .lines()
            .any(|l| l.contains("step started") && l.contains("wait for the node"))
    };
    let started = Instant::now();
    while !agents.iter().all(waiting) {
        for request in &requests {
            let outcome = capi.update_machine(request).await;
            assert!(
                matches!(outcome, UpdateOutcome::InProgress { .. }),
                "{outcome:?}"
            );
        }
        assert!(started.elapsed() < SETTLE);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let value = annotation(&management, guarded).expect("the guard is set");
    server.kill9();

    // Alone, each agent ends its running step (the node is Ready now) and waits for a server.
    let before: Vec<usize> = agents.iter().map(steps_succeeded).collect();
    for agent in &agents {
        agent.sandbox.kube.set_ready(true);
    }
    wait_until("the wait for the node ended on both nodes", || {
        agents
            .iter()
            .zip(&before)
            .all(|(agent, before)| steps_succeeded(agent) > *before)
    });
    assert_eq!(
        annotation(&management, guarded),
        Some(value.clone()),
        "no server: the guard is still there"
    );

    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ServerProcess::start_at(&setup.certs.paths, &listen, &args, None);
    wait_until_async("the guard removed by the restarted server", || {
        annotation(&management, guarded).is_none()
    })
    .await;
    for request in &requests {
        let (outcome, messages) = capi.update_until_settled(request, SETTLE).await;
        assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    }
    let patches = management.machine_patches();
    assert_eq!(patches.len(), 2, "set once, removed once: {patches:?}");
    assert!(
        patches
            .iter()
            .all(|p| p.machine == format!("default/{guarded}"))
    );
    assert_eq!(patches[1].before.get(SKIP), Some(&value));
    assert_eq!(
        annotation(&management, operator).as_deref(),
        Some("ops:ticket-9"),
        "an operator's own value is never touched"
    );
    drop(server);
}
