//! The `osImage` driver: switches an image-based node (bootc, rpm-ostree, an A/B image) to the step's
//! image with the node's own `osImage.apply` sequence (`{{image}}` templated in), reboots into it with the
//! reboot machinery of `super::reboot` (unconditionally), and checks with `osImage.current` that the node
//! booted it. A node whose `current` already prints the image is left alone ("already on <image>").
//!
//! Crash safety: the reboot journal (`crate::os::reboot`, `<state-dir>/reboot.json`) is written only after
//! `apply` completed, with the image the node booted before. A (re)started step that finds its own intent
//! there goes straight to the reboot decision (never applies again, never reboots twice); one that finds none
//! asks `current` and continues `apply` at its first unfinished command (recorded per command, as for the
//! Kubernetes version steps). After the new boot, `current` printing the previous image means the boot fell
//! back (A/B): the step fails saying so.
//!
//! Undo (the kind is `undo: Restores`): before the step's first effect the image the node booted is recorded
//! ([`UndoRecord::OsImage`]); the undo is the same switch to that image — `apply` with the previous image, the
//! reboot (its own journal entry, marked undo), and `current` verified against it. An undo that finds the
//! previous image booted already (the boot fell back, or the step never rebooted) still runs `apply` with it:
//! the step's image may still be the next boot's default (an A/B fallback or a boot menu choice boots the
//! other entry once, and bootc keeps the new deployment first until told otherwise), so without it the
//! node's next reboot could land on the image the rollback undid. It does not reboot then: the node runs the
//! image already. `apply` must therefore make `{{image}}` the next boot's image even when it is the booted
//! one (the shipped bootc example uses `bootc edit`, which `bootc switch` would not do).
//!
//! osImage is optional ([`Driver::optional`]): only an image-based OS can switch images, so a node without an
//! `osImage:` section refuses the step before any effect.

use std::sync::Arc;

use inplace_agent_api::{RebootWhen, StepAction, StepKind};
use tokio::sync::watch;
use tokio::time::Instant;

use super::driver::{Driver, RecordFuture, StepFuture, wrong_kind};
use super::error::DriverError;
use super::prepared::{fingerprint, prepare};
use super::reboot::{Rebooting, load_intent, reboot_once};
use super::sequence_run::{SequenceList, run_list};
use super::step::{Done, StepContext};
use super::undo::{RecordContext, UndoContext, UndoRecord};
use crate::config::{DriverConfig, OsImageConfig};
use crate::os::driver_env::DriverEnv;
use crate::os::reboot::RebootOwner;
use crate::sequence::process::{display_argv, run_command};
use crate::sequence::progress::SequenceProgress;
use crate::sequence::template::{Vars, expand};

/// The refusal of a node whose config has no `osImage:` section.
pub(crate) const NO_OS_IMAGE_SECTION: &str = "this node's agent config has no osImage section: it cannot apply OS images \
     (add osImage.apply and osImage.current)";

/// The `osImage` driver.
pub(crate) struct OsImage;

impl Driver for OsImage {
    fn kind(&self) -> StepKind {
        StepKind::OsImage
    }

    fn unconfigured(&self, config: &DriverConfig) -> Option<String> {
        config.os_image.is_none().then(|| "osImage".to_owned())
    }

    fn optional(&self) -> bool {
        true
    }

    fn run(&self, env: Arc<DriverEnv>, mut ctx: StepContext) -> StepFuture {
        let StepAction::OsImage { image } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        Box::pin(async move { switch_to(&env, &mut ctx, &image, false).await })
    }

    fn record(&self, env: Arc<DriverEnv>, ctx: RecordContext) -> Option<RecordFuture> {
        Some(Box::pin(async move {
            let (StepAction::OsImage { image }, Some(config)) =
                (&ctx.step.action, env.config.os_image.as_ref())
            else {
                // No section: the step fails before any effect, saying so.
                return Ok(None);
            };
            let mut cancel = ctx.cancel.clone();
            let previous = current_image(&env, config, image, ctx.deadline, &mut cancel).await?;
            Ok(Some(UndoRecord::OsImage {
                previous_image: previous,
            }))
        }))
    }

    fn undo(&self, env: Arc<DriverEnv>, ctx: UndoContext) -> StepFuture {
        Box::pin(async move {
            let Some(UndoRecord::OsImage { previous_image }) = ctx.record.clone() else {
                return Err(DriverError::refused(
                    "nothing was recorded before the step began: the previous image is unknown",
                ));
            };
            let mut step_ctx = ctx.into_step_context();
            switch_to(&env, &mut step_ctx, &previous_image, true).await
        })
    }
}

/// Brings the node onto `target` (the step's image, or for an undo the previous one).
async fn switch_to(
    env: &DriverEnv,
    ctx: &mut StepContext,
    target: &str,
    undo: bool,
) -> Result<Done, DriverError> {
    let Some(config) = env.config.os_image.as_ref() else {
        return Err(DriverError::refused(NO_OS_IMAGE_SECTION));
    };
    switch(env, ctx, config, target, undo).await.map(Done::ok)
}

