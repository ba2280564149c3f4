//! The Kubernetes version steps and the command runner: fake programs in a sandbox PATH.

use std::time::Duration;

use inplace_agent_api::{KubeadmUpgradeMode, STDERR_TAIL_MAX_BYTES, StepAction};
use sha2::Digest;

use super::{Sandbox, run_action, wait_until};
use crate::drivers::DriverOutcome;

const APT_CONFIG: &str = r#"
kubernetes:
  installKubeadm:
    commands:
      - writeFile:
          path: /etc/apt/sources.list.d/kubernetes.list
          content: "deb https://pkgs.k8s.io/core:/stable:/{{minor}}/deb/ /\n"
      - run: [apt-get, install, -y, "kubeadm={{bareVersion}}-*"]
  kubeadmUpgradeApply:
    commands:
      - run: [kubeadm, upgrade, apply, "{{version}}", --yes]
  kubeadmUpgradeNode:
    skipIf: {run: [kubeadm, already-node, "{{version}}"]}
    commands:
      - run: [kubeadm, upgrade, node]
  installKubelet:
    commands:
      - run: [apt-get, install, -y, "kubelet={{bareVersion}}-*", "kubectl={{bareVersion}}-*"]
      - run: [systemctl, restart, kubelet]
"#;

fn version(v: &str) -> String {
    v.to_owned()
}

#[tokio::test]
async fn version_steps_run_the_configured_commands_with_the_version() {
    let sb = Sandbox::new();
    sb.fake("apt-get", "exit 0");
    sb.fake("systemctl", "exit 0");
    sb.fake("kubeadm", "[ \"$1\" = already-node ] && exit 1; exit 0");
    let env = sb.env(APT_CONFIG);
    let steps = [
        StepAction::InstallKubeadm {
            version: version("v1.34.1"),
        },
        StepAction::KubeadmUpgrade {
            version: version("v1.34.1"),
            mode: KubeadmUpgradeMode::Apply,
        },
        StepAction::KubeadmUpgrade {
            version: version("v1.34.1"),
            mode: KubeadmUpgradeMode::Node,
        },
        StepAction::InstallKubelet {
            version: version("v1.34.1"),
        },
    ];
    for action in steps {
        let result = run_action(&env, "p", action, 30).await;
        assert_eq!(
            result.outcome,
            DriverOutcome::Succeeded,
            "{}",
            result.message
        );
    }
    assert_eq!(
        sb.calls(),
        [
            "apt-get install -y kubeadm=1.34.1-*",
            "kubeadm upgrade apply v1.34.1 --yes",
            "kubeadm already-node v1.34.1",
            "kubeadm upgrade node",
            "apt-get install -y kubelet=1.34.1-* kubectl=1.34.1-*",
            "systemctl restart kubelet",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/apt/sources.list.d/kubernetes.list")).unwrap(),
        "deb https://pkgs.k8s.io/core:/stable:/v1.34/deb/ /\n"
    );
}

#[tokio::test]
async fn skip_if_makes_a_step_a_no_op() {
    let sb = Sandbox::new();
    sb.fake("kubeadm", "[ \"$1\" = version ] && echo v1.34.1; exit 0");
    let env = sb.env(
        "kubernetes:\n  installKubeadm:\n    skipIf: {run: [kubeadm, version, -o, short], stdoutEquals: \"{{version}}\"}\n    commands:\n      - run: [kubeadm, install-me]\n",
    );
    let result = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.34.1"),
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);
    assert!(
        result.message.contains("already done"),
        "{}",
        result.message
    );
    assert_eq!(sb.calls(), ["kubeadm version -o short"]);
    let result = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.35.0"),
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);
    assert_eq!(sb.calls().last().unwrap(), "kubeadm install-me");
}

