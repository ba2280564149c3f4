//! Node-local drivers: one per step kind. Each converges the node to the step's desired state
//! and is idempotent — a step whose desired state already holds is a no-op success.

mod attempts;
mod etcd;
mod files;
mod kubelet;
mod kubernetes;
mod node;
mod ntp;
mod ssh;

use std::path::PathBuf;
use std::sync::Arc;

use inplace_agent_api::{Step, StepAction, validate_action};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::backup::Backups;
use crate::command::{CommandEnd, CommandEnv, CommandOutput, display_argv, run_command};
use crate::driver_config::DriverConfig;
use crate::fsutil::{RootFs, euid};
use crate::state::SequenceProgress;
use crate::unfinished;

pub use node::NODE_STEP_DEADLINE_GRACE;

/// `unfinished.json` key of the ntp driver's restart: set before the drop-in changes, cleared
/// after the restart succeeded.
const NTP_RESTART: &str = "ntp.restart";
/// `unfinished.json` key of the kubeletArgs driver's restart.
const KUBELET_RESTART: &str = "kubeletArgs.restart";

/// What every driver works with: the root, the config, the command environment, the state dir.
#[derive(Clone, Debug)]
pub(crate) struct DriverEnv {
    /// `--root`.
    pub fs: RootFs,
    /// The `--config` file.
    pub config: DriverConfig,
    /// Environment of commands.
    pub command_env: CommandEnv,
    /// `--state-dir` (driver journals live here).
    pub state_dir: PathBuf,
    /// Backups of replaced files.
    pub backups: Backups,
    /// True when the agent runs as root: owners are applied only then.
    pub is_root: bool,
}

impl DriverEnv {
    /// Builds the environment.
    pub fn new(root: PathBuf, config: DriverConfig, state_dir: PathBuf) -> Self {
        let root_text = root.display().to_string();
        let command_env = CommandEnv {
            path: config.path_env(&root_text),
            root: root.clone(),
            extra: config.env.clone(),
        };
        Self {
            fs: RootFs::new(root),
            backups: Backups::new(&state_dir),
            command_env,
            config,
            state_dir,
            is_root: euid() == 0,
        }
    }
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DriverOutcome {
    /// The desired state holds.
    Succeeded,
    /// It does not; the plan stops.
    Failed,
    /// The agent is shutting down: the step stopped and will be re-run.
    Interrupted,
}

/// The result of one step.
#[derive(Clone, Debug)]
pub(crate) struct StepResult {
    /// How it ended.
    pub outcome: DriverOutcome,
    /// For operators.
    pub message: String,
    /// Exit code of the command that ended it.
    pub exit_code: Option<i32>,
    /// That command's stderr tail.
    pub stderr_tail: Option<String>,
}

impl StepResult {
    /// Success with a message.
    pub fn ok(message: impl Into<String>) -> Self {
        Self {
            outcome: DriverOutcome::Succeeded,
            message: message.into(),
            exit_code: None,
            stderr_tail: None,
        }
    }

    /// Failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            outcome: DriverOutcome::Failed,
            message: message.into(),
            exit_code: None,
            stderr_tail: None,
        }
    }

    /// The failure (or interruption) a command's end means, or `None` when it succeeded.
    pub fn from_command(
        argv: &[String],
        output: &CommandOutput,
        timeout_seconds: u32,
    ) -> Option<Self> {
        let shown = display_argv(argv);
        let tail = (!output.stderr_tail.is_empty()).then(|| output.stderr_tail.clone());
        let (outcome, message, exit_code) = match &output.end {
            CommandEnd::Exited(0) => return None,
            CommandEnd::Exited(code) => (
                DriverOutcome::Failed,
                format!("`{shown}` exited with {code}"),
                Some(*code),
            ),
            CommandEnd::Signaled(signal) => (
                DriverOutcome::Failed,
                format!("`{shown}` was killed by signal {signal}"),
                None,
            ),
            CommandEnd::TimedOut => (
                DriverOutcome::Failed,
                format!(
                    "`{shown}` timed out: step timeout of {timeout_seconds} s reached, process group killed"
                ),
                None,
            ),
            CommandEnd::Cancelled => (
                DriverOutcome::Interrupted,
                format!("`{shown}` stopped: agent shutting down"),
                None,
            ),
            CommandEnd::SpawnFailed(e) => (DriverOutcome::Failed, e.clone(), None),
        };
        Some(Self {
            outcome,
            message,
            exit_code,
            stderr_tail: tail,
        })
    }
}

