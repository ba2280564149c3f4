//! Automatic retries at the driver level: a `retryable` command that fails twice then succeeds
//! within 3 attempts; attempts exhausted; commands not marked retryable fail at once; a step
//! resumed during a retry wait continues at the recorded attempt; the config's bounds.

use inplace_agent_api::StepAction;

use super::{Sandbox, run_recorded};
use crate::config::DriverConfig;
use crate::drivers::DriverOutcome;
use crate::state::SequenceProgress;

/// `download kubeadm` fails with exit 100 until it has been called `<root>/fail-times` times;
/// `step` always succeeds. Delays are 0 s so the tests do not wait.
const CONFIG: &str = r#"
kubernetes:
  installKubeadm:
    retry: {attempts: 3, initialDelaySeconds: 0, maxDelaySeconds: 0}
    commands:
      - run: [step, before]
      - run: [download, kubeadm]
        retryable: true
      - run: [step, after]
"#;

fn sandbox(fail_times: u32) -> Sandbox {
    let sb = Sandbox::new();
    sb.fake("step", "exit 0");
    sb.fake(
        "download",
        "n=$(grep -c '^download' \"$INPLACE_ROOT/calls.log\")\n\
         [ \"$n\" -gt \"$(cat \"$INPLACE_ROOT/fail-times\")\" ] || { echo 'E: mirror unreachable' >&2; exit 100; }",
    );
    sb.write_node("/fail-times", &format!("{fail_times}\n"));
    sb
}

fn install_kubeadm() -> StepAction {
    StepAction::InstallKubeadm {
        version: "v1.34.1".into(),
    }
}

#[tokio::test]
async fn a_retryable_command_that_fails_twice_succeeds_at_its_third_attempt() {
    let sb = sandbox(2);
    let env = sb.env(CONFIG);
    let (result, records) = run_recorded(&env, install_kubeadm(), false, None).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        sb.calls(),
        [
            "step before",
            "download kubeadm",
            "download kubeadm",
            "download kubeadm",
            "step after"
        ]
    );
    assert!(
        result
            .message
            .ends_with("(`download kubeadm` succeeded at attempt 3/3 after exit 100)"),
        "{}",
        result.message
    );
    // Each wait was recorded (attempt count, due time) and reported before it began.
    let messages: Vec<&str> = records.iter().filter_map(|(_, m)| m.as_deref()).collect();
    assert_eq!(
        messages,
        [
            "attempt 2/3 of `download kubeadm` after exit 100, in 0 s",
            "attempt 3/3 of `download kubeadm` after exit 100, in 0 s"
        ]
    );
    let waits: Vec<(u32, u32)> = records
        .iter()
        .filter(|(p, _)| p.retry_at_unix_ms.is_some())
        .map(|(p, _)| (p.done, p.failed_attempts))
        .collect();
    assert_eq!(waits, [(1, 1), (1, 2)]);
}

#[tokio::test]
async fn exhausted_attempts_fail_the_step_naming_them() {
    let sb = sandbox(5);
    let env = sb.env(CONFIG);
    let (result, _) = run_recorded(&env, install_kubeadm(), false, None).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(result.exit_code, Some(100));
    assert_eq!(
        result.message,
        "`download kubeadm` exited with 100 (attempt 3/3; no attempts left)"
    );
    assert!(
        result
            .stderr_tail
            .as_deref()
            .is_some_and(|t| t.contains("mirror unreachable")),
        "{result:?}"
    );
    assert_eq!(
        sb.calls()
            .iter()
            .filter(|c| *c == "download kubeadm")
            .count(),
        3
    );
}

#[tokio::test]
async fn a_command_not_marked_retryable_fails_at_once() {
    let sb = sandbox(1);
    let env = sb.env(&CONFIG.replace("        retryable: true\n", ""));
    let (result, _) = run_recorded(&env, install_kubeadm(), false, None).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(result.message, "`download kubeadm` exited with 100");
    assert_eq!(sb.calls(), ["step before", "download kubeadm"]);
}

#[tokio::test]
async fn a_step_resumed_during_a_retry_wait_continues_at_the_recorded_attempt() {
    let sb = sandbox(2);
    let env = sb.env(CONFIG);
    // A first run records the sequence id; then pretend the agent died waiting after attempt 2 of
    // `download kubeadm` failed.
    let (_, records) = run_recorded(&env, install_kubeadm(), false, None).await;
    let sequence = records[0].0.sequence.clone();
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    sb.write_node("/fail-times", "1\n");
    let progress = SequenceProgress {
        sequence,
        done: 1,
        failed_attempts: 2,
        retry_at_unix_ms: Some(crate::clock::now_unix_ms() + 3_600_000),
    };
    // The due time an hour away is capped at maxDelaySeconds (0): the attempt runs at once, as 3/3.
    let (result, _) = run_recorded(&env, install_kubeadm(), true, Some(progress.clone())).await;
    assert_eq!(result.outcome, DriverOutcome::Failed, "{}", result.message);
    assert_eq!(
        result.message,
        "`download kubeadm` exited with 100 (attempt 3/3; no attempts left)"
    );
    assert_eq!(sb.calls(), ["download kubeadm"]);
    // With one failure fewer recorded, the same resume has an attempt left and succeeds.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let progress = SequenceProgress {
        failed_attempts: 1,
        ..progress
    };
    let (result, _) = run_recorded(&env, install_kubeadm(), true, Some(progress)).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        sb.calls(),
        ["download kubeadm", "download kubeadm", "step after"]
    );
}

#[test]
fn retry_config_is_checked_at_load() {
    let bad = [
        (
            CONFIG.replace("attempts: 3", "attempts: 11"),
            "retry.attempts is 11",
        ),
        (
            CONFIG.replace("maxDelaySeconds: 0", "maxDelaySeconds: 7200"),
            "retry.maxDelaySeconds is 7200",
        ),
        (
            CONFIG.replace(
                "    retry: {attempts: 3, initialDelaySeconds: 0, maxDelaySeconds: 0}\n",
                "",
            ),
            "commands[1]: retryable, but the sequence has no `retry",
        ),
        (
            CONFIG.replace("retryable: true", "retryble: true"),
            "unknown field `retryble`",
        ),
        (
            CONFIG.replace(
                "      - run: [step, after]",
                "      - {writeFile: {path: /x, content: y}, retryable: true}",
            ),
            "`retryable` applies to `run` commands only",
        ),
    ];
    for (yaml, expected) in bad {
        let err = DriverConfig::from_yaml(&yaml).unwrap_err().to_string();
        assert!(err.contains(expected), "{expected}: {err}");
    }
}
