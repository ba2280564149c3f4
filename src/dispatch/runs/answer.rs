//! UpdateMachine's answer from what is recorded: the run's outcome and step, who holds it and until when, when
//! its agent was last seen and why it was refused, and how long until CAPI should call again. Pure: every input
//! is loaded before and passed in, so a restart or another replica answers the same.

use inplace_agent_api::{Hold, HoldReason, MachineRef, OnFailure};
use inplace_core::knobs::{CANCEL_ANNOTATION, PAUSE_ANNOTATION, RETRY_ANNOTATION};
use inplace_core::settings::REMEDIATION_GUARD_PAST_DEADLINE_SETTING;
use inplace_core::window::{Gate, Window};

use super::request::UpdateAnswer;
use super::retry::retry_command;
use crate::dispatch::agents::{AgentRefusalRecord, CONNECTED_WITHIN};
use crate::dispatch::fleet::pace::{self, RunPace, StepDurations};
use crate::dispatch::floor::DispatchConfig;
use crate::dispatch::floor::config::{PRESENCE_STALE_AFTER, RetryAfterMode};
use crate::dispatch::floor::hold::{hold_on, timestamp};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::{RunOutcome, RunView, StepState};

/// Longest stderr excerpt put in a Failure message (CAPI logs it; our status shows the full tail).
pub const FAILURE_STDERR_EXCERPT_BYTES: usize = 600;
/// The ExtensionConfig setting that pauses every Machine of a registration.
pub const PAUSED_SETTING: &str = "paused";

/// `12s ago`, `5m ago`, `3h ago`.
pub fn ago(now: u64, then: u64) -> String {
    let seconds = now.saturating_sub(then) / 1000;
    match seconds {
        0..=119 => format!("{seconds}s ago"),
        120..=7199 => format!("{}m ago", seconds / 60),
        _ => format!("{}h ago", seconds / 3600),
    }
}

/// The command an operator runs to resume `machine` after pausing it by annotation.
pub fn resume_command(machine: &MachineRef) -> String {
    format!(
        "kubectl annotate machine -n {} {} {PAUSE_ANNOTATION}-",
        machine.namespace, machine.name
    )
}

/// Everything an answer is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The Machine's record, as committed.
    pub record: &'a MachineRecord,
    /// Its current run.
    pub run: &'a RunView,
    /// When its agent was last heard from (this replica's memory or the store, whichever is later); only
    /// needed while the run waits for it or runs a step that reboots the node.
    pub last_seen: Option<u64>,
    /// The agent's last refusal, likewise.
    pub refusal: Option<&'a AgentRefusalRecord>,
    /// Now (Unix ms).
    pub now_ms: u64,
    /// The tunables.
    pub config: &'a DispatchConfig,
    /// Step durations learned on this replica (adaptive `retryAfterSeconds`).
    pub durations: &'a StepDurations,
}

/// The answer for the Machine's current run.
pub fn answer(inputs: &Inputs<'_>) -> UpdateAnswer {
    let (record, run) = (inputs.record, inputs.run);
    let outcome = run.outcome();
    let hold = hold_on(
        record,
        &record.run_id,
        matches!(outcome, RunOutcome::Done | RunOutcome::Failed { .. }),
        run.cancelled.as_ref().map(|c| &c.value),
        // The remediation guard's short hold is between the server and its agent: CAPI's answer is the same
        // with or without a management-cluster client.
        None,
        inputs.now_ms,
    );
    let normal = inputs.config.retry_after_seconds;
    let ended_or_undoing =
        outcome.is_failure() || matches!(outcome, RunOutcome::RollingBack { .. });
    match hold.filter(|_| !ended_or_undoing) {
        Some(hold) if matches!(hold.reason, HoldReason::Window { .. }) => {
            match record
                .window
                .as_ref()
                .and_then(|w| window_closed(w, inputs.now_ms, "the next step", normal))
            {
                Some(UpdateAnswer::InProgress {
                    message,
                    retry_after_seconds,
                }) => held_answer(run, &hold, Some(&message), retry_after_seconds),
                _ => held_answer(run, &hold, None, normal),
            }
        }
        Some(hold) => held_answer(run, &hold, None, normal),
        None => with_ignored_retry(with_lifted_guard(answer_run(inputs), inputs), record),
    }
}

