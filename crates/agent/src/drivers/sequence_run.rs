//! Runs a list of prepared commands with durable progress — the forward `commands:` of a Kubernetes version
//! step and its `undo:` alike: a resumed run first runs `onResume`, then continues at the first command not
//! recorded complete (and a retry an interruption cut short at its attempt); each command's completion is
//! recorded right after it exits.

use super::attempts::Attempts;
use super::error::DriverError;
use super::prepared::{Prepared, run_one};
use super::step::StepContext;
use crate::os::driver_env::DriverEnv;
use crate::retry::RetryPolicy;
use crate::sequence::command::SequenceCommand;
use crate::sequence::progress::SequenceProgress;

/// One list of commands to run with progress.
pub(super) struct SequenceList<'a> {
    /// Its config key for messages, e.g. `kubernetes.installKubelet` or `kubernetes.installKubelet.undo`.
    pub label: &'a str,
    /// The commands, expanded.
    pub commands: &'a [Prepared],
    /// The commands as configured (for `retryable`).
    pub specs: &'a [SequenceCommand],
    /// `onResume`, expanded.
    pub on_resume: &'a [Prepared],
    /// The retry policy of the `retryable` commands.
    pub retry: Option<RetryPolicy>,
    /// The fingerprint recorded progress refers to.
    pub id: &'a str,
}

/// Runs `list` from its first unfinished command; returns where it started and the notes of commands that
/// took retries, or the step's end.
pub(super) async fn run_list(
    env: &DriverEnv,
    ctx: &mut StepContext,
    list: &SequenceList<'_>,
) -> Result<(usize, Vec<String>), DriverError> {
    let (label, id) = (list.label, list.id);
    let total = list.commands.len();
    let first = match &ctx.progress {
        Some(p) if p.sequence == id => (p.done as usize).min(total),
        Some(_) => {
            tracing::warn!(
                step = label,
                "recorded progress is for other commands (agent config or pins changed); running every command"
            );
            0
        }
        None => 0,
    };
    if ctx.resumed {
        tracing::info!(
            step = label,
            first = first + 1,
            total,
            "resuming the sequence"
        );
        for (i, command) in list.on_resume.iter().enumerate() {
            if *ctx.cancel.borrow() {
                return Err(DriverError::shutting_down());
            }
            let context = format!("{label}.onResume[{i}]");
            if let Some(end) = run_one(env, ctx, command, &context).await {
                return Err(end);
            }
        }
    }
    // A retry of command `first` that an interruption cut short continues at its attempt.
    let mut pending_retry = match &ctx.progress {
        Some(p) if p.sequence == id && p.done as usize == first => {
            Some((p.failed_attempts, p.retry_at_unix_ms))
        }
        _ => None,
    };
    let mut retried = Vec::new();
    for (i, command) in list.commands.iter().enumerate().skip(first) {
        let policy = list.retry.filter(|_| list.specs[i].retryable);
        let (failures, due) = pending_retry.take().unwrap_or_default();
        let context = format!("{label}.commands[{i}]");
        let attempts = Attempts {
            index: i,
            sequence: id,
            policy,
            failures,
            due,
        };
        if let Some(note) = attempts.run(env, ctx, command, &context).await? {
            retried.push(note);
        }
        let progress = SequenceProgress {
            sequence: id.to_owned(),
            done: (i + 1) as u32,
            ..SequenceProgress::default()
        };
        // When this fails the command runs again after an interruption: safe by the resume rule.
        ctx.recorder.record(progress).await;
    }
    Ok((first, retried))
}
