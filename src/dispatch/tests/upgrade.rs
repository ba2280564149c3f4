//! Agent self-upgrades as dispatch offers them (issue 29), over the in-memory store: only to an agent that says
//! it may replace itself and runs nothing, never instead of a plan the Machine has for it, at most
//! `concurrency` at once across the fleet, confirmed by the agent's next poll on the new binary, and stopped
//! once `max_failures` agents failed.

use std::collections::BTreeMap;

use inplace_agent_api::{AgentFacts, PlanProgress, PlanStatus, PollRequest, UpgradeOutcome};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::dispatch::testing::*;
use crate::dispatch::upkeep::rollout::release::{AgentRelease, ReleaseBinary};
use crate::dispatch::*;
use crate::observe::OutcomeLabels;

const NEW: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const OLD: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn release(concurrency: u32, max_failures: u32) -> AgentRelease {
    AgentRelease {
        version: "0.2.0".into(),
        binaries: BTreeMap::from([(
            "amd64".to_string(),
            ReleaseBinary {
                sha256: NEW.into(),
                url: None,
            },
        )]),
        concurrency,
        max_failures,
    }
}

/// A poll of an agent on binary `sha` that may replace itself, saying `outcome` of its last upgrade.
pub(super) fn polling(name: &str, sha: &str, outcome: Option<UpgradeOutcome>) -> PollRequest {
    PollRequest {
        facts: Some(AgentFacts {
            version: "0.1.0".into(),
            arch: "amd64".into(),
            sha256: Some(sha.into()),
            self_upgrade: true,
            upgrade: outcome,
            ..AgentFacts::default()
        }),
        ..poll_for(name, 0)
    }
}

/// A poll of an outdated agent that says it runs a step of a plan.
fn busy(name: &str) -> PollRequest {
    PollRequest {
        current: Some(PlanProgress {
            plan_id: "a".repeat(64),
            status: PlanStatus::Running,
            succeeded_steps: 1,
            total_steps: 3,
            failed_step: None,
            hold: None,
            rollback: None,
        }),
        ..polling(name, OLD, None)
    }
}

async fn offered(d: &Dispatcher, poll: &PollRequest) -> bool {
    d.agents
        .poll(&scope(), poll)
        .await
        .unwrap()
        .agent_upgrade
        .is_some()
}

async fn dispatcher(
    concurrency: u32,
    max_failures: u32,
) -> (std::sync::Arc<Dispatcher>, FleetMetrics) {
    let metrics = FleetMetrics::new();
    let d = Dispatcher::with_metrics(
        memory().await,
        DispatchConfig::default(),
        CancellationToken::new(),
        metrics.clone(),
    );
    d.upkeep
        .rollout
        .set_release(Some(release(concurrency, max_failures)));
    (d, metrics)
}

fn ended(metrics: &FleetMetrics, outcome: &'static str) -> u64 {
    metrics
        .agent_upgrades
        .get_or_create(&OutcomeLabels { outcome })
        .get()
}

#[tokio::test]
async fn upgrades_are_paced_confirmed_by_the_new_binary_and_stopped_after_too_many_failures() {
    let (d, metrics) = dispatcher(1, 1).await;
    assert!(offered(&d, &polling("m-1", OLD, None)).await);
    // One at a time: the second agent waits while the first upgrades.
    assert!(!offered(&d, &polling("m-2", OLD, None)).await);
    // The first comes back on the new binary and says so: confirmed, and the second's turn comes.
    let passed = UpgradeOutcome {
        target_sha256: NEW.into(),
        succeeded: true,
        message: "now running agent 0.2.0".into(),
    };
    assert!(!offered(&d, &polling("m-1", NEW, Some(passed))).await);
    assert_eq!(ended(&metrics, "succeeded"), 1);
    assert!(offered(&d, &polling("m-2", OLD, None)).await);
    // The second's new binary did not reach the server: agent-start restored the previous one.
    let failed = UpgradeOutcome {
        target_sha256: NEW.into(),
        succeeded: false,
        message: "restored the previous agent binary".into(),
    };
    assert!(
        !offered(&d, &polling("m-2", OLD, Some(failed))).await,
        "not the same binary again"
    );
    assert_eq!(ended(&metrics, "failed"), 1);
    // One failure is --agent-upgrade-max-failures 1: the rollout stops for everyone else.
    assert!(!offered(&d, &polling("m-3", OLD, None)).await);
    let rows = d.agents.list().await.unwrap();
    assert!(
        rows.is_empty() || rows.iter().all(|r| r.upgrade.is_none()),
        "no inventories sent"
    );
}

