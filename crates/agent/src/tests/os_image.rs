//! The osImage driver on a sandbox root with a stand-in `fake-bootc`: `switch <image>` stages the image
//! (`<root>/staged`), `status` prints the booted one (`<root>/booted`). The test's reboot boots the staged
//! image (or, for an A/B fallback, keeps the old one) under a new boot id.

use std::time::Duration;

use inplace_agent_api::{StepAction, StepKind};
use tokio::sync::watch;
use tokio::time::Instant;

use super::reboot::{OnWait, assert_ok, attempt, reboot_node, reboot_sandbox, reboots};
use super::{Sandbox, record_context, test_step};
use crate::drivers::{
    DriverOutcome, ProgressRecorder, StepResult, UndoContext, UndoRecord, execute_undo, record_undo,
};

const CONFIG: &str = r#"
reboot:
  command: [fake-reboot]
osImage:
  apply:
    commands:
      - run: [fake-bootc, switch, "{{image}}"]
  current: [fake-bootc, status]
"#;

pub(super) const OLD: &str = "registry.example/os:41";
pub(super) const NEW: &str = "registry.example/os:42";

fn sandbox() -> Sandbox {
    let sb = reboot_sandbox();
    sb.fake(
        "fake-bootc",
        "case \"$1\" in\n  status) cat \"$INPLACE_ROOT/booted\" ;;\n  switch) echo \"$2\" > \"$INPLACE_ROOT/staged\" ;;\n  *) exit 2 ;;\nesac",
    );
    sb.write_node("/booted", &format!("{OLD}\n"));
    sb
}

pub(super) fn os_image(image: &str) -> StepAction {
    StepAction::OsImage {
        image: image.into(),
    }
}

/// The machine reboots into the staged image (`fall_back`: into the one it booted before).
fn boot_staged(sb: &Sandbox, boot_id: &str, fall_back: bool) {
    if !fall_back {
        let staged = std::fs::read_to_string(sb.node("/staged")).unwrap();
        sb.write_node("/booted", &staged);
    }
    reboot_node(sb, boot_id);
}

fn switches(sb: &Sandbox) -> Vec<String> {
    sb.calls()
        .into_iter()
        .filter(|c| c.starts_with("fake-bootc switch"))
        .collect()
}

/// The first attempt applies and runs the reboot command; the agent is stopped while the machine goes down.
pub(super) async fn until_the_reboot(env: &std::sync::Arc<crate::drivers::DriverEnv>, image: &str) {
    let (result, _) = attempt(env, os_image(image), 30, OnWait::Stop).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Interrupted,
        "{}",
        result.message
    );
}

/// [`until_the_reboot`], the reboot command run once.
async fn apply_and_reboot(
    sb: &Sandbox,
    env: &std::sync::Arc<crate::drivers::DriverEnv>,
    image: &str,
) {
    until_the_reboot(env, image).await;
    assert_eq!(reboots(sb), 1);
}

/// The undo of an osImage step whose node booted `NEW`: its first attempt applies `OLD` and runs the reboot
/// command (the agent stopped as the machine goes down), `boot` is the machine's restart, the second attempt
/// verifies `OLD`.
pub(super) async fn undo_reboots_into_the_previous_image(
    env: &std::sync::Arc<crate::drivers::DriverEnv>,
    record: &UndoRecord,
    boot: impl FnOnce(),
) {
    let stopped = undo_attempt(env.clone(), record, true).await;
    assert_eq!(
        stopped.outcome,
        DriverOutcome::Interrupted,
        "{}",
        stopped.message
    );
    boot();
    let result = undo_attempt(env.clone(), record, false).await;
    assert_ok(&result);
    assert!(
        result.message.starts_with(&format!("now on {OLD}")),
        "{}",
        result.message
    );
}

