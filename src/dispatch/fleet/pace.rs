//! The pace of a run: how long until it is expected to end, and the `retryAfterSeconds` UpdateMachine answers
//! from that, so Cluster API calls again about when the run ends instead of up to a fixed period late.
//!
//! Each step kind's duration (mean and spread) is learned from the steps this replica saw succeed
//! ([`StepDurations`], an exponentially weighted average per kind: a fixed, bounded table). A run's expected
//! remaining time is what is left of its running step plus the later steps; the answer aims that much minus a
//! safety margin of [`MARGIN_SIGMAS`] standard deviations, so CAPI comes a little early rather than late and
//! then asks every second. Pure: no clock, no I/O, no lock; the fleet wing owns the table and passes `now`.

use crate::dispatch::floor::config::MIN_RETRY_AFTER_SECONDS;
use crate::dispatch::floor::run::{RunView, StepState};

/// Weight of the newest step duration in its kind's average (the rest is the history's).
pub const LEARNING_RATE: f64 = 0.2;
/// Finished steps of a kind needed before its learned duration is trusted beyond the fixed answer.
pub const TRUSTED_AFTER_SAMPLES: u32 = 3;
/// Standard deviations of the remaining time the answer aims early by (2.33: the 99th percentile of a normal).
pub const MARGIN_SIGMAS: f64 = 2.33;
/// Spread assumed after a kind's first sample, as a fraction of it (later samples measure it).
pub const FIRST_SAMPLE_SPREAD: f64 = 0.5;
/// Step durations longer than this are not learned from (a step left hanging says nothing about the next).
pub const MAX_LEARNED_STEP_MS: u64 = 2 * 3600 * 1000;
/// Once the run is past its expected end, the answer is this fraction of how far its running step is past
/// its own expected end (at least [`MIN_RETRY_AFTER_SECONDS`]): 1 s just past it, slower polls for a step
/// stuck for minutes (an agent's automatic retries wait up to minutes).
pub const OVERRUN_BACKOFF: f64 = 0.1;

/// The kinds of step: the one table of them, in the protocol crate (its `guess_seconds` is what a step of a
/// kind is expected to take before one was seen).
pub use inplace_agent_api::StepKind;

/// What a step of `kind` is guessed to take (ms) before one was seen: a typical node's
/// ([`StepKind::guess_seconds`]).
pub fn guess_ms(kind: StepKind) -> f64 {
    f64::from(kind.guess_seconds()) * 1000.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Learned {
    mean_ms: f64,
    variance: f64,
    samples: u32,
}

/// Learned step durations per kind (one fixed-size table per replica).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepDurations {
    kinds: [Learned; StepKind::SLOTS],
}

impl StepDurations {
    /// Learns from a step of `kind` that succeeded after `ms`.
    pub fn learn(&mut self, kind: StepKind, ms: u64) {
        if ms > MAX_LEARNED_STEP_MS {
            return;
        }
        let x = ms as f64;
        let entry = &mut self.kinds[kind.index()];
        if entry.samples == 0 {
            *entry = Learned {
                mean_ms: x,
                variance: (x * FIRST_SAMPLE_SPREAD).powi(2),
                samples: 1,
            };
            return;
        }
        let diff = x - entry.mean_ms;
        let step = LEARNING_RATE * diff;
        entry.mean_ms += step;
        entry.variance = (1.0 - LEARNING_RATE) * (entry.variance + diff * step);
        entry.samples = entry.samples.saturating_add(1);
    }

    /// Mean and variance (ms, ms²) of a step of `kind`, and whether they were learned (else guessed).
    fn of(&self, kind: StepKind) -> (f64, f64, bool) {
        let entry = &self.kinds[kind.index()];
        if entry.samples == 0 {
            let guess = guess_ms(kind);
            return (guess, (guess * FIRST_SAMPLE_SPREAD).powi(2), false);
        }
        (
            entry.mean_ms,
            entry.variance,
            entry.samples >= TRUSTED_AFTER_SAMPLES,
        )
    }
}

