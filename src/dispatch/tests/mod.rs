//! Dispatch over the in-memory store: recording runs once, long-poll wake-ups (also across two dispatchers on
//! one store, as two replicas), scoping, report handling, and the answers UpdateMachine derives.

mod budget;
mod changes;
mod drain;
mod fault;
mod guard;
mod hold;
mod observe;
mod presence;
mod quiet;
mod reboot;
mod retention;
mod retry;
mod retry_after;
mod rollback;
mod upgrade;
mod verdict;
mod window;

use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_agent_api::{KubeadmUpgradeMode, MachineRef, PlanStatus, StepAction, StepStatus};
use serde_json::value::RawValue;

use super::testing::*;
use super::*;

#[tokio::test]
async fn a_run_is_recorded_once_and_answered_from_the_store() {
    let d = dispatcher(memory().await);
    let first = update(&d, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let UpdateAnswer::InProgress { message, .. } = &first else {
        panic!("{first:?}")
    };
    assert!(
        message.starts_with("waiting for agent on default/m-1 (last seen: never)"),
        "{message}"
    );
    assert_eq!(
        update(&d, &request("m-1", false, "v1.34.1", "hi"))
            .await
            .unwrap(),
        first
    );
    assert_eq!(
        d.store().list("updates/").await.unwrap().len(),
        1,
        "repeated calls record nothing new"
    );

    let plan = handed_plan(&d, "m-1").await;
    for index in 0..plan.steps.len() as u32 {
        d.agents
            .report(
                &scope(),
                &report("m-1", &plan.id, index, StepStatus::Running),
            )
            .await
            .unwrap();
        let UpdateAnswer::InProgress { message, .. } =
            update(&d, &request("m-1", false, "v1.34.1", "hi"))
                .await
                .unwrap()
        else {
            panic!()
        };
        assert!(
            message.starts_with(&format!("step {}/{}: ", index + 1, plan.steps.len())),
            "{message}"
        );
        d.agents
            .report(
                &scope(),
                &report("m-1", &plan.id, index, StepStatus::Succeeded),
            )
            .await
            .unwrap();
    }
    assert!(matches!(
        update(&d, &request("m-1", false, "v1.34.1", "hi"))
            .await
            .unwrap(),
        UpdateAnswer::Done { .. }
    ));
    // A restart of the server (a new dispatcher on the same store) gives the same answer.
    let again = dispatcher(d.store().clone());
    assert!(matches!(
        again
            .runs
            .update_machine(&request("m-1", false, "v1.34.1", "hi"))
            .await
            .unwrap(),
        UpdateAnswer::Done { .. }
    ));
}

#[tokio::test]
async fn a_failed_step_is_the_answer_for_ever_and_a_new_spec_starts_over() {
    let d = dispatcher(memory().await);
    update(&d, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let plan = handed_plan(&d, "m-1").await;
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap();
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 1, StepStatus::Failed))
        .await
        .unwrap();
    for _ in 0..3 {
        let UpdateAnswer::Failed { message } = update(&d, &request("m-1", false, "v1.34.1", "hi"))
            .await
            .unwrap()
        else {
            panic!()
        };
        assert!(
            message.contains("step 2/")
                && message.contains("exit 1")
                && message.contains("kubeadm says no"),
            "{message}"
        );
    }
    let changed = update(&d, &request("m-1", false, "v1.34.2", "hi"))
        .await
        .unwrap();
    assert!(
        matches!(changed, UpdateAnswer::InProgress { .. }),
        "{changed:?}"
    );
    let stale = d
        .agents
        .report(&scope(), &report("m-1", &plan.id, 2, StepStatus::Succeeded))
        .await;
    assert!(
        matches!(stale, Err(DispatchError::Conflict(_))),
        "reports for the old run are refused: {stale:?}"
    );
}

#[tokio::test]
async fn returning_to_an_earlier_spec_is_a_new_run() {
    let d = dispatcher(memory().await);
    let run = |motd: &'static str| {
        let d = d.clone();
        async move {
            update(&d, &request("m-1", false, "v1.34.1", motd))
                .await
                .unwrap();
            d.agents
                .poll(&scope(), &poll_for("m-1", 0))
                .await
                .unwrap()
                .plan
                .unwrap()
                .id
        }
    };
    let a = run("a").await;
    let b = run("b").await;
    let a_again = run("a").await;
    assert_ne!(a, b);
    assert_ne!(
        a, a_again,
        "the agent must converge to A again, so it gets a run id it has not finished"
    );
}

#[tokio::test]
async fn the_first_control_plane_machine_of_a_version_runs_apply() {
    let d = dispatcher(memory().await);
    let mut modes = Vec::new();
    for name in ["cp-a", "cp-b", "cp-a"] {
        update(&d, &request(name, true, "v1.34.1", "x"))
            .await
            .unwrap();
        let plan = d
            .agents
            .poll(&scope(), &poll_for(name, 0))
            .await
            .unwrap()
            .plan
            .unwrap();
        let mode = plan.steps.iter().find_map(|s| match &s.action {
            StepAction::KubeadmUpgrade { mode, .. } => Some(*mode),
            _ => None,
        });
        modes.push(mode.unwrap());
    }
    assert_eq!(
        modes,
        [
            KubeadmUpgradeMode::Apply,
            KubeadmUpgradeMode::Node,
            KubeadmUpgradeMode::Apply
        ]
    );
}

