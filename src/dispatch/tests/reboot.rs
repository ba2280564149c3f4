//! A run whose running step reboots the node (osImage, reboot), judged by a pinned clock: while the agent is
//! silent UpdateMachine says the node is rebooting and when its agent was last seen; past the step's deadline,
//! that the node has not returned.

use std::time::Duration;

use serde_json::json;
use serde_json::value::RawValue;

use crate::dispatch::testing::*;
use crate::dispatch::*;
use inplace_agent_api::{StepKind, StepStatus};
use inplace_core::Action;
use inplace_core::plan::PlanInputs;
use inplace_core::policy::ImageField;

/// UpdateMachine of Machine `default/<name>` switching its OS image (the osImage action).
pub(super) fn os_image_request(name: &str) -> UpdateRequest {
    let infra = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
        "spec": {"image": {"url": "https://images.example/edge-2026-12.raw"}}
    });
    UpdateRequest {
        inputs: PlanInputs {
            actions: [Action::OsImage].into(),
            os_image: Some(ImageField::parse("spec.image.url").unwrap()),
            ..PlanInputs::default()
        },
        infra: Some(RawValue::from_string(infra.to_string()).unwrap()),
        ..request(name, false, "v1.34.1", "hi")
    }
}

fn message(answer: UpdateAnswer) -> String {
    match answer {
        UpdateAnswer::InProgress { message, .. } => message,
        other => panic!("expected progress, got {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_rebooting_node_is_said_rebooting_then_not_returned_past_its_deadline() {
    let d = dispatcher(memory().await);
    let start = 1_796_000_000_000;
    d.clock().pin_for_tests(start);
    let name = "edge-01-md-0-reboot";
    let request = os_image_request(name);
    update(&d, &request).await.unwrap();
    let plan = handed_plan(&d, name).await;
    let index = (plan.steps.iter())
        .position(|s| s.action.step_kind() == StepKind::OsImage)
        .expect("an osImage step");
    let timeout = u64::from(plan.steps[index].timeout_seconds);
    for earlier in 0..index as u32 {
        let mut done = report(name, &plan.id, earlier, StepStatus::Succeeded);
        done.started_at_unix_ms = Some(start);
        d.agents.report(&scope(), &done).await.unwrap();
    }
    let mut running = report(name, &plan.id, index as u32, StepStatus::Running);
    running.started_at_unix_ms = Some(start);
    running.finished_at_unix_ms = None;
    d.agents.report(&scope(), &running).await.unwrap();

    // Connected: the step's own description, nothing about a reboot.
    let text = message(d.runs.update_machine(&request).await.unwrap());
    assert!(
        text.contains("OS image https://images.example/edge-2026-12.raw"),
        "{text}"
    );
    assert!(!text.contains("rebooting"), "{text}");

    // Silent for 3 minutes: rebooting, last seen said.
    d.clock().advance_for_tests(Duration::from_secs(180));
    let text = message(d.runs.update_machine(&request).await.unwrap());
    assert!(
        text.contains("the node is rebooting: its agent was last seen 3m ago"),
        "{text}"
    );

    // Past the deadline: the node has not returned.
    d.clock().advance_for_tests(Duration::from_secs(timeout));
    let text = message(d.runs.update_machine(&request).await.unwrap());
    assert!(
        text.contains("the node has not returned: its agent was last seen 63m ago")
            && text.contains(&format!(
                "the step's deadline ({timeout} s from its start 63m ago) passed 3m ago"
            )),
        "{text}"
    );

    // Back: the agent polls again, and the message is the step's own again.
    d.agents.poll(&scope(), &poll_for(name, 0)).await.unwrap();
    let text = message(d.runs.update_machine(&request).await.unwrap());
    assert!(
        !text.contains("not returned") && !text.contains("rebooting"),
        "{text}"
    );
}
