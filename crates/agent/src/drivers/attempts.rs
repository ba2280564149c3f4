//! One command of a sequence with its automatic retries: a `retryable` command that exits non-zero
//! runs again after the policy's jittered delay, up to its attempts. Before each wait the failed
//! attempt count and the time the next attempt is due are recorded durably in the step's progress
//! (with a `running` report saying which attempt comes when), so an agent stopped during the wait
//! resumes the step at the same attempt and waits out only what is left of the delay.

use std::time::Duration;

use tokio::time::Instant;

use super::error::DriverError;
use super::prepared::{Prepared, run_one};
use super::step::StepContext;
use crate::clock::now_unix_ms;
use crate::os::driver_env::DriverEnv;
use crate::retry::RetryPolicy;
use crate::sequence::process::{cancelled, display_argv};
use crate::sequence::progress::SequenceProgress;

/// Command `index` of a sequence, and where its retries stand.
pub(super) struct Attempts<'a> {
    /// Its index in the sequence's commands.
    pub index: usize,
    /// The fingerprint of the sequence's expanded commands.
    pub sequence: &'a str,
    /// Its retry policy, when it is `retryable`.
    pub policy: Option<RetryPolicy>,
    /// Attempts that failed already (recorded by an interrupted earlier run of the step).
    pub failures: u32,
    /// When the next attempt is due (Unix ms), if a wait was under way.
    pub due: Option<u64>,
}

impl Attempts<'_> {
    /// Runs the command until it succeeds (`Ok`, with a note when it took retries) or fails for
    /// good (`Err`: the step's end).
    pub async fn run(
        mut self,
        env: &DriverEnv,
        ctx: &mut StepContext,
        command: &Prepared,
        context: &str,
    ) -> Result<Option<String>, DriverError> {
        let attempts = self.policy.map_or(1, |p| p.attempts);
        // A policy shrunk since the failures were recorded still gets one more attempt.
        self.failures = self.failures.min(attempts.saturating_sub(1));
        let mut last_exit = None;
        loop {
            if let Some(due) = self.due.take() {
                self.wait(ctx, due).await?;
            }
            if *ctx.cancel.borrow() {
                return Err(DriverError::shutting_down());
            }
            let Some(end) = run_one(env, ctx, command, context).await else {
                return Ok((self.failures > 0).then(|| {
                    let exit = last_exit.map_or(String::new(), |c| format!(" after exit {c}"));
                    format!(
                        "`{}` succeeded at attempt {}/{attempts}{exit}",
                        shown(command),
                        self.failures + 1
                    )
                }));
            };
            let retry = match (self.policy, end.exit_code()) {
                (Some(policy), Some(code)) if code != 0 && self.failures + 1 < attempts => {
                    Some((policy, code))
                }
                _ => None,
            };
            let Some((policy, code)) = retry else {
                if self.policy.is_some() && end.exit_code().is_some() {
                    return Err(DriverError::Retried {
                        source: Box::new(end),
                        attempts: format!(
                            "attempt {}/{attempts}; no attempts left",
                            self.failures + 1
                        ),
                    });
                }
                return Err(end);
            };
            self.failures += 1;
            last_exit = Some(code);
            let delay = policy.delay_after(self.failures);
            let next = self.failures + 1;
            if Instant::now() + delay >= ctx.deadline {
                return Err(DriverError::Retried {
                    source: Box::new(end),
                    attempts: format!(
                        "attempt {}/{attempts}; attempt {next} would start after the step timeout of {} s",
                        self.failures, ctx.step.timeout_seconds
                    ),
                });
            }
            let due = now_unix_ms() + delay.as_millis() as u64;
            let message = format!(
                "attempt {next}/{attempts} of `{}` after exit {code}, in {} s",
                shown(command),
                delay.as_secs_f64().ceil() as u64
            );
            tracing::warn!(command = %shown(command), exit = code, attempt = next, attempts, delay_ms = delay.as_millis() as u64, "retryable command failed; trying again");
            self.record(ctx, Some(due), message).await;
            self.due = Some(due);
        }
    }

    /// Waits until `due` (at most the policy's maximum delay from now, whatever the clock did), or
    /// fails when the agent shuts down meanwhile; then records that the attempt starts.
    async fn wait(&self, ctx: &mut StepContext, due: u64) -> Result<(), DriverError> {
        let max = Duration::from_secs(u64::from(self.policy.map_or(0, |p| p.max_delay_seconds)));
        let left = Duration::from_millis(due.saturating_sub(now_unix_ms())).min(max);
        tokio::select! {
            () = tokio::time::sleep(left) => {}
            () = cancelled(&mut ctx.cancel) => return Err(DriverError::shutting_down()),
        }
        Ok(())
    }

    async fn record(&self, ctx: &StepContext, due: Option<u64>, message: String) {
        let progress = SequenceProgress {
            sequence: self.sequence.to_owned(),
            done: self.index as u32,
            failed_attempts: self.failures,
            retry_at_unix_ms: due,
        };
        // Not durable: an interruption then starts this command's attempts over, which the
        // resume rule makes safe.
        ctx.recorder
            .record_with_message(progress, Some(message))
            .await;
    }
}

fn shown(command: &Prepared) -> String {
    match command {
        Prepared::Run(argv) => display_argv(argv),
        Prepared::WriteFile(path, ..) => format!("writeFile {path}"),
        Prepared::VerifySha256(path, _) => format!("verifySha256 {path}"),
        Prepared::Fetch(fetch) => fetch.shown(),
        Prepared::SysextSwitch(name, image) => format!("sysextSwitch {name} {image}"),
        Prepared::Skip => "a skipped command".to_owned(),
    }
}
