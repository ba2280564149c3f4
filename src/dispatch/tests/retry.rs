//! Operator retry over the in-memory store: a new value restarts a failed run exactly once, also when two
//! dispatchers (two replicas) see it at the same instant; a value on a run that did not fail is recorded and
//! ignored; a retry of the licensed desired state needs no new verdict, a changed desired state still does.

use inplace_agent_api::{MachineRef, StepStatus};
use serde_json::json;

use crate::dispatch::floor::keys::machine_key;
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::testing::*;
use crate::dispatch::*;

fn annotated(retry: Option<&str>, version: &str) -> UpdateRequest {
    let mut machine = json!({
        "metadata": {
            "name": "m-1",
            "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" }
        },
        "spec": { "clusterName": "edge-01", "version": version }
    });
    if let Some(value) = retry {
        machine["metadata"]["annotations"] = json!({ RETRY_ANNOTATION: value });
    }
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    request_of(&machine, &bootstrap)
}

fn machine() -> MachineRef {
    MachineRef::new("default", "m-1")
}

/// Records a judged run for m-1 and fails its first step; returns the run id.
async fn failed_run(d: &Dispatcher) -> String {
    let request = annotated(None, "v1.34.1");
    judge_in_place(d, &request).await;
    d.runs.update_machine(&request).await.unwrap();
    let plan = d
        .agents
        .poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan;
    let plan = plan.expect("a plan for the agent");
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Failed))
        .await
        .unwrap();
    let answer = d.runs.update_machine(&request).await.unwrap();
    let UpdateAnswer::Failed { message } = answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.ends_with(
            "to run it again once the cause is fixed: kubectl annotate machine -n default m-1 \
             inplace-updater.dev/retry=$(date +%s) --overwrite"
        ),
        "{message}"
    );
    plan.id
}

async fn current_run(d: &Dispatcher) -> String {
    let (record, _) = d
        .db()
        .read::<MachineRecord>(&machine_key(&machine()))
        .await
        .unwrap()
        .unwrap();
    record.run_id
}

#[tokio::test]
async fn two_replicas_seeing_one_value_start_one_fresh_run() {
    let store = memory().await;
    let (a, b) = (dispatcher(store.clone()), dispatcher(store.clone()));
    let failed = failed_run(&a).await;
    let m = machine();
    let (x, y) = tokio::join!(a.runs.retry(&m, "1"), b.runs.retry(&m, "1"));
    let mut outcomes = [x.unwrap(), y.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, RetryOutcome::AlreadySeen));
    let RetryOutcome::Started { run_id } = &outcomes[0] else {
        panic!("{outcomes:?}")
    };
    assert_eq!(outcomes[1], RetryOutcome::AlreadySeen, "{outcomes:?}");
    assert_ne!(run_id, &failed);
    assert_eq!(&current_run(&a).await, run_id);
    assert_eq!(store.list("updates/").await.unwrap().len(), 2);
    // The agent is handed the fresh run, and UpdateMachine answers from it.
    let plan = b
        .agents
        .poll(&scope(), &poll_for("m-1", 0))
        .await
        .unwrap()
        .plan;
    assert_eq!(plan.map(|p| p.id).as_ref(), Some(run_id));
    let answer = a
        .runs
        .update_machine(&annotated(None, "v1.34.1"))
        .await
        .unwrap();
    assert!(
        matches!(answer, UpdateAnswer::InProgress { .. }),
        "{answer:?}"
    );
    // The same value again, on either replica, does nothing.
    assert_eq!(
        b.runs.retry(&machine(), "1").await.unwrap(),
        RetryOutcome::AlreadySeen
    );
    assert_eq!(&current_run(&b).await, run_id);
}

#[tokio::test]
async fn the_annotation_restarts_a_failed_run_once_without_a_new_verdict() {
    let store = memory().await;
    let (a, b) = (dispatcher(store.clone()), dispatcher(store.clone()));
    let failed = failed_run(&a).await;
    // The verdict is gone (retention, or never judged again): the run's licence still covers its state.
    store
        .delete(
            &floor::keys::machine_verdict_key(&machine()),
            inplace_store::Precondition::Any,
        )
        .await
        .unwrap();
    let retry = annotated(Some("1700000000"), "v1.34.1");
    let (x, y) = tokio::join!(a.runs.update_machine(&retry), b.runs.update_machine(&retry));
    for answer in [x.unwrap(), y.unwrap()] {
        assert!(
            matches!(&answer, UpdateAnswer::InProgress { message, .. } if message.starts_with("waiting for agent")),
            "{answer:?}"
        );
    }
    let fresh = current_run(&a).await;
    assert_ne!(fresh, failed);
    assert_eq!(
        store.list("updates/").await.unwrap().len(),
        2,
        "one fresh run"
    );
    // Fail the fresh run too: the same value does nothing, the answer is its Failure.
    a.agents
        .report(&scope(), &report("m-1", &fresh, 0, StepStatus::Failed))
        .await
        .unwrap();
    assert!(matches!(
        b.runs.update_machine(&retry).await.unwrap(),
        UpdateAnswer::Failed { .. }
    ));
    assert_eq!(current_run(&a).await, fresh);
    // A changed desired state still needs a CanUpdate verdict, retry value or not.
    let changed = annotated(Some("1700000001"), "v1.34.2");
    let refused = a.runs.update_machine(&changed).await.unwrap();
    assert!(
        matches!(refused, UpdateAnswer::Refused { .. }),
        "{refused:?}"
    );
    assert_eq!(current_run(&a).await, fresh);
}

#[tokio::test]
async fn a_value_on_a_run_that_did_not_fail_is_recorded_and_ignored() {
    let d = dispatcher(memory().await);
    let request = annotated(None, "v1.34.1");
    judge_in_place(&d, &request).await;
    d.runs.update_machine(&request).await.unwrap();
    let run = current_run(&d).await;
    let answer = d
        .runs
        .update_machine(&annotated(Some("2"), "v1.34.1"))
        .await
        .unwrap();
    let UpdateAnswer::InProgress { message, .. } = &answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.ends_with(
            "(inplace-updater.dev/retry=\"2\" ignored: a retry only restarts a failed run, and this one has not failed)"
        ),
        "{message}"
    );
    assert_eq!(current_run(&d).await, run);
    // Once the run fails, the ignored value stays spent: only a new one restarts it.
    d.agents
        .report(&scope(), &report("m-1", &run, 0, StepStatus::Failed))
        .await
        .unwrap();
    assert!(matches!(
        d.runs
            .update_machine(&annotated(Some("2"), "v1.34.1"))
            .await
            .unwrap(),
        UpdateAnswer::Failed { .. }
    ));
    assert_eq!(
        d.runs.retry(&machine(), "2").await.unwrap(),
        RetryOutcome::AlreadySeen
    );
    assert!(matches!(
        d.runs
            .update_machine(&annotated(Some("3"), "v1.34.1"))
            .await
            .unwrap(),
        UpdateAnswer::InProgress { .. }
    ));
    assert_ne!(current_run(&d).await, run);
}

#[tokio::test]
async fn retry_values_are_bounded_and_unknown_machines_have_nothing_to_retry() {
    let d = dispatcher(memory().await);
    assert_eq!(
        d.runs.retry(&machine(), "1").await.unwrap(),
        RetryOutcome::NoRecord
    );
    let long = "x".repeat(MAX_KNOB_VALUE_BYTES + 1);
    assert!(matches!(
        d.runs.retry(&machine(), &long).await,
        Err(DispatchError::BadRequest(_))
    ));
}
