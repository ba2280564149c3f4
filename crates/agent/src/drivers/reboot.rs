//! The `reboot` driver, kured-like, and the reboot machinery the osImage driver shares ([`reboot_once`]).
//!
//! `when: ifRequired` asks the node first (`reboot.required`: a file such as Debian's
//! `/var/run/reboot-required`, or a command such as dnf's `needs-restarting -r`, exit 1 = required, 0 = not);
//! `when: always` does not ask. The reboot itself follows the journal protocol of `crate::os::reboot`
//! (`<state-dir>/reboot.json`): the intent (step, boot id before, time) is written fsynced BEFORE
//! `reboot.command` runs and marked issued after it returned 0. On every (re)start of the step the boot id
//! decides: a new one means the reboot happened (never reboot twice: wait for the Node to be Ready, when the
//! config has `node:`, and succeed); the same one with the command issued means it has not happened yet (an
//! agent restart is not a reboot): wait for the machine to go down, at most the step's timeout counted from
//! the recorded intent, then fail saying when the command ran.

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{RebootWhen, StepAction, StepKind};

use super::driver::{Driver, StepFuture, blocking_value, wrong_kind};
use super::error::DriverError;
use super::step::{Done, StepContext};
use super::wait_node_ready::wait_ready;
use crate::clock::{now_unix_ms, utc_text};
use crate::config::RequiredCheck;
use crate::fsutil::{read_journal, remove_file, write_journal};
use crate::os::driver_env::DriverEnv;
use crate::os::inventory::read_fact;
use crate::os::reboot::{
    Next, REBOOT_JOURNAL, RebootIntent, RebootJournal, RebootOwner, Situation, decide,
    short_boot_id,
};
use crate::sequence::process::{CommandEnd, display_argv, run_command};
use crate::sequence::template::{Vars, expand};

/// The `reboot` driver.
pub(crate) struct Reboot;

impl Driver for Reboot {
    fn kind(&self) -> StepKind {
        StepKind::Reboot
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        let StepAction::Reboot { when } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        Box::pin(async move {
            let plan_id = ctx.plan_id.clone();
            let owner = RebootOwner {
                plan_id: &plan_id,
                step_index: ctx.step.index,
                undo: false,
            };
            Ok(
                match reboot_once(&env, &mut ctx, owner, when, None).await? {
                    Rebooting::NotRequired(how) => Done::ok(format!("no reboot required ({how})")),
                    Rebooting::Done(done) => Done::ok(done.summary()),
                },
            )
        })
    }
}

/// How a reboot ended well.
pub(super) enum Rebooting {
    /// `ifRequired` and the node needs none (how that was checked).
    NotRequired(String),
    /// The node rebooted.
    Done(Rebooted),
}

/// A reboot that happened.
pub(super) struct Rebooted {
    /// Why it rebooted (`always`, or what said a reboot is required).
    pub reason: String,
    /// The boot id before.
    pub before: String,
    /// The boot id now.
    pub after: String,
    /// Whether the Node Ready was confirmed (false: the config has no `node:` section).
    pub node_ready: bool,
    /// osImage: the image the node booted before.
    pub previous_image: Option<String>,
}

impl Rebooted {
    /// `rebooted (boot id 0123abcd… → 4567ef01…), node Ready`, with the reason.
    pub fn summary(&self) -> String {
        let ready = if self.node_ready {
            ", node Ready"
        } else {
            "; Node Ready not checked (no `node:` section in the agent config)"
        };
        format!(
            "{}: rebooted (boot id {} → {}){ready}",
            self.reason,
            short_boot_id(&self.before),
            short_boot_id(&self.after)
        )
    }
}

