//! The rollback phase on a sandbox root (issue 28): a files step that fails after another succeeded is
//! undone with it, byte-equal with modes, the files it created removed; a crash between two undos resumes
//! the rollback to the same end state; `hold` undoes nothing.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, FileEncoding, FileSpec, MachineRef, OnFailure, Plan, PlanStatus,
    RollbackProgress, RollbackState, Step, StepAction,
};
use tokio::time::Instant;

use super::{Sandbox, mode_of};
use crate::attempt::host::StepHost;
use crate::os::driver_env::DriverEnv;
use crate::rollback::{pending, run_undo};
use crate::run::executor::run_step;
use crate::shutdown::Shutdown;
use crate::state::{LocalStepStatus, StateStore};

/// A test's reaction to a report the executor sends at once.
pub(super) type OnSend = Box<dyn FnMut(&inplace_agent_api::StepReport) + Send>;

/// The executor's host without a server: reports stay in the outbox; those sent at once are kept in `sent`
/// (and shown to `on_send`).
pub(super) struct Host {
    pub store: StateStore,
    pub env: Arc<DriverEnv>,
    pub identity: AgentIdentity,
    pub sent: Vec<inplace_agent_api::StepReport>,
    pub on_send: Option<OnSend>,
}

/// Opens `state` again in this process. Another test's child between its fork and its exec holds a copy of the
/// lock's descriptor for a moment (the tests share this process): it waits for the lock like a restarted agent
/// does (at most 5 s).
pub(super) fn reopen_store(state: &std::path::Path) -> StateStore {
    let mut tries = 0;
    loop {
        match StateStore::open(state) {
            Ok(store) => return store,
            Err(e) => assert!(tries < 500, "{e}"),
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Host {
    /// An agent (re)starting on `state` with `env`.
    pub(super) fn open(state: &std::path::Path, env: Arc<DriverEnv>) -> Self {
        Self::with_store(reopen_store(state), env)
    }

    /// An agent on an opened state dir.
    fn with_store(store: StateStore, env: Arc<DriverEnv>) -> Self {
        Self {
            store,
            env,
            identity: AgentIdentity::Machine(MachineRef::new("default", "m")),
            sent: Vec::new(),
            on_send: None,
        }
    }
}

impl StepHost for Host {
    fn store(&mut self) -> &mut StateStore {
        &mut self.store
    }
    fn identity(&self) -> &AgentIdentity {
        &self.identity
    }
    fn env(&self) -> Arc<DriverEnv> {
        self.env.clone()
    }
    fn step_boundary(&mut self) {}
    fn plan_ended(&mut self) {}
    fn next_delay(&mut self) -> Duration {
        Duration::from_millis(10)
    }
    fn reports_due_at(&self) -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }
    async fn deliver_reports(&mut self) {}
    async fn send_report(&mut self, report: inplace_agent_api::StepReport) -> bool {
        if let Some(on_send) = self.on_send.as_mut() {
            on_send(&report);
        }
        self.sent.push(report);
        true
    }
}

fn host(sb: &Sandbox) -> Host {
    host_with(sb, "")
}

pub(super) fn host_with(sb: &Sandbox, config: &str) -> Host {
    Host::open(&sb.state, sb.env(config))
}

pub(super) fn file(path: &str, content: &str) -> FileSpec {
    FileSpec {
        path: path.into(),
        owner: None,
        permissions: Some("0644".into()),
        encoding: FileEncoding::None,
        append: false,
        content: content.into(),
    }
}

pub(super) fn files_step(index: u32, files: Vec<FileSpec>) -> Step {
    Step {
        index,
        description: format!("files {index}"),
        timeout_seconds: 30,
        action: StepAction::Files { files },
    }
}

/// Step 0 replaces `/etc/a.conf` and creates `/etc/app/new.conf`; step 1 replaces `/etc/b.conf`, then fails
/// on `/etc/blocked` (a directory is in the way).
fn plan() -> Plan {
    Plan {
        id: "plan-rb".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![
            files_step(
                0,
                vec![
                    file("/etc/a.conf", "new a\n"),
                    file("/etc/app/new.conf", "created\n"),
                ],
            ),
            files_step(
                1,
                vec![
                    file("/etc/a.conf", "new a\n"),
                    file("/etc/app/new.conf", "created\n"),
                    file("/etc/b.conf", "new b\n"),
                    file("/etc/blocked", "never\n"),
                ],
            ),
        ],
        control_plane: false,
    }
}

/// The node before the plan: `a.conf` 0640, `b.conf` 0600, `blocked` a directory.
pub(super) fn sandbox() -> Sandbox {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    sb.write_node("/etc/a.conf", "old a\n");
    sb.write_node("/etc/b.conf", "old b\n");
    std::fs::set_permissions(
        sb.node("/etc/a.conf"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::set_permissions(
        sb.node("/etc/b.conf"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::create_dir_all(sb.node("/etc/blocked")).unwrap();
    sb
}

/// Runs forward steps, undos and the rollback's end until nothing is left, or until `max_undos` undos ran.
pub(super) async fn run(host: &mut Host, max_undos: Option<usize>) {
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    let mut undos = 0;
    loop {
        if pending(&host.store) {
            if max_undos.is_some_and(|max| undos >= max) {
                return;
            }
            assert_eq!(
                run_undo(host, &mut shutdown).await,
                ControlFlow::Continue(())
            );
            undos += 1;
            continue;
        }
        if crate::rollback::verify::pending(&host.store) {
            assert_eq!(
                crate::rollback::verify::run_finish(host, &mut shutdown).await,
                ControlFlow::Continue(())
            );
            continue;
        }
        let next = host
            .store
            .state
            .current
            .as_ref()
            .and_then(|r| r.next_step());
        let Some(index) = next else { return };
        assert_eq!(
            run_step(host, index, &mut shutdown).await,
            ControlFlow::Continue(())
        );
    }
}

pub(super) fn assert_node_as_before(sb: &Sandbox) {
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/a.conf")).unwrap(),
        "old a\n"
    );
    assert_eq!(mode_of(&sb.node("/etc/a.conf")), 0o640);
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/b.conf")).unwrap(),
        "old b\n"
    );
    assert_eq!(mode_of(&sb.node("/etc/b.conf")), 0o600);
    assert!(
        !sb.node("/etc/app").exists(),
        "the file and the directory the plan created are removed"
    );
    assert!(sb.node("/etc/blocked").is_dir());
    assert!(
        !sb.state.join("managed-files.json").exists(),
        "the files journal is as before the plan (absent)"
    );
}

fn assert_rolled_back(host: &Host) {
    let record = host.store.state.current.as_ref().unwrap();
    assert_eq!(record.steps[1].status, LocalStepStatus::Failed);
    let progress = record.progress();
    assert_eq!(progress.status, PlanStatus::Failed, "the plan stays failed");
    let rollback = progress
        .rollback
        .expect("the progress carries the rollback");
    assert_eq!(
        rollback.state,
        RollbackState::RolledBack,
        "{}",
        rollback.message
    );
    assert_eq!((rollback.failed_step, rollback.undone), (1, 2));
    let undo_reports: Vec<(u32, _)> = host
        .store
        .state
        .outbox
        .iter()
        .filter(|r| r.undo)
        .map(|r| (r.step_index, r.status))
        .collect();
    // Each undo's `running` report was superseded in the outbox by its final one (as for forward steps).
    use inplace_agent_api::StepStatus::Succeeded;
    assert_eq!(undo_reports, [(1, Succeeded), (0, Succeeded)]);
}

#[tokio::test]
async fn a_failed_files_step_and_the_one_before_it_are_undone_byte_equal() {
    let sb = sandbox();
    let mut host = host(&sb);
    host.store.adopt(plan()).unwrap();
    run(&mut host, None).await;
    assert_node_as_before(&sb);
    assert_rolled_back(&host);
}

#[tokio::test]
async fn a_crash_between_two_undos_resumes_the_rollback_to_the_same_end() {
    let sb = sandbox();
    let mut first = host(&sb);
    first.store.adopt(plan()).unwrap();
    run(&mut first, Some(1)).await;
    // The failed step is undone, the one before it not yet.
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/b.conf")).unwrap(),
        "old b\n"
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/a.conf")).unwrap(),
        "new a\n"
    );
    // Killed right after recording the second undo `running` (before it changed anything).
    let record = first.store.state.current.as_mut().unwrap();
    let rollback = record.rollback.as_mut().unwrap();
    rollback.undos[1].status = LocalStepStatus::Running;
    rollback.undos[1].attempt = 1;
    first.store.save().unwrap();
    drop(first);

    let mut second = host(&sb);
    assert!(second.store.plan.is_some(), "the plan body is reloaded");
    run(&mut second, None).await;
    assert_node_as_before(&sb);
    let record = second.store.state.current.as_ref().unwrap();
    assert_eq!(
        record.steps[1].attempt, 1,
        "the failed step never ran again"
    );
    let rollback = record.progress().rollback.unwrap();
    assert_eq!(
        rollback.state,
        RollbackState::RolledBack,
        "{}",
        rollback.message
    );
    assert_eq!(rollback.undone, 2);
    assert_eq!(record.rollback.as_ref().unwrap().undos[1].attempt, 2);
}

#[tokio::test]
async fn hold_leaves_the_node_as_it_failed() {
    let sb = sandbox();
    let mut host = host(&sb);
    host.store.adopt(plan()).unwrap();
    host.store.state.current.as_mut().unwrap().on_failure = Some(OnFailure::Hold);
    run(&mut host, None).await;
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/a.conf")).unwrap(),
        "new a\n"
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/b.conf")).unwrap(),
        "new b\n"
    );
    assert!(sb.node("/etc/app/new.conf").exists());
    let record = host.store.state.current.as_ref().unwrap();
    assert_eq!(record.status(), PlanStatus::Failed);
    assert!(record.rollback.is_none());
    assert!(record.progress().rollback.is_none());
    assert!(host.store.state.outbox.iter().all(|r| !r.undo));
}

#[tokio::test]
async fn undoing_kubelet_flags_restores_the_file_and_restarts_kubelet_again() {
    let sb = Sandbox::new();
    sb.fake("systemctl", "exit 0");
    let flags = "KUBELET_KUBEADM_ARGS=\"--max-pods=110 --v=2\"\n";
    sb.write_node("/var/lib/kubelet/kubeadm-flags.env", flags);
    std::fs::create_dir_all(sb.node("/etc/blocked")).unwrap();
    let mut host = host(&sb);
    let plan = Plan {
        steps: vec![
            Step {
                index: 0,
                description: "kubelet flags".into(),
                timeout_seconds: 30,
                action: StepAction::KubeletArgs {
                    args: vec![inplace_agent_api::KubeletArg {
                        name: "max-pods".into(),
                        value: "200".into(),
                    }],
                },
            },
            files_step(1, vec![file("/etc/blocked", "never\n")]),
        ],
        ..plan()
    };
    host.store.adopt(plan).unwrap();
    run(&mut host, None).await;
    assert_eq!(
        std::fs::read_to_string(sb.node("/var/lib/kubelet/kubeadm-flags.env")).unwrap(),
        flags
    );
    assert_eq!(
        sb.calls(),
        ["systemctl restart kubelet", "systemctl restart kubelet"],
        "kubelet restarted by the step, then again by its undo"
    );
    assert!(!sb.state.join("managed-kubelet-args.json").exists());
    assert_eq!(rolled_back(&host).undone, 2);
}

/// The current plan's rollback, which must have ended in `state`.
fn rollback_ended(host: &Host, state: RollbackState) -> RollbackProgress {
    let rollback = host
        .store
        .state
        .current
        .as_ref()
        .unwrap()
        .progress()
        .rollback
        .unwrap();
    assert_eq!(rollback.state, state, "{}", rollback.message);
    rollback
}

/// The current plan's rollback, which must have ended rolled back.
pub(super) fn rolled_back(host: &Host) -> RollbackProgress {
    rollback_ended(host, RollbackState::RolledBack)
}

/// The current plan's rollback, which must have ended `failed`.
pub(super) fn rollback_failed(host: &Host) -> RollbackProgress {
    rollback_ended(host, RollbackState::Failed)
}

#[tokio::test]
async fn a_package_step_without_a_configured_undo_ends_the_rollback_failed_naming_the_key() {
    let sb = sandbox();
    sb.fake("step", "exit 0");
    let config = "kubernetes:\n  installKubelet:\n    commands:\n      - run: [step, install]\n";
    let mut host = host_with(&sb, config);
    let mut plan = plan();
    plan.steps[0] = Step {
        index: 0,
        description: "install kubelet v1.34.1".into(),
        timeout_seconds: 30,
        action: StepAction::InstallKubelet {
            version: "v1.34.1".into(),
        },
    };
    host.store.adopt(plan).unwrap();
    run(&mut host, None).await;
    // The failed files step was undone; the install has no `undo:` in the config.
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/b.conf")).unwrap(),
        "old b\n"
    );
    let rollback = host
        .store
        .state
        .current
        .as_ref()
        .unwrap()
        .progress()
        .rollback
        .unwrap();
    assert_eq!(rollback.state, RollbackState::Failed);
    assert_eq!(rollback.undone, 1);
    assert!(
        rollback.message.starts_with(
            "undo of step 1 (install kubelet v1.34.1) failed: the agent config has no \
                 kubernetes.installKubelet.undo"
        ) && rollback
            .message
            .ends_with("; the plan did not cordon the node"),
        "{}",
        rollback.message
    );
}
