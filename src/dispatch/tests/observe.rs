//! What dispatch tells operators, over the in-memory store shared by two dispatchers (two replicas): refusals
//! remembered and shared through the store (for known Machines only), the census behind
//! `inplace_updater_updates{state}`, and the step metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_agent_api::{AgentIdentity, MachineRef, StepStatus};
use inplace_store::{EtcdOptions, Store, StoreUrl};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::dispatch::testing::*;
use crate::dispatch::*;
use crate::observe::{KindLabels, StateLabels};

async fn memory() -> Arc<dyn Store> {
    inplace_store::open(&StoreUrl::Memory, &EtcdOptions::default())
        .await
        .unwrap()
}

fn replica(store: Arc<dyn Store>, config: DispatchConfig) -> (Arc<Dispatcher>, FleetMetrics) {
    let metrics = FleetMetrics::new();
    let dispatcher =
        Dispatcher::with_metrics(store, config, CancellationToken::new(), metrics.clone());
    tokio::spawn(dispatcher.agents.clone().follow_changes());
    tokio::spawn(dispatcher.fleet.clone().run_census());
    (dispatcher, metrics)
}

fn request(name: &str, motd: &str) -> UpdateRequest {
    let machine = json!({
        "metadata": { "name": name, "namespace": "default",
                      "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" } },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": motd } ] } });
    request_with(&machine, &bootstrap, &[inplace_core::Action::Files])
}

/// UpdateMachine for `request` after CanUpdateMachine judged it in place, as CAPI calls them.
async fn judged_update(dispatcher: &Dispatcher, request: UpdateRequest) -> UpdateAnswer {
    judge_in_place(dispatcher, &request).await;
    dispatcher.runs.update_machine(&request).await.unwrap()
}

fn scope() -> AgentScope {
    AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    }
}

fn agent(name: &str) -> AgentIdentity {
    AgentIdentity::Machine(MachineRef::new("default", name))
}

/// The plan the agent of `name` gets from a poll.
async fn plan_for_agent(dispatcher: &Dispatcher, name: &str) -> inplace_agent_api::Plan {
    dispatcher
        .agents
        .poll(
            &scope(),
            &inplace_agent_api::PollRequest {
                agent: agent(name),
                current: None,
                wait_seconds: 0,
                facts: None,
            },
        )
        .await
        .unwrap()
        .plan
        .unwrap()
}

fn step_report(name: &str, plan: &str, status: StepStatus) -> inplace_agent_api::StepReport {
    inplace_agent_api::StepReport {
        agent: agent(name),
        plan_id: plan.into(),
        step_index: 0,
        status,
        attempt: 1,
        started_at_unix_ms: Some(1_000),
        finished_at_unix_ms: (status != StepStatus::Running).then_some(3_500),
        exit_code: (status == StepStatus::Failed).then_some(2),
        stderr_tail: None,
        message: None,
        undo: false,
        rollback: None,
    }
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn count(metrics: &FleetMetrics, state: &'static str) -> i64 {
    metrics.updates.get_or_create(&StateLabels { state }).get()
}

fn waiting_message(answer: UpdateAnswer) -> String {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message,
        other => panic!("not waiting: {other:?}"),
    }
}

#[tokio::test]
async fn refusals_reach_other_replicas_through_the_store_for_known_machines_only() {
    let store = memory().await;
    let config = DispatchConfig::default();
    let ((a, metrics), (b, _)) = (
        replica(store.clone(), config.clone()),
        replica(store.clone(), config),
    );
    let machine = MachineRef::new("default", "w-1");
    let peer = Some("10.0.0.7:40000".parse().unwrap());

    a.agents
        .refusals
        .refused(
            Some(&agent("w-1")),
            AgentRefusalReason::ExpiredToken,
            "token expired at 2026-01-01T00:00:00Z",
            peer,
        )
        .await;
    assert_eq!(
        a.agents
            .refusals
            .last(&machine)
            .await
            .unwrap()
            .unwrap()
            .reason,
        AgentRefusalReason::ExpiredToken,
        "remembered where it happened"
    );
    assert!(
        b.agents.refusals.last(&machine).await.unwrap().is_none(),
        "a Machine this updater has no record of is never written (the claim is not authenticated)"
    );
    assert_eq!(
        store.list("agent-refusals/").await.unwrap().len(),
        0,
        "nothing stored for an invented name"
    );

    let message = waiting_message(judged_update(&b, request("w-1", "hi")).await);
    assert!(message.contains("last seen: never)"), "{message}");
    // Refusal times are in milliseconds: the next one must be later to be the newer one.
    tokio::time::sleep(Duration::from_millis(3)).await;
    b.agents
        .refusals
        .refused(
            Some(&agent("w-1")),
            AgentRefusalReason::OutOfScope,
            "this token is scoped to cluster default/other",
            peer,
        )
        .await;
    let on_a = a.agents.refusals.last(&machine).await.unwrap().unwrap();
    assert_eq!(
        on_a.reason,
        AgentRefusalReason::OutOfScope,
        "the newer refusal, from the store"
    );
    assert_eq!(on_a.peer.as_deref(), Some("10.0.0.7:40000"));
    let message = waiting_message(judged_update(&a, request("w-1", "hi")).await);
    assert!(
        message.starts_with("waiting for agent on default/w-1 (last seen: never; refused ")
            && message.contains("s ago: token does not cover this Machine)"),
        "{message}"
    );

    let rows = a.agents.list().await.unwrap();
    let row = rows.iter().find(|r| r.machine == "default/w-1").unwrap();
    assert_eq!(
        row.last_refusal.as_ref().unwrap().reason,
        AgentRefusalReason::OutOfScope
    );
    assert!(!row.connected && row.last_seen_ms.is_none());
    let refused = |reason: AgentRefusalReason| {
        metrics
            .auth_failures
            .get_or_create(&crate::observe::ReasonLabels {
                reason: reason.as_str(),
            })
            .get()
    };
    assert_eq!(refused(AgentRefusalReason::ExpiredToken), 1);
    assert_eq!(
        refused(AgentRefusalReason::OutOfScope),
        0,
        "counted on the replica that refused"
    );

    // Once the agent gets through, the refusal is history: the message says when it was seen instead.
    a.agents
        .poll(
            &scope(),
            &inplace_agent_api::PollRequest {
                agent: agent("w-1"),
                current: None,
                wait_seconds: 0,
                facts: None,
            },
        )
        .await
        .unwrap();
    let message = waiting_message(judged_update(&a, request("w-1", "hi")).await);
    assert!(!message.contains("refused"), "{message}");
    let rows = a.agents.list().await.unwrap();
    let row = rows.iter().find(|r| r.machine == "default/w-1").unwrap();
    assert!(row.connected && row.last_seen_ms.is_some(), "{row:?}");
}

