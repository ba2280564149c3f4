//! The reboot driver on a sandbox root: the reboot command is a stand-in that logs its call; the test
//! "reboots" by writing a new boot id into `<root>/proc/sys/kernel/random/boot_id` and running the step
//! again, as the agent does after its start. A kill at each point around the reboot is the disk state it
//! leaves (the reboot journal as written up to that point) followed by a resumed attempt: exactly one reboot
//! command runs in total, a restart on the same boot never passes the step, and no step is skipped.

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{RebootWhen, StepAction};
use tokio::sync::watch;

use super::{Sandbox, step_context};
use crate::clock::now_unix_ms;
use crate::drivers::{
    DriverEnv, DriverOutcome, ProgressRecorder, StepContext, StepResult, execute,
};
use crate::os::reboot::{REBOOT_JOURNAL, RebootIntent, RebootJournal};

/// The node path of the boot id.
pub(super) const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The plan every attempt belongs to.
pub(super) const PLAN: &str = "p";

/// A sandbox whose `fake-reboot` logs its call and whose boot id is `boot-a`.
pub(super) fn reboot_sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.fake("fake-reboot", "exit 0");
    sb.write_node(BOOT_ID, "boot-aaaaaaaaaaaa\n");
    sb
}

/// What the test does once the attempt says it waits for the machine to go down.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OnWait {
    /// Let the wait run to its end.
    Keep,
    /// Stop the agent (systemd stopping it as the machine goes down): the step is interrupted.
    Stop,
}

/// One attempt of `action` as step 0 of [`PLAN`]; returns the result and the running messages it reported.
pub(super) async fn attempt(
    env: &Arc<DriverEnv>,
    action: StepAction,
    timeout_seconds: u32,
    on_wait: OnWait,
) -> (StepResult, Vec<String>) {
    let (cancel_tx, cancel) = watch::channel(false);
    let (sender, mut receiver) = tokio::sync::mpsc::channel(1);
    let ctx = StepContext {
        resumed: true,
        ..step_context(
            PLAN,
            action,
            timeout_seconds,
            ProgressRecorder::new(sender),
            cancel,
        )
    };
    let collector = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((_, message, ack)) = receiver.recv().await {
            let waiting = message
                .as_deref()
                .is_some_and(|m| m.contains("waiting for the node to go down"));
            seen.extend(message);
            let _ = ack.send(true);
            if waiting && on_wait == OnWait::Stop {
                let _ = cancel_tx.send(true);
            }
        }
        seen
    });
    let result = execute(env.clone(), ctx).await;
    (result, collector.await.unwrap())
}

/// The machine rebooted: a new boot id.
pub(super) fn reboot_node(sb: &Sandbox, boot_id: &str) {
    sb.write_node(BOOT_ID, &format!("{boot_id}\n"));
}

/// How many times the reboot command ran.
pub(super) fn reboots(sb: &Sandbox) -> usize {
    sb.calls().iter().filter(|c| *c == "fake-reboot ").count()
}

pub(super) fn journal(sb: &Sandbox) -> Option<RebootIntent> {
    let bytes = std::fs::read(sb.state.join(REBOOT_JOURNAL)).ok()?;
    serde_json::from_slice::<RebootJournal>(&bytes)
        .unwrap()
        .intent
}

fn write_journal(sb: &Sandbox, intent: RebootIntent) {
    let journal = RebootJournal {
        intent: Some(intent),
    };
    std::fs::write(
        sb.state.join(REBOOT_JOURNAL),
        serde_json::to_vec(&journal).unwrap(),
    )
    .unwrap();
}

fn intent(issued: Option<u64>, at: u64) -> RebootIntent {
    RebootIntent {
        plan_id: PLAN.into(),
        step_index: 0,
        undo: false,
        boot_id_before: "boot-aaaaaaaaaaaa".into(),
        intent_at_unix_ms: at,
        issued_at_unix_ms: issued,
        previous_image: None,
        reason: "always".into(),
    }
}

const CONFIG: &str = "reboot:\n  command: [fake-reboot]\n";

fn always() -> StepAction {
    StepAction::Reboot {
        when: RebootWhen::Always,
    }
}