async fn switch(
    env: &DriverEnv,
    ctx: &mut StepContext,
    config: &OsImageConfig,
    target: &str,
    undo: bool,
) -> Result<String, DriverError> {
    let plan_id = ctx.plan_id.clone();
    let owner = RebootOwner {
        plan_id: &plan_id,
        step_index: ctx.step.index,
        undo,
    };
    let rebooting = load_intent(ctx, env)
        .await?
        .is_some_and(|intent| intent.is_for(owner));
    let mut previous = None;
    if !rebooting {
        let booted = current_image(env, config, target, ctx.deadline, &mut ctx.cancel).await?;
        if booted == target && !undo {
            return Ok(format!("already on {target}"));
        }
        apply(env, ctx, config, target).await?;
        if booted == target {
            return Ok(format!(
                "{target} is booted already; osImage.apply made it the next boot's image again (no reboot)"
            ));
        }
        previous = Some(booted);
    }
    let done = match reboot_once(env, ctx, owner, RebootWhen::Always, previous).await? {
        Rebooting::Done(done) => done,
        Rebooting::NotRequired(_) => {
            return Err(DriverError::Unverified(
                "osImage: the reboot was skipped".to_owned(),
            ));
        }
    };
    let booted = current_image(env, config, target, ctx.deadline, &mut ctx.cancel).await?;
    if booted == target {
        return Ok(format!("now on {target}: {}", done.summary()));
    }
    if done.previous_image.as_deref() == Some(booted.as_str()) {
        return Err(DriverError::Unverified(format!(
            "booted the previous image {booted} instead of {target} (the boot fell back)"
        )));
    }
    Err(DriverError::Unverified(format!(
        "after the reboot osImage.current printed {booted:?}, not {target}"
    )))
}

/// Runs `osImage.apply` for `target` from its first unfinished command.
async fn apply(
    env: &DriverEnv,
    ctx: &mut StepContext,
    config: &OsImageConfig,
    target: &str,
) -> Result<(), DriverError> {
    let key = "osImage.apply";
    let vars = image_vars(env, target);
    let sequence = &config.apply;
    let commands = prepare(env, key, "commands", &sequence.commands, &vars)?;
    let on_resume = prepare(env, key, "onResume", &sequence.on_resume, &vars)?;
    let id = fingerprint(key, &commands);
    let list = SequenceList {
        label: key,
        commands: &commands,
        specs: &sequence.commands,
        on_resume: &on_resume,
        retry: sequence.retry,
        id: &id,
    };
    run_list(env, ctx, &list).await?;
    // What the running step's later messages carry along: the whole sequence done.
    ctx.progress = Some(SequenceProgress {
        sequence: id,
        done: commands.len() as u32,
        ..SequenceProgress::default()
    });
    Ok(())
}

fn image_vars(env: &DriverEnv, image: &str) -> Vars {
    Vars::for_image(image, &env.fs.root().display().to_string())
}

/// What `osImage.current` says the node booted: its trimmed first stdout line, or the string at
/// `currentJsonPointer` of its JSON stdout.
async fn current_image(
    env: &DriverEnv,
    config: &OsImageConfig,
    target: &str,
    deadline: Instant,
    cancel: &mut watch::Receiver<bool>,
) -> Result<String, DriverError> {
    let vars = image_vars(env, target);
    let argv = config
        .current
        .iter()
        .map(|arg| expand(arg, &vars))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DriverError::from(e).at("osImage.current"))?;
    let timeout_seconds = deadline
        .saturating_duration_since(Instant::now())
        .as_secs()
        .try_into()
        .unwrap_or(u32::MAX);
    let output = run_command(&argv, &env.command_env, deadline, cancel).await;
    if let Some(failure) = DriverError::command(&argv, &output, timeout_seconds) {
        return Err(failure.at("osImage.current"));
    }
    let shown = display_argv(&argv);
    let printed = match &config.current_json_pointer {
        None => output
            .stdout_tail
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        Some(pointer) => {
            let json: serde_json::Value =
                serde_json::from_str(&output.stdout_tail).map_err(|e| {
                    DriverError::Unverified(format!(
                        "osImage.current `{shown}` did not print JSON ({e}; only the last {} bytes of stdout are read)",
                        crate::sequence::process::STDOUT_TAIL_MAX_BYTES
                    ))
                })?;
            match json.pointer(pointer) {
                Some(serde_json::Value::String(image)) => image.trim().to_owned(),
                other => {
                    return Err(DriverError::Unverified(format!(
                        "osImage.current `{shown}`: no string at osImage.currentJsonPointer {pointer} (found {})",
                        other.map_or("nothing".to_owned(), |v| v.to_string())
                    )));
                }
            }
        }
    };
    if printed.is_empty() {
        return Err(DriverError::Unverified(format!(
            "osImage.current `{shown}` printed no image"
        )));
    }
    Ok(printed)
}
