//! Fatal errors of a binary: one line, once, in the chosen log format (a JSON object under
//! `--log-format json`), naming the flag to change and how, then exit code 1. Never a backtrace, never the same
//! cause twice. Command-line mistakes (clap's errors) get the same treatment, so a bad flag looks like any other
//! start-up error to whatever collects the logs. Shared by `inplace-agent` and `inplace-updater`.

use std::ffi::OsString;

use super::args::LogFormat;
use crate::{AgentError, ClientError};

/// The exit code of every fatal error.
pub const EXIT_FATAL: i32 = 1;

/// A fatal error: what is wrong, with which flag, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem}")]
pub struct Fatal {
    /// The flag to change, e.g. `--tls-cert`.
    pub flag: Option<String>,
    /// What is wrong, starting with the flag and its value when there is one.
    pub problem: String,
    /// What to do.
    pub fix: Option<String>,
}

impl Fatal {
    /// A fatal error about `flag`.
    pub fn new(
        flag: Option<&str>,
        problem: impl Into<String>,
        fix: Option<impl Into<String>>,
    ) -> Self {
        Self {
            flag: flag.map(str::to_owned),
            problem: problem.into(),
            fix: fix.map(Into::into),
        }
    }

    /// Logs it as one ERROR line (the caller then flushes its logs and exits with [`EXIT_FATAL`]).
    pub fn log(&self) {
        match (self.flag.as_deref(), &self.fix) {
            (Some(flag), Some(fix)) => {
                tracing::error!(flag, fix = %fix, "cannot go on: {}", self.problem)
            }
            (Some(flag), None) => tracing::error!(flag, "cannot go on: {}", self.problem),
            (None, Some(fix)) => tracing::error!(fix = %fix, "cannot go on: {}", self.problem),
            (None, None) => tracing::error!("cannot go on: {}", self.problem),
        }
    }
}

/// Every cause of `error` in one line, `outer: inner: innermost`, leaving out a cause whose text its parent
/// already shows (thiserror messages often embed their source).
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.replace(['\n', '\r'], " ")
}

/// The flag and fix of an agent that cannot start.
pub fn agent_fatal(error: &AgentError) -> Fatal {
    let problem = one_line(error);
    match error {
        AgentError::Config(_) => Fatal::new(
            Some("--config"),
            format!("--config: {problem}"),
            Some("correct the file (unknown keys are errors; see crates/agent/config-examples/)"),
        ),
        AgentError::NoKubernetesSteps(_) => Fatal::new(Some("--config"), problem, None::<String>),
        AgentError::State(_) => Fatal::new(
            Some("--state-dir"),
            format!("--state-dir: {problem}"),
            Some("give each agent a state directory of its own that this user may write"),
        ),
        AgentError::Root(_) => Fatal::new(
            Some("--root"),
            problem,
            Some(
                "point --root at the node's root directory (/ unless the agent runs in a container)",
            ),
        ),
        AgentError::Client(ClientError::Setup(message)) => {
            let flag = ["--server", "--ca-file", "--tls-server-name"]
                .into_iter()
                .find(|flag| message.starts_with(flag));
            Fatal::new(
                flag,
                problem,
                Some(
                    "--server is the https:// URL of the server's hook port; --ca-file the PEM CA that signed its certificate",
                ),
            )
        }
        AgentError::Client(_) => Fatal::new(None, problem, None::<String>),
    }
}

/// The fatal error of a command line clap refused: its message in one line, with the flag it names. `usage` is
/// what the fix tells to ask for help, e.g. `inplace-updater <command>`.
pub fn of_clap(error: &clap::Error, usage: &str) -> Fatal {
    let text = error.render().to_string();
    let mut parts: Vec<&str> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let flag = match error.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(arg)) => Some(arg.as_str()),
        Some(clap::error::ContextValue::Strings(args)) => args.first().map(String::as_str),
        _ => None,
    }
    .and_then(|arg| arg.split_whitespace().next())
    .filter(|flag| flag.starts_with("--"));
    Fatal::new(
        flag,
        parts.join(" "),
        Some(format!("see `{usage} --help` for what each flag takes")),
    )
}

/// `--log-format` as the raw command line (or `INPLACE_UPDATER_LOG_FORMAT`) gives it, for errors found before
/// the command line could be parsed.
pub fn log_format_of(args: &[OsString]) -> LogFormat {
    let mut given = std::env::var("INPLACE_UPDATER_LOG_FORMAT").ok();
    let mut words = args.iter().filter_map(|arg| arg.to_str());
    while let Some(word) = words.next() {
        if word == "--log-format" {
            given = words.next().map(str::to_owned);
        } else if let Some(value) = word.strip_prefix("--log-format=") {
            given = Some(value.to_owned());
        }
    }
    match given.as_deref() {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:9443: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("starting")]
    struct Starting(#[source] Embeds);

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let error = Starting(Embeds(io));
        assert_eq!(
            one_line(&error),
            "starting: cannot listen on 127.0.0.1:9443: address in use"
        );
    }

    #[test]
    fn the_log_format_is_found_before_parsing() {
        let args = |words: &[&str]| words.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            log_format_of(&args(&["x", "--log-format", "json", "agent"])),
            LogFormat::Json
        );
        assert_eq!(
            log_format_of(&args(&["x", "--log-format=json"])),
            LogFormat::Json
        );
        assert_eq!(log_format_of(&args(&["x", "agent"])), LogFormat::Text);
    }
}