/// Where a run is, as the estimator needs it.
#[derive(Debug, Clone, Copy)]
pub struct RunPace<'a> {
    /// The kind of each plan step, in order.
    pub kinds: &'a [StepKind],
    /// The first unfinished step.
    pub current: usize,
    /// Since when it runs (Unix ms; the previous step's end while it is not reported started), if known.
    pub current_since_ms: Option<u64>,
}

/// A run's expected remaining time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Remaining {
    /// Expected milliseconds until the last step ends.
    pub mean_ms: f64,
    /// Their standard deviation.
    pub sigma_ms: f64,
    /// How far the running step is past its expected end (ms, 0 when it is not).
    pub overdue_ms: f64,
    /// Whether every remaining step's duration was learned (not a default guess).
    pub learned: bool,
}

/// The kind of each step of `run`.
pub fn kinds_of(run: &RunView) -> Vec<StepKind> {
    run.plan.steps.iter().map(|step| step.action.kind).collect()
}

/// Since when step `current` of `run` runs: its reported start, else the previous step's end (the agent
/// starts the next step at once), else unknown.
pub fn current_since(run: &RunView, current: usize) -> Option<u64> {
    let step = run.steps.get(current)?;
    let started = step.started_ms.filter(|_| step.state == StepState::Running);
    started.or_else(|| {
        let previous = run.steps.get(current.checked_sub(1)?)?;
        previous.finished_ms
    })
}

/// The expected remaining time of a run at `now_ms`.
pub fn remaining(run: &RunPace<'_>, durations: &StepDurations, now_ms: u64) -> Remaining {
    let mut out = Remaining {
        mean_ms: 0.0,
        sigma_ms: 0.0,
        overdue_ms: 0.0,
        learned: true,
    };
    let mut variance = 0.0;
    for (offset, kind) in run.kinds.iter().skip(run.current).enumerate() {
        let (mean, var, learned) = durations.of(*kind);
        out.learned &= learned;
        variance += var;
        if offset == 0 {
            let elapsed = run
                .current_since_ms
                .map_or(0.0, |since| now_ms.saturating_sub(since) as f64);
            out.mean_ms += (mean - elapsed).max(0.0);
            out.overdue_ms = (elapsed - mean).max(0.0);
        } else {
            out.mean_ms += mean;
        }
    }
    out.sigma_ms = variance.sqrt();
    out
}

/// The `retryAfterSeconds` for a run expected to end in `remaining`: the seconds until its expected end less
/// the margin, rounded down, between [`MIN_RETRY_AFTER_SECONDS`] and `max_seconds`; while a remaining step's
/// duration is still a guess, the seconds until the guessed end without margin, at most `fixed_seconds`; past the expected end, [`OVERRUN_BACKOFF`] of how far the
/// running step is overdue (at least 1 s).
pub fn retry_after(remaining: &Remaining, fixed_seconds: i32, max_seconds: i32) -> i32 {
    let cap = if remaining.learned {
        max_seconds
    } else {
        fixed_seconds.min(max_seconds)
    }
    .max(MIN_RETRY_AFTER_SECONDS);
    // A guessed spread would only make CAPI call every second: guesses aim at their mean, capped above.
    let margin = if remaining.learned {
        MARGIN_SIGMAS * remaining.sigma_ms
    } else {
        0.0
    };
    let aim_ms = remaining.mean_ms - margin;
    let seconds = if aim_ms >= 1000.0 {
        aim_ms / 1000.0
    } else {
        remaining.overdue_ms * OVERRUN_BACKOFF / 1000.0
    };
    // Saturating float-to-int conversion, then the bounds.
    (seconds.floor() as i32).clamp(MIN_RETRY_AFTER_SECONDS, cap)
}

#[cfg(test)]
#[path = "pace_tests.rs"]
mod tests;
