//! The containerRuntime driver on a sandbox root: stand-in `containerd`, `runc` and CNI `loopback` print the
//! versions in `<root>/versions/<component>`; the configured install sequence's `fake-install` writes them (a
//! real install replaces binaries, restarts containerd). What a user sees: a node already on its matrix bundle is
//! left alone, an undrained node is refused before any change, a drained node gets the bundle verified, a wrong
//! version after the install fails the step, and the undo puts the recorded versions back.

use std::time::Duration;

use inplace_agent_api::{StepAction, StepKind};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Sandbox, record_context, step_context, test_step};
use crate::drivers::{
    DriverOutcome, ProgressRecorder, StepResult, UndoContext, UndoRecord, execute, execute_undo,
    record_undo,
};

const DIGEST: &str = "1111111111111111111111111111111111111111111111111111111111111111";

fn config() -> String {
    format!(
        r#"
runtime:
  matrix:
    - kubernetes: v1.33
      containerd: {{version: "1.7.28", source: "oci://r.example/containerd@sha256:{DIGEST}"}}
      runc: {{version: "1.3.3", source: "oci://r.example/runc@sha256:{DIGEST}"}}
      cniPlugins: {{version: "1.7.1", source: "oci://r.example/cni@sha256:{DIGEST}"}}
    - kubernetes: v1.34
      containerd: {{version: "2.1.4", source: "oci://r.example/containerd@sha256:{DIGEST}"}}
      runc: {{version: "1.3.3", source: "oci://r.example/runc@sha256:{DIGEST}"}}
      cniPlugins: {{version: "v1.8.0", source: "oci://r.example/cni@sha256:{DIGEST}"}}
  install:
    record:
      - {{name: containerd, run: [cat, "{{{{root}}}}/versions/containerd"]}}
      - {{name: runc, run: [cat, "{{{{root}}}}/versions/runc"]}}
      - {{name: cni, run: [cat, "{{{{root}}}}/versions/cniPlugins"]}}
    commands:
      - run: [fake-install, "{{{{pin.containerdVersion}}}}", "{{{{pin.runcVersion}}}}", "{{{{pin.cniPluginsVersion}}}}"]
    undo:
      commands:
        - run: [fake-install, "{{{{record.containerd}}}}", "{{{{record.runc}}}}", "{{{{record.cni}}}}"]
"#
    )
}

