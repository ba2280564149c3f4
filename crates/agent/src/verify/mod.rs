//! The node verification (issue 39's health gate "on the node"): after a plan's last step succeeded — after its
//! uncordon — the node proves itself before the step is reported done. First every pod that was Running and
//! Ready before the drain and is bound to the node again must be Running and Ready within
//! `verify.podsReadyTimeoutSeconds` (read through the node's own API access, the drainer's client; which pods:
//! [`pods`]), then every `verify.commands` entry must exit 0 within its attempts ([`commands`]). A node that fails
//! its verification fails its last step, with a message that says which check failed and why, so its update fails
//! and the server's `onFailure` applies as to any failed step (rollback undoes the plan, hold leaves it).
//!
//! It is part of the last step's attempt, not a phase of its own: the step is recorded `running` until the
//! verification ended, so a crash, kill or reboot anywhere in it (during a command, between the pods check and
//! the commands, after the last command passed and before the step's end is on disk) resumes the step — its
//! driver runs again (the node steps are idempotent: an uncordon already done is not patched again), then the
//! whole verification, whose checks only read. The pods it waits for were recorded before the drain in the state
//! dir (`crate::drivers::pods_before_drain`), so a reboot between the drain and the verification does not lose them. A shutdown stops it
//! like any step (it runs again at the next start, the attempt not counted); [`crate::attempt::MAX_STEP_ATTEMPTS`]
//! interrupted attempts fail the step as for any other.
//!
//! Without a `verify:` section nothing is recorded and nothing is verified: the plan ends as before.

pub(crate) mod commands;
pub mod pods;

use std::sync::Arc;
use std::time::Duration;

use inplace_drain::{DrainError, Drainer};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::VerifyConfig;
use crate::drivers::{
    DriverOutcome, ProgressRecorder, StepContext, StepResult, drainer as node_drainer,
};
use crate::fsutil::JournalError;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{CommandEnd, cancelled};
use crate::sequence::template::TemplateError;
use crate::state::SequenceProgress;

/// Why the node verification did not pass.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    /// A verify command failed its last attempt.
    #[error("{key} `{shown}` {} (attempt {attempts}/{attempts})", Self::ended(end, *timeout_seconds))]
    Command {
        /// `verify.commands[0]`.
        key: String,
        /// The command as the messages show it.
        shown: String,
        /// How its last attempt ended.
        end: CommandEnd,
        /// Its `timeoutSeconds`.
        timeout_seconds: u32,
        /// Its attempts in all.
        attempts: u32,
        /// The end of what its last attempt wrote to stderr (`None`: nothing).
        stderr_tail: Option<String>,
    },
    /// A verify command's template cannot be filled.
    #[error("{key}: {source}")]
    Template {
        /// `verify.commands[0]`.
        key: String,
        /// Why.
        #[source]
        source: TemplateError,
    },
    /// Pods waited for were not Running and Ready within `verify.podsReadyTimeoutSeconds`.
    #[error("not within verify.podsReadyTimeoutSeconds ({seconds} s): {text}")]
    PodsNotReady {
        /// The timeout.
        seconds: u32,
        /// The pods and why each is not Ready ([`pods::PodsCheck::text`]).
        text: String,
    },
    /// The node's API access failed (the kubeconfig, the pod list).
    #[error("{what}: {source}")]
    NodeApi {
        /// What was asked.
        what: &'static str,
        /// What the drainer said (boxed: it is large).
        #[source]
        source: Box<DrainError>,
    },
    /// The node API could not be reached through the `node:` section.
    #[error("{0}")]
    Unconfigured(String),
    /// The record of the pods before the drain cannot be read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The agent is shutting down: the verification runs again with the step at the next start.
    #[error("node verification stopped: agent shutting down")]
    Interrupted,
}

impl VerifyError {
    /// `exited with 1`, `timed out after 30 s (process group killed)`, …
    pub(crate) fn ended(end: &CommandEnd, timeout_seconds: u32) -> String {
        match end {
            CommandEnd::Exited(code) => format!("exited with {code}"),
            CommandEnd::Signaled(signal) => format!("was killed by signal {signal}"),
            CommandEnd::TimedOut => {
                format!("timed out after {timeout_seconds} s (process group killed)")
            }
            CommandEnd::Cancelled => "stopped: agent shutting down".to_owned(),
            CommandEnd::SpawnFailed(e) => format!("could not start: {e}"),
        }
    }

    fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Command {
                end: CommandEnd::Exited(code),
                ..
            } => Some(*code),
            _ => None,
        }
    }

    fn stderr_tail(&self) -> Option<String> {
        match self {
            Self::Command { stderr_tail, .. } => stderr_tail.clone(),
            _ => None,
        }
    }
}

/// The verification that follows the last step of a plan: what it needs of the step's context.
pub(crate) struct Verification {
    env: Arc<DriverEnv>,
    config: VerifyConfig,
    plan_id: String,
    recorder: ProgressRecorder,
    progress: SequenceProgress,
    cancel: watch::Receiver<bool>,
}

