//! The Kubernetes version steps (`installKubeadm`, `kubeadmUpgrade`, `installKubelet`): the
//! operator's configured sequence for this node, with the validated version templated in.
//! The server only says which step and version; how this node installs packages or binaries is
//! the agent config's business.
//!
//! Resume rule: `skipIf` is consulted only for a step that never began (and whose sequence no
//! earlier plan left unfinished). A step that began runs its `onResume` commands, then continues
//! at the first command not recorded complete; each command's completion is recorded durably in
//! the step's record (through the executor) right after it exits.

use std::sync::Arc;

use inplace_agent_api::{KubeadmUpgradeMode, StepAction, StepKind, is_valid_kubernetes_version};

use super::driver::{Driver, RecordFuture, StepFuture};
use super::kubernetes_undo;
use super::prepared::{fingerprint, prepare};
use super::sequence_run::{SequenceList, run_list};
use super::step::{StepContext, StepResult};
use super::undo::{RecordContext, UndoContext};
use crate::command::{display_argv, run_command};
use crate::driver_config::{Check, CommandSequence, DriverConfig};
use crate::driver_env::DriverEnv;
use crate::template::{Vars, expand};
use crate::unfinished;

/// The driver of one Kubernetes version step kind (`installKubeadm`, `kubeadmUpgrade`,
/// `installKubelet`): the three run the same way, each through its own configured sequences.
pub(crate) struct KubernetesVersion(pub StepKind);

impl Driver for KubernetesVersion {
    fn kind(&self) -> StepKind {
        self.0
    }

    fn unconfigured(&self, config: &DriverConfig) -> Option<String> {
        let k = &config.kubernetes;
        let sequences = match self.0 {
            StepKind::InstallKubeadm => vec![("installKubeadm", &k.install_kubeadm)],
            StepKind::KubeadmUpgrade => vec![
                ("kubeadmUpgradeApply", &k.kubeadm_upgrade_apply),
                ("kubeadmUpgradeNode", &k.kubeadm_upgrade_node),
            ],
            StepKind::InstallKubelet => vec![("installKubelet", &k.install_kubelet)],
            other => return Some(format!("{other} is not a Kubernetes version step")),
        };
        let missing: Vec<_> = sequences
            .into_iter()
            .filter(|(_, sequence)| sequence.is_none())
            .map(|(key, _)| format!("kubernetes.{key}"))
            .collect();
        (!missing.is_empty()).then(|| missing.join(", "))
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        Box::pin(async move {
            let action = ctx.step.action.clone();
            run(&env, &mut ctx, &action).await
        })
    }

    fn record(&self, env: Arc<DriverEnv>, ctx: RecordContext) -> Option<RecordFuture> {
        Some(kubernetes_undo::record(env, ctx))
    }

    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        kubernetes_undo::undo(env, ctx)
    }
}

/// The configured sequence of `action` (its YAML key under `kubernetes`, the sequence when configured, the
/// version), or the step's failure.
pub(super) fn sequence_of<'a>(
    config: &'a DriverConfig,
    action: &'a StepAction,
) -> Result<(&'static str, Option<&'a CommandSequence>, &'a str), StepResult> {
    let k = &config.kubernetes;
    let (key, sequence, version) = match action {
        StepAction::InstallKubeadm { version } => ("installKubeadm", &k.install_kubeadm, version),
        StepAction::KubeadmUpgrade {
            version,
            mode: KubeadmUpgradeMode::Apply,
        } => ("kubeadmUpgradeApply", &k.kubeadm_upgrade_apply, version),
        StepAction::KubeadmUpgrade {
            version,
            mode: KubeadmUpgradeMode::Node,
        } => ("kubeadmUpgradeNode", &k.kubeadm_upgrade_node, version),
        StepAction::InstallKubelet { version } => ("installKubelet", &k.install_kubelet, version),
        other => {
            return Err(StepResult::failed(format!(
                "{} is not a Kubernetes version step",
                other.kind()
            )));
        }
    };
    if !is_valid_kubernetes_version(version) {
        return Err(StepResult::failed(format!(
            "version {version:?} is not of the form v1.2.3"
        )));
    }
    Ok((key, sequence.as_ref(), version))
}

