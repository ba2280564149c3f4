//! The resume rule at the driver level: a step that began is never skipped by `skipIf`, runs
//! `onResume`, then continues at the first command not recorded complete; recorded progress for
//! other commands is never used; work an earlier plan left unfinished is finished, not skipped.

use inplace_agent_api::{KubeletArg, SshUser, StepAction};

use inplace_drain::fake::{FakeApiServer, FakeNode};

use super::{Sandbox, mode_of, run_action, run_attempt};
use crate::drivers::DriverOutcome;
use crate::state::SequenceProgress;

/// `kubelet --version` prints the version in `<root>/kubelet-version`; `step` logs and fails
/// while `<root>/fail-<name>` exists; the Node (the drain crate's fake API) reports the running kubelet.
const CONFIG: &str = r#"
node:
  kubeconfig: /etc/kubernetes/kubelet.conf
  name: n1
kubernetes:
  installKubelet:
    skipIf: {run: [kubelet, --version], stdoutEquals: "Kubernetes {{version}}"}
    onResume:
      - run: [dpkg, --configure, -a]
    commands:
      - run: [step, install, "{{bareVersion}}"]
      - run: [step, hold]
      - run: [step, daemon-reload]
      - run: [step, restart]
"#;

/// The node at v1.33.4 (the kubelet file and the Node), and its API.
fn sandbox() -> (Sandbox, FakeApiServer) {
    let sb = Sandbox::new();
    let api = FakeApiServer::start(FakeNode {
        kubelet_version: "v1.33.4".into(),
        ..FakeNode::new("n1")
    })
    .unwrap();
    api.write_kubeconfig(&sb.node("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    sb.fake(
        "kubelet",
        "echo \"Kubernetes $(cat \"$INPLACE_ROOT/kubelet-version\")\"",
    );
    sb.fake("dpkg", "exit 0");
    sb.fake("step", "[ ! -e \"$INPLACE_ROOT/fail-$1\" ]");
    sb.write_node("/kubelet-version", "v1.33.4\n");
    (sb, api)
}

/// The node at v1.34.1: the kubelet file installed and the kubelet restarted on it.
fn upgraded(sb: &Sandbox, api: &FakeApiServer) {
    sb.write_node("/kubelet-version", "v1.34.1\n");
    api.set_kubelet_version("v1.34.1");
}

fn install_kubelet() -> StepAction {
    StepAction::InstallKubelet {
        version: "v1.34.1".into(),
    }
}

#[tokio::test]
async fn a_resumed_step_ignores_skip_if_and_continues_at_its_first_unfinished_command() {
    let (sb, api) = sandbox();
    let env = sb.env(CONFIG);

    // A fresh attempt records each command's completion, in order, for one sequence id.
    let (result, records) = run_attempt(&env, install_kubelet(), false, None).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    let done: Vec<u32> = records.iter().map(|p| p.done).collect();
    assert_eq!(done, [1, 2, 3, 4]);
    let sequence = records[0].sequence.clone();
    assert!(records.iter().all(|p| p.sequence == sequence));
    assert_eq!(sequence.len(), 64);

    // Now the node looks upgraded: a step that never began is skipped…
    upgraded(&sb, &api);
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let (result, records) = run_attempt(&env, install_kubelet(), false, None).await;
    assert!(
        result.message.contains("skipIf check passed"),
        "{}",
        result.message
    );
    assert!(records.is_empty());
    assert_eq!(sb.calls(), ["kubelet --version"]);

    // …but one that began after two commands runs onResume and the remaining two, and never
    // asks skipIf.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let progress = SequenceProgress {
        sequence: sequence.clone(),
        done: 2,
        ..SequenceProgress::default()
    };
    let (result, records) = run_attempt(&env, install_kubelet(), true, Some(progress)).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(
        result.message.contains("resumed at command 3 of 4"),
        "{}",
        result.message
    );
    assert_eq!(
        sb.calls(),
        ["dpkg --configure -a", "step daemon-reload", "step restart"]
    );
    assert_eq!(records.iter().map(|p| p.done).collect::<Vec<_>>(), [3, 4]);

    // All four recorded complete (the crash came before the step's result): nothing but onResume.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let progress = SequenceProgress {
        sequence: sequence.clone(),
        done: 4,
        ..SequenceProgress::default()
    };
    let (result, _) = run_attempt(&env, install_kubelet(), true, Some(progress)).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(sb.calls(), ["dpkg --configure -a"]);

    // Began with no progress recorded (interrupted inside the first command): everything runs.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let (result, _) = run_attempt(&env, install_kubelet(), true, None).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(sb.calls().len(), 5, "{:?}", sb.calls());
}

#[tokio::test]
async fn progress_recorded_for_other_commands_is_never_used() {
    let (sb, _api) = sandbox();
    let env = sb.env(CONFIG);
    let (_, records) = run_attempt(&env, install_kubelet(), false, None).await;
    let sequence = records[0].sequence.clone();

    // Another version expands to other commands: a count for v1.34.1 means nothing for v1.34.2.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let progress = SequenceProgress {
        sequence: sequence.clone(),
        done: 3,
        ..SequenceProgress::default()
    };
    let other = StepAction::InstallKubelet {
        version: "v1.34.2".into(),
    };
    let (result, records) = run_attempt(&env, other, true, Some(progress)).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        sb.calls(),
        [
            "dpkg --configure -a",
            "step install 1.34.2",
            "step hold",
            "step daemon-reload",
            "step restart"
        ]
    );
    assert_ne!(records[0].sequence, sequence);

    // So does an edited agent config (same key, other commands).
    let edited = sb.env(&CONFIG.replace("[step, hold]", "[step, hold, kubectl]"));
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let progress = SequenceProgress {
        sequence,
        done: 3,
        ..SequenceProgress::default()
    };
    let (_, _) = run_attempt(&edited, install_kubelet(), true, Some(progress)).await;
    assert_eq!(sb.calls().len(), 5, "{:?}", sb.calls());
}

