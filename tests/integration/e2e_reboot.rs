//! Reboots with real agent processes on the demo's sandboxed nodes (`inplace_updater::cmd::demo::Sandbox`: a
//! fake `systemctl reboot` that only records the request, a boot id, a fake `bootc`, the node's API as
//! `inplace_drain::fake`). A plan drains, reboots (or switches the OS image), waits for the Node Ready and
//! uncordons. When the reboot is requested the test SIGKILLs the agent (the machine going down), starts it
//! again on the SAME boot id — that is not a reboot: the step must keep waiting and not pass — then "boots"
//! the sandbox (a new boot id) and starts the agent again: the plan finishes with exactly one reboot.
//!
//! The plans come from the agent crate's own protocol test server (its `tests/integration/common`): the
//! server's planner learns the osImage action separately; this test is about the agent's side.

#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::agent_side::common as agent_server;

use std::path::Path;
use std::time::Duration;

use inplace_agent_api::{Plan, RebootWhen, RollbackState, StepAction, StepReport, StepStatus};
use inplace_updater::cmd::demo::Sandbox;

use agent_server::TestServer;

use crate::common::fleet::AgentProcess;

const TOKEN: &str = "reboot-e2e-token";
/// The sandbox's Node and the plan's Machine (`default/cp-0`).
const NAME: &str = "cp-0";
/// The image the osImage plan switches to.
const NEXT_IMAGE: &str = "registry.example/node-os:1.1";

fn plan(id: &str, disruption: StepAction) -> Plan {
    use agent_server::step;
    agent_server::plan(
        id,
        vec![
            step(
                0,
                "drain",
                StepAction::DrainNode {
                    delete_empty_dir_data: false,
                    force_unmanaged: false,
                },
            ),
            step(1, "reboot", disruption),
            step(
                2,
                "wait for the node",
                StepAction::WaitNodeReady {
                    kubelet_version: None,
                },
            ),
            step(3, "uncordon", StepAction::UncordonNode),
        ],
    )
}

/// Waits (a bounded poll) for the server to hold a report of step `index` matching `wanted`.
async fn report_where(
    server: &TestServer,
    index: u32,
    what: &str,
    wanted: impl Fn(&StepReport) -> bool,
) -> StepReport {
    agent_server::wait_until(what, Duration::from_secs(20), || {
        server.reports_for(index).iter().any(&wanted)
    })
    .await;
    server
        .reports_for(index)
        .into_iter()
        .find(|r| wanted(r))
        .unwrap()
}

fn waiting_to_go_down(report: &StepReport, attempt: u32) -> bool {
    report.attempt == attempt
        && report.status == StepStatus::Running
        && report
            .message
            .as_deref()
            .is_some_and(|m| m.contains("waiting for the node to go down"))
}