/// One step to run.
pub(crate) struct StepContext {
    /// The plan it belongs to (names backups).
    pub plan_id: String,
    /// The step.
    pub step: Step,
    /// When its timeout expires.
    pub deadline: Instant,
    /// True when an earlier attempt of this step began (see `LocalStepRecord::began`) and was
    /// interrupted, by a crash or by a clean shutdown: `skipIf` is then not consulted, and drivers
    /// redo side effects (restarts) even if the files already look right, since the interruption
    /// may have come between the two.
    pub resumed: bool,
    /// The sequence progress earlier attempts recorded (only when `resumed`).
    pub progress: Option<SequenceProgress>,
    /// Records sequence progress durably in the step's record.
    pub recorder: ProgressRecorder,
    /// Turns true when the agent shuts down.
    pub cancel: watch::Receiver<bool>,
}

/// A progress record on its way to `state.json`, with the answer "it is on disk".
/// The optional message replaces the step's message in `state.json` and goes to the server in a
/// `running` report (e.g. which retry attempt is due).
pub(crate) type ProgressUpdate = (SequenceProgress, Option<String>, oneshot::Sender<bool>);

/// The driver's side of progress recording: the executor owns `state.json` and writes each
/// update (temp, fsync, rename) before answering.
#[derive(Clone, Debug)]
pub(crate) struct ProgressRecorder(Option<mpsc::Sender<ProgressUpdate>>);

impl ProgressRecorder {
    /// A recorder feeding `sender`.
    pub fn new(sender: mpsc::Sender<ProgressUpdate>) -> Self {
        Self(Some(sender))
    }

    /// A recorder that keeps nothing (driver tests).
    #[cfg(test)]
    pub fn discard() -> Self {
        Self(None)
    }

    /// Records `progress`; true once it is durable. False when it could not be written: the
    /// step goes on (the command would then run again after an interruption, which the resume
    /// rule makes safe).
    pub async fn record(&self, progress: SequenceProgress) -> bool {
        self.record_with_message(progress, None).await
    }

    /// [`ProgressRecorder::record`], also telling the server `message` as the running step's message.
    pub async fn record_with_message(
        &self,
        progress: SequenceProgress,
        message: Option<String>,
    ) -> bool {
        let Some(sender) = &self.0 else {
            return false;
        };
        let (ack, done) = oneshot::channel();
        if sender.send((progress, message, ack)).await.is_err() {
            return false;
        }
        done.await.unwrap_or(false)
    }
}

