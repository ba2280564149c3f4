//! The package steps' rollback (issue 28) with real packages: the *shipped* apt config's record, forward and
//! undo commands run with the real `apt-get`, `apt-mark`, `dpkg` and `dpkg-query` against a sandbox root and
//! a local repository of stand-in `.deb`s (tests/package_world.rs), and the shipped release-binaries config
//! with the real coreutils. Only `env`, `path`, the pins and the retry delays (zero) differ from the shipped
//! files. A plan installs kubeadm and kubelet v1.34.1 on a node at v1.33.4, then a files step fails: the
//! rollback must put the node back exactly (versions, holds, files and modes).
//!
//! The failure-injection table: every `run` command of `record`, `commands` and `undo.commands` of
//! installKubeadm and installKubelet fails for good (after its retries), and the agent is killed (the
//! in-process equivalent of a SIGKILL, as tests/rollback.rs does it: the agent's future is dropped, the
//! command's process group killed, and a new agent opens the state dir) before and after the effect of each
//! undo command. A forward or record failure and every kill must end at the start state, rolled back; an undo
//! command that fails for good ends the rollback `failed` naming it (by design: node left cordoned).
//!
//! The single scenarios (forward alone, a package not installed before, dnf) are `package_cases.rs`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_agent_api::{MachineRef, Plan, RollbackState, Step, StepAction};

use super::package_world::{FROM, Node, World};
use super::rollback::{Host, file, files_step};
use crate::config::{CommandSequence, CommandSpec, DriverConfig, SequenceCommand};
use crate::rollback::{pending, run_undo};
use crate::sequence::template::{Vars, expand};
use crate::shutdown::Shutdown;

/// Stands for the case's root in [`Case::argv`].
const ROOT: &str = "<root>";

/// Cases of the table running at once (processes mostly wait on each other: 2 cores stay busy).
const CONCURRENT_CASES: usize = 6;
/// Bound on one case (a failure bound; a case takes about a second).
const CASE_LIMIT: Duration = Duration::from_secs(60);

/// The plan: installKubeadm (`kinds` 0) and/or installKubelet (1), then, when `fail_at_end`, a files step
/// that fails (a directory is in the way). A case runs only the step it is about.
pub(super) fn plan(kinds: &[usize], fail_at_end: bool) -> Plan {
    let version = || "v1.34.1".to_owned();
    let mut steps: Vec<Step> = kinds
        .iter()
        .enumerate()
        .map(|(index, kind)| Step {
            index: index as u32,
            description: ["install kubeadm v1.34.1", "install kubelet v1.34.1"][*kind].into(),
            timeout_seconds: 60,
            action: match kind {
                0 => StepAction::InstallKubeadm { version: version() },
                _ => StepAction::InstallKubelet { version: version() },
            },
        })
        .collect();
    if fail_at_end {
        let index = steps.len() as u32;
        steps.push(files_step(index, vec![file("/etc/blocked", "never\n")]));
    }
    Plan {
        id: "plan-pkg".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps,
        control_plane: false,
    }
}

/// What a case does to one invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// It fails, every attempt.
    Fail,
    /// The agent is killed as it starts, before its effect.
    KillBefore,
    /// The agent is killed once its effect is done, before the agent records it.
    KillAfter,
}

/// Where the invocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Record,
    Forward,
    Undo,
}

#[derive(Clone, Debug)]
pub(super) struct Case {
    world: World,
    step: usize,
    phase: Phase,
    command: usize,
    argv: String,
    act: Act,
    /// For a kill: the invocations after the restart, in order — the undo's `onResume`, then its commands
    /// from the killed one (those before it completed and must not run again).
    resumed: Vec<String>,
}

impl Case {
    fn name(&self) -> String {
        let key = ["installKubeadm", "installKubelet"][self.step];
        let list = match self.phase {
            Phase::Record => "record",
            Phase::Forward => "commands",
            Phase::Undo => "undo.commands",
        };
        format!(
            "{:?} {key}.{list}[{}] {:?} `{}`",
            self.world, self.command, self.act, self.argv
        )
    }
}

