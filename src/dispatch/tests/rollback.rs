//! A run its agent rolls back (issue 28), over the in-memory store: while the agent undoes the run UpdateMachine
//! answers in progress saying so (CAPI shows it on the Machine) and a retry is not taken; once rolled back it
//! answers Failure naming the failed step, the undone steps and what the node is now; `status` and the metrics
//! say `rolled-back`; a retry then starts a fresh run. The Machine's `onFailure` reaches the agent with its plan.

use inplace_agent_api::{
    OnFailure, PlanProgress, PlanStatus, PollRequest, RollbackProgress, RollbackState, StepKind,
    StepStatus,
};
use inplace_core::knobs::{ON_FAILURE_ANNOTATION, RETRY_ANNOTATION};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::dispatch::testing::*;
use crate::dispatch::*;
use crate::observe::OutcomeLabels;

fn annotated(annotations: serde_json::Value) -> UpdateRequest {
    let machine = json!({
        "metadata": {
            "name": "m-1",
            "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" },
            "annotations": annotations
        },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    request_of(&machine, &bootstrap)
}

fn rollback(
    state: RollbackState,
    failed_step: u32,
    undone: u32,
    message: &str,
) -> RollbackProgress {
    RollbackProgress {
        state,
        failed_step,
        undone,
        message: message.into(),
    }
}

fn in_progress(answer: UpdateAnswer) -> String {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message,
        other => panic!("not in progress: {other:?}"),
    }
}

#[tokio::test]
async fn a_rolled_back_run_answers_failure_naming_the_rollback_and_a_retry_starts_afresh() {
    let metrics = FleetMetrics::new();
    let d = Dispatcher::with_metrics(
        memory().await,
        DispatchConfig::default(),
        CancellationToken::new(),
        metrics.clone(),
    );
    let request = annotated(json!({}));
    update(&d, &request).await.unwrap();
    let plan = handed_plan(&d, "m-1").await;
    let failed = plan
        .steps
        .iter()
        .position(|s| s.action.step_kind() == StepKind::InstallKubelet)
        .expect("the plan installs the kubelet") as u32;
    agent_reports(&d, "m-1", &plan.id, 0..failed, StepStatus::Succeeded).await;
    let mut failure = report("m-1", &plan.id, failed, StepStatus::Failed);
    failure.rollback = Some(rollback(RollbackState::RollingBack, failed, 0, ""));
    d.agents.report(&scope(), &failure).await.unwrap();

    let message = in_progress(d.runs.update_machine(&request).await.unwrap());
    assert!(
        message.starts_with(&format!("step {}/{}: ", failed + 1, plan.steps.len()))
            && message.contains("failed (exit 1)")
            && message.ends_with("; rolling back"),
        "{message}"
    );
    // A retry while the agent undoes the run is not taken (the agent would drop the rollback for the new plan).
    let retry = annotated(json!({ RETRY_ANNOTATION: "1" }));
    let message = in_progress(d.runs.update_machine(&retry).await.unwrap());
    assert!(message.contains("ignored"), "{message}");

    for (undone, index) in [failed, failed - 1].into_iter().enumerate() {
        let mut undo = report("m-1", &plan.id, index, StepStatus::Succeeded);
        undo.undo = true;
        let progress = rollback(RollbackState::RollingBack, failed, undone as u32 + 1, "");
        undo.rollback = Some(progress);
        d.agents.report(&scope(), &undo).await.unwrap();
    }
    let done = "node m-1 is Ready (kubelet v1.33.4), the kubelet version it had before; uncordoned";
    let poll = PollRequest {
        current: Some(PlanProgress {
            plan_id: plan.id.clone(),
            status: PlanStatus::Failed,
            succeeded_steps: failed,
            total_steps: plan.steps.len() as u32,
            failed_step: Some(failed),
            hold: None,
            rollback: Some(rollback(RollbackState::RolledBack, failed, 2, done)),
        }),
        ..poll_for("m-1", 0)
    };
    d.agents.poll(&scope(), &poll).await.unwrap();

    let answer = d.runs.update_machine(&retry).await.unwrap();
    let UpdateAnswer::Failed { message } = answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.contains(&format!(
            "; rolled back steps {}\u{2013}{failed}: {done}; to run it again once the cause is fixed",
            failed + 1
        )),
        "{message}"
    );
    let rows = d.fleet.status().await.unwrap();
    assert_eq!(rows[0].state, StatusState::RolledBack, "{rows:?}");
    assert!(rows[0].message.contains("rolled back steps"), "{rows:?}");
    let counted = |outcome| {
        metrics
            .rollbacks
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    };
    assert_eq!((counted("rolled-back"), counted("failed")), (1, 0));

    // The same progress again (lost acks) counts nothing more; a retry value now starts a fresh run.
    d.agents.poll(&scope(), &poll).await.unwrap();
    assert_eq!(counted("rolled-back"), 1);
    let again = annotated(json!({ RETRY_ANNOTATION: "2" }));
    in_progress(d.runs.update_machine(&again).await.unwrap());
    let fresh = handed_plan(&d, "m-1").await;
    assert_ne!(fresh.id, plan.id, "a fresh run");
}

#[tokio::test]
async fn a_failed_rollback_says_the_node_is_left_cordoned() {
    let d = dispatcher(memory().await);
    let request = annotated(json!({}));
    update(&d, &request).await.unwrap();
    let plan = handed_plan(&d, "m-1").await;
    let mut failure = report("m-1", &plan.id, 2, StepStatus::Failed);
    let why = "undo of step 2 (install kubeadm v1.34.1) failed: exit 100; node left cordoned";
    failure.rollback = Some(rollback(RollbackState::Failed, 2, 0, why));
    agent_reports(&d, "m-1", &plan.id, 0..2, StepStatus::Succeeded).await;
    d.agents.report(&scope(), &failure).await.unwrap();
    let answer = d.runs.update_machine(&request).await.unwrap();
    let UpdateAnswer::Failed { message } = answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.contains(&format!("; rollback failed: {why};")),
        "{message}"
    );
    let rows = d.fleet.status().await.unwrap();
    assert_eq!(rows[0].state, StatusState::Failed, "{rows:?}");
}

#[tokio::test]
async fn on_failure_reaches_the_agent_with_its_plan_and_hold_is_said_in_the_failure() {
    let d = dispatcher(memory().await);
    let request = annotated(json!({ ON_FAILURE_ANNOTATION: "hold" }));
    update(&d, &request).await.unwrap();
    let answer = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(answer.on_failure, Some(OnFailure::Hold));
    let plan = answer.plan.expect("a plan");
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Failed))
        .await
        .unwrap();
    let answer = d.runs.update_machine(&request).await.unwrap();
    let UpdateAnswer::Failed { message } = answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.contains("nothing undone: the node is left as it failed for inspection"),
        "{message}"
    );

    // The setting applies when the annotation is absent; the annotation wins over it.
    let d = dispatcher(memory().await);
    let mut by_setting = annotated(json!({}));
    by_setting.on_failure_setting = Some(OnFailure::Hold);
    update(&d, &by_setting).await.unwrap();
    let answer = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(answer.on_failure, Some(OnFailure::Hold));
    let mut overridden = annotated(json!({ ON_FAILURE_ANNOTATION: "rollback" }));
    overridden.on_failure_setting = Some(OnFailure::Hold);
    d.runs.update_machine(&overridden).await.unwrap();
    let answer = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(answer.on_failure, Some(OnFailure::Rollback));
}
