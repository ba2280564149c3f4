//! The Kubernetes version steps (`installKubeadm`, `kubeadmUpgrade`, `installKubelet`): the
//! operator's configured sequence for this node, with the validated version templated in.
//! The server only says which step and version; how this node installs packages or binaries is
//! the agent config's business.
//!
//! A step whose target the node already has is passed over (it succeeds without an effect, recorded as such):
//! when its configured `skipIf` holds, and for `kubeadmUpgrade` and `installKubelet` only when the node runs
//! the target (`kubernetes_running`: the control-plane static pods, the running kubelet). A passed-over
//! `kubeadmUpgrade` crosses no point of no return.
//!
//! Resume rule: these checks are consulted only for a step that never began (and whose sequence no
//! earlier plan left unfinished). A step that began runs its `onResume` commands, then continues
//! at the first command not recorded complete; each command's completion is recorded durably in
//! the step's record (through the executor) right after it exits.

use std::collections::BTreeMap;
use std::sync::Arc;

use inplace_agent_api::{KubeadmUpgradeMode, StepAction, StepKind, is_valid_kubernetes_version};

use super::driver::{Driver, RecordFuture, StepFuture};
use super::error::DriverError;
use super::kubernetes_running::{self, Runs};
use super::kubernetes_undo;
use super::prepared::{fingerprint, prepare};
use super::sequence_run::{SequenceList, run_list};
use super::step::{Done, StepContext};
use super::undo::{RecordContext, UndoContext};
use crate::config::runtime::Bundle;
use crate::config::{Check, CommandSequence, DriverConfig};
use crate::drivers::unfinished;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{display_argv, run_command};
use crate::sequence::template::{Vars, expand};

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

/// The configured sequence of a step: where it lives in the agent config (`kubernetes.installKubelet`,
/// `runtime.install`), the sequence when configured, the Kubernetes version and the pins its templates see.
pub(super) struct Configured<'a> {
    /// The config section: `kubernetes` or `runtime`.
    pub section: &'static str,
    /// The key in it (also what the sequence's recorded progress is fingerprinted with).
    pub key: &'static str,
    /// The sequence, when the node configures one.
    pub sequence: Option<&'a CommandSequence>,
    /// The Kubernetes version, `v1.2.3`.
    pub version: &'a str,
    /// `{{pin.<name>}}` values: the version's `pins:`, or the runtime bundle.
    pub pins: BTreeMap<String, String>,
    /// The runtime matrix's bundle for the version (containerRuntime steps on a node with a matrix).
    pub bundle: Option<&'a Bundle>,
}

impl Configured<'_> {
    /// `kubernetes.installKubelet`.
    pub fn label(&self) -> String {
        format!("{}.{}", self.section, self.key)
    }

    /// The template values (`version`, `root`, the pins).
    pub fn vars(&self, env: &DriverEnv) -> Vars {
        let root = env.fs.root().display().to_string();
        Vars::for_version(self.version, &root, self.pins.clone())
    }
}

/// The configured sequence of `action`, or the step's failure (a bad version; a runtime step whose matrix has
/// no bundle for the version).
pub(super) fn sequence_of<'a>(
    config: &'a DriverConfig,
    action: &'a StepAction,
) -> Result<Configured<'a>, DriverError> {
    let k = &config.kubernetes;
    let (section, key, sequence, version) = match action {
        StepAction::InstallKubeadm { version } => (
            "kubernetes",
            "installKubeadm",
            k.install_kubeadm.as_ref(),
            version,
        ),
        StepAction::KubeadmUpgrade {
            version,
            mode: KubeadmUpgradeMode::Apply,
        } => (
            "kubernetes",
            "kubeadmUpgradeApply",
            k.kubeadm_upgrade_apply.as_ref(),
            version,
        ),
        StepAction::KubeadmUpgrade {
            version,
            mode: KubeadmUpgradeMode::Node,
        } => (
            "kubernetes",
            "kubeadmUpgradeNode",
            k.kubeadm_upgrade_node.as_ref(),
            version,
        ),
        StepAction::InstallKubelet { version } => (
            "kubernetes",
            "installKubelet",
            k.install_kubelet.as_ref(),
            version,
        ),
        StepAction::ContainerRuntime { kubernetes_version } => (
            "runtime",
            "install",
            config.runtime.as_ref().map(|r| &r.install),
            kubernetes_version,
        ),
        other => {
            return Err(DriverError::refused(format!(
                "{} is not a step run by a configured sequence",
                other.kind()
            )));
        }
    };
    if !is_valid_kubernetes_version(version) {
        return Err(DriverError::refused(format!(
            "version {version:?} is not of the form v1.2.3"
        )));
    }
    let bundle = match (section, &config.runtime) {
        ("runtime", Some(runtime)) => match runtime.bundle_for(version) {
            Some(bundle) => Some(bundle),
            None => {
                return Err(DriverError::refused(format!(
                    "runtime.matrix has no bundle for Kubernetes {version} (it has {}): add one for its minor, \
                     or turn the setting upgradeContainerRuntime off",
                    runtime.minors()
                )));
            }
        },
        _ => None,
    };
    let pins = match bundle {
        Some(bundle) => bundle.pins(),
        None => config.pins.get(version).cloned().unwrap_or_default(),
    };
    Ok(Configured {
        section,
        key,
        sequence,
        version,
        pins,
        bundle,
    })
}