#[tokio::test]
async fn commands_get_a_clean_env_with_root_and_path() {
    let sb = Sandbox::new();
    sb.fake("kubeadm", "env > \"$INPLACE_ROOT/env.txt\"");
    let env = sb.env("env: {DEBIAN_FRONTEND: noninteractive}\nkubernetes:\n  kubeadmUpgradeNode:\n    commands: [{run: [kubeadm, upgrade, node]}]\n");
    let result = run_action(
        &env,
        "p",
        StepAction::KubeadmUpgrade {
            version: version("v1.34.1"),
            mode: KubeadmUpgradeMode::Node,
        },
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    let dump = std::fs::read_to_string(sb.node("/env.txt")).unwrap();
    assert!(
        dump.contains(&format!("INPLACE_ROOT={}\n", sb.root.display())),
        "{dump}"
    );
    assert!(
        dump.contains(&format!("PATH={}:/usr/bin:/bin\n", sb.bin.display())),
        "{dump}"
    );
    assert!(dump.contains("DEBIAN_FRONTEND=noninteractive\n"));
    assert!(!dump.contains("HOME="), "agent environment leaked: {dump}");
}

#[tokio::test]
async fn failure_reports_exit_code_and_a_bounded_stderr_tail() {
    let sb = Sandbox::new();
    sb.fake(
        "kubeadm",
        "i=0; while [ $i -lt 200 ]; do echo 'noise noise noise noise noise noise noise noise' >&2; i=$((i+1)); done\necho '[ERROR] etcd is not healthy' >&2\nexit 3",
    );
    let env = sb.env("kubernetes:\n  kubeadmUpgradeApply:\n    commands: [{run: [kubeadm, upgrade, apply, \"{{version}}\", --yes]}, {run: [never-reached]}]\n");
    let result = run_action(
        &env,
        "p",
        StepAction::KubeadmUpgrade {
            version: version("v1.34.1"),
            mode: KubeadmUpgradeMode::Apply,
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(result.exit_code, Some(3));
    assert_eq!(
        result.message,
        "`kubeadm upgrade apply v1.34.1 --yes` exited with 3"
    );
    let tail = result.stderr_tail.unwrap();
    assert!(tail.len() <= STDERR_TAIL_MAX_BYTES, "{}", tail.len());
    assert!(tail.len() > STDERR_TAIL_MAX_BYTES - 100);
    assert!(tail.ends_with("[ERROR] etcd is not healthy\n"), "{tail}");
    assert_eq!(
        sb.calls().len(),
        1,
        "the sequence stops at the first failure"
    );
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let sb = Sandbox::new();
    sb.fake(
        "kubeadm",
        "sleep 300 &\necho $! > \"$INPLACE_ROOT/child.pid\"\nsleep 300",
    );
    let env = sb.env(
        "kubernetes:\n  kubeadmUpgradeNode:\n    commands: [{run: [kubeadm, upgrade, node]}]\n",
    );
    let started = std::time::Instant::now();
    let result = run_action(
        &env,
        "p",
        StepAction::KubeadmUpgrade {
            version: version("v1.34.1"),
            mode: KubeadmUpgradeMode::Node,
        },
        1,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result.message.contains("timed out: step timeout of 1 s"),
        "{}",
        result.message
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    let pid = std::fs::read_to_string(sb.node("/child.pid"))
        .unwrap()
        .trim()
        .to_owned();
    // The background child was in the step's group: it must be gone (or a zombie awaiting reaping).
    wait_until(
        "background child killed",
        Duration::from_secs(10),
        || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        },
    )
    .await;
}

#[tokio::test]
async fn pinned_sha256_and_missing_configuration() {
    let sb = Sandbox::new();
    let binary = b"fake kubeadm binary";
    let digest: String = sha2::Sha256::digest(binary)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    sb.fake(
        "fetch",
        "printf 'fake kubeadm binary' > \"$INPLACE_ROOT/usr/local/bin/.kubeadm.download\"",
    );
    std::fs::create_dir_all(sb.node("/usr/local/bin")).unwrap();
    let yaml = format!(
        "pins:\n  v1.34.1: {{kubeadmSha256: {digest}}}\n  v1.34.2: {{kubeadmSha256: {}}}\nkubernetes:\n  installKubeadm:\n    commands:\n      - run: [fetch, \"{{{{version}}}}\"]\n      - verifySha256: {{path: /usr/local/bin/.kubeadm.download, sha256: \"{{{{pin.kubeadmSha256}}}}\"}}\n",
        "0".repeat(64)
    );
    let env = sb.env(&yaml);
    let ok = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.34.1"),
        },
        30,
    )
    .await;
    assert_eq!(ok.outcome, DriverOutcome::Succeeded, "{}", ok.message);
    let bad = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.34.2"),
        },
        30,
    )
    .await;
    assert_eq!(bad.outcome, DriverOutcome::Failed);
    assert!(
        bad.message.contains(&format!("is {digest}, pinned 0000")),
        "{}",
        bad.message
    );
    let unpinned = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.35.0"),
        },
        30,
    )
    .await;
    assert!(
        unpinned
            .message
            .contains("no value for {{pin.kubeadmSha256}}"),
        "{}",
        unpinned.message
    );

    let result = run_action(
        &env,
        "p",
        StepAction::InstallKubelet {
            version: version("v1.34.1"),
        },
        30,
    )
    .await;
    assert!(
        result.message.contains("no kubernetes.installKubelet"),
        "{}",
        result.message
    );
    let result = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("1.34.1; reboot"),
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result.message.contains("not of the form v1.2.3"),
        "{}",
        result.message
    );
    let result = run_action(&env, "p", StepAction::Unsupported, 30).await;
    assert!(
        result.message.contains("not supported"),
        "{}",
        result.message
    );
}

