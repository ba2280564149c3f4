//! Why a step, its undo, or the record its undo needs failed: [`DriverError`], what every driver returns.
//!
//! Its `Display` is the message the agent reports for the step — the server shows it in CAPI's UpdateMachine
//! message — so each variant's text is part of what operators read and must not drift. The exit code and
//! stderr tail of the command that ended the step travel beside it ([`DriverError::exit_code`],
//! [`DriverError::stderr_tail`]), and a shutdown is told from a failure ([`DriverError::is_interrupted`]):
//! [`super::StepResult`]'s `From<DriverError>` puts all three where the report carries them.

use inplace_drain::DrainError;
use tokio::task::JoinError;

use crate::artifact::{FetchErrorKind, OptionsError};
use crate::fsutil::{FsError, JournalError, PathError};
use crate::os::sysext::SysextError;
use crate::os::users::OwnerError;
use crate::sequence::process::{CommandEnd, CommandOutput, display_argv};
use crate::sequence::template::TemplateError;
use crate::sequence::undo::RecordValueError;

/// Why a driver could not bring the node to its step's desired state (or back, for an undo).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DriverError {
    /// A command of the step ended badly: a non-zero exit, a signal, the step timeout (its process group
    /// killed), a shutdown (the step runs again), or it could not be started.
    #[error("{}", command_text(shown, end, *timeout_seconds))]
    Command {
        /// The command as the messages show it.
        shown: String,
        /// How it ended.
        end: CommandEnd,
        /// The step's timeout, for a command it stopped.
        timeout_seconds: u32,
        /// The end of what it wrote to stderr (`None`: nothing).
        stderr_tail: Option<String>,
    },
    /// A check command exited with a code that is neither of the answers it is asked for.
    #[error("{what} `{shown}` exited with {code}: {expected}")]
    UnexpectedExit {
        /// Its config key (`reboot.required.command`).
        what: &'static str,
        /// The command as the messages show it.
        shown: String,
        /// Its exit code.
        code: i32,
        /// The codes it must exit with, and what each means.
        expected: &'static str,
        /// The end of what it wrote to stderr, trimmed (`None`: nothing).
        stderr_tail: Option<String>,
    },
    /// The agent is shutting down: the step stopped where the text says and runs again at the next start.
    #[error("{0}")]
    Interrupted(String),
    /// The step's timeout passed before its work ended.
    #[error("timed out: step timeout of {seconds} s reached")]
    TimedOut {
        /// The step's timeout.
        seconds: u32,
    },
    /// Work the step ran off the async threads panicked.
    #[error("{what}{source}")]
    Crashed {
        /// The words before the panic: which work (`"driver crashed: "`, `"install: "`).
        what: &'static str,
        /// The panic, as the runtime reports it.
        #[source]
        source: JoinError,
    },
    /// A file of the node or of the state dir could not be read, written or removed.
    #[error(transparent)]
    Io(#[from] FsError),
    /// A `record:` command of a package step gave no value to keep for its undo (before any effect).
    #[error("`{shown}`: {source}{}", stderr.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    Record {
        /// The command as the messages show it.
        shown: String,
        /// Why its end gives no value.
        #[source]
        source: RecordValueError,
        /// What it wrote to stderr, trimmed (`None`: nothing).
        stderr: Option<String>,
    },
    /// An artifact was not fetched before the step's timeout.
    #[error("not fetched within the step timeout of {seconds} s")]
    FetchTimedOut {
        /// The step's timeout.
        seconds: u32,
    },
    /// A node file the step works on cannot be inspected.
    #[error("{what}: {source}")]
    NodeFile {
        /// Its node path, or what the step tried to tell about it.
        what: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A driver journal in the state dir (`unfinished.json`, `cordon.json`, …) cannot be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A node path (from the step or the agent config) that names nothing under `--root`.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A file's owner cannot be resolved through the node's user database (no such user or group).
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// A template of the agent config that cannot be filled for this step (a pin missing for the version).
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// An artifact could not be fetched: named as configured (and by the mirror it came through).
    #[error("{named}: {source}{}", attempts.as_deref().map(|a| format!(" ({a})")).unwrap_or_default())]
    Fetch {
        /// `artifact <source>` (and its mirror).
        named: String,
        /// What went wrong at the last attempt (boxed: it is large, and rare).
        #[source]
        source: Box<FetchErrorKind>,
        /// How the retries of a transient failure ended (`None`: not retried).
        attempts: Option<String>,
    },
    /// The artifact settings (credentials, CA file) cannot be used for a fetch.
    #[error("{named}: {source}")]
    FetchSetup {
        /// `artifact <source>` (and its mirror).
        named: String,
        /// What is wrong with the settings.
        #[source]
        source: OptionsError,
    },
    /// The node API (the kubeconfig, a cordon, a drain, the Node's readiness) failed.
    #[error("{what}: {source}{then}")]
    NodeApi {
        /// The step kind (and the call: `drainNode: cordon`).
        what: String,
        /// What the API or the drainer said (boxed: it is large).
        #[source]
        source: Box<DrainError>,
        /// What that leaves behind, for the operator (`"; the node stays cordoned"`), or empty.
        then: &'static str,
    },
    /// A systemd-sysext switch failed (the link was left as the text says).
    #[error("sysextSwitch {name}: {source}")]
    Sysext {
        /// The extension.
        name: String,
        /// Why.
        #[source]
        source: SysextError,
    },
    /// A file's SHA-256 is not the pinned one.
    #[error("sha256 of {path} is {got}, pinned {want}")]
    Sha256Mismatch {
        /// Its node path.
        path: String,
        /// The digest it has.
        got: String,
        /// The pinned digest.
        want: String,
    },
    /// After its effects the node is not as the step wants it: the text names what differs, wanted and found.
    #[error("{0}")]
    Unverified(String),
    /// The step cannot run as asked on this node, refused before any effect: its input, the agent config (a
    /// missing section, no bundle for the version) or the node's state (not drained, no boot id) says so.
    #[error("{0}")]
    Refused(String),
    /// The same failure, said where it happened (a config key, a command's place in its sequence, a file).
    #[error("{context}: {source}")]
    At {
        /// Where.
        context: String,
        /// What failed there.
        #[source]
        source: Box<DriverError>,
    },
    /// A retryable command that failed for good, with how its attempts ended.
    #[error("{source} ({attempts})")]
    Retried {
        /// Its last failure.
        #[source]
        source: Box<DriverError>,
        /// `attempt 3/3; no attempts left`, or why no attempt is left within the step timeout.
        attempts: String,
    },
}