impl Verification {
    /// The verification after step `ctx` when it is the plan's last (`last`) and the agent config has `verify:`.
    pub(crate) fn after(env: &Arc<DriverEnv>, ctx: &StepContext, last: bool) -> Option<Self> {
        let config = env.config.verify.clone().filter(|_| last)?;
        Some(Self {
            env: env.clone(),
            config,
            plan_id: ctx.plan_id.clone(),
            recorder: ctx.recorder.clone(),
            progress: ctx.progress.clone().unwrap_or_default(),
            cancel: ctx.cancel.clone(),
        })
    }

    /// Verifies the node after the last step ended `step`: a step that did not succeed is returned as it is;
    /// one that did succeeds only when the node passes (its message then says what was verified), and fails
    /// otherwise, saying which check failed and why.
    pub(crate) async fn run(mut self, step: StepResult) -> StepResult {
        if step.outcome != DriverOutcome::Succeeded {
            return step;
        }
        let recorder = self.recorder.clone();
        let progress = self.progress.clone();
        let (tx, mut rx) = watch::channel(String::new());
        let mut say = move |text: String| {
            let _ = tx.send(text);
        };
        let work = self.verify(&mut say);
        tokio::pin!(work);
        let verified = loop {
            tokio::select! {
                verified = &mut work => break verified,
                Ok(()) = rx.changed() => {
                    let text = rx.borrow_and_update().clone();
                    recorder.record_with_message(progress.clone(), Some(text)).await;
                }
            }
        };
        match verified {
            Ok(text) => StepResult {
                message: format!("{}; node verified: {text}", step.message),
                ..step
            },
            Err(VerifyError::Interrupted) => {
                StepResult::interrupted(VerifyError::Interrupted.to_string())
            }
            Err(e) => StepResult {
                outcome: DriverOutcome::Failed,
                message: format!("{}; node verification failed: {e}", step.message),
                exit_code: e.exit_code(),
                stderr_tail: e.stderr_tail(),
                passed_over: false,
            },
        }
    }

    /// The pods check, then the commands: what passed, or the first failure.
    async fn verify(
        &mut self,
        say: &mut (dyn FnMut(String) + Send),
    ) -> Result<String, VerifyError> {
        let pods = self.pods(say).await?;
        let commands =
            commands::run_all(&self.env, &self.config.commands, &mut self.cancel, say).await?;
        Ok(format!("{pods}, {commands} command(s) passed"))
    }

    /// Waits until every pod recorded before the drain and bound to the node again is Running and Ready.
    async fn pods(&mut self, say: &mut (dyn FnMut(String) + Send)) -> Result<String, VerifyError> {
        let seconds = self.config.pods_ready_timeout_seconds;
        if seconds == 0 {
            return Ok("pods not checked (verify.podsReadyTimeoutSeconds: 0)".to_owned());
        }
        let state_dir = self.env.state_dir.clone();
        let plan = self.plan_id.clone();
        let recorded = tokio::task::spawn_blocking(move || {
            crate::drivers::pods_before_drain::load(&state_dir, &plan)
        })
        .await
        .unwrap_or(Ok(None))?;
        let Some(recorded) = recorded else {
            return Ok("no pods recorded before a drain of this plan".to_owned());
        };
        let drainer = node_drainer(&self.env, "verify")
            .await
            .map_err(|e| VerifyError::Unconfigured(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(u64::from(seconds));
        let poll = self
            .env
            .config
            .node
            .as_ref()
            .map(|n| n.timing().poll_interval)
            .unwrap_or(inplace_drain::drainer::DEFAULT_POLL_INTERVAL);
        let mut last = String::new();
        loop {
            let found = tokio::select! {
                found = list(&drainer, deadline) => found?,
                () = cancelled(&mut self.cancel) => return Err(VerifyError::Interrupted),
            };
            let check = pods::check(&recorded, &found);
            let text = check.text();
            if check.passed() {
                return Ok(text);
            }
            if Instant::now() >= deadline {
                return Err(VerifyError::PodsNotReady { seconds, text });
            }
            if text != last {
                say(format!("verifying the node: {text}"));
                last = text;
            }
            tokio::select! {
                () = tokio::time::sleep_until((Instant::now() + poll).min(deadline)) => {}
                () = cancelled(&mut self.cancel) => return Err(VerifyError::Interrupted),
            }
        }
    }
}

/// The node's pods now, the list ending by `deadline` (plus the API's own request timeout).
async fn list(
    drainer: &Drainer,
    deadline: Instant,
) -> Result<Vec<inplace_drain::decide::PodFacts>, VerifyError> {
    let give_up = deadline + inplace_drain::drainer::MAX_REQUEST_TIMEOUT;
    match tokio::time::timeout_at(give_up, drainer.list_pods()).await {
        Ok(listed) => listed.map_err(|source| VerifyError::NodeApi {
            what: "list the node's pods",
            source: Box::new(source),
        }),
        Err(_) => Err(VerifyError::NodeApi {
            what: "list the node's pods",
            source: Box::new(DrainError::Timeout(
                "no answer within the pods check's time".to_owned(),
            )),
        }),
    }
}