/// While a guarded run's step that can take the node down is past its deadline, the remediation guard is
/// lifted, or kept by the run's setting (the guards wing decides the same from the same run): the answer says
/// which.
fn with_lifted_guard(answer: UpdateAnswer, inputs: &Inputs<'_>) -> UpdateAnswer {
    let run = inputs.run;
    let UpdateAnswer::InProgress {
        message,
        retry_after_seconds,
    } = answer
    else {
        return answer;
    };
    let overdue = run.guarded
        && run.steps.iter().zip(&run.plan.steps).any(|(state, step)| {
            state.state == StepState::Running
                && step.action.kind.disrupts()
                && state.started_ms.is_some_and(|started| {
                    started.saturating_add(u64::from(step.timeout_seconds) * 1000) <= inputs.now_ms
                })
        });
    let message = match (overdue, run.guard_kept_past_deadline) {
        (false, _) => message,
        (true, false) => {
            message
                + " (remediation guard lifted at the step's deadline so remediation can act: a \
                   MachineHealthCheck may replace the Machine now)"
        }
        (true, true) => format!(
            "{message} (remediation guard kept past the step's deadline by setting \
             {REMEDIATION_GUARD_PAST_DEADLINE_SETTING}=keep: no MachineHealthCheck replaces the Machine until \
             the run moves on or ends)"
        ),
    };
    UpdateAnswer::InProgress {
        message,
        retry_after_seconds,
    }
}

/// A retry value this run ignored is said on every answer while the run has not failed.
fn with_ignored_retry(answer: UpdateAnswer, record: &MachineRecord) -> UpdateAnswer {
    let Some(value) = record
        .retry
        .as_ref()
        .filter(|m| m.ignored && m.run_id == record.run_id)
        .map(|m| m.value.as_str())
    else {
        return answer;
    };
    let note = format!(
        " ({RETRY_ANNOTATION}={value:?} ignored: a retry only restarts a failed run, and this one has not failed)"
    );
    match answer {
        UpdateAnswer::InProgress {
            message,
            retry_after_seconds,
        } => UpdateAnswer::InProgress {
            message: message + &note,
            retry_after_seconds,
        },
        UpdateAnswer::Done { message } => UpdateAnswer::Done {
            message: message + &note,
        },
        other => other,
    }
}