#[tokio::test]
async fn old_refusals_are_swept_by_retention() {
    let store = memory().await;
    let config = DispatchConfig {
        retention: Duration::ZERO,
        ..DispatchConfig::default()
    };
    let (a, _) = replica(store.clone(), config);
    judged_update(&a, request("w-1", "hi")).await;
    a.agents
        .refusals
        .refused(
            Some(&agent("w-1")),
            AgentRefusalReason::UnknownToken,
            "unknown or revoked token",
            None,
        )
        .await;
    assert_eq!(store.list("agent-refusals/").await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(a.agents.refusals.sweep().await.unwrap(), 1);
    assert!(store.list("agent-refusals/").await.unwrap().is_empty());
    assert!(
        a.agents.list().await.unwrap().is_empty(),
        "forgotten in memory too"
    );
}

#[tokio::test]
async fn every_replica_counts_each_machines_current_update_by_state() {
    let store = memory().await;
    let config = DispatchConfig::default();
    let ((a, on_a), (b, on_b)) = (
        replica(store.clone(), config.clone()),
        replica(store, config),
    );
    eventually("both censuses started", || {
        count(&on_a, "recorded") == 0 && count(&on_b, "recorded") == 0
    })
    .await;
    assert_eq!(a.unfinished_update_oldest_progress_ms(), None);

    judged_update(&a, request("w-1", "one")).await;
    judged_update(&a, request("w-2", "one")).await;
    eventually("two recorded, seen by the other replica", || {
        count(&on_b, "recorded") == 2
    })
    .await;
    assert!(b.waited_agent_oldest_contact_ms().is_some());
    assert!(b.unfinished_update_oldest_progress_ms().is_some());

    let plan = plan_for_agent(&a, "w-1").await;
    a.agents
        .report(&scope(), &step_report("w-1", &plan.id, StepStatus::Running))
        .await
        .unwrap();
    eventually("one running", || {
        count(&on_b, "running") == 1 && count(&on_b, "recorded") == 1
    })
    .await;
    a.agents
        .report(&scope(), &step_report("w-1", &plan.id, StepStatus::Failed))
        .await
        .unwrap();
    eventually("one failed", || {
        count(&on_a, "failed") == 1 && count(&on_b, "failed") == 1
    })
    .await;
    assert_eq!(count(&on_b, "running"), 0);

    // A new desired state replaces the failed run: it no longer counts.
    judged_update(&b, request("w-1", "two")).await;
    eventually("the failed run superseded", || {
        count(&on_a, "failed") == 0 && count(&on_a, "recorded") == 2
    })
    .await;
    for state in ["done", "paused", "cancelled"] {
        assert_eq!(count(&on_a, state), 0, "{state}");
    }
}

#[tokio::test]
async fn finished_steps_are_timed_and_failures_counted_once() {
    let store = memory().await;
    let (a, metrics) = replica(store, DispatchConfig::default());
    judged_update(&a, request("w-1", "one")).await;
    let plan = plan_for_agent(&a, "w-1").await;
    let kind = plan.steps[0].action.kind();
    let failed = step_report("w-1", &plan.id, StepStatus::Failed);
    a.agents.report(&scope(), &failed).await.unwrap();
    a.agents.report(&scope(), &failed).await.unwrap();
    let failures = metrics
        .step_failures
        .get_or_create(&KindLabels { kind })
        .get();
    assert_eq!(failures, 1, "a repeated report is not a second failure");
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(&format!(
            "step_duration_seconds_sum{{kind=\"{kind}\"}} 2.5\n"
        )),
        "the agent's 2.5 s: {text}"
    );
}