/// Runs the configured sequence for `action`.
async fn run(
    env: &DriverEnv,
    ctx: &mut StepContext,
    action: &StepAction,
) -> Result<Done, DriverError> {
    let configured = sequence_of(&env.config, action)?;
    run_sequence(env, ctx, &configured).await
}

/// Runs a configured sequence: `skipIf` (for a step that never began), then its commands from the first
/// unfinished one.
pub(super) async fn run_sequence(
    env: &DriverEnv,
    ctx: &mut StepContext,
    configured: &Configured<'_>,
) -> Result<Done, DriverError> {
    let (key, version) = (configured.key, configured.version);
    let label = configured.label();
    let Some(sequence) = configured.sequence else {
        return Err(DriverError::refused(format!(
            "the agent config has no {label}: this node does not know how to run it"
        )));
    };
    let vars = &configured.vars(env);
    let commands = prepare(env, &label, "commands", &sequence.commands, vars)?;
    let on_resume = prepare(env, &label, "onResume", &sequence.on_resume, vars)?;
    let sequence_id = fingerprint(key, &commands);
    let unfinished_key = &label;
    let left_unfinished = unfinished::contains(&env.state_dir, unfinished_key)?;
    // A step that began may have made its first effects and not the rest: whatever the node looks
    // like now, the remaining commands must run. Only a step that never began may be passed over.
    if ctx.resumed || left_unfinished {
        let why = if ctx.resumed {
            "the step began before"
        } else {
            "an earlier plan left it unfinished"
        };
        tracing::info!(
            step = key,
            why,
            "not passed over: the checks are not consulted"
        );
    } else {
        if let Some(message) = already_there(env, ctx, configured, vars).await? {
            return Ok(Done::passed_over(message));
        }
    }
    unfinished::mark(&env.state_dir, unfinished_key)?;
    let total = commands.len();
    let list = SequenceList {
        label: &label,
        commands: &commands,
        specs: &sequence.commands,
        on_resume: &on_resume,
        retry: sequence.retry,
        id: &sequence_id,
    };
    let (first, retried) = run_list(env, ctx, &list).await?;
    if let Err(e) = unfinished::clear(&env.state_dir, unfinished_key) {
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
    Ok(Done::ok(message))
}

/// Why the step of `ctx` can be passed over (the node already has its target, so it would change nothing),
/// or `None` when it runs. The configured `skipIf`, when there is one, must hold; a `kubeadmUpgrade` is
/// passed over only when the node already runs its target (its control-plane static pods and its running
/// kubelet), and an `installKubelet` only when the running kubelet is the target too, not merely the file
/// `skipIf` reads (`kubernetes_running`).
async fn already_there(
    env: &DriverEnv,
    ctx: &mut StepContext,
    configured: &Configured<'_>,
    vars: &Vars,
) -> Result<Option<String>, DriverError> {
    let version = configured.version;
    let skip_if = configured.sequence.and_then(|s| s.skip_if.as_ref());
    let checked = match skip_if {
        Some(check) if !check_holds(env, ctx, check, vars).await? => return Ok(None),
        Some(_) => true,
        None => false,
    };
    let running = match ctx.step.action.step_kind() {
        StepKind::KubeadmUpgrade => {
            Some(kubernetes_running::upgraded(env, version, ctx.deadline).await)
        }
        StepKind::InstallKubelet if checked => {
            Some(kubernetes_running::kubelet_runs(env, version, ctx.deadline).await)
        }
        _ => None,
    };
    Ok(match running {
        Some(Runs::Not(why)) => {
            tracing::info!(
                step = configured.key,
                version,
                why,
                "the node does not run the target yet"
            );
            None
        }
        Some(Runs::Target(what)) if ctx.step.action.step_kind() == StepKind::KubeadmUpgrade => {
            Some(format!(
                "passed over, no point of no return crossed: the node already runs {version} ({what})"
            ))
        }
        Some(Runs::Target(what)) => Some(format!(
            "already done for {version}: skipIf check passed and {what}"
        )),
        None if checked => Some(format!("already done for {version}: skipIf check passed")),
        None => None,
    })
}

async fn check_holds(
    env: &DriverEnv,
    ctx: &mut StepContext,
    check: &Check,
    vars: &Vars,
) -> Result<bool, DriverError> {
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
