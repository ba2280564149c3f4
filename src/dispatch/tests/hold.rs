//! Pause and cancel over the in-memory store: UpdateMachine records them, agents learn them from report acks
//! and poll answers (also from a second dispatcher, as after a server restart), UpdateMachine says "paused
//! after step N" only once the agent confirmed it, removing the pause lets the agent go on, and a cancel ends
//! the run with Failure once the agent stopped, spent once per value, so the operator retry restarts it.

use std::time::{Duration, Instant};

use inplace_agent_api::{Hold, HoldReason, PlanProgress, PlanStatus, PollRequest, StepStatus};
use serde_json::json;

use crate::dispatch::testing::*;
use crate::dispatch::*;

fn annotated(annotations: serde_json::Value) -> UpdateRequest {
    let machine = json!({
        "metadata": {
            "name": "m-1",
            "namespace": "default",
            "labels": { "cluster.x-k8s.io/cluster-name": "edge-01" },
            "annotations": annotations,
        },
        "spec": { "clusterName": "edge-01", "version": "v1.34.1" }
    });
    let bootstrap = json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } });
    request_of(&machine, &bootstrap)
}

/// A poll of m-1's agent holding `plan_id` with `done` steps succeeded, honouring `hold`.
fn holding(plan_id: &str, done: u32, total: u32, hold: Option<Hold>, wait: u32) -> PollRequest {
    PollRequest {
        current: Some(PlanProgress {
            plan_id: plan_id.into(),
            status: PlanStatus::Running,
            succeeded_steps: done,
            total_steps: total,
            failed_step: None,
            hold,
            rollback: None,
        }),
        ..poll_for("m-1", wait)
    }
}

fn in_progress(answer: &UpdateAnswer) -> &str {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message,
        other => panic!("not in progress: {other:?}"),
    }
}

/// Records m-1's run (judged in place), hands it to the agent and starts step 0; returns the plan.
async fn started(d: &Dispatcher) -> inplace_agent_api::Plan {
    let request = annotated(json!({}));
    judge_in_place(d, &request).await;
    d.runs.update_machine(&request).await.unwrap();
    let plan = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(plan.hold, None);
    let plan = plan.plan.expect("a plan");
    assert!(plan.steps.len() >= 2, "a multi-step plan: {plan:?}");
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Running))
        .await
        .unwrap();
    plan
}