impl DriverError {
    /// The failure (or interruption) a command's end means, or `None` when it exited 0.
    pub(crate) fn command(
        argv: &[String],
        output: &CommandOutput,
        timeout_seconds: u32,
    ) -> Option<Self> {
        if output.end == CommandEnd::Exited(0) {
            return None;
        }
        Some(Self::Command {
            shown: display_argv(argv),
            end: output.end.clone(),
            timeout_seconds,
            stderr_tail: (!output.stderr_tail.is_empty()).then(|| output.stderr_tail.clone()),
        })
    }

    /// A refusal before any effect.
    pub(crate) fn refused(text: impl Into<String>) -> Self {
        Self::Refused(text.into())
    }

    /// The step stopped because the agent is shutting down.
    pub(crate) fn shutting_down() -> Self {
        Self::Interrupted("agent shutting down".to_owned())
    }

    /// This failure, said to have happened at `context`.
    pub(crate) fn at(self, context: impl Into<String>) -> Self {
        Self::At {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The exit code of the command that ended the step (`None`: no command exited).
    pub(crate) fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Command {
                end: CommandEnd::Exited(code),
                ..
            }
            | Self::UnexpectedExit { code, .. } => Some(*code),
            Self::At { source, .. } | Self::Retried { source, .. } => source.exit_code(),
            _ => None,
        }
    }

    /// The end of the stderr of the command that ended the step.
    pub(crate) fn stderr_tail(&self) -> Option<&str> {
        match self {
            Self::Command { stderr_tail, .. } | Self::UnexpectedExit { stderr_tail, .. } => {
                stderr_tail.as_deref()
            }
            Self::At { source, .. } | Self::Retried { source, .. } => source.stderr_tail(),
            _ => None,
        }
    }

    /// Whether an out-of-space write caused it (`ENOSPC`, `EDQUOT`, whatever wraps the `io::Error`): a full disk,
    /// not the step's own failure.
    pub(crate) fn is_no_space(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = cause {
            if let Some(io) = error.downcast_ref::<std::io::Error>()
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
                )
            {
                return true;
            }
            cause = error.source();
        }
        false
    }

    /// Whether the step stopped for a shutdown (it runs again) rather than failed.
    pub(crate) fn is_interrupted(&self) -> bool {
        match self {
            Self::Interrupted(_)
            | Self::Command {
                end: CommandEnd::Cancelled,
                ..
            } => true,
            Self::At { source, .. } | Self::Retried { source, .. } => source.is_interrupted(),
            _ => false,
        }
    }
}