fn answer_run(inputs: &Inputs<'_>) -> UpdateAnswer {
    let (run, now) = (inputs.run, inputs.now_ms);
    let plan = &run.plan;
    let total = plan.steps.len();
    match run.outcome() {
        RunOutcome::Done => UpdateAnswer::Done {
            message: format!(
                "in-place update done: {total} step{} on {}",
                if total == 1 { "" } else { "s" },
                plan.machine
            ),
        },
        RunOutcome::Failed { index } => {
            let mut message = failed_step(run, index);
            match &run.rollback {
                Some(rollback) => message.push_str(&format!("; {}", rollback.summary())),
                None if inputs.record.on_failure == Some(OnFailure::Hold) => message.push_str(
                    "; nothing undone: the node is left as it failed for inspection (onFailure hold)",
                ),
                None => {}
            }
            message.push_str(&format!(
                "; to run it again once the cause is fixed: {}",
                retry_command(&plan.machine)
            ));
            UpdateAnswer::Failed { message }
        }
        // CAPI shows an in-progress message on the Machine, a Failure only in its log: while the agent undoes
        // the run, say so where operators look, and answer Failure once the rollback ended.
        RunOutcome::RollingBack { index } => UpdateAnswer::InProgress {
            message: format!(
                "{}; {}",
                failed_step(run, index),
                run.rollback
                    .as_ref()
                    .map_or_else(|| "rolling back".to_owned(), |r| r.summary())
            ),
            retry_after_seconds: inputs.config.retry_after_seconds,
        },
        RunOutcome::Cancelled { after } => UpdateAnswer::Failed {
            message: format!(
                "cancelled by operator ({CANCEL_ANNOTATION}={}) after step {after} of {total}; to run it again: {}",
                run.cancelled.as_ref().map_or("", |c| c.value.as_str()),
                retry_command(&plan.machine)
            ),
        },
        RunOutcome::Waiting => {
            let last_seen = inputs.last_seen;
            let mut seen = match last_seen {
                None => "never".to_string(),
                Some(at) => ago(now, at),
            };
            // A refusal since the agent last got through is why it is not here.
            if let Some(refusal) = inputs
                .refusal
                .filter(|r| last_seen.is_none_or(|at| r.at_ms > at))
            {
                seen.push_str(&format!(
                    "; refused {}: {}",
                    ago(now, refusal.at_ms),
                    refusal.reason.summary()
                ));
            }
            // An agent long-polling gets the plan at once: its run is paced from now. One not connected is
            // asked about at the fixed pace. Another replica's agent is known as of its replica's heartbeat.
            let horizon =
                now.saturating_sub((CONNECTED_WITHIN + PRESENCE_STALE_AFTER).as_millis() as u64);
            let retry_after_seconds = match last_seen {
                Some(at) if at >= horizon => retry_after(inputs, 0),
                _ => inputs.config.retry_after_seconds,
            };
            UpdateAnswer::InProgress {
                message: format!(
                    "waiting for agent on {} (last seen: {seen}); {total} steps planned",
                    plan.machine
                ),
                retry_after_seconds,
            }
        }
        RunOutcome::InProgress { index } => {
            let mut message = format!(
                "step {}/{total}: {}",
                index + 1,
                plan.steps[index].description
            );
            // What the agent says about the running step, e.g. which retry attempt is due.
            let step = &run.steps[index];
            if let Some(text) = step
                .message
                .as_deref()
                .filter(|_| step.state == StepState::Running)
            {
                message.push_str(&format!(" ({text})"));
            }
            if let Some(absence) = reboot_absence(inputs, index) {
                message.push_str(&format!("; {absence}"));
            }
            UpdateAnswer::InProgress {
                message,
                retry_after_seconds: retry_after(inputs, index),
            }
        }
    }
}

/// What a running step that reboots the node says while its agent is silent: the node is rebooting, or, past
/// the step's deadline (its timeout from the attempt's start), that it has not returned. `None` while the agent
/// is connected or the step is not such a step.
fn reboot_absence(inputs: &Inputs<'_>, index: usize) -> Option<String> {
    let (run, now) = (inputs.run, inputs.now_ms);
    let step = run.plan.steps.get(index)?;
    let record = run.steps.get(index)?;
    if !step.action.kind.reboots() || record.state != StepState::Running {
        return None;
    }
    let connected_since = now.saturating_sub(CONNECTED_WITHIN.as_millis() as u64);
    let seen = match inputs.last_seen {
        Some(at) if at >= connected_since => return None,
        Some(at) => ago(now, at),
        None => "never".to_owned(),
    };
    let deadline = record
        .started_ms
        .map(|started| started.saturating_add(u64::from(step.timeout_seconds) * 1000));
    Some(match deadline {
        Some(deadline) if now > deadline => format!(
            "the node has not returned: its agent was last seen {seen}, and the step's deadline ({} s from its \
             start {}) passed {}; check the machine's console or BMC",
            step.timeout_seconds,
            ago(now, record.started_ms.unwrap_or(deadline)),
            ago(now, deadline)
        ),
        _ => format!("the node is rebooting: its agent was last seen {seen}"),
    })
}

/// `step 7/11: install kubelet v1.34.1 failed (exit 100): <agent message>; stderr: <excerpt>`.
fn failed_step(run: &RunView, index: usize) -> String {
    let step = &run.steps[index];
    let mut message = format!(
        "step {}/{}: {} failed",
        index + 1,
        run.plan.steps.len(),
        run.plan.steps[index].description
    );
    if let Some(code) = step.exit_code {
        message.push_str(&format!(" (exit {code})"));
    }
    if let Some(text) = &step.message {
        message.push_str(&format!(": {text}"));
    }
    if let Some(tail) = step.stderr_tail.as_deref().filter(|t| !t.trim().is_empty()) {
        let excerpt =
            inplace_agent_api::truncate_tail(tail.trim_end(), FAILURE_STDERR_EXCERPT_BYTES);
        message.push_str(&format!("; stderr: {excerpt}"));
    }
    message
}

