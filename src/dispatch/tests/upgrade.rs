//! Agent self-upgrades as dispatch offers them (issue 29), over the in-memory store: only to an agent that says
//! it may replace itself and runs nothing, never instead of a plan the Machine has for it, at most
//! `concurrency` at once across the fleet, confirmed by the agent's next poll on the new binary, and stopped
//! once `max_failures` agents failed.

use std::collections::BTreeMap;

use inplace_agent_api::{AgentFacts, PlanProgress, PlanStatus, PollRequest, UpgradeOutcome};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::dispatch::testing::*;
use crate::dispatch::upgrade_decide::{AgentRelease, ReleaseBinary};
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

fn polling(name: &str, sha: &str, outcome: Option<UpgradeOutcome>) -> PollRequest {
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
    d.agents
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
    let busy = PollRequest {
        current: Some(PlanProgress {
            plan_id: "a".repeat(64),
            status: PlanStatus::Running,
            succeeded_steps: 1,
            total_steps: 3,
            failed_step: None,
            hold: None,
            rollback: None,
        }),
        ..polling("m-1", OLD, None)
    };
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