/// Reboots the node once for `owner` (see the module doc), or finds it rebooted; `previous_image` goes into
/// the intent (osImage). `Err` is the step's end.
pub(super) async fn reboot_once(
    env: &DriverEnv,
    ctx: &mut StepContext,
    owner: RebootOwner<'_>,
    when: RebootWhen,
    previous_image: Option<String>,
) -> Result<Rebooting, DriverError> {
    let boot_id = current_boot_id(env)?;
    let mut intent = load_intent(ctx, env).await?;
    if intent.as_ref().is_some_and(|i| !i.is_for(owner)) {
        tracing::info!(
            journal = REBOOT_JOURNAL,
            "clearing the reboot journal of another step"
        );
        save_intent(ctx, env, None).await?;
        intent = None;
    }
    let timeout_ms = u64::from(ctx.step.timeout_seconds) * 1000;
    let mut required = None;
    let (mut reason, mut how) = ("always".to_owned(), String::new());
    loop {
        let situation = Situation {
            owner,
            intent: intent.as_ref(),
            boot_id: &boot_id,
            when,
            required,
            now_unix_ms: now_unix_ms(),
            timeout_ms,
        };
        match decide(&situation) {
            Next::AskRequired => {
                let (is_required, checked) = ask_required(env, ctx).await?;
                required = Some(is_required);
                reason = format!("reboot required ({checked})");
                how = checked;
            }
            Next::NotRequired => return Ok(Rebooting::NotRequired(how)),
            Next::Reboot => {
                let mut recorded = RebootIntent {
                    plan_id: owner.plan_id.to_owned(),
                    step_index: owner.step_index,
                    undo: owner.undo,
                    boot_id_before: boot_id.clone(),
                    intent_at_unix_ms: now_unix_ms(),
                    issued_at_unix_ms: None,
                    previous_image: intent
                        .as_ref()
                        .and_then(|i| i.previous_image.clone())
                        .or_else(|| previous_image.clone()),
                    reason: intent.as_ref().map_or(reason.clone(), |i| i.reason.clone()),
                };
                save_intent(ctx, env, Some(recorded.clone())).await?;
                run_reboot_command(env, ctx).await?;
                recorded.issued_at_unix_ms = Some(now_unix_ms());
                save_intent(ctx, env, Some(recorded.clone())).await?;
                intent = Some(recorded);
            }
            Next::WaitDown {
                issued_at_unix_ms,
                until_unix_ms,
            } => wait_down(ctx, issued_at_unix_ms, until_unix_ms).await?,
            Next::NeverWentDown { issued_at_unix_ms } => {
                return Err(DriverError::Unverified(format!(
                    "the reboot command ran at {} and the boot id is unchanged ({}) after the step's timeout of {} s: \
                     the node did not reboot",
                    utc_text(issued_at_unix_ms),
                    short_boot_id(&boot_id),
                    ctx.step.timeout_seconds
                )));
            }
            Next::Rebooted { before, after } => {
                let kind = ctx.step.action.kind();
                let node_ready = if env.config.node.is_some() {
                    // The Node's Ready must be this boot's: a fast reboot can leave the old one standing.
                    wait_ready(env, ctx, None, Some(&boot_id), kind).await?;
                    true
                } else {
                    false
                };
                // `decide` answers `Rebooted` only from a recorded intent.
                let (reason, previous_image) = intent
                    .map(|i| (i.reason, i.previous_image))
                    .unwrap_or_default();
                return Ok(Rebooting::Done(Rebooted {
                    reason,
                    before,
                    after,
                    node_ready,
                    previous_image,
                }));
            }
        }
    }
}

/// The boot id now (`reboot.bootIdFile`); the step cannot tell a reboot without it.
fn current_boot_id(env: &DriverEnv) -> Result<String, DriverError> {
    let file = &env.config.reboot.boot_id_file;
    read_fact(env, file).ok_or_else(|| {
        DriverError::refused(format!(
            "cannot read the boot id from {file} (reboot.bootIdFile): without it a reboot cannot be told from an agent restart"
        ))
    })
}

/// The recorded intent, whoever's it is.
pub(super) async fn load_intent(
    ctx: &StepContext,
    env: &DriverEnv,
) -> Result<Option<RebootIntent>, DriverError> {
    let path = env.state_dir.join(REBOOT_JOURNAL);
    blocking_value(ctx, move || {
        Ok(
            read_journal::<RebootJournal>(&path, "move it away to forget a reboot in progress")
                .map(|journal| journal.intent)?,
        )
    })
    .await
}

