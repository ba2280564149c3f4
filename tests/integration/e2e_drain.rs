//! Drain end to end (issue 15), all real processes over TLS: one server, five agents on sandboxed roots, each
//! node's Kubernetes API the TLS fake of `inplace_drain::fake` (it answers as the API documents — 429 while a
//! budget is exhausted — which proves our reactions, not Kubernetes itself). A CAPI-faithful caller upgrades
//! three control-plane Machines one by one and two workers from v1.33.4 to v1.34.1 (a minor change: the drain
//! cannot be turned off). One node's PodDisruptionBudget blocks until released and its agent is SIGKILLed
//! mid-drain; one node was cordoned by an operator beforehand.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::time::{Duration, Instant};

use capi_sim::{CapiDecision, UpdateOutcome};
use inplace_drain::fake::{FakeApiServer, PdbBlock};
use inplace_updater::cmd::demo::setup::add_workloads;
use serde_json::Value;

use crate::common;
use crate::e2e_rollout::{CONTROL_PLANE, SETTLE, WORKERS};
use common::fleet::{AgentProcess, Capi, Setup, update_request, wait_until};

/// The node whose budget blocks until released, and whose agent is killed mid-drain.
const BLOCKED: usize = 1;
/// The node an operator cordoned before the update.
const OPERATOR_CORDONED: usize = 4;

/// Calls UpdateMachine until its message satisfies `wanted`; returns that message.
async fn message_until(capi: &Capi, request: &Value, wanted: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        match capi.update_machine(request).await {
            UpdateOutcome::InProgress { message, .. } if wanted(&message) => return message,
            UpdateOutcome::InProgress { message, .. } => seen.push(message),
            other => panic!("settled before the wanted message: {other:?}; saw {seen:?}"),
        }
        assert!(started.elapsed() < SETTLE, "never seen; saw {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn refused(kube: &FakeApiServer) -> usize {
    kube.evictions().iter().filter(|e| e.status == 429).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_minor_upgrade_drains_every_node_and_uncordons_exactly_what_it_cordoned() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let mut agents: Vec<AgentProcess> = CONTROL_PLANE
        .iter()
        .chain(WORKERS.iter())
        .enumerate()
        .map(|(i, name)| setup.agent(&server, name, i < 3))
        .collect();
    for (i, agent) in agents.iter().enumerate() {
        let block = if i == BLOCKED {
            PdbBlock::UntilReleased
        } else {
            PdbBlock::Attempts(2)
        };
        add_workloads(&agent.sandbox.kube, i, block);
    }
    agents[OPERATOR_CORDONED]
        .sandbox
        .kube
        .set_unschedulable(true);

    for (i, name) in CONTROL_PLANE.iter().enumerate() {
        capi.kcp_judges(name).await;
        let request = update_request("update-machine-kcp.json", name);
        if i == BLOCKED {
            let message = message_until(&capi, &request, |m| {
                m.contains("waiting on PDB default/web")
            })
            .await;
            assert!(
                message.contains("drain") && message.contains(&format!("default/web-{i}")),
                "the blocking pod and budget are named: {message}"
            );
            let kube = agents[i].sandbox.kube.clone();
            assert!(kube.unschedulable(), "cordoned before evicting");
            // SIGKILL mid-drain; the restarted agent resumes the drain (more refusals arrive), then the
            // budget lets go.
            agents[i].kill();
            let before = refused(&kube);
            agents[i].restart();
            wait_until("the restarted agent to evict again", || {
                refused(&kube) > before
            });
            kube.release_pdb("default", "web");
        }
        let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
        assert_eq!(outcome, UpdateOutcome::Done, "{name}: {messages:?}");
    }

    let can_set =
        serde_json::from_slice::<Value>(&common::fixture("can-update-machineset-md.json")).unwrap();
    assert_eq!(
        capi.can_update_machine_set(&can_set).await,
        CapiDecision::InPlace
    );
    for name in WORKERS {
        let request = update_request("update-machine-worker.json", name);
        let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
        assert_eq!(outcome, UpdateOutcome::Done, "{name}: {messages:?}");
    }

    for (i, agent) in agents.iter().enumerate() {
        let kube = &agent.sandbox.kube;
        let name = &agent.name;
        assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1", "{name}");
        let evicted: Vec<String> = kube
            .evictions()
            .into_iter()
            .filter(|e| (200..300).contains(&e.status))
            .map(|e| e.pod)
            .collect();
        assert_eq!(
            evicted,
            [format!("default/web-{i}")],
            "{name}: the web pod evicted once, the DaemonSet pod and the finished pod left"
        );
        assert!(refused(kube) >= 2, "{name}: the budget was honoured");
        if i == OPERATOR_CORDONED {
            assert!(
                kube.unschedulable_patches().is_empty(),
                "{name}: an operator's cordon is neither repeated nor undone: {:?}",
                kube.unschedulable_patches()
            );
            assert!(kube.unschedulable(), "{name} stays cordoned");
        } else {
            assert_eq!(
                kube.unschedulable_patches(),
                [Some(true), None],
                "{name}: cordoned once and uncordoned exactly once"
            );
            assert!(!kube.unschedulable(), "{name} is schedulable again");
        }
    }
}