/// Runs `disruption` through the kill / same-boot restart / new-boot restart sequence in `dir`; returns the
/// step's success message and the sandbox.
async fn reboot_for_real(dir: &Path, plan_id: &str, disruption: StepAction) -> (String, Sandbox) {
    let server = TestServer::start(TOKEN).await;
    let sandbox = Sandbox::create(&dir.join(NAME), "v1.33.4", false).unwrap();
    let (ca, token) = (dir.join("ca.pem"), dir.join("token"));
    std::fs::write(&ca, &server.ca_pem).unwrap();
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    server.offer(plan(plan_id, disruption));
    let mut agent = AgentProcess::start_at(&server.url(), &ca, &token, NAME, sandbox.clone(), &[]);

    // The reboot command ran and the agent recorded it: the machine goes down (SIGKILL).
    report_where(&server, 1, "the reboot issued", |r| {
        waiting_to_go_down(r, 1)
    })
    .await;
    assert!(sandbox.reboot_requested());
    agent.kill();
    let boot_before = sandbox.boot_id();

    // The agent starts again on the same boot: not a reboot. The step waits again; it does not pass.
    agent.restart();
    report_where(&server, 1, "the same-boot restart waiting", |r| {
        waiting_to_go_down(r, 2)
    })
    .await;
    agent.kill();
    assert!(
        server
            .reports_for(1)
            .iter()
            .all(|r| r.status == StepStatus::Running),
        "{:?}",
        server.reports_for(1)
    );
    assert_eq!(sandbox.reboots(), 1, "{:?}", sandbox.calls());

    // The machine comes back with a new boot id; the agent starts with it.
    let boot_after = sandbox.boot().unwrap();
    assert_ne!(boot_before, boot_after);
    agent.restart();
    let done = report_where(&server, 1, "the reboot step succeeded", |r| {
        r.status == StepStatus::Succeeded
    })
    .await;
    report_where(&server, 3, "the uncordon", |r| {
        r.status == StepStatus::Succeeded
    })
    .await;
    agent.kill();
    assert_eq!(sandbox.reboots(), 1, "{:?}", sandbox.calls());
    for index in [0, 2, 3] {
        let ends: Vec<StepStatus> = server
            .reports_for(index)
            .iter()
            .map(|r| r.status)
            .filter(|s| *s != StepStatus::Running)
            .collect();
        assert_eq!(ends, [StepStatus::Succeeded], "step {index}");
    }
    let message = done.message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "(boot id {}… → {}…), node Ready",
            &boot_before[..8],
            &boot_after[..8]
        )),
        "{message}\n{}",
        agent.log()
    );
    (message, sandbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_step_reboots_once_across_agent_kills_and_a_same_boot_restart_does_not_pass() {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (message, _sandbox) = reboot_for_real(
        dir.path(),
        "plan-reboot",
        StepAction::Reboot {
            when: RebootWhen::Always,
        },
    )
    .await;
    assert!(
        message.starts_with("always: rebooted (boot id "),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_os_image_step_boots_the_new_image_once() {
    let dir = tempfile::tempdir().unwrap();
    let (message, sandbox) = reboot_for_real(
        dir.path(),
        "plan-os-image",
        StepAction::OsImage {
            image: NEXT_IMAGE.into(),
        },
    )
    .await;
    assert!(
        message.starts_with(&format!("now on {NEXT_IMAGE}: always: rebooted")),
        "{message}"
    );
    assert_eq!(sandbox.os_image(), NEXT_IMAGE);
    assert_eq!(applies(&sandbox), 1);
}

/// How many times the sandbox's `osImage.apply` ran (`bootc edit` of the host spec it wrote).
fn applies(sandbox: &Sandbox) -> usize {
    let edit = format!(
        "bootc edit --quiet --filename {}",
        sandbox
            .path("/var/lib/inplace-updater/bootc-host.yaml")
            .display()
    );
    sandbox.calls().iter().filter(|c| **c == edit).count()
}

/// Issue 43.2: the node comes back on its previous image (an A/B fallback) while the new image stays the default
/// boot entry. The step fails, and the rollback makes the previous image the default again — without a second
/// reboot — so the node's next reboot cannot land on the failed image; then the node is verified and uncordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_os_image_boot_that_falls_back_is_rolled_back_to_the_previous_image_as_the_default_entry()
 {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let server = TestServer::start(TOKEN).await;
    let sandbox = Sandbox::create(&dir.join(NAME), "v1.33.4", false).unwrap();
    sandbox.fall_back_next_boot(true).unwrap();
    let before = sandbox.os_image();
    let (ca, token) = (dir.join("ca.pem"), dir.join("token"));
    std::fs::write(&ca, &server.ca_pem).unwrap();
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let image = StepAction::OsImage {
        image: NEXT_IMAGE.into(),
    };
    server.offer(plan("plan-os-fallback", image));
    let mut agent = AgentProcess::start_at(&server.url(), &ca, &token, NAME, sandbox.clone(), &[]);
    report_where(&server, 1, "the reboot issued", |r| {
        waiting_to_go_down(r, 1)
    })
    .await;
    agent.kill();
    sandbox.boot().unwrap();
    assert_eq!(sandbox.os_image(), before, "the boot fell back");
    assert_eq!(
        sandbox.next_os_image(),
        NEXT_IMAGE,
        "the new image is still the default entry"
    );
    agent.restart();

    let failed = report_where(&server, 1, "the step's failure", |r| {
        !r.undo && r.status == StepStatus::Failed
    })
    .await;
    assert_eq!(
        failed.message.as_deref(),
        Some(
            format!(
                "booted the previous image {before} instead of {NEXT_IMAGE} (the boot fell back)"
            )
            .as_str()
        )
    );
    let undone = report_where(&server, 1, "the undo", |r| {
        r.undo && r.status == StepStatus::Succeeded
    })
    .await;
    assert_eq!(
        undone.message.as_deref(),
        Some(format!("{before} is booted already; osImage.apply made it the next boot's image again (no reboot)").as_str())
    );
    agent_server::wait_until("the rollback's end", Duration::from_secs(20), || {
        server.with(|s| {
            s.polls.iter().any(|p| {
                p.current
                    .as_ref()
                    .and_then(|c| c.rollback.as_ref())
                    .is_some_and(|r| r.state == RollbackState::RolledBack)
            })
        })
    })
    .await;
    agent.kill();
    assert_eq!(
        sandbox.next_os_image(),
        before,
        "the previous image is the default entry again"
    );
    assert_eq!(sandbox.os_image(), before);
    assert_eq!(
        sandbox.reboots(),
        1,
        "no reboot for the undo: {:?}",
        sandbox.calls()
    );
    assert_eq!(
        applies(&sandbox),
        2,
        "apply ran for the step and for its undo"
    );
}
