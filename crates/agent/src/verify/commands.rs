//! The `verify.commands` of the node verification: each runs (argv, the agent's clean command environment, its
//! own process group) until it exits 0, at most `1 + retries` attempts `retryDelaySeconds` apart, each killed
//! after `timeoutSeconds`. [`after_attempt`] is the decision, without I/O; [`run_all`] does the runs. Its output
//! is kept as bounded tails (`sequence/process.rs`); only the stderr tail of the last failed attempt reaches the
//! report, beside the message, as for every failed command of a step.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::VerifyCommand;
use crate::os::driver_env::DriverEnv;
use crate::sequence::process::{CommandEnd, cancelled, display_argv, run_command};
use crate::sequence::template::{Vars, expand};
use crate::verify::VerifyError;

/// What follows an attempt of a verify command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// It exited 0: the command passed.
    Passed,
    /// It failed and attempts are left: the next one after this pause.
    RetryAfter(Duration),
    /// It failed and it was the last attempt: the verification fails.
    Failed,
}

/// What follows attempt `attempt` (1 = the first) of `command`, which ended `end`. A shutdown is none of these:
/// the caller stops first.
pub(crate) fn after_attempt(command: &VerifyCommand, attempt: u32, end: &CommandEnd) -> Next {
    if *end == CommandEnd::Exited(0) {
        Next::Passed
    } else if attempt <= command.retries {
        Next::RetryAfter(Duration::from_secs(u64::from(command.retry_delay_seconds)))
    } else {
        Next::Failed
    }
}

/// Runs every command of `commands` in order; `Ok(count)` when each passed. `say` gets each attempt's start and
/// each failure that is retried (for the running step's message).
pub(crate) async fn run_all(
    env: &DriverEnv,
    commands: &[VerifyCommand],
    cancel: &mut watch::Receiver<bool>,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<usize, VerifyError> {
    let vars = Vars::root_only(&env.fs.root().display().to_string());
    for (i, command) in commands.iter().enumerate() {
        let key = format!("verify.commands[{i}]");
        let argv = command
            .run
            .iter()
            .map(|arg| expand(arg, &vars))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| VerifyError::Template {
                key: key.clone(),
                source,
            })?;
        let shown = display_argv(&argv);
        let attempts = command.retries + 1;
        for attempt in 1.. {
            say(format!(
                "verifying the node: {key} `{shown}`, attempt {attempt}/{attempts}"
            ));
            let deadline = Instant::now() + Duration::from_secs(u64::from(command.timeout_seconds));
            let output = run_command(&argv, &env.command_env, deadline, cancel).await;
            if output.end == CommandEnd::Cancelled {
                return Err(VerifyError::Interrupted);
            }
            match after_attempt(command, attempt, &output.end) {
                Next::Passed => break,
                Next::RetryAfter(pause) => {
                    say(format!(
                        "verifying the node: {key} `{shown}` {}, attempt {attempt}/{attempts}; again in {} s",
                        VerifyError::ended(&output.end, command.timeout_seconds),
                        pause.as_secs()
                    ));
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = cancelled(cancel) => return Err(VerifyError::Interrupted),
                    }
                }
                Next::Failed => {
                    return Err(VerifyError::Command {
                        key,
                        shown,
                        end: output.end,
                        timeout_seconds: command.timeout_seconds,
                        attempts,
                        stderr_tail: (!output.stderr_tail.trim().is_empty())
                            .then_some(output.stderr_tail),
                    });
                }
            }
        }
    }
    Ok(commands.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::tests::Sandbox;

    fn command(retries: u32, delay: u32) -> VerifyCommand {
        VerifyCommand {
            run: vec!["check".into()],
            timeout_seconds: 5,
            retries,
            retry_delay_seconds: delay,
        }
    }

    #[test]
    fn a_failed_attempt_is_retried_while_retries_are_left() {
        let c = command(2, 7);
        let exit1 = CommandEnd::Exited(1);
        assert_eq!(
            after_attempt(&c, 1, &exit1),
            Next::RetryAfter(Duration::from_secs(7))
        );
        assert_eq!(
            after_attempt(&c, 2, &CommandEnd::TimedOut),
            Next::RetryAfter(Duration::from_secs(7))
        );
        assert_eq!(after_attempt(&c, 3, &exit1), Next::Failed);
        assert_eq!(after_attempt(&c, 3, &CommandEnd::Exited(0)), Next::Passed);
        assert_eq!(
            after_attempt(&command(0, 7), 1, &CommandEnd::Signaled(9)),
            Next::Failed
        );
        assert_eq!(
            after_attempt(&c, 1, &CommandEnd::SpawnFailed("no such program".into())),
            Next::RetryAfter(Duration::from_secs(7))
        );
    }

    // Tokio's paused clock jumps to the next timer whenever the runtime idles (a child process running
    // included): the test controls time, so timeouts and delays of minutes pass at once. Only a command that
    // never ends is run under it (a short one could be overtaken by its own virtual timeout).
    #[tokio::test(start_paused = true)]
    async fn each_attempt_is_killed_at_its_timeout_and_the_next_waits_the_delay() {
        let sb = Sandbox::new();
        sb.fake("hang", "sleep 1000");
        let env = sb.env("");
        let commands = [VerifyCommand {
            run: vec!["hang".into(), "{{root}}".into()],
            timeout_seconds: 30,
            retries: 1,
            retry_delay_seconds: 600,
        }];
        let (_tx, mut cancel) = watch::channel(false);
        let mut said = Vec::new();
        let started = Instant::now();
        let real = std::time::Instant::now();
        let failed = run_all(&env, &commands, &mut cancel, &mut |t| said.push(t))
            .await
            .unwrap_err();
        let elapsed = started.elapsed();
        // Two timeouts and the delay, plus at most each kill's grace and output drain.
        let least = Duration::from_secs(30 + 600 + 30);
        let most = least
            + 2 * (crate::sequence::process::KILL_GRACE
                + crate::sequence::process::OUTPUT_DRAIN_TIMEOUT);
        assert!(elapsed >= least && elapsed <= most, "{elapsed:?}");
        assert!(
            real.elapsed() < Duration::from_secs(60),
            "{:?}",
            real.elapsed()
        );
        let root = sb.root.display().to_string();
        assert_eq!(
            failed.to_string(),
            format!(
                "verify.commands[0] `hang {root}` timed out after 30 s (process group killed) (attempt 2/2)"
            )
        );
        assert_eq!(failed.exit_code(), None);
        assert_eq!(
            said,
            [
                format!("verifying the node: verify.commands[0] `hang {root}`, attempt 1/2"),
                format!(
                    "verifying the node: verify.commands[0] `hang {root}` timed out after 30 s (process group killed), attempt 1/2; again in 600 s"
                ),
                format!("verifying the node: verify.commands[0] `hang {root}`, attempt 2/2"),
            ]
        );
    }

    #[tokio::test]
    async fn a_shutdown_stops_a_command_and_is_no_failure() {
        let sb = Sandbox::new();
        sb.fake("hang", "sleep 1000");
        let env = sb.env("");
        let commands = [VerifyCommand {
            run: vec!["hang".into()],
            ..command(3, 1)
        }];
        let (tx, mut cancel) = watch::channel(false);
        let stop = async {
            while sb.calls().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tx.send(true).unwrap();
        };
        let mut quiet = |_| {};
        let (ended, ()) = tokio::join!(run_all(&env, &commands, &mut cancel, &mut quiet), stop);
        assert!(matches!(ended, Err(VerifyError::Interrupted)), "{ended:?}");
        assert_eq!(sb.calls().len(), 1, "not retried");
    }
}