/// A node running containerd `containerd`, runc `runc`, CNI plugins `cni`.
fn sandbox(containerd: &str, runc: &str, cni: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.fake(
        "containerd",
        "echo \"containerd github.com/containerd/containerd/v2 v$(cat \"$INPLACE_ROOT/versions/containerd\") 75cb2b7\"",
    );
    sb.fake(
        "runc",
        "echo \"runc version $(cat \"$INPLACE_ROOT/versions/runc\")\"; echo 'spec: 1.2.1'",
    );
    sb.fake(
        "fake-install",
        "[ -n \"$FAIL_CONTAINERD\" ] && exit 0\n\
         echo \"$1\" > \"$INPLACE_ROOT/versions/containerd\"; echo \"$2\" > \"$INPLACE_ROOT/versions/runc\"; \
         echo \"$3\" > \"$INPLACE_ROOT/versions/cniPlugins\"",
    );
    let loopback =
        "#!/bin/sh\necho \"CNI loopback plugin v$(cat \"$INPLACE_ROOT/versions/cniPlugins\")\"\n";
    sb.write_node("/opt/cni/bin/loopback", loopback);
    std::fs::set_permissions(
        sb.node("/opt/cni/bin/loopback"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    sb.write_node("/versions/containerd", &format!("{containerd}\n"));
    sb.write_node("/versions/runc", &format!("{runc}\n"));
    sb.write_node("/versions/cniPlugins", &format!("{cni}\n"));
    sb
}

fn versions(sb: &Sandbox) -> [String; 3] {
    ["containerd", "runc", "cniPlugins"].map(|c| {
        std::fs::read_to_string(sb.node(&format!("/versions/{c}")))
            .unwrap()
            .trim()
            .to_owned()
    })
}

fn installs(sb: &Sandbox) -> Vec<String> {
    sb.calls()
        .into_iter()
        .filter(|c| c.starts_with("fake-install"))
        .collect()
}

fn runtime(version: &str) -> StepAction {
    StepAction::ContainerRuntime {
        kubernetes_version: version.into(),
    }
}

/// One fresh attempt; `drained`: a drainNode step of the plan came before.
async fn attempt(sb: &Sandbox, yaml: &str, action: StepAction, drained: bool) -> StepResult {
    let env = sb.env(yaml);
    let (_tx, cancel) = watch::channel(false);
    let mut ctx = step_context("p1", action, 30, ProgressRecorder::discard(), cancel);
    ctx.drained = drained;
    execute(env, ctx).await
}

#[tokio::test]
async fn a_node_on_its_bundle_or_without_a_matrix_is_left_alone() {
    let sb = sandbox("2.1.4", "1.3.3", "1.8.0");
    let result = attempt(&sb, &config(), runtime("v1.34.2"), true).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(
        result.message,
        "already on the runtime matrix bundle for v1.34.2: containerd 2.1.4, runc 1.3.3, CNI plugins 1.8.0"
    );
    let result = attempt(&sb, "", runtime("v1.34.2"), true).await;
    assert_eq!(result.outcome, DriverOutcome::Succeeded);
    assert!(
        result.message.starts_with("no runtime: section"),
        "{}",
        result.message
    );
    assert!(installs(&sb).is_empty());
}

#[tokio::test]
async fn an_undrained_node_whose_runtime_differs_is_refused_before_any_change() {
    let sb = sandbox("1.7.28", "1.3.3", "1.7.1");
    let result = attempt(&sb, &config(), runtime("v1.34.2"), false).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .starts_with("not changed: containerd reports")
            && result.message.contains("the bundle has 2.1.4")
            && result
                .message
                .contains("cniPlugins reports \"CNI loopback plugin v1.7.1\"")
            && !result.message.contains("runc reports")
            && result.message.contains("exclude-node-draining"),
        "{}",
        result.message
    );
    assert!(installs(&sb).is_empty());
    assert_eq!(versions(&sb), ["1.7.28", "1.3.3", "1.7.1"]);
}

#[tokio::test]
async fn a_drained_node_gets_its_bundle_verified_and_the_undo_puts_the_old_one_back() {
    let sb = sandbox("1.7.28", "1.3.3", "1.7.1");
    let env = sb.env(&config());
    let record = record_undo(env.clone(), record_context("p1", runtime("v1.34.2")))
        .await
        .unwrap()
        .unwrap();
    let UndoRecord::Commands { values, .. } = &record else {
        panic!("{record:?}");
    };
    assert_eq!(values["containerd"], "1.7.28");
    let result = attempt(&sb, &config(), runtime("v1.34.2"), true).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(
        result
            .message
            .starts_with("containerd 2.1.4, runc 1.3.3, CNI plugins 1.8.0 (")
            && result
                .message
                .contains("was: containerd containerd github.com/containerd/containerd/v2 v1.7.28"),
        "{}",
        result.message
    );
    assert_eq!(versions(&sb), ["2.1.4", "1.3.3", "1.8.0"]);
    assert_eq!(installs(&sb), ["fake-install 2.1.4 1.3.3 1.8.0"]);

    let result = undo(&sb, &record).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert_eq!(versions(&sb), ["1.7.28", "1.3.3", "1.7.1"]);
}

#[tokio::test]
async fn an_install_that_leaves_another_version_fails_naming_it() {
    let sb = sandbox("1.7.28", "1.3.3", "1.7.1");
    let mut yaml = config();
    yaml.push_str("env:\n  FAIL_CONTAINERD: \"1\"\n");
    let result = attempt(&sb, &yaml, runtime("v1.34.2"), true).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .starts_with("runtime.install ran, but containerd reports")
            && result.message.contains("the bundle has 2.1.4"),
        "{}",
        result.message
    );
}

#[tokio::test]
async fn a_version_the_matrix_does_not_cover_fails_naming_the_minors() {
    let sb = sandbox("1.7.28", "1.3.3", "1.7.1");
    let result = attempt(&sb, &config(), runtime("v1.35.0"), true).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        "runtime.matrix has no bundle for Kubernetes v1.35.0 (it has v1.33, v1.34): add one for its minor, \
         or turn the setting upgradeContainerRuntime off"
    );
    assert!(installs(&sb).is_empty());
}

async fn undo(sb: &Sandbox, record: &UndoRecord) -> StepResult {
    let env = sb.env(&config());
    let (_tx, cancel) = watch::channel(false);
    let ctx = UndoContext {
        plan_id: "p1".into(),
        index: 0,
        step: test_step(runtime("v1.34.2")),
        progress: None,
        recorder: ProgressRecorder::discard(),
        record: Some(record.clone()),
        resumed: false,
        deadline: Instant::now() + Duration::from_secs(30),
        timeout_seconds: 30,
        cancel,
    };
    execute_undo(env, StepKind::ContainerRuntime, ctx).await
}
