//! Server holds (pause, cancel) against a real TLS server: the step running when a hold comes finishes, no
//! step starts after an ack or poll answer that carried one — also after a crash right after that ack — and
//! the plan continues from where it stopped once the hold is lifted.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fixtures::*;
use common::*;
use inplace_agent::api::*;

fn paused(plan_id: &str) -> Hold {
    Hold {
        plan_id: plan_id.into(),
        reason: HoldReason::Paused {
            by: "annotation inplace-updater.dev/paused=alice".into(),
        },
    }
}

/// Whether a poll said the agent honours `hold` with `done` steps succeeded.
fn honoured(server: &TestServer, hold: &Hold, done: u32) -> bool {
    server.with(|s| {
        s.polls.iter().any(|p| {
            p.current
                .as_ref()
                .is_some_and(|c| c.hold.as_ref() == Some(hold) && c.succeeded_steps == done)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_in_a_step_ack_stops_the_plan_across_a_crash_until_it_is_lifted() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    let hold = paused("plan-h");
    server.with(|s| s.hold_on_report = Some((0, StepStatus::Succeeded, hold.clone())));
    let config = node.agent_config(&server, TOKEN, DRIVERS);
    let agent = spawn_agent(config.clone());
    server.offer(upgrade_plan("plan-h"));

    // Step 0's success is acked with the hold: step 1 never starts, and the agent says it holds.
    wait_until("the agent honours the hold", LIMIT, || {
        honoured(&server, &hold, 1)
    })
    .await;
    assert!(server.reports_for(1).is_empty());
    assert_eq!(node.calls("kubeadm upgrade node"), 0);
    let state = std::fs::read_to_string(node.state.join("state.json")).unwrap();
    assert!(
        state.contains("inplace-updater.dev/paused=alice"),
        "{state}"
    );

    // Killed while held: the restarted agent asks the server first and, still held, starts nothing.
    agent.crash().await;
    let polls = server.with(|s| s.polls.len());
    let agent = spawn_agent(config);
    wait_until("a poll from the restarted agent", LIMIT, || {
        server.with(|s| s.polls.len() > polls)
    })
    .await;
    wait_until("the restarted agent honours the hold", LIMIT, || {
        server.with(|s| {
            s.polls[polls..].iter().any(|p| {
                p.current
                    .as_ref()
                    .is_some_and(|c| c.hold == Some(hold.clone()))
            })
        })
    })
    .await;
    assert!(server.reports_for(1).is_empty());
    assert_eq!(node.calls("kubeadm upgrade node"), 0);

    // Lifted: the plan continues with step 1 and finishes; step 0 is not run again.
    server.with(|s| {
        s.hold = None;
        s.hold_on_report = None;
    });
    server.wake.notify_waiters();
    wait_until("step 2 succeeded", LIMIT, || {
        server
            .reports_for(2)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    assert_eq!(node.calls("kubeadm upgrade node"), 1);
    assert_eq!(node.calls("apt-get"), 1);
    assert_eq!(
        server
            .reports_for(0)
            .iter()
            .filter(|r| r.status == StepStatus::Running)
            .map(|r| r.attempt)
            .max(),
        Some(1),
        "step 0 ran once"
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_step_lets_it_finish_and_starts_no_other() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    // `kubeadm upgrade node` runs until the test lets it finish.
    node.fake(
        "kubeadm",
        "[ \"$1\" = version ] && echo v1.34.1 && exit 0\nwhile [ ! -f \"$INPLACE_ROOT/go\" ]; do sleep 0.05; done\nexit 0",
    );
    let cancel = Hold {
        plan_id: "plan-c".into(),
        reason: HoldReason::Cancelled {
            value: "ticket-7".into(),
        },
    };
    server.with(|s| s.hold_on_report = Some((1, StepStatus::Running, cancel.clone())));
    let agent = spawn_agent(node.agent_config(&server, TOKEN, DRIVERS));
    server.offer(upgrade_plan("plan-c"));

    wait_until("the cancel acked while step 1 runs", LIMIT, || {
        server.with(|s| s.hold.is_some())
    })
    .await;
    node.write("/go", "");
    wait_until("the agent stopped for the cancel", LIMIT, || {
        honoured(&server, &cancel, 2)
    })
    .await;
    assert_eq!(
        node.calls("kubeadm upgrade node"),
        1,
        "the running step finished"
    );
    assert!(
        server
            .reports_for(1)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    );
    assert!(server.reports_for(2).is_empty(), "step 2 never started");
    assert_eq!(node.calls("apt-get"), 0);

    // A new plan (the operator's retry) is adopted and run from the start.
    server.with(|s| {
        s.hold = None;
        s.hold_on_report = None;
    });
    let mut retry = upgrade_plan("plan-c2");
    retry.steps.truncate(1);
    server.offer(retry);
    wait_until("the new plan ran", LIMIT, || {
        server.with(|s| {
            s.reports
                .iter()
                .any(|r| r.plan_id == "plan-c2" && r.status == StepStatus::Succeeded)
        })
    })
    .await;
    agent.shutdown().await;
}