#[tokio::test]
async fn a_sequence_an_earlier_plan_left_unfinished_is_finished_not_skipped() {
    let (sb, api) = sandbox();
    let env = sb.env(CONFIG);
    // The package got installed, then `hold` failed: the plan failed with the node looking
    // upgraded.
    sb.write_node("/fail-hold", "");
    let (result, _) = run_attempt(&env, install_kubelet(), false, None).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    upgraded(&sb, &api);
    std::fs::remove_file(sb.node("/fail-hold")).unwrap();

    // A new plan's step (not resumed) must not trust skipIf: it runs every command.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let (result, _) = run_attempt(&env, install_kubelet(), false, None).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        sb.calls(),
        [
            "step install 1.34.1",
            "step hold",
            "step daemon-reload",
            "step restart"
        ]
    );

    // Finished: the next one is a no-op again.
    std::fs::remove_file(sb.node("/calls.log")).unwrap();
    let (result, _) = run_attempt(&env, install_kubelet(), false, None).await;
    assert!(
        result.message.contains("skipIf check passed"),
        "{}",
        result.message
    );
}

#[tokio::test]
async fn a_template_that_cannot_be_filled_fails_before_the_first_command() {
    let (sb, _api) = sandbox();
    let env = sb.env(
        "kubernetes:\n  installKubeadm:\n    commands:\n      - run: [step, download]\n      - verifySha256: {path: /x, sha256: \"{{pin.kubeadmSha256}}\"}\n",
    );
    let action = StepAction::InstallKubeadm {
        version: "v1.34.1".into(),
    };
    let result = run_action(&env, "p", action, 30).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result.message.contains("commands[1]") && result.message.contains("pin.kubeadmSha256"),
        "{}",
        result.message
    );
    assert!(sb.calls().is_empty(), "{:?}", sb.calls());
}

fn kubelet_args(max_pods: &str) -> StepAction {
    StepAction::KubeletArgs {
        args: vec![KubeletArg {
            name: "max-pods".into(),
            value: max_pods.into(),
        }],
    }
}

#[tokio::test]
async fn a_restart_that_failed_after_the_write_is_owed_to_the_next_plan() {
    let sb = Sandbox::new();
    sb.write_node(
        "/var/lib/kubelet/kubeadm-flags.env",
        "KUBELET_KUBEADM_ARGS=\"\"\n",
    );
    sb.fake("systemctl", "exit 5");
    let env = sb.env("");
    let result = run_action(&env, "p1", kubelet_args("150"), 30).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);

    // The file already holds the flags, but kubelet never restarted with them.
    sb.fake("systemctl", "exit 0");
    let result = run_action(&env, "p2", kubelet_args("150"), 30).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(result.message.contains("already set"), "{}", result.message);
    assert!(
        result.message.contains("ran `systemctl restart kubelet`"),
        "{}",
        result.message
    );
    assert_eq!(sb.calls().len(), 2);

    // Paid: no restart the time after.
    let result = run_action(&env, "p3", kubelet_args("150"), 30).await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);
    assert_eq!(sb.calls().len(), 2, "{:?}", sb.calls());

    // The same for the ntp drop-in.
    sb.fake("systemctl", "exit 5");
    let ntp = || StepAction::Ntp {
        servers: vec!["0.pool.ntp.org".into()],
        enabled: Some(true),
    };
    assert_eq!(
        run_action(&env, "p4", ntp(), 30).await.outcome,
        DriverOutcome::Failed
    );
    sb.fake("systemctl", "exit 0");
    let result = run_action(&env, "p5", ntp(), 30).await;
    assert!(
        result.message.contains("ran `systemctl restart chrony`"),
        "{}",
        result.message
    );
    let before = sb.calls().len();
    run_action(&env, "p6", ntp(), 30).await;
    assert_eq!(sb.calls().len(), before);
}

#[tokio::test]
async fn an_ssh_dir_appears_with_its_mode_even_after_an_interrupted_creation() {
    let sb = Sandbox::new();
    sb.write_node("/etc/passwd", "capi:x:1000:1000::/home/capi:/bin/sh\n");
    // What an interruption of the creation leaves: the temp dir, never a `.ssh` with the umask's
    // mode.
    std::fs::create_dir_all(sb.node("/home/capi/..ssh.inplace-tmp")).unwrap();
    let env = sb.env("");
    let action = StepAction::SshKeys {
        users: vec![SshUser {
            name: "capi".into(),
            authorized_keys: vec!["ssh-ed25519 AAAA key-1".into()],
        }],
    };
    let result = run_action(&env, "p", action, 30).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(mode_of(&sb.node("/home/capi/.ssh")), 0o700);
    assert_eq!(mode_of(&sb.node("/home/capi/.ssh/authorized_keys")), 0o600);
    assert!(!sb.node("/home/capi/..ssh.inplace-tmp").exists());
}