fn if_required() -> StepAction {
    StepAction::Reboot {
        when: RebootWhen::IfRequired,
    }
}

pub(super) fn assert_ok(result: &StepResult) {
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
}

/// The normal life of a reboot: the command runs, the agent is stopped while it waits for the machine to go
/// down, the machine comes back with a new boot id, the step is resumed and succeeds without a second reboot.
async fn reboot_through(sb: &Sandbox, env: &Arc<DriverEnv>, action: StepAction) -> StepResult {
    let (result, messages) = attempt(env, action.clone(), 30, OnWait::Stop).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Interrupted,
        "{}",
        result.message
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("reboot command sent at 20")),
        "{messages:?}"
    );
    reboot_node(sb, "boot-bbbbbbbbbbbb");
    let (result, _) = attempt(env, action, 30, OnWait::Keep).await;
    assert_ok(&result);
    result
}

#[tokio::test]
async fn if_required_reboots_only_when_the_reboot_required_file_is_there() {
    let sb = reboot_sandbox();
    let env = sb.env(CONFIG);
    let (result, _) = attempt(&env, if_required(), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(
        result.message,
        "no reboot required (/var/run/reboot-required is absent)"
    );
    assert_eq!(reboots(&sb), 0);
    assert!(journal(&sb).is_none());

    sb.write_node(
        "/var/run/reboot-required",
        "*** System restart required ***\n",
    );
    let result = reboot_through(&sb, &env, if_required()).await;
    assert_eq!(
        result.message,
        "reboot required (/var/run/reboot-required exists): rebooted (boot id boot-aaa… → boot-bbb…); \
         Node Ready not checked (no `node:` section in the agent config)"
    );
    assert_eq!(reboots(&sb), 1);
}

#[tokio::test]
async fn needs_restarting_exit_1_reboots_0_does_not_and_anything_else_fails() {
    let sb = reboot_sandbox();
    let config =
        "reboot:\n  command: [fake-reboot]\n  required: {command: [needs-restarting, -r]}\n";
    let env = sb.env(config);
    sb.fake(
        "needs-restarting",
        "exit \"$(cat \"$INPLACE_ROOT/answer\")\"",
    );

    sb.write_node("/answer", "0");
    let (result, _) = attempt(&env, if_required(), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(
        result.message,
        "no reboot required (`needs-restarting -r` exited 0)"
    );

    sb.write_node("/answer", "3");
    let (result, _) = attempt(&env, if_required(), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .contains("`needs-restarting -r` exited with 3"),
        "{}",
        result.message
    );
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(reboots(&sb), 0);

    sb.write_node("/answer", "1");
    let result = reboot_through(&sb, &env, if_required()).await;
    assert!(
        result
            .message
            .starts_with("reboot required (`needs-restarting -r` exited 1): rebooted"),
        "{}",
        result.message
    );
    assert_eq!(reboots(&sb), 1);
}

#[tokio::test]
async fn a_kill_at_every_point_around_the_reboot_reboots_exactly_once() {
    // Before the intent is recorded: nothing on disk; the resumed step reboots.
    let sb = reboot_sandbox();
    let env = sb.env(CONFIG);
    reboot_through(&sb, &env, always()).await;
    assert_eq!(reboots(&sb), 1, "before the intent");

    // After the intent, before the command: the resumed step runs the command (never skips it).
    let sb = reboot_sandbox();
    let env = sb.env(CONFIG);
    write_journal(&sb, intent(None, now_unix_ms()));
    reboot_through(&sb, &env, always()).await;
    assert_eq!(reboots(&sb), 1, "after the intent");

    // After the command, before "issued": the machine went down; the new boot is recognised.
    let sb = reboot_sandbox();
    let env = sb.env(CONFIG);
    write_journal(&sb, intent(None, now_unix_ms()));
    reboot_node(&sb, "boot-bbbbbbbbbbbb");
    let (result, _) = attempt(&env, always(), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(reboots(&sb), 0, "after the command: no second reboot");

    // After "issued", same boot id: an agent restart is not a reboot. The wait runs to the step's timeout…
    let sb = reboot_sandbox();
    let env = sb.env(CONFIG);
    let now = now_unix_ms();
    write_journal(&sb, intent(Some(now), now));
    let started = std::time::Instant::now();
    let (result, messages) = attempt(&env, always(), 1, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert!(
        result.message.starts_with("the reboot command ran at 20")
            && result
                .message
                .contains("the boot id is unchanged (boot-aaa…)"),
        "{}",
        result.message
    );
    assert!(
        messages[0].contains("waiting for the node to go down"),
        "{messages:?}"
    );
    assert_eq!(reboots(&sb), 0);
    // …counted from the recorded intent, not from this start: a long-gone intent fails at once.
    write_journal(&sb, intent(Some(now - 120_000), now - 120_000));
    let started = std::time::Instant::now();
    let (result, _) = attempt(&env, always(), 60, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(started.elapsed() < Duration::from_secs(5));
    // With a new boot id the same journal passes, without a second reboot.
    reboot_node(&sb, "boot-bbbbbbbbbbbb");
    let (result, _) = attempt(&env, always(), 60, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(reboots(&sb), 0, "after issued");

    // Before the report: the step succeeded, its report was lost; the resumed step succeeds again.
    let (again, _) = attempt(&env, always(), 60, OnWait::Keep).await;
    assert_ok(&again);
    assert_eq!(again.message, result.message);
    assert_eq!(reboots(&sb), 0, "before the report");
}

#[tokio::test]
async fn a_failing_reboot_command_fails_the_step_and_a_stale_journal_is_ignored() {
    let sb = reboot_sandbox();
    sb.fake("fake-reboot", "exit 1");
    let env = sb.env(CONFIG);
    // A journal of another plan, on another boot: not this step's reboot.
    let mut stale = intent(Some(1), 1);
    stale.plan_id = "older-plan".into();
    stale.boot_id_before = "boot-0".into();
    write_journal(&sb, stale);
    let (result, _) = attempt(&env, always(), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        "reboot.command: `fake-reboot` exited with 1"
    );
    assert_eq!(reboots(&sb), 1);
    let recorded = journal(&sb).unwrap();
    assert_eq!(
        (recorded.plan_id.as_str(), recorded.issued_at_unix_ms),
        (PLAN, None)
    );
}

#[tokio::test]
async fn without_a_boot_id_the_step_fails_before_rebooting() {
    let sb = Sandbox::new();
    sb.fake("fake-reboot", "exit 0");
    let env = sb.env(CONFIG);
    let (result, _) = attempt(&env, always(), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .starts_with("cannot read the boot id from /proc/sys/kernel/random/boot_id"),
        "{}",
        result.message
    );
    assert_eq!(reboots(&sb), 0);
}

#[test]
fn the_reboot_and_os_image_sections_are_checked_at_load() {
    let config = crate::config::DriverConfig::from_yaml("").unwrap();
    assert_eq!(config.reboot.command, ["systemctl", "reboot"]);
    assert_eq!(config.reboot.boot_id_file, BOOT_ID);
    assert!(config.os_image.is_none());
    for (yaml, expected) in [
        ("reboot: {required: {}}", "set exactly one of `file`"),
        (
            "reboot: {required: {file: /run/x, command: [needs-restarting, -r]}}",
            "set exactly one of `file`",
        ),
        ("reboot: {bootIdFile: boot_id}", "reboot.bootIdFile"),
        (
            "reboot: {command: []}",
            "reboot.command: argv needs a program",
        ),
        (
            "reboot: {command: [\"{{version}}\"]}",
            "this command knows: root",
        ),
        ("reboot: {commnd: [x]}", "unknown field `commnd`"),
        ("osImage: {current: [x]}", "missing field `apply`"),
        (
            "osImage: {current: [x], apply: {commands: [{run: [\"{{version}}\"]}]}}",
            "osImage.apply: commands[0]: unknown variable {{version}}",
        ),
        (
            "osImage: {current: [x], currentJsonPointer: status, apply: {commands: []}}",
            "osImage.currentJsonPointer",
        ),
        (
            "osImage: {current: [x], apply: {skipIf: {run: [x]}, commands: []}}",
            "osImage.apply.skipIf",
        ),
    ] {
        let err = crate::config::DriverConfig::from_yaml(yaml)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{yaml}: {err}");
    }
}
