//! Driver and state tests on temporary `--root` sandboxes, with fake programs in a sandbox PATH
//! that record their arguments.

mod bounded_reads;
mod commands;
mod container_runtime;
mod files;
mod node_config;
mod os_image;
mod os_image_bootc;
mod package_cases;
mod package_undo;
mod package_world;
mod passed_over;
mod preflight;
mod preflight_undo;
mod reboot;
mod resume;
mod retries;
mod rollback;
mod rollback_node;
mod state_full;
mod sysext;
mod sysext_no_return;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{Step, StepAction};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::DriverConfig;
use crate::drivers::{DriverEnv, ProgressRecorder, StepContext, StepResult, execute};
use crate::state::SequenceProgress;

/// A root dir, a state dir and a bin dir of fake programs.
pub(crate) struct Sandbox {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub bin: PathBuf,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let bin = dir.path().join("bin");
        for d in [&root, &state, &bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        Self {
            _dir: dir,
            root,
            state,
            bin,
        }
    }

    /// A file under the root.
    pub fn node(&self, node_path: &str) -> PathBuf {
        self.root.join(node_path.trim_start_matches('/'))
    }

    pub fn write_node(&self, node_path: &str, content: &str) {
        let path = self.node(node_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// A fake program: logs `name args…` to `<root>/calls.log`, then runs `body` (sh).
    pub fn fake(&self, name: &str, body: &str) {
        let script =
            format!("#!/bin/sh\necho \"{name} $*\" >> \"$INPLACE_ROOT/calls.log\"\n{body}\n");
        let path = self.bin.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Lines of `<root>/calls.log`.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.node("/calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The driver config from YAML, with PATH = the sandbox bin dir, then the system's.
    pub fn config(&self, yaml: &str) -> DriverConfig {
        let mut config = if yaml.trim().is_empty() {
            DriverConfig::default()
        } else {
            DriverConfig::from_yaml(yaml).unwrap()
        };
        config.path = vec![
            self.bin.display().to_string(),
            "/usr/bin".into(),
            "/bin".into(),
        ];
        config
    }

    pub fn env(&self, yaml: &str) -> Arc<DriverEnv> {
        Arc::new(DriverEnv::new(
            self.root.clone(),
            self.config(yaml),
            self.state.clone(),
        ))
    }
}

/// Runs one action as step 0 of plan `plan_id`.
pub(crate) async fn run_action(
    env: &Arc<DriverEnv>,
    plan_id: &str,
    action: StepAction,
    timeout_seconds: u32,
) -> StepResult {
    let (_tx, cancel) = watch::channel(false);
    let ctx = step_context(
        plan_id,
        action,
        timeout_seconds,
        ProgressRecorder::discard(),
        cancel,
    );
    execute(env.clone(), ctx).await
}

/// Step 0 of a test plan, due in 30 s.
pub(crate) fn test_step(action: StepAction) -> Step {
    Step {
        index: 0,
        description: "test".into(),
        timeout_seconds: 30,
        action,
    }
}

/// What recording the undo of step 0 of plan `plan_id` gets, due in 30 s.
pub(crate) fn record_context(plan_id: &str, action: StepAction) -> crate::drivers::RecordContext {
    let (_tx, cancel) = watch::channel(false);
    crate::drivers::RecordContext {
        plan_id: plan_id.into(),
        index: 0,
        step: test_step(action),
        deadline: Instant::now() + Duration::from_secs(30),
        cancel,
    }
}

/// Step 0 of plan `plan_id`, fresh (not resumed, no progress), due `timeout_seconds` from now.
pub(crate) fn step_context(
    plan_id: &str,
    action: StepAction,
    timeout_seconds: u32,
    recorder: ProgressRecorder,
    cancel: watch::Receiver<bool>,
) -> StepContext {
    StepContext {
        plan_id: plan_id.to_owned(),
        step: Step {
            index: 0,
            description: "test".into(),
            timeout_seconds,
            action,
        },
        deadline: Instant::now() + Duration::from_secs(u64::from(timeout_seconds)),
        resumed: false,
        progress: None,
        recorder,
        cancel,
        drained: true,
    }
}

/// Runs one action as a resumed (or fresh) attempt with the given recorded progress; returns the
/// result and every progress record the driver made, in order.
pub(crate) async fn run_attempt(
    env: &Arc<DriverEnv>,
    action: StepAction,
    resumed: bool,
    progress: Option<SequenceProgress>,
) -> (StepResult, Vec<SequenceProgress>) {
    let (result, records) = run_recorded(env, action, resumed, progress).await;
    (result, records.into_iter().map(|(p, _)| p).collect())
}

/// [`run_attempt`], also returning the message each progress record reported.
pub(crate) async fn run_recorded(
    env: &Arc<DriverEnv>,
    action: StepAction,
    resumed: bool,
    progress: Option<SequenceProgress>,
) -> (StepResult, Vec<(SequenceProgress, Option<String>)>) {
    let (_tx, cancel) = watch::channel(false);
    let (sender, mut receiver) = tokio::sync::mpsc::channel(1);
    let ctx = StepContext {
        resumed,
        progress,
        ..step_context("p", action, 30, ProgressRecorder::new(sender), cancel)
    };
    let collector = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((progress, message, ack)) = receiver.recv().await {
            seen.push((progress, message));
            let _ = ack.send(true);
        }
        seen
    });
    let result = execute(env.clone(), ctx).await;
    (result, collector.await.unwrap())
}

/// Waits (polling, with a deadline) until `condition` holds.
pub(crate) async fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}