/// How a command's end reads in the step's message.
fn command_text(shown: &str, end: &CommandEnd, timeout_seconds: u32) -> String {
    match end {
        CommandEnd::Exited(code) => format!("`{shown}` exited with {code}"),
        CommandEnd::Signaled(signal) => format!("`{shown}` was killed by signal {signal}"),
        CommandEnd::TimedOut => format!(
            "`{shown}` timed out: step timeout of {timeout_seconds} s reached, process group killed"
        ),
        CommandEnd::Cancelled => format!("`{shown}` stopped: agent shutting down"),
        CommandEnd::SpawnFailed(e) => e.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::{DriverOutcome, StepResult};

    fn ended(end: CommandEnd, stderr: &str) -> DriverError {
        let output = CommandOutput {
            end,
            stdout_tail: String::new(),
            stderr_tail: stderr.to_owned(),
        };
        let argv = ["apt-get".to_owned(), "install".to_owned()];
        DriverError::command(&argv, &output, 30).expect("a failure")
    }

    #[test]
    fn a_command_says_how_it_ended_and_its_report_carries_exit_and_stderr() {
        let output = CommandOutput {
            end: CommandEnd::Exited(0),
            stdout_tail: String::new(),
            stderr_tail: "warning".to_owned(),
        };
        assert!(DriverError::command(&["true".to_owned()], &output, 30).is_none());
        let cases = [
            (CommandEnd::Exited(100), "`apt-get install` exited with 100"),
            (
                CommandEnd::Signaled(9),
                "`apt-get install` was killed by signal 9",
            ),
            (
                CommandEnd::TimedOut,
                "`apt-get install` timed out: step timeout of 30 s reached, process group killed",
            ),
            (
                CommandEnd::Cancelled,
                "`apt-get install` stopped: agent shutting down",
            ),
            (
                CommandEnd::SpawnFailed("cannot run apt-get: not found".into()),
                "cannot run apt-get: not found",
            ),
        ];
        for (end, text) in cases {
            assert_eq!(ended(end, "").to_string(), text);
        }
        let result = StepResult::from(ended(CommandEnd::Exited(100), "E: broken\n"));
        assert_eq!(result.outcome, DriverOutcome::Failed);
        assert_eq!(result.exit_code, Some(100));
        assert_eq!(result.stderr_tail.as_deref(), Some("E: broken\n"));
        let stopped = StepResult::from(ended(CommandEnd::Cancelled, ""));
        assert_eq!(stopped.outcome, DriverOutcome::Interrupted);
        assert_eq!((stopped.exit_code, stopped.stderr_tail), (None, None));
    }

    #[test]
    fn context_and_retries_keep_the_commands_exit_stderr_and_interruption() {
        let retried = DriverError::Retried {
            source: Box::new(ended(CommandEnd::Exited(1), "busy")),
            attempts: "attempt 3/3; no attempts left".to_owned(),
        }
        .at("kubernetes.installKubelet.commands[2]");
        assert_eq!(
            retried.to_string(),
            "kubernetes.installKubelet.commands[2]: `apt-get install` exited with 1 (attempt 3/3; no attempts left)"
        );
        let result = StepResult::from(retried);
        assert_eq!(result.exit_code, Some(1));
        assert_eq!(result.stderr_tail.as_deref(), Some("busy"));
        let stopped = ended(CommandEnd::Cancelled, "").at("osImage.current");
        assert!(stopped.is_interrupted());
        assert_eq!(
            stopped.to_string(),
            "osImage.current: `apt-get install` stopped: agent shutting down"
        );
        assert!(!DriverError::refused("no").is_interrupted());
    }

    #[test]
    fn a_full_disk_is_told_from_the_io_cause_whatever_wraps_it() {
        let full = FsError {
            action: "write",
            path: "/var/lib/inplace-agent/undo/p1/0/node/etc/x".into(),
            source: std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
        };
        let error = DriverError::from(full).at("kubernetes.installKubelet");
        assert!(error.is_no_space(), "{error}");
        let denied = FsError {
            action: "write",
            path: "/etc/x".into(),
            source: std::io::Error::from_raw_os_error(rustix::io::Errno::ACCESS.raw_os_error()),
        };
        assert!(!DriverError::from(denied).is_no_space());
        assert!(!DriverError::refused("No space left on device (os error 28)").is_no_space());
    }
}