/// `retryAfterSeconds` for the run whose first unfinished step is `current`: the fixed one, or paced by the
/// run's expected remaining time ([`pace`]).
fn retry_after(inputs: &Inputs<'_>, current: usize) -> i32 {
    let config = inputs.config;
    if config.retry_after == RetryAfterMode::Fixed {
        return config.retry_after_seconds;
    }
    let kinds = pace::kinds_of(inputs.run);
    let at = RunPace {
        kinds: &kinds,
        current,
        current_since_ms: pace::current_since(inputs.run, current),
    };
    let remaining = pace::remaining(&at, inputs.durations, inputs.now_ms);
    pace::retry_after(
        &remaining,
        config.retry_after_seconds,
        config.retry_after_max_seconds,
    )
}

/// When `window` is closed at `now_ms`: the InProgress answer saying when it opens, with `retryAfterSeconds`
/// `normal` or the wait until it opens, whichever is shorter (at least 1 s). `waiting_for`: "the update" (a
/// new run) or "the next step" (a held run).
pub fn window_closed(
    window: &Window,
    now_ms: u64,
    waiting_for: &str,
    normal: i32,
) -> Option<UpdateAnswer> {
    let Gate::Closed { opens, message } = window.gate(timestamp(now_ms)) else {
        return None;
    };
    let retry_after_seconds = match opens {
        Some(opens) => {
            let wait_ms = opens
                .timestamp()
                .as_millisecond()
                .saturating_sub(now_ms as i64);
            let wait_s = i32::try_from(wait_ms.saturating_add(999) / 1000).unwrap_or(i32::MAX);
            wait_s.clamp(1, normal.max(1))
        }
        None => normal,
    };
    Some(UpdateAnswer::InProgress {
        message: format!("{message}; {waiting_for} starts then"),
        retry_after_seconds,
    })
}

/// The answer for a run under `hold`: InProgress (CAPI keeps polling), saying who holds it, after which step,
/// and whether a step is still finishing; "after step N of M" once the agent confirmed it stopped.
/// `window_message` is the shut window's own words (when it opens), said instead of the hold's reason.
pub fn held_answer(
    run: &RunView,
    hold: &Hold,
    window_message: Option<&str>,
    retry_after_seconds: i32,
) -> UpdateAnswer {
    let total = run.plan.steps.len();
    let done = run
        .steps
        .iter()
        .take_while(|s| s.state == StepState::Succeeded)
        .count();
    let confirmed = run.held.as_ref() == Some(hold);
    let running = run
        .steps
        .iter()
        .position(|s| s.state == StepState::Running)
        .filter(|_| !confirmed);
    let what = match &hold.reason {
        HoldReason::Cancelled { value } => format!("cancelling ({CANCEL_ANNOTATION}={value})"),
        HoldReason::Window { .. } if window_message.is_some() => {
            format!("{}; held", window_message.unwrap_or_default())
        }
        reason => reason.to_string(),
    };
    let mut message = match running {
        Some(index) => format!(
            "{what}: step {}/{total}: {} is running and finishes first; no step starts after it",
            index + 1,
            run.plan.steps[index].description
        ),
        None => format!("{what} after step {done} of {total}"),
    };
    if !confirmed && running.is_none() {
        message.push_str(" (the agent has not confirmed it stopped yet)");
    }
    message.push_str(&match &hold.reason {
        HoldReason::Cancelled { .. } => {
            "; once the agent stops, the run answers Failure and an operator retry starts it again"
                .to_owned()
        }
        HoldReason::Paused { by } if by.starts_with("annotation") => {
            format!("; to resume: {}", resume_command(&run.plan.machine))
        }
        HoldReason::Paused { .. } => {
            format!("; to resume, remove the ExtensionConfig setting {PAUSED_SETTING}")
        }
        _ => String::new(),
    });
    UpdateAnswer::InProgress {
        message,
        retry_after_seconds,
    }
}