/// Writes the intent (`None` removes the journal).
async fn save_intent(
    ctx: &StepContext,
    env: &DriverEnv,
    intent: Option<RebootIntent>,
) -> Result<(), DriverError> {
    let path = env.state_dir.join(REBOOT_JOURNAL);
    blocking_value(ctx, move || match intent {
        Some(intent) => Ok(write_journal(
            &path,
            &RebootJournal {
                intent: Some(intent),
            },
        )?),
        None => Ok(remove_file(&path).map(|_| ())?),
    })
    .await
}

/// Expands a reboot command's `{{root}}`.
fn expand_root(env: &DriverEnv, argv: &[String], key: &str) -> Result<Vec<String>, DriverError> {
    let vars = Vars::root_only(&env.fs.root().display().to_string());
    argv.iter()
        .map(|arg| expand(arg, &vars))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DriverError::from(e).at(key))
}

/// Runs `reboot.command`; `Err` unless it exited 0.
async fn run_reboot_command(env: &DriverEnv, ctx: &mut StepContext) -> Result<(), DriverError> {
    let argv = expand_root(env, &env.config.reboot.command, "reboot.command")?;
    let output = run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
    match DriverError::command(&argv, &output, ctx.step.timeout_seconds) {
        None => Ok(()),
        Some(failure) => Err(failure.at("reboot.command")),
    }
}

/// Whether the node says a reboot is required, and how that was checked.
async fn ask_required(
    env: &DriverEnv,
    ctx: &mut StepContext,
) -> Result<(bool, String), DriverError> {
    let check = env
        .config
        .reboot
        .required
        .check()
        .map_err(DriverError::Refused)?;
    match check {
        RequiredCheck::File(file) => {
            let path = env.fs.path(&file)?;
            match tokio::fs::try_exists(&path).await {
                Ok(true) => Ok((true, format!("{file} exists"))),
                Ok(false) => Ok((false, format!("{file} is absent"))),
                Err(source) => Err(DriverError::NodeFile {
                    what: format!("reboot.required.file: cannot tell whether {file} exists"),
                    source,
                }),
            }
        }
        RequiredCheck::Command(argv) => {
            let argv = expand_root(env, &argv, "reboot.required.command")?;
            let shown = display_argv(&argv);
            let output = run_command(&argv, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
            match output.end {
                CommandEnd::Exited(1) => Ok((true, format!("`{shown}` exited 1"))),
                CommandEnd::Exited(0) => Ok((false, format!("`{shown}` exited 0"))),
                CommandEnd::Exited(code) => {
                    let stderr = output.stderr_tail.trim();
                    Err(DriverError::UnexpectedExit {
                        what: "reboot.required.command",
                        shown,
                        code,
                        expected: "it must exit 1 (a reboot is required) or 0 (none is)",
                        stderr_tail: (!stderr.is_empty()).then(|| stderr.to_owned()),
                    })
                }
                _ => Err(
                    DriverError::command(&argv, &output, ctx.step.timeout_seconds).unwrap_or_else(
                        || DriverError::refused("reboot.required.command: no result"),
                    ),
                ),
            }
        }
    }
}

/// Waits for the machine to go down (the agent is then stopped) until `until_unix_ms`, saying so as the
/// running step's message. `Ok` when the time is up; `Err` when the agent shuts down (the step resumes).
async fn wait_down(
    ctx: &mut StepContext,
    issued_at_unix_ms: u64,
    until_unix_ms: u64,
) -> Result<(), DriverError> {
    let sent = utc_text(issued_at_unix_ms);
    let text = format!("reboot command sent at {sent}, waiting for the node to go down");
    tracing::info!(step = ctx.step.index, "{text}");
    let progress = ctx.progress.clone().unwrap_or_default();
    ctx.recorder.record_with_message(progress, Some(text)).await;
    let wait = Duration::from_millis(until_unix_ms.saturating_sub(now_unix_ms()));
    let cancel = &mut ctx.cancel;
    let cancelled = async move {
        if cancel.wait_for(|c| *c).await.is_err() {
            // No one can cancel any more: only the time is left.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = cancelled => Err(DriverError::Interrupted(format!(
            "reboot command sent at {sent}; stopped: agent shutting down (the reboot is under way)"
        ))),
        () = tokio::time::sleep(wait) => Ok(()),
    }
}