/// What recording the undo of an osImage step to `NEW` takes, before its first effect: the image booted, `OLD`.
pub(super) async fn recorded_previous(
    env: &std::sync::Arc<crate::drivers::DriverEnv>,
) -> UndoRecord {
    let record = record_undo(
        env.clone(),
        record_context(super::reboot::PLAN, os_image(NEW)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        record,
        UndoRecord::OsImage {
            previous_image: OLD.into()
        }
    );
    record
}

#[tokio::test]
async fn a_node_already_on_the_image_is_left_alone() {
    let sb = sandbox();
    let env = sb.env(CONFIG);
    let (result, _) = attempt(&env, os_image(OLD), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);
    assert_eq!(result.message, format!("already on {OLD}"));
    assert_eq!(sb.calls(), ["fake-bootc status"]);
}

#[tokio::test]
async fn the_node_switches_reboots_once_and_verifies_the_new_image() {
    let sb = sandbox();
    let env = sb.env(CONFIG);
    apply_and_reboot(&sb, &env, NEW).await;
    boot_staged(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert!(
        result.message.starts_with(&format!(
            "now on {NEW}: always: rebooted (boot id boot-aaa… → boot-bbb…)"
        )),
        "{}",
        result.message
    );
    // A kill before the report: the resumed step neither applies nor reboots again.
    let (again, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(again.outcome, DriverOutcome::Succeeded);
    assert_eq!(reboots(&sb), 1);
    assert_eq!(switches(&sb), [format!("fake-bootc switch {NEW}")]);
}

#[tokio::test]
async fn a_boot_that_falls_back_to_the_previous_image_fails_the_step() {
    let sb = sandbox();
    let env = sb.env(CONFIG);
    apply_and_reboot(&sb, &env, NEW).await;
    boot_staged(&sb, "boot-bbbbbbbbbbbb", true);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        format!("booted the previous image {OLD} instead of {NEW} (the boot fell back)")
    );

    // Something else entirely is named as such.
    let sb = sandbox();
    let env = sb.env(CONFIG);
    apply_and_reboot(&sb, &env, NEW).await;
    sb.write_node("/booted", "registry.example/other:1\n");
    reboot_node(&sb, "boot-cccccccccccc");
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        format!("after the reboot osImage.current printed \"registry.example/other:1\", not {NEW}")
    );
    assert_eq!(reboots(&sb), 1);
}

#[tokio::test]
async fn a_node_without_an_os_image_section_refuses_the_step_before_any_effect() {
    let sb = sandbox();
    let env = sb.env("reboot:\n  command: [fake-reboot]\n");
    let record = record_undo(
        env.clone(),
        record_context(super::reboot::PLAN, os_image(NEW)),
    )
    .await;
    assert!(record.unwrap().is_none());
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        "this node's agent config has no osImage section: it cannot apply OS images \
         (add osImage.apply and osImage.current)"
    );
    assert!(sb.calls().is_empty());
}

/// One attempt of the undo of the osImage step, with `record`; the agent is stopped (like a reboot
/// stops it) when `stop` is set, as soon as the reboot command ran.
pub(super) async fn undo_attempt(
    env: std::sync::Arc<crate::drivers::DriverEnv>,
    record: &UndoRecord,
    stop: bool,
) -> StepResult {
    let (cancel_tx, cancel) = watch::channel(false);
    let (sender, mut receiver) = tokio::sync::mpsc::channel(1);
    let ctx = UndoContext {
        plan_id: super::reboot::PLAN.into(),
        index: 0,
        step: test_step(os_image(NEW)),
        progress: None,
        recorder: ProgressRecorder::new(sender),
        record: Some(record.clone()),
        resumed: true,
        deadline: Instant::now() + Duration::from_secs(30),
        timeout_seconds: 30,
        cancel,
    };
    let collector = tokio::spawn(async move {
        while let Some((_, message, ack)) = receiver.recv().await {
            let _ = ack.send(true);
            if stop && message.is_some_and(|m| m.contains("waiting for the node to go down")) {
                let _ = cancel_tx.send(true);
            }
        }
    });
    let result = execute_undo(env, StepKind::OsImage, ctx).await;
    collector.await.unwrap();
    result
}

#[tokio::test]
async fn the_undo_switches_back_to_the_recorded_previous_image() {
    let sb = sandbox();
    let env = sb.env(CONFIG);
    let record = recorded_previous(&env).await;
    apply_and_reboot(&sb, &env, NEW).await;
    boot_staged(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);

    // A rollback: the previous image is applied, the node reboots into it, and it is verified.
    undo_reboots_into_the_previous_image(&env, &record, || {
        boot_staged(&sb, "boot-cccccccccccc", false)
    })
    .await;
    assert_eq!(reboots(&sb), 2);
    assert_eq!(
        switches(&sb),
        [
            format!("fake-bootc switch {NEW}"),
            format!("fake-bootc switch {OLD}")
        ]
    );
}

#[tokio::test]
async fn current_may_print_json_read_at_a_pointer() {
    let sb = sandbox();
    sb.fake(
        "fake-status",
        "printf '{\"status\":{\"booted\":{\"image\":{\"image\":{\"image\":\"%s\"}}}}}\\n' \"$(cat \"$INPLACE_ROOT/booted\")\"",
    );
    let config = CONFIG.replace(
        "current: [fake-bootc, status]",
        "current: [fake-status]\n  currentJsonPointer: /status/booted/image/image/image",
    );
    let env = sb.env(&config);
    let (result, _) = attempt(&env, os_image(OLD), 30, OnWait::Keep).await;
    assert_eq!(result.message, format!("already on {OLD}"));
    let wrong = config.replace("/status/booted/image/image/image", "/status/staged");
    let env = sb.env(&wrong);
    let (result, _) = attempt(&env, os_image(OLD), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .contains("no string at osImage.currentJsonPointer /status/staged"),
        "{}",
        result.message
    );
}