#[test]
fn config_errors_name_the_key() {
    let err = crate::config::DriverConfig::from_yaml(
        "kubernetes:\n  installKubeadm:\n    commands: [{run: [apt-get, \"{{verison}}\"]}]\n",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("kubernetes.installKubeadm: commands[0]: unknown variable"),
        "{err}"
    );
    let err = crate::config::DriverConfig::from_yaml("kubelett: {}\n").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `kubelett`"),
        "{err}"
    );
    let err = crate::config::DriverConfig::from_yaml("kubelet: {restart: []}\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("kubelet.restart: argv needs a program"),
        "{err}"
    );
}

#[test]
fn shipped_config_examples_load() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config-examples");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let config = crate::config::DriverConfig::load(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let k = &config.kubernetes;
        assert!(
            k.install_kubeadm.is_some()
                && k.kubeadm_upgrade_apply.is_some()
                && k.kubeadm_upgrade_node.is_some()
                && k.install_kubelet.is_some(),
            "{} lacks a Kubernetes step",
            path.display()
        );
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(
        names,
        [
            "apt.yaml",
            "bootc.yaml",
            "dnf.yaml",
            "release-binaries.yaml",
            "sysext.yaml"
        ]
    );
}

#[tokio::test]
async fn release_binary_example_installs_a_pinned_download() {
    // The shipped example, with curl/install/systemctl faked: a download matching the pin is
    // installed; the same download under a wrong pin is refused before anything is installed.
    let sb = Sandbox::new();
    let payload = "pretend kubeadm v1.34.1";
    let digest: String = sha2::Sha256::digest(payload.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // curl -fsSL --retry 3 -o OUT URL: writes the payload to OUT ($5).
    sb.fake("curl", &format!("printf '{payload}' > \"$5\""));
    sb.fake("install", "cp \"$3\" \"$4\"");
    sb.fake("rm", "exit 0");
    std::fs::create_dir_all(sb.node("/usr/local/bin")).unwrap();
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config-examples/release-binaries.yaml"),
    )
    .unwrap();
    let pinned = example.replacen(&"0".repeat(64), &digest, 1);
    let env = sb.env(&pinned);
    let result = run_action(
        &env,
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.34.1"),
        },
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/usr/local/bin/kubeadm")).unwrap(),
        payload
    );

    let wrong = Sandbox::new();
    wrong.fake("curl", &format!("printf '{payload}' > \"$5\""));
    wrong.fake("install", "cp \"$3\" \"$4\"");
    std::fs::create_dir_all(wrong.node("/usr/local/bin")).unwrap();
    let result = run_action(
        &wrong.env(&example),
        "p",
        StepAction::InstallKubeadm {
            version: version("v1.34.1"),
        },
        30,
    )
    .await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(result.message.contains("pinned 0000"), "{}", result.message);
    assert!(!wrong.node("/usr/local/bin/kubeadm").exists());
}