fn sequence(config: &DriverConfig, step: usize) -> &CommandSequence {
    let k = &config.kubernetes;
    [&k.install_kubeadm, &k.install_kubelet][step]
        .as_ref()
        .unwrap()
}

/// The argv a `run` command runs on `node` with everything installed before (the undo's conditions then
/// hold for `ifRecorded`, not for `ifNotRecorded`: those are `None`).
fn runs(
    node: &Node,
    commands: &[SequenceCommand],
    records: &BTreeMap<String, String>,
) -> Vec<Option<String>> {
    let mut vars = Vars::for_version(
        "v1.34.1",
        &node.root.display().to_string(),
        node.env
            .config
            .pins
            .get("v1.34.1")
            .cloned()
            .unwrap_or_default(),
    );
    vars.records = records.clone();
    commands
        .iter()
        .map(|command| match &command.spec {
            CommandSpec::Run(argv)
                if command
                    .when
                    .as_ref()
                    .is_none_or(|w| w.holds(&records[w.record()])) =>
            {
                let argv: Vec<String> = argv.iter().map(|a| expand(a, &vars).unwrap()).collect();
                Some(argv.join(" "))
            }
            _ => None,
        })
        .collect()
}

/// The values the records take on a node at [`FROM`] with kubeadm and kubelet held, kubectl not.
fn records_at_start(sequence: &CommandSequence) -> BTreeMap<String, String> {
    sequence
        .record
        .iter()
        .map(|r| {
            let value = match r.name.as_str() {
                "kubeadm" | "kubelet" | "kubectl" => FROM,
                "kubeadmHold" | "kubeletHold" => "hold",
                "kubectlHold" => "unhold",
                _ => "",
            };
            (r.name.clone(), value.to_owned())
        })
        .collect()
}

/// Every case of the table for `world`.
fn cases(world: World) -> Vec<Case> {
    let node = Node::new(world, true);
    let mut out = Vec::new();
    for step in 0..2 {
        let sequence = sequence(&node.env.config, step);
        let records = records_at_start(sequence);
        let record_argv: Vec<Option<String>> = sequence
            .record
            .iter()
            .map(|r| {
                let vars =
                    Vars::for_version("v1.34.1", &node.root.display().to_string(), BTreeMap::new());
                Some(
                    r.run
                        .iter()
                        .map(|a| expand(a, &vars).unwrap())
                        .collect::<Vec<_>>()
                        .join(" "),
                )
            })
            .collect();
        let undo = sequence
            .undo
            .as_ref()
            .expect("the shipped config has an undo");
        let lists = [
            (Phase::Record, record_argv),
            (Phase::Forward, runs(&node, &sequence.commands, &records)),
            (Phase::Undo, runs(&node, &undo.commands, &records)),
        ];
        let on_resume: Vec<String> = runs(&node, &undo.on_resume, &records)
            .into_iter()
            .flatten()
            .collect();
        for (phase, argvs) in lists {
            let present: Vec<&String> = argvs.iter().flatten().collect();
            for (command, argv) in argvs.iter().enumerate() {
                let Some(argv) = argv else { continue };
                assert_eq!(
                    present.iter().filter(|a| **a == argv).count(),
                    1,
                    "{argv} twice in one list: the shim could not tell them apart"
                );
                let acts: &[Act] = match phase {
                    Phase::Undo => &[Act::Fail, Act::KillBefore, Act::KillAfter],
                    _ => &[Act::Fail],
                };
                // Each case runs on its own node: its root goes in at run time.
                let root = node.root.display().to_string();
                let argv = argv.replace(&root, ROOT);
                let resumed: Vec<String> = on_resume
                    .iter()
                    .chain(argvs[command..].iter().flatten())
                    .map(|a| a.replace(&root, ROOT))
                    .collect();
                for &act in acts {
                    out.push(Case {
                        world,
                        step,
                        phase,
                        command,
                        argv: argv.clone(),
                        act,
                        resumed: resumed.clone(),
                    });
                }
            }
        }
    }
    out
}

