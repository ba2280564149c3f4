//! A sequence's commands with their templates expanded ([`Prepared`]), their fingerprint (what recorded
//! progress refers to), and how one of them runs: a program, or the built-in `writeFile`,
//! `verifySha256`, `fetch` (`fetch_command.rs`) and `sysextSwitch`.

use inplace_agent_api::parse_mode;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::DriverError;
use super::fetch_command::{self, Fetch};
use super::step::StepContext;
use crate::fsutil::{FileMeta, atomic_write, fs_err};
use crate::hex::hex;
use crate::os::driver_env::DriverEnv;
use crate::sequence::command::{CommandSpec, SequenceCommand};
use crate::sequence::process::run_command;
use crate::sequence::template::{Vars, expand};

/// One command of a sequence with its templates expanded (and serialized for the fingerprint).
#[derive(Serialize)]
pub(super) enum Prepared {
    /// argv.
    Run(Vec<String>),
    /// Node path, content, mode.
    WriteFile(String, String, u32),
    /// Node path, expected digest (lowercase hex).
    VerifySha256(String, String),
    /// An artifact to fetch and install.
    Fetch(Fetch),
    /// Extension name, image node path (empty: remove the link).
    SysextSwitch(String, String),
    /// An undo command whose `ifRecorded`/`ifNotRecorded` condition does not hold: it does nothing.
    Skip,
}

/// Expands every command of `list` (`commands`, `onResume`) of the sequence at config key `key` (e.g.
/// `kubernetes.installKubelet`) before the first one runs, so a template that cannot be filled (a
/// version without pins) fails the step before it changes anything.
pub(super) fn prepare(
    env: &DriverEnv,
    key: &str,
    list: &str,
    commands: &[SequenceCommand],
    vars: &Vars,
) -> Result<Vec<Prepared>, DriverError> {
    let mut prepared = Vec::with_capacity(commands.len());
    for (i, command) in commands.iter().enumerate() {
        if let Some(when) = &command.when {
            let value = vars.records.get(when.record()).ok_or_else(|| {
                DriverError::refused(format!(
                    "{key}.{list}[{i}]: no value for record {:?} (the agent config changed since \
                     the step began?)",
                    when.record()
                ))
            })?;
            if !when.holds(value) {
                prepared.push(Prepared::Skip);
                continue;
            }
        }
        let one = match &command.spec {
            CommandSpec::Run(template) => template
                .iter()
                .map(|a| expand(a, vars))
                .collect::<Result<Vec<_>, _>>()
                .map(Prepared::Run)
                .map_err(DriverError::from),
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
                    return Err(DriverError::refused(format!(
                        "sha256 for {node_path} is not 64 hex digits"
                    )));
                }
                Ok(Prepared::VerifySha256(node_path, expected))
            })(),
            CommandSpec::Fetch {
                source,
                sha256,
                to,
                mode,
            } => fetch_command::prepare(env, source, sha256.as_deref(), to, mode.as_deref(), vars)
                .map(Prepared::Fetch),
            CommandSpec::SysextSwitch { name, image } => (|| {
                let image = expand(image, vars)?;
                if !image.is_empty() {
                    env.fs.path(&image)?;
                }
                Ok(Prepared::SysextSwitch(name.clone(), image))
            })(),
        };
        prepared.push(one.map_err(|e| e.at(format!("{key}.{list}[{i}]")))?);
    }
    Ok(prepared)
}

/// SHA-256 (hex) of a sequence's expanded commands: what recorded progress refers to.
pub(super) fn fingerprint(key: &str, commands: &[Prepared]) -> String {
    let bytes = serde_json::to_vec(&(key, commands)).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

/// Runs one prepared command; `Some` is the step's end (a failure or an interruption). A failure of a
/// built-in command is said at `context` (its place in its sequence); a program's says its argv.
pub(super) async fn run_one(
    env: &DriverEnv,
    ctx: &mut StepContext,
    command: &Prepared,
    context: &str,
) -> Option<DriverError> {
    match command {
        Prepared::Run(argv) => {
            let output = run_command(argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
            DriverError::command(argv, &output, ctx.step.timeout_seconds)
        }
        Prepared::WriteFile(node_path, content, mode) => write_file(env, node_path, content, *mode)
            .err()
            .map(|e| e.at(context)),
        Prepared::VerifySha256(node_path, expected) => verify_sha256(env, node_path, expected)
            .await
            .err()
            .map(|e| e.at(context)),
        Prepared::Fetch(fetch) => fetch.run(env, ctx, context).await.err(),
        Prepared::SysextSwitch(name, image) => {
            let mut run = crate::os::sysext::Run {
                env,
                deadline: ctx.deadline,
                cancel: &mut ctx.cancel,
            };
            match run.switch(name, image).await {
                Ok(done) => {
                    tracing::info!(extension = %name, "{done}");
                    None
                }
                Err(crate::os::sysext::SysextError::ShuttingDown) => {
                    Some(DriverError::shutting_down())
                }
                Err(source) => Some(
                    DriverError::Sysext {
                        name: name.clone(),
                        source,
                    }
                    .at(context),
                ),
            }
        }
        Prepared::Skip => None,
    }
}

fn write_file(
    env: &DriverEnv,
    node_path: &str,
    content: &str,
    mode: u32,
) -> Result<(), DriverError> {
    let real = env.fs.path(node_path)?;
    let owner = env.is_root.then_some((0, 0));
    Ok(atomic_write(
        &real,
        content.as_bytes(),
        FileMeta { mode, owner },
    )?)
}

async fn verify_sha256(
    env: &DriverEnv,
    node_path: &str,
    expected: &str,
) -> Result<(), DriverError> {
    let real = env.fs.path(node_path)?;
    let digest = tokio::task::spawn_blocking(move || -> Result<String, DriverError> {
        let mut file = std::fs::File::open(&real).map_err(fs_err("open", &real))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(fs_err("read", &real))?;
        Ok(hex(&hasher.finalize()))
    })
    .await
    .map_err(|source| DriverError::Crashed { what: "", source })??;
    if digest != expected {
        return Err(DriverError::Sha256Mismatch {
            path: node_path.to_owned(),
            got: digest,
            want: expected.to_owned(),
        });
    }
    Ok(())
}
