//! The Kubernetes version steps (`installKubeadm`, `kubeadmUpgrade`, `installKubelet`): the
//! operator's configured sequence for this node, with the validated version templated in.
//! The server only says which step and version; how this node installs packages or binaries is
//! the agent config's business.

use inplace_agent_api::{KubeadmUpgradeMode, StepAction, is_valid_kubernetes_version, parse_mode};
use sha2::{Digest, Sha256};

use super::{DriverEnv, Outcome, StepContext, StepResult};
use crate::command::{display_argv, run_command};
use crate::driver_config::{Check, CommandSequence, CommandSpec};
use crate::fsutil::{FileMeta, atomic_write};
use crate::template::{Vars, expand};

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

async fn run_sequence(
    env: &DriverEnv,
    ctx: &mut StepContext,
    key: &str,
    sequence: &CommandSequence,
    vars: &Vars,
    version: &str,
) -> StepResult {
    if let Some(check) = &sequence.skip_if {
        match check_holds(env, ctx, check, vars).await {
            Ok(true) => {
                return StepResult::ok(format!("already done for {version}: skipIf check passed"));
            }
            Ok(false) => {}
            Err(message) => return StepResult::failed(message),
        }
    }
    for (i, command) in sequence.commands.iter().enumerate() {
        if *ctx.cancel.borrow() {
            return StepResult {
                outcome: Outcome::Interrupted,
                ..StepResult::failed("agent shutting down")
            };
        }
        let context = |e: String| format!("kubernetes.{key}.commands[{i}]: {e}");
        match command {
            CommandSpec::Run(template) => {
                let argv = match template
                    .iter()
                    .map(|a| expand(a, vars))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(argv) => argv,
                    Err(e) => return StepResult::failed(context(e)),
                };
                let output =
                    run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
                if let Some(failure) =
                    StepResult::from_command(&argv, &output, ctx.step.timeout_seconds)
                {
                    return failure;
                }
            }
            CommandSpec::WriteFile {
                path,
                content,
                mode,
            } => {
                if let Err(e) = write_file(env, path, content, mode.as_deref(), vars) {
                    return StepResult::failed(context(e));
                }
            }
            CommandSpec::VerifySha256 { path, sha256 } => {
                if let Err(e) = verify_sha256(env, path, sha256, vars).await {
                    return StepResult::failed(context(e));
                }
            }
        }
    }
    StepResult::ok(format!(
        "{} configured commands ran for {version}",
        sequence.commands.len()
    ))
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

fn write_file(
    env: &DriverEnv,
    path: &str,
    content: &str,
    mode: Option<&str>,
    vars: &Vars,
) -> Result<(), String> {
    let node_path = expand(path, vars)?;
    let real = env.fs.path(&node_path)?;
    let content = expand(content, vars)?;
    let mode = mode.and_then(parse_mode).unwrap_or(0o644);
    let owner = env.is_root.then_some((0, 0));
    atomic_write(&real, content.as_bytes(), FileMeta { mode, owner }).map_err(|e| e.to_string())
}

async fn verify_sha256(
    env: &DriverEnv,
    path: &str,
    expected: &str,
    vars: &Vars,
) -> Result<(), String> {
    let node_path = expand(path, vars)?;
    let expected = expand(expected, vars)?.to_ascii_lowercase();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("sha256 for {node_path} is not 64 hex digits"));
    }
    let real = env.fs.path(&node_path)?;
    let digest = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let mut file =
            std::fs::File::open(&real).map_err(|e| format!("open {}: {e}", real.display()))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)
            .map_err(|e| format!("read {}: {e}", real.display()))?;
        Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
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
