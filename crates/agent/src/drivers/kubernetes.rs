//! The Kubernetes version steps (`installKubeadm`, `kubeadmUpgrade`, `installKubelet`): the
//! operator's configured sequence for this node, with the validated version templated in.
//! The server only says which step and version; how this node installs packages or binaries is
//! the agent config's business.
//!
//! Resume rule: `skipIf` is consulted only for a step that never began (and whose sequence no
//! earlier plan left unfinished). A step that began runs its `onResume` commands, then continues
//! at the first command not recorded complete; each command's completion is recorded durably in
//! the step's record (through the executor) right after it exits.

use inplace_agent_api::{KubeadmUpgradeMode, StepAction, is_valid_kubernetes_version, parse_mode};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::attempts::Attempts;
use super::{DriverEnv, DriverOutcome, StepContext, StepResult};
use crate::command::{display_argv, run_command};
use crate::driver_config::{Check, CommandSequence, CommandSpec, SequenceCommand};
use crate::fsutil::{FileMeta, atomic_write};
use crate::state::SequenceProgress;
use crate::template::{Vars, expand};
use crate::unfinished;

/// Runs the configured sequence for `action`.
pub(crate) async fn run(env: &DriverEnv, ctx: &mut StepContext, action: &StepAction) -> StepResult {
    let k = &env.config.kubernetes;
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
            return StepResult::failed(format!(
                "{} is not a Kubernetes version step",
                other.kind()
            ));
        }
    };
    let Some(sequence) = sequence else {
        return StepResult::failed(format!(
            "the agent config has no kubernetes.{key}: this node does not know how to run it"
        ));
    };
    if !is_valid_kubernetes_version(version) {
        return StepResult::failed(format!("version {version:?} is not of the form v1.2.3"));
    }
    let root = env.fs.root().display().to_string();
    let pins = env
        .config
        .pins
        .get(version.as_str())
        .cloned()
        .unwrap_or_default();
    let vars = Vars::for_version(version, &root, pins);
    run_sequence(env, ctx, key, sequence, &vars, version).await
}

/// One command of a sequence with its templates expanded (and serialized for the fingerprint).
#[derive(Serialize)]
pub(super) enum Prepared {
    /// argv.
    Run(Vec<String>),
    /// Node path, content, mode.
    WriteFile(String, String, u32),
    /// Node path, expected digest (lowercase hex).
    VerifySha256(String, String),
}

/// Expands every command before the first one runs, so a template that cannot be filled (a
/// version without pins) fails the step before it changes anything.
fn prepare(
    env: &DriverEnv,
    key: &str,
    list: &str,
    commands: &[SequenceCommand],
    vars: &Vars,
) -> Result<Vec<Prepared>, String> {
    let mut prepared = Vec::with_capacity(commands.len());
    for (i, command) in commands.iter().enumerate() {
        let one = match &command.spec {
            CommandSpec::Run(template) => template
                .iter()
                .map(|a| expand(a, vars))
                .collect::<Result<Vec<_>, _>>()
                .map(Prepared::Run),
            CommandSpec::WriteFile {
                path,
                content,
                mode,
            } => (|| {
                let node_path = expand(path, vars)?;
                env.fs.path(&node_path)?;
                let mode = mode.as_deref().and_then(parse_mode).unwrap_or(0o644);
                Ok(Prepared::WriteFile(node_path, expand(content, vars)?, mode))
            })(),
            CommandSpec::VerifySha256 { path, sha256 } => (|| {
                let node_path = expand(path, vars)?;
                env.fs.path(&node_path)?;
                let expected = expand(sha256, vars)?.to_ascii_lowercase();
                if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("sha256 for {node_path} is not 64 hex digits"));
                }
                Ok(Prepared::VerifySha256(node_path, expected))
            })(),
        };
        prepared.push(one.map_err(|e| format!("kubernetes.{key}.{list}[{i}]: {e}"))?);
    }
    Ok(prepared)
}