#[tokio::test]
async fn a_waiting_poll_wakes_when_work_is_recorded_even_on_another_replica() {
    let store = memory().await;
    let (a, b) = (dispatcher(store.clone()), dispatcher(store));
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = b.agents.poll(&scope(), &poll_for("m-1", 30)).await.unwrap();
            (answer, started.elapsed())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.agents.waiters.waiting() == 0 {
        assert!(Instant::now() < deadline, "the poll never started waiting");
        tokio::task::yield_now().await;
    }
    update(&a, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let (answer, took) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.plan.is_some());
    assert!(
        took < Duration::from_secs(2),
        "woken by the change feed, not by the 30 s timeout: {took:?}"
    );
}

#[tokio::test]
async fn tokens_only_see_their_own_cluster_or_machine() {
    let d = dispatcher(memory().await);
    update(&d, &request("m-1", false, "v1.34.1", "secret-content"))
        .await
        .unwrap();
    let other = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "other".into(),
    };
    assert!(matches!(
        d.agents.poll(&other, &poll_for("m-1", 0)).await,
        Err(DispatchError::Forbidden(_))
    ));
    let wrong_namespace = AgentScope::Cluster {
        namespace: "prod".into(),
        cluster: "edge-01".into(),
    };
    assert!(matches!(
        d.agents.poll(&wrong_namespace, &poll_for("m-1", 0)).await,
        Err(DispatchError::Forbidden(_))
    ));
    let machine = AgentScope::Machine(MachineRef::new("default", "m-2"));
    assert!(matches!(
        d.agents.poll(&machine, &poll_for("m-1", 0)).await,
        Err(DispatchError::Forbidden(_))
    ));
    let own = AgentScope::Machine(MachineRef::new("default", "m-1"));
    assert!(
        d.agents
            .poll(&own, &poll_for("m-1", 0))
            .await
            .unwrap()
            .plan
            .is_some()
    );
    let bad = poll_for("../etc", 0);
    assert!(matches!(
        d.agents.poll(&scope(), &bad).await,
        Err(DispatchError::BadRequest(_))
    ));
}

#[tokio::test]
async fn agent_progress_recovers_reports_lost_in_a_crash() {
    let d = dispatcher(memory().await);
    update(&d, &request("m-1", false, "v1.34.1", "hi"))
        .await
        .unwrap();
    let plan = handed_plan(&d, "m-1").await;
    let done = plan.steps.len() as u32;
    let poll = poll_with_progress("m-1", &plan, PlanStatus::Succeeded, done, None);
    assert!(
        d.agents.poll(&scope(), &poll).await.unwrap().plan.is_none(),
        "a finished agent gets nothing more"
    );
    assert!(matches!(
        update(&d, &request("m-1", false, "v1.34.1", "hi"))
            .await
            .unwrap(),
        UpdateAnswer::Done { .. }
    ));
}

#[tokio::test]
async fn status_lists_runs_and_retention_keeps_current_ones() {
    let store = memory().await;
    let d = Dispatcher::new(
        store,
        DispatchConfig {
            retry_after_seconds: 5,
            retention: Duration::ZERO,
            ..DispatchConfig::default()
        },
        CancellationToken::new(),
    );
    update(&d, &request("m-1", false, "v1.34.1", "a"))
        .await
        .unwrap();
    update(&d, &request("m-1", false, "v1.34.1", "b"))
        .await
        .unwrap();
    let rows = d.fleet.status().await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().any(|r| r.state == StatusState::Superseded));
    assert_eq!(
        d.fleet.sweep().await.unwrap(),
        1,
        "the superseded run goes, the current one stays"
    );
    assert_eq!(d.fleet.status().await.unwrap().len(), 1);
}

/// The Machine record remembers a fingerprint of the inputs its plan was built from, so CAPI's repeated calls
/// skip building the plan. The fingerprint is of the texts: the same objects spelled differently (other
/// whitespace) cost one more build, never a new run.
#[tokio::test]
async fn respelled_inputs_keep_the_run() {
    let d = dispatcher(memory().await);
    let asked = request("m-1", false, "v1.34.1", "hi");
    update(&d, &asked).await.unwrap();
    let key = "machines/default/m-1";
    let stored = |d: &Arc<Dispatcher>| {
        let d = d.clone();
        async move {
            let entry = d.store().get(key).await.unwrap().unwrap();
            serde_json::from_slice::<serde_json::Value>(&entry.value).unwrap()
        }
    };
    let first = stored(&d).await;
    assert!(first["inputHash"].is_string(), "{first}");

    let pretty = |raw: &RawValue| {
        let value: serde_json::Value = serde_json::from_str(raw.get()).unwrap();
        RawValue::from_string(serde_json::to_string_pretty(&value).unwrap()).unwrap()
    };
    let respelled = UpdateRequest {
        machine_text: pretty(&asked.machine_text),
        bootstrap: asked.bootstrap.as_deref().map(pretty),
        hashed: Default::default(),
        ..asked.clone()
    };
    update(&d, &respelled).await.unwrap();
    let second = stored(&d).await;
    assert_eq!(second["runId"], first["runId"], "same state, same run");
    assert_ne!(
        second["inputHash"], first["inputHash"],
        "the new spelling is learned"
    );

    update(&d, &asked).await.unwrap();
    assert_eq!(stored(&d).await["runId"], first["runId"]);
    assert_eq!(d.store().list("updates/").await.unwrap().len(), 1);

    // A real change of the desired state is a new run, fingerprint or not.
    update(&d, &request("m-1", false, "v1.34.1", "changed"))
        .await
        .unwrap();
    assert_ne!(stored(&d).await["runId"], first["runId"]);
}