/// The template values of a step at `version` on this node (`version`, `root`, the version's pins).
pub(super) fn vars_for(env: &DriverEnv, version: &str) -> Vars {
    let root = env.fs.root().display().to_string();
    let pins = env.config.pins.get(version).cloned().unwrap_or_default();
    Vars::for_version(version, &root, pins)
}

/// Runs the configured sequence for `action`.
async fn run(env: &DriverEnv, ctx: &mut StepContext, action: &StepAction) -> StepResult {
    let (key, sequence, version) = match sequence_of(&env.config, action) {
        Ok(found) => found,
        Err(end) => return end,
    };
    let Some(sequence) = sequence else {
        return StepResult::failed(format!(
            "the agent config has no kubernetes.{key}: this node does not know how to run it"
        ));
    };
    let vars = vars_for(env, version);
    run_sequence(env, ctx, key, sequence, &vars, version).await
}

async fn run_sequence(
    env: &DriverEnv,
    ctx: &mut StepContext,
    key: &str,
    sequence: &CommandSequence,
    vars: &Vars,
    version: &str,
) -> StepResult {
    let (commands, on_resume) = match (
        prepare(
            env,
            &format!("kubernetes.{key}"),
            "commands",
            &sequence.commands,
            vars,
        ),
        prepare(
            env,
            &format!("kubernetes.{key}"),
            "onResume",
            &sequence.on_resume,
            vars,
        ),
    ) {
        (Ok(commands), Ok(on_resume)) => (commands, on_resume),
        (Err(e), _) | (_, Err(e)) => return StepResult::failed(e),
    };
    let sequence_id = fingerprint(key, &commands);
    let unfinished_key = format!("kubernetes.{key}");
    let left_unfinished = match unfinished::contains(&env.state_dir, &unfinished_key) {
        Ok(found) => found,
        Err(e) => return StepResult::failed(e),
    };
    // A step that began may have made its first effects and not the rest: whatever the node looks
    // like now, the remaining commands must run. Only a step that never began may be skipped.
    if let Some(check) = &sequence.skip_if {
        if ctx.resumed || left_unfinished {
            let why = if ctx.resumed {
                "the step began before"
            } else {
                "an earlier plan left it unfinished"
            };
            tracing::info!(step = key, why, "skipIf not consulted");
        } else {
            match check_holds(env, ctx, check, vars).await {
                Ok(true) => {
                    return StepResult::ok(format!(
                        "already done for {version}: skipIf check passed"
                    ));
                }
                Ok(false) => {}
                Err(message) => return StepResult::failed(message),
            }
        }
    }
    if let Err(e) = unfinished::mark(&env.state_dir, &unfinished_key) {
        return StepResult::failed(e);
    }
    let total = commands.len();
    let list = SequenceList {
        label: &format!("kubernetes.{key}"),
        commands: &commands,
        specs: &sequence.commands,
        on_resume: &on_resume,
        retry: sequence.retry,
        id: &sequence_id,
    };
    let (first, retried) = match run_list(env, ctx, &list).await {
        Ok(done) => done,
        Err(end) => return end,
    };
    if let Err(e) = unfinished::clear(&env.state_dir, &unfinished_key) {
        // Only means the next step of this kind is not skipped by skipIf.
        tracing::warn!(error = %e, step = key, "cannot record the sequence as finished");
    }
    let mut message = if first == 0 {
        format!("{total} configured commands ran for {version}")
    } else {
        format!(
            "resumed at command {} of {total} for {version}: the first {first} had completed",
            first + 1
        )
    };
    if !retried.is_empty() {
        message.push_str(&format!(" ({})", retried.join("; ")));
    }
    StepResult::ok(message)
}

async fn check_holds(
    env: &DriverEnv,
    ctx: &mut StepContext,
    check: &Check,
    vars: &Vars,
) -> Result<bool, String> {
    let argv = check
        .run
        .iter()
        .map(|a| expand(a, vars))
        .collect::<Result<Vec<_>, _>>()?;
    let output = run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
    if !output.success() {
        tracing::debug!(command = %display_argv(&argv), end = ?output.end, "skipIf check did not pass");
        return Ok(false);
    }
    let stdout = output.stdout_tail.trim();
    if let Some(expected) = &check.stdout_equals
        && stdout != expand(expected, vars)?
    {
        return Ok(false);
    }
    if let Some(expected) = &check.stdout_contains
        && !stdout.contains(&expand(expected, vars)?)
    {
        return Ok(false);
    }
    Ok(true)
}
