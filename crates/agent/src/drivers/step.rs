//! One step as a driver sees it: the step and its deadline, whether it is resumed, how it records
//! progress ([`StepContext`]), and how it ended: [`Done`] or a [`DriverError`] from its driver, one
//! [`StepResult`] for the executor and the report.

use inplace_agent_api::Step;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::error::DriverError;
use crate::sequence::progress::SequenceProgress;

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
    /// It succeeded without an effect: a check before its first effect found the target already on the node.
    pub passed_over: bool,
}

impl StepResult {
    /// Success with a message.
    pub fn ok(message: impl Into<String>) -> Self {
        Self {
            outcome: DriverOutcome::Succeeded,
            message: message.into(),
            exit_code: None,
            stderr_tail: None,
            passed_over: false,
        }
    }

    /// Success without an effect: the node already had the step's target (`message` says how it was seen).
    pub fn passed_over(message: impl Into<String>) -> Self {
        Self {
            passed_over: true,
            ..Self::ok(message)
        }
    }

    /// Failure with a message.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            outcome: DriverOutcome::Failed,
            message: message.into(),
            exit_code: None,
            stderr_tail: None,
            passed_over: false,
        }
    }

    /// The agent is shutting down: the step stopped and will be re-run (`message` says where).
    pub fn interrupted(message: impl Into<String>) -> Self {
        Self {
            outcome: DriverOutcome::Interrupted,
            ..Self::failed(message)
        }
    }

    /// The step stopped because the agent is shutting down.
    pub fn shutting_down() -> Self {
        Self::interrupted("agent shutting down")
    }
}

impl From<DriverError> for StepResult {
    fn from(error: DriverError) -> Self {
        Self {
            outcome: if error.is_interrupted() {
                DriverOutcome::Interrupted
            } else {
                DriverOutcome::Failed
            },
            exit_code: error.exit_code(),
            stderr_tail: error.stderr_tail().map(str::to_owned),
            message: error.to_string(),
            passed_over: false,
        }
    }
}

impl From<Result<Done, DriverError>> for StepResult {
    fn from(ended: Result<Done, DriverError>) -> Self {
        match ended {
            Ok(Done {
                message,
                passed_over: false,
            }) => Self::ok(message),
            Ok(Done { message, .. }) => Self::passed_over(message),
            Err(error) => error.into(),
        }
    }
}

/// How a driver's step (or undo) ended well.
#[derive(Clone, Debug)]
pub(crate) struct Done {
    /// For operators: what it did.
    pub message: String,
    /// It succeeded without an effect: a check before its first effect found the target already on the node.
    pub passed_over: bool,
}

impl Done {
    /// The desired state holds; `message` says how.
    pub fn ok(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            passed_over: false,
        }
    }

    /// Without an effect: the node already had the step's target (`message` says how it was seen).
    pub fn passed_over(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            passed_over: true,
        }
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
    /// Whether a drainNode step of the plan comes before this one (steps run in order: it drained the
    /// node). A containerRuntime step restarts containerd only then.
    pub drained: bool,
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