#[tokio::test]
async fn an_agent_running_a_step_or_with_a_plan_to_run_is_not_offered_its_upgrade() {
    let (d, _) = dispatcher(10, 3).await;
    // The agent says it runs a step of a plan: no upgrade now.
    let busy = busy("m-1");
    assert!(!offered(&d, &busy).await);
    // The Machine has a plan for its agent: the plan, not the upgrade.
    let machine = json!({
        "metadata": { "name": "m-1", "namespace": "default",
                      "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" } },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    update(&d, &request_of(&machine, &bootstrap)).await.unwrap();
    let answer = d
        .agents
        .poll(&scope(), &polling("m-1", OLD, None))
        .await
        .unwrap();
    assert!(
        answer.plan.is_some() && answer.agent_upgrade.is_none(),
        "{answer:?}"
    );
    // An agent that cannot replace itself (the DaemonSet), or an older one that says nothing, is never offered.
    let mut daemonset = polling("m-2", OLD, None);
    if let Some(facts) = daemonset.facts.as_mut() {
        facts.self_upgrade = false;
    }
    assert!(!offered(&d, &daemonset).await);
    assert!(!offered(&d, &poll_for("m-2", 0)).await);
    // The same agent, idle: offered.
    assert!(offered(&d, &polling("m-2", OLD, None)).await);
}

#[tokio::test]
async fn replicas_on_one_store_never_offer_more_upgrades_than_the_concurrency() {
    // Two replicas (two dispatchers on one store), one slot. Replica B looked at the rollout before replica A
    // offered its upgrade: B's view is stale, and only the slot in the store stops it.
    let store = memory().await;
    let replica = || {
        let d = Dispatcher::new(
            store.clone(),
            DispatchConfig::default(),
            CancellationToken::new(),
        );
        d.upkeep.rollout.set_release(Some(release(1, 3)));
        d
    };
    let (a, b) = (replica(), replica());
    for d in [&a, &b] {
        d.clock().pin_for_tests(1_800_000_000_000);
    }
    let busy = busy("m-0");
    assert!(!offered(&b, &busy).await, "busy: B only looks");
    assert!(offered(&a, &polling("m-1", OLD, None)).await);
    assert!(
        !offered(&b, &polling("m-2", OLD, None)).await,
        "the one slot is m-1's, whatever B saw before"
    );
    let slots = store.list("slots/agent-upgrades/").await.unwrap();
    assert_eq!(slots.len(), 1);
    // m-1 confirms on A; its slot goes back with its record in one write, and B offers m-2.
    let passed = UpgradeOutcome {
        target_sha256: NEW.into(),
        succeeded: true,
        message: "now running agent 0.2.0".into(),
    };
    assert!(!offered(&a, &polling("m-1", NEW, Some(passed))).await);
    assert!(
        store
            .list("slots/agent-upgrades/")
            .await
            .unwrap()
            .is_empty()
    );
    // B's own view says "full" for up to ROLLOUT_VIEW_TTL (a late "not now", never an extra offer).
    assert!(!offered(&b, &polling("m-2", OLD, None)).await);
    b.clock()
        .advance_for_tests(crate::dispatch::upkeep::rollout::decide::ROLLOUT_VIEW_TTL);
    assert!(offered(&b, &polling("m-2", OLD, None)).await);
    // Many polls at once on both replicas: still one.
    let polls = (3..20).map(|i| {
        let d = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { offered(&d, &polling(&format!("m-{i}"), OLD, None)).await }
    });
    let more = futures_util::future::join_all(polls).await;
    assert!(more.iter().all(|o| !o), "m-2 holds the slot: {more:?}");
}