/// How a run ended: the plan's status and its rollback's state, message and undone count, and whether the
/// case's injection fired.
pub(super) struct End {
    fired: bool,
    /// The shims' invocations after the restart (kills only).
    after_kill: Vec<String>,
    pub(super) status: inplace_agent_api::PlanStatus,
    pub(super) state: Option<RollbackState>,
    pub(super) message: String,
    pub(super) undone: u32,
}

/// Runs the plan on `node` to its end, applying `case` (when given) to its invocation.
pub(super) async fn drive(node: &Node, plan: Plan, case: Option<&Case>) -> End {
    let mut host = Host::open(&node.state, node.env.clone());
    host.store.adopt(plan).unwrap();
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    let mut fired = false;
    let mut killed_at = None;
    loop {
        let record = host.store.state.current.as_ref().unwrap();
        if crate::rollback::verify::pending(&host.store) {
            let flow = crate::rollback::verify::run_finish(&mut host, &mut shutdown).await;
            assert_eq!(flow, ControlFlow::Continue(()));
            continue;
        }
        let (phases, index) = if pending(&host.store) {
            let rollback = record.rollback.as_ref().unwrap();
            let pos = rollback.next_undo().unwrap();
            (vec![Phase::Undo], rollback.order[pos] as usize)
        } else if let Some(index) = record.next_step() {
            (vec![Phase::Record, Phase::Forward], index)
        } else {
            break;
        };
        let kind = match host.store.plan.as_ref().unwrap().steps[index].action {
            StepAction::InstallKubeadm { .. } => Some(0),
            StepAction::InstallKubelet { .. } => Some(1),
            _ => None,
        };
        let armed = case.filter(|c| !fired && Some(c.step) == kind && phases.contains(&c.phase));
        node.inject(
            armed
                .map(|c| {
                    let verb = match c.act {
                        Act::Fail => "fail",
                        Act::KillBefore => "before",
                        Act::KillAfter => "after",
                    };
                    format!("{verb} {}", c.argv)
                })
                .as_deref(),
        );
        let blocked = async {
            while node.blocked().is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let undo = pending(&host.store);
        let killed = tokio::select! {
            flow = async {
                if undo {
                    run_undo(&mut host, &mut shutdown).await
                } else {
                    crate::run::executor::run_step(&mut host, index, &mut shutdown).await
                }
            } => {
                assert_eq!(flow, ControlFlow::Continue(()));
                false
            }
            () = blocked => true,
        };
        if killed {
            // SIGKILL: the command's process group dies with the agent; a new agent opens the state dir.
            node.kill_blocked();
            node.inject(None);
            fired = true;
            killed_at = Some(node.calls().len());
            drop(host);
            host = Host::open(&node.state, node.env.clone());
        } else if armed.is_some_and(|c| c.act == Act::Fail) && node.failed_injection() {
            fired = true;
        }
    }
    node.inject(None);
    let progress = host.store.state.current.as_ref().unwrap().progress();
    let rollback = progress.rollback;
    let after_kill = killed_at.map_or_else(Vec::new, |at| node.calls().split_off(at));
    End {
        fired,
        after_kill,
        status: progress.status,
        state: rollback.as_ref().map(|r| r.state),
        message: rollback
            .as_ref()
            .map(|r| r.message.clone())
            .unwrap_or_default(),
        undone: rollback.map_or(0, |r| r.undone),
    }
}

/// Runs one case on a fresh node; returns whether the node ended at its start state, rolled back.
async fn run_case(mut case: Case) -> Result<bool, String> {
    let node = Node::new(case.world, true);
    let root = node.root.display().to_string();
    case.argv = case.argv.replace(ROOT, &root);
    for argv in &mut case.resumed {
        *argv = argv.replace(ROOT, &root);
    }
    std::fs::create_dir_all(node.root.join("etc/blocked")).unwrap();
    let start = node.fingerprint();
    let end = tokio::time::timeout(
        CASE_LIMIT,
        drive(&node, plan(&[case.step], true), Some(&case)),
    )
    .await
    .map_err(|_| format!("{}: timed out", case.name()))?;
    if !end.fired {
        return Err(format!("{}: the injection never fired", case.name()));
    }
    let mut end_state = node.fingerprint();
    if case.phase == Phase::Record {
        // A record command that fails after an earlier one kept a binary aside leaves that copy
        // (`*.inplace-prev`, overwritten by the next attempt): the step never began, so nothing undoes it.
        end_state.retain(|l| !l.contains(".inplace-prev ") || start.contains(l));
    }
    let at_start = end_state == start;
    match (case.phase, case.act) {
        (Phase::Undo, Act::Fail) => {
            // By design an undo that fails for good ends the rollback failed, naming it; the node stays
            // cordoned for an operator.
            let named = end
                .message
                .contains(&format!("`{}` exited with 100", case.argv));
            if end.state != Some(RollbackState::Failed) || !named {
                return Err(format!("{}: {:?} {}", case.name(), end.state, end.message));
            }
            Ok(at_start)
        }
        _ => {
            if end.state != Some(RollbackState::RolledBack) || !at_start {
                let diff = diff(&start, &end_state);
                return Err(format!(
                    "{}: {:?} ({} undone) {}; differences from the start: {diff:?}",
                    case.name(),
                    end.state,
                    end.undone,
                    end.message
                ));
            }
            if case.act != Act::Fail && end.after_kill != case.resumed {
                return Err(format!(
                    "{}: after the restart ran {:?}, expected onResume then the commands from the killed one \
                     {:?}",
                    case.name(),
                    end.after_kill,
                    case.resumed
                ));
            }
            if case.step == 1 && case.phase != Phase::Record {
                // kubelet runs the old version again: restarted by the undo after the restore.
                let calls = node.systemctl();
                if calls.last().map(String::as_str) != Some("restart kubelet") {
                    return Err(format!("{}: systemctl calls {calls:?}", case.name()));
                }
            }
            Ok(true)
        }
    }
}

pub(super) fn diff(a: &[String], b: &[String]) -> Vec<String> {
    let only_a = a
        .iter()
        .filter(|l| !b.contains(l))
        .map(|l| format!("- {l}"));
    let only_b = b
        .iter()
        .filter(|l| !a.contains(l))
        .map(|l| format!("+ {l}"));
    only_a.chain(only_b).collect()
}

/// Runs every case of `world`, a few at once; prints the table's counts.
async fn table(world: World) {
    let started = Instant::now();
    let cases = cases(world);
    let semaphore = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CASES));
    let mut set = tokio::task::JoinSet::new();
    for case in cases.clone() {
        let semaphore = semaphore.clone();
        set.spawn(async move {
            let _permit = semaphore.acquire().await.unwrap();
            let key = (case.phase, case.act);
            (key, run_case(case).await)
        });
    }
    let mut counts: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut errors = Vec::new();
    while let Some(joined) = set.join_next().await {
        let ((phase, act), result) = joined.unwrap();
        let row = counts.entry(format!("{phase:?} {act:?}")).or_default();
        row.0 += 1;
        match result {
            Ok(true) => row.1 += 1,
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    eprintln!(
        "package-undo table, {world:?} ({} cases, {:.1} s): case kind: cases / back at the start state, rolled back",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    for (kind, (n, ok)) in &counts {
        eprintln!("  {kind}: {n} / {ok}");
    }
    assert!(
        errors.is_empty(),
        "{} cases failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
    assert!(cases.len() >= 20, "{world:?}: only {} cases", cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt_every_injected_failure_and_kill_ends_at_the_start_or_names_the_failed_undo() {
    table(World::Apt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_binaries_every_injected_failure_and_kill_ends_at_the_start_or_names_the_failed_undo()
 {
    table(World::Release).await;
}