/// Runs one step through its driver.
pub(crate) async fn execute(env: Arc<DriverEnv>, mut ctx: StepContext) -> StepResult {
    if let Err(reason) = validate_action(&ctx.step.action) {
        return StepResult::failed(format!("invalid {} step: {reason}", ctx.step.action.kind()));
    }
    match ctx.step.action.clone() {
        StepAction::Files { files } => {
            let plan_id = ctx.plan_id.clone();
            blocking(&ctx, move || files::apply(&env, &plan_id, &files)).await
        }
        StepAction::SshKeys { users } => {
            let plan_id = ctx.plan_id.clone();
            blocking(&ctx, move || ssh::apply(&env, &plan_id, &users)).await
        }
        StepAction::EtcdImage {
            image_tag,
            image_repository,
        } => {
            let plan_id = ctx.plan_id.clone();
            blocking(&ctx, move || {
                etcd::apply(&env, &plan_id, &image_tag, image_repository.as_deref())
            })
            .await
        }
        StepAction::Ntp { servers, enabled } => {
            let plan_id = ctx.plan_id.clone();
            let env2 = env.clone();
            let changed = blocking_value(&ctx, move || {
                let owed = unfinished::contains(&env2.state_dir, NTP_RESTART)?;
                let mark = || unfinished::mark(&env2.state_dir, NTP_RESTART);
                let (changed, message) = ntp::write(&env2, &plan_id, &servers, enabled, mark)?;
                Ok((changed || owed, message))
            })
            .await;
            match changed {
                Err(result) => result,
                Ok((changed, message)) => {
                    let restart = env.config.ntp.restart();
                    restart_if(&env, &mut ctx, changed, NTP_RESTART, &restart, message).await
                }
            }
        }
        StepAction::KubeletArgs { args } => {
            let plan_id = ctx.plan_id.clone();
            let env2 = env.clone();
            let changed = blocking_value(&ctx, move || {
                let owed = unfinished::contains(&env2.state_dir, KUBELET_RESTART)?;
                let mark = || unfinished::mark(&env2.state_dir, KUBELET_RESTART);
                let (changed, message) = kubelet::write(&env2, &plan_id, &args, mark)?;
                Ok((changed || owed, message))
            })
            .await;
            match changed {
                Err(result) => result,
                Ok((changed, message)) => {
                    let restart = env.config.kubelet.restart.clone();
                    restart_if(&env, &mut ctx, changed, KUBELET_RESTART, &restart, message).await
                }
            }
        }
        action @ (StepAction::InstallKubeadm { .. }
        | StepAction::KubeadmUpgrade { .. }
        | StepAction::InstallKubelet { .. }) => kubernetes::run(&env, &mut ctx, &action).await,
        StepAction::DrainNode {
            delete_empty_dir_data,
            force_unmanaged,
        } => {
            let options = inplace_drain::DrainOptions {
                delete_empty_dir_data,
                force_unmanaged,
            };
            node::drain(&env, &mut ctx, options).await
        }
        StepAction::WaitNodeReady { kubelet_version } => {
            node::wait_ready(&env, &mut ctx, kubelet_version).await
        }
        StepAction::UncordonNode => node::uncordon(&env, &mut ctx).await,
        StepAction::Unsupported => StepResult::failed("step kind not supported by this agent"),
    }
}

/// Runs synchronous disk work off the async threads, bounded by the step deadline.
async fn blocking(
    ctx: &StepContext,
    work: impl FnOnce() -> Result<String, String> + Send + 'static,
) -> StepResult {
    match blocking_value(ctx, work).await {
        Ok(message) => StepResult::ok(message),
        Err(result) => result,
    }
}

async fn blocking_value<T: Send + 'static>(
    ctx: &StepContext,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, StepResult> {
    match tokio::time::timeout_at(ctx.deadline, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(message))) => Err(StepResult::failed(message)),
        Ok(Err(join)) => Err(StepResult::failed(format!("driver crashed: {join}"))),
        Err(_) => Err(StepResult::failed(format!(
            "timed out: step timeout of {} s reached",
            ctx.step.timeout_seconds
        ))),
    }
}

/// Runs `restart` when the driver changed something now or earlier without a successful restart
/// since (`changed`), or the step is a resumed attempt; then clears the `unfinished` key.
async fn restart_if(
    env: &DriverEnv,
    ctx: &mut StepContext,
    changed: bool,
    key: &str,
    restart: &[String],
    message: String,
) -> StepResult {
    if !changed && !ctx.resumed {
        return StepResult::ok(message);
    }
    let output = run_command(restart, &env.command_env, ctx.deadline, &mut ctx.cancel).await;
    if let Some(failure) = StepResult::from_command(restart, &output, ctx.step.timeout_seconds) {
        return failure;
    }
    if let Err(e) = unfinished::clear(&env.state_dir, key) {
        // Only costs one more restart at the next step of this kind.
        tracing::warn!(error = %e, key, "cannot record the restart as done");
    }
    StepResult::ok(format!("{message}; ran `{}`", display_argv(restart)))
}