/// SHA-256 (hex) of a sequence's expanded commands: what recorded progress refers to.
fn fingerprint(key: &str, commands: &[Prepared]) -> String {
    let bytes = serde_json::to_vec(&(key, commands)).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs one prepared command; `Some` is the step's end (a failure or an interruption).
pub(super) async fn run_one(
    env: &DriverEnv,
    ctx: &mut StepContext,
    command: &Prepared,
    context: impl Fn(String) -> String,
) -> Option<StepResult> {
    match command {
        Prepared::Run(argv) => {
            let output = run_command(argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
            StepResult::from_command(argv, &output, ctx.step.timeout_seconds)
        }
        Prepared::WriteFile(node_path, content, mode) => write_file(env, node_path, content, *mode)
            .err()
            .map(|e| StepResult::failed(context(e))),
        Prepared::VerifySha256(node_path, expected) => verify_sha256(env, node_path, expected)
            .await
            .err()
            .map(|e| StepResult::failed(context(e))),
    }
}

pub(super) fn interrupted() -> StepResult {
    StepResult {
        outcome: DriverOutcome::Interrupted,
        ..StepResult::failed("agent shutting down")
    }
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
        prepare(env, key, "commands", &sequence.commands, vars),
        prepare(env, key, "onResume", &sequence.on_resume, vars),
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
    let first = match &ctx.progress {
        Some(p) if p.sequence == sequence_id => (p.done as usize).min(total),
        Some(_) => {
            tracing::warn!(
                step = key,
                "recorded progress is for other commands (agent config or pins changed); running every command"
            );
            0
        }
        None => 0,
    };
    if ctx.resumed {
        tracing::info!(
            step = key,
            first = first + 1,
            total,
            "resuming the sequence"
        );
        for (i, command) in on_resume.iter().enumerate() {
            if *ctx.cancel.borrow() {
                return interrupted();
            }
            let context = |e: String| format!("kubernetes.{key}.onResume[{i}]: {e}");
            if let Some(end) = run_one(env, ctx, command, context).await {
                return end;
            }
        }
    }
    // A retry of command `first` that an interruption cut short continues at its attempt.
    let mut pending_retry = match &ctx.progress {
        Some(p) if p.sequence == sequence_id && p.done as usize == first => {
            Some((p.failed_attempts, p.retry_at_unix_ms))
        }
        _ => None,
    };
    let mut retried = Vec::new();
    for (i, command) in commands.iter().enumerate().skip(first) {
        let policy = sequence.retry.filter(|_| sequence.commands[i].retryable);
        let (failures, due) = pending_retry.take().unwrap_or_default();
        let context = |e: String| format!("kubernetes.{key}.commands[{i}]: {e}");
        let attempts = Attempts {
            index: i,
            sequence: &sequence_id,
            policy,
            failures,
            due,
        };
        match attempts.run(env, ctx, command, context).await {
            Err(end) => return end,
            Ok(Some(note)) => retried.push(note),
            Ok(None) => {}
        }
        let progress = SequenceProgress {
            sequence: sequence_id.clone(),
            done: (i + 1) as u32,
            ..SequenceProgress::default()
        };
        // When this fails the command runs again after an interruption: safe by the resume rule.
        ctx.recorder.record(progress).await;
    }
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

fn write_file(env: &DriverEnv, node_path: &str, content: &str, mode: u32) -> Result<(), String> {
    let real = env.fs.path(node_path)?;
    let owner = env.is_root.then_some((0, 0));
    atomic_write(&real, content.as_bytes(), FileMeta { mode, owner }).map_err(|e| e.to_string())
}

async fn verify_sha256(env: &DriverEnv, node_path: &str, expected: &str) -> Result<(), String> {
    let real = env.fs.path(node_path)?;
    let digest = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let mut file =
            std::fs::File::open(&real).map_err(|e| format!("open {}: {e}", real.display()))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)
            .map_err(|e| format!("read {}: {e}", real.display()))?;
        Ok(hex(&hasher.finalize()))
    })
    .await
    .map_err(|e| e.to_string())??;
    if digest != expected {
        return Err(format!(
            "sha256 of {node_path} is {digest}, pinned {expected}"
        ));
    }
    Ok(())
}