#[tokio::test]
async fn a_pause_holds_after_the_running_step_and_removing_it_lets_the_agent_go_on() {
    let store = memory().await;
    let a = dispatcher(store.clone());
    let plan = started(&a).await;
    let total = plan.steps.len() as u32;
    let paused = annotated(json!({ PAUSE_ANNOTATION: "alice: disk check" }));
    let message = a.runs.update_machine(&paused).await.unwrap();
    let message = in_progress(&message);
    assert!(
        message.starts_with(
            "paused by annotation inplace-updater.dev/paused=alice: disk check: step 1/"
        ) && message.contains("is running and finishes first"),
        "{message}"
    );

    // A second replica (or this one restarted) acks the step's end with the hold.
    let b = dispatcher(store.clone());
    let hold = b
        .agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap()
        .expect("the ack carries the hold");
    assert_eq!(
        hold.reason,
        HoldReason::Paused {
            by: "annotation inplace-updater.dev/paused=alice: disk check".into()
        }
    );
    assert_eq!(hold.plan_id, plan.id);

    // The agent confirms with its next poll, which then waits and says the hold again.
    let answer = b
        .agents
        .poll(
            &scope(),
            &holding(&plan.id, 1, total, Some(hold.clone()), 0),
        )
        .await
        .unwrap();
    assert_eq!((answer.plan, answer.hold.as_ref()), (None, Some(&hold)));
    let message = a.runs.update_machine(&paused).await.unwrap();
    assert_eq!(
        in_progress(&message),
        format!(
            "paused by annotation inplace-updater.dev/paused=alice: disk check after step 1 of {total}; \
             to resume: kubectl annotate machine -n default m-1 inplace-updater.dev/paused-"
        )
    );
    let rows = a.fleet.status().await.unwrap();
    assert_eq!(rows[0].state, StatusState::Paused, "{rows:?}");

    // Removed while the agent waits in a long poll on the other replica: it is woken with the go-ahead.
    let waiting = {
        let b = b.clone();
        let request = holding(&plan.id, 1, total, Some(hold.clone()), 30);
        tokio::spawn(async move {
            let started = Instant::now();
            (
                b.agents.poll(&scope(), &request).await.unwrap(),
                started.elapsed(),
            )
        })
    };
    tokio::task::yield_now().await;
    let resumed = a.runs.update_machine(&annotated(json!({}))).await.unwrap();
    assert!(
        in_progress(&resumed).starts_with(&format!("step 2/{total}: ")),
        "{resumed:?}"
    );
    let (answer, waited) = waiting.await.unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "woken, not timed out: {waited:?}"
    );
    assert_eq!(answer.hold, None);
    assert_eq!(answer.plan.map(|p| p.id), Some(plan.id.clone()));
    assert_eq!(
        a.agents
            .report(&scope(), &report("m-1", &plan.id, 1, StepStatus::Running))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn the_setting_pauses_a_brand_new_run_which_is_handed_out_held() {
    let store = memory().await;
    let d = dispatcher(store);
    let mut request = annotated(json!({}));
    request.paused_setting = Some("freeze until Monday".into());
    judge_in_place(&d, &request).await;
    let answer = d.runs.update_machine(&request).await.unwrap();
    assert!(
        in_progress(&answer).starts_with(
            "paused by ExtensionConfig setting paused=freeze until Monday after step 0 of "
        ) && in_progress(&answer).contains("remove the ExtensionConfig setting paused"),
        "{answer:?}"
    );
    let answer = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    let (plan, hold) = (answer.plan.expect("handed out"), answer.hold.expect("held"));
    assert!(
        matches!(hold.reason, HoldReason::Paused { ref by } if by == "ExtensionConfig setting paused=freeze until Monday")
    );
    // The annotation names the Machine and wins over the setting.
    let mut named = annotated(json!({ PAUSE_ANNOTATION: "bob" }));
    named.paused_setting = request.paused_setting.clone();
    let answer = d.runs.update_machine(&named).await.unwrap();
    assert!(
        in_progress(&answer).starts_with("paused by annotation inplace-updater.dev/paused=bob"),
        "{answer:?}"
    );
    let total = plan.steps.len() as u32;
    let answer = d
        .agents
        .poll(&scope(), &holding(&plan.id, 0, total, Some(hold), 0))
        .await
        .unwrap();
    assert!(
        answer
            .hold
            .is_some_and(|h| matches!(h.reason, HoldReason::Paused { by } if by.contains("=bob")))
    );
}

#[tokio::test]
async fn a_cancel_ends_the_run_with_failure_once_the_agent_stopped_and_a_retry_restarts_it() {
    let store = memory().await;
    let d = dispatcher(store.clone());
    let plan = started(&d).await;
    let total = plan.steps.len() as u32;
    let cancel = annotated(json!({ CANCEL_ANNOTATION: "ticket-7" }));
    let answer = d.runs.update_machine(&cancel).await.unwrap();
    assert!(
        in_progress(&answer)
            .starts_with("cancelling (inplace-updater.dev/cancel=ticket-7): step 1/"),
        "{answer:?}"
    );
    let hold = d
        .agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap()
        .expect("the cancel in the ack");
    assert!(hold.cancels());
    // Not yet confirmed: still in progress.
    assert!(
        in_progress(&d.runs.update_machine(&cancel).await.unwrap()).contains("has not confirmed")
    );
    d.agents
        .poll(
            &scope(),
            &holding(&plan.id, 1, total, Some(hold.clone()), 0),
        )
        .await
        .unwrap();
    let answer = d.runs.update_machine(&cancel).await.unwrap();
    let UpdateAnswer::Failed { message } = &answer else {
        panic!("{answer:?}")
    };
    assert!(
        message.starts_with(&format!(
            "cancelled by operator (inplace-updater.dev/cancel=ticket-7) after step 1 of {total}; to run it again: \
             kubectl annotate machine -n default m-1 inplace-updater.dev/retry="
        )),
        "{message}"
    );
    let rows = d.fleet.status().await.unwrap();
    assert_eq!(rows[0].state, StatusState::Cancelled, "{rows:?}");
    // A late report of the stopped agent changes nothing.
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 1, StepStatus::Succeeded))
        .await
        .unwrap();
    assert!(matches!(
        d.runs.update_machine(&cancel).await.unwrap(),
        UpdateAnswer::Failed { .. }
    ));

    // The retry starts a fresh run; the spent cancel value, still on the Machine, does not cancel it.
    let retry = annotated(json!({ CANCEL_ANNOTATION: "ticket-7", RETRY_ANNOTATION: "1" }));
    let answer = d.runs.update_machine(&retry).await.unwrap();
    assert!(
        in_progress(&answer).starts_with("waiting for agent"),
        "{answer:?}"
    );
    let answer = d
        .agents
        .poll(&scope(), &holding(&plan.id, 1, total, Some(hold), 0))
        .await
        .unwrap();
    let fresh = answer.plan.expect("the fresh run");
    assert_ne!(fresh.id, plan.id);
    assert_eq!(answer.hold, None);
    // A new value cancels the fresh run.
    let again = annotated(json!({ CANCEL_ANNOTATION: "ticket-8", RETRY_ANNOTATION: "1" }));
    d.runs.update_machine(&again).await.unwrap();
    let answer = d
        .agents
        .poll(&scope(), &holding(&fresh.id, 0, total, None, 0))
        .await
        .unwrap();
    assert!(
        matches!(answer.hold.map(|h| h.reason), Some(HoldReason::Cancelled { value }) if value == "ticket-8")
    );
}
