//! Maintenance windows in UpdateMachine, judged by a pinned clock: outside the window no run is recorded and
//! the answer says when it opens; inside, the run starts; `retryAfterSeconds` never passes the opening.

use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::testing::*;
use crate::dispatch::*;
use inplace_agent_api::{HoldReason, StepStatus};
use inplace_core::Window;

const MONDAY_NIGHT: &str = "days=mon start=22:00 end=04:00 tz=Europe/Berlin";

fn ms(rfc3339: &str) -> u64 {
    rfc3339.parse::<jiff::Timestamp>().unwrap().as_millisecond() as u64
}

fn windowed(motd: &str) -> UpdateRequest {
    UpdateRequest {
        window: Some(Window::parse(MONDAY_NIGHT).unwrap()),
        ..request("m-1", false, "v1.34.1", motd)
    }
}

async fn machine_record(d: &Dispatcher) -> Option<MachineRecord> {
    d.db()
        .read::<MachineRecord>("machines/default/m-1")
        .await
        .unwrap()
        .map(|(r, _)| r)
}

#[tokio::test]
async fn outside_the_window_no_run_starts_and_the_answer_says_when_it_opens() {
    let d = dispatcher(memory().await);
    // Monday 2026-12-07 18:48 in Berlin: the window opens at 22:00 local (21:00Z).
    d.clock().pin_for_tests(ms("2026-12-07T17:48:00Z"));
    let answer = update(&d, &windowed("v2")).await.unwrap();
    assert_eq!(
        answer,
        UpdateAnswer::InProgress {
            message: format!(
                "outside maintenance window {MONDAY_NIGHT}: opens 2026-12-07T22:00:00+01:00 (in 3h12m); \
                 the update starts then"
            ),
            retry_after_seconds: DEFAULT_RETRY_AFTER_SECONDS,
        }
    );
    assert!(
        machine_record(&d).await.is_none(),
        "nothing recorded, so no agent gets a plan"
    );

    // Three seconds before it opens, CAPI is told to come back at the opening, not later.
    d.clock().pin_for_tests(ms("2026-12-07T20:59:57Z"));
    match update(&d, &windowed("v2")).await.unwrap() {
        UpdateAnswer::InProgress {
            retry_after_seconds,
            message,
        } => {
            assert_eq!(retry_after_seconds, 3, "{message}");
            assert!(message.contains("(in 1m)"), "{message}");
        }
        other => panic!("expected in progress, got {other:?}"),
    }

    // Open: the run is recorded and the agent is awaited.
    d.clock().pin_for_tests(ms("2026-12-07T21:00:00Z"));
    match update(&d, &windowed("v2")).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => {
            assert!(
                message.starts_with("waiting for agent on default/m-1"),
                "{message}"
            )
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    assert!(machine_record(&d).await.is_some());
}

#[tokio::test]
async fn a_new_desired_state_waits_for_the_window_but_the_recorded_run_is_kept() {
    let d = dispatcher(memory().await);
    d.clock().pin_for_tests(ms("2026-12-07T23:00:00Z"));
    update(&d, &windowed("v2")).await.unwrap();
    let first = machine_record(&d).await.unwrap();

    // The window closed (Tuesday 05:00 in Berlin): the recorded run is held, and says until when.
    d.clock().pin_for_tests(ms("2026-12-08T04:00:00Z"));
    match update(&d, &windowed("v2")).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => assert!(
            message.starts_with(&format!(
                "outside maintenance window {MONDAY_NIGHT}: opens 2026-12-14T22:00:00+01:00 (in 6d17h); \
                 the next step starts then; held after step 0 of"
            )),
            "{message}"
        ),
        other => panic!("expected in progress, got {other:?}"),
    }
    // Another desired state does not replace it until the window opens again next Monday.
    match update(&d, &windowed("v3")).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => assert!(
            message.contains("opens 2026-12-14T22:00:00+01:00 (in 6d17h)"),
            "{message}"
        ),
        other => panic!("expected in progress, got {other:?}"),
    }
    assert_eq!(machine_record(&d).await.unwrap().run_id, first.run_id);

    d.clock().pin_for_tests(ms("2026-12-14T21:00:00Z"));
    update(&d, &windowed("v3")).await.unwrap();
    assert_ne!(machine_record(&d).await.unwrap().run_id, first.run_id);
}

#[tokio::test]
async fn without_a_window_the_clock_does_not_matter() {
    let d = dispatcher(memory().await);
    d.clock().pin_for_tests(ms("2026-12-07T17:48:00Z"));
    let plain = request("m-1", false, "v1.34.1", "v2");
    match update(&d, &plain).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => {
            assert!(message.starts_with("waiting for agent"), "{message}")
        }
        other => panic!("expected in progress, got {other:?}"),
    }
}

#[tokio::test]
async fn a_run_in_progress_is_held_after_its_step_when_the_window_shuts_and_goes_on_when_it_opens()
{
    let d = dispatcher(memory().await);
    d.clock().pin_for_tests(ms("2026-12-07T23:00:00Z"));
    update(&d, &windowed("v2")).await.unwrap();
    let first = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(first.hold, None);
    let plan = first.plan.expect("a plan");
    d.agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Running))
        .await
        .unwrap();

    // The window shuts while step 1 runs: the step's end is acked with the window hold, and polls say so.
    d.clock().pin_for_tests(ms("2026-12-08T04:00:00Z"));
    let opens = ms("2026-12-14T21:00:00Z");
    let ack = d
        .agents
        .report(&scope(), &report("m-1", &plan.id, 0, StepStatus::Succeeded))
        .await
        .unwrap()
        .expect("held");
    assert_eq!(ack.plan_id, plan.id);
    assert_eq!(
        ack.reason,
        HoldReason::Window {
            opens_at_unix_ms: Some(opens)
        }
    );
    let polled = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(polled.hold, Some(ack.clone()));
    match update(&d, &windowed("v2")).await.unwrap() {
        UpdateAnswer::InProgress {
            message,
            retry_after_seconds,
        } => {
            assert!(
                message.contains("opens 2026-12-14T22:00:00+01:00 (in 6d17h); the next step starts then; held after step 1 of"),
                "{message}"
            );
            assert_eq!(retry_after_seconds, DEFAULT_RETRY_AFTER_SECONDS);
        }
        other => panic!("expected in progress, got {other:?}"),
    }

    // It opens: no hold any more, and UpdateMachine reports the run again.
    d.clock().pin_for_tests(opens);
    let polled = d.agents.poll(&scope(), &poll_for("m-1", 0)).await.unwrap();
    assert_eq!(polled.hold, None);
    match update(&d, &windowed("v2")).await.unwrap() {
        UpdateAnswer::InProgress { message, .. } => {
            assert!(!message.contains("maintenance window"), "{message}")
        }
        other => panic!("expected in progress, got {other:?}"),
    }
}
