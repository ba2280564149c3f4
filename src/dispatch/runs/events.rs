//! The Events UpdateMachine posts on the Machine (issue 40): the run recorded (what will change, its step
//! count) and every hold the answer is made of (the window, a pause; the change's holds and the update budget
//! are posted where they are decided). Posted on every call that answers so: the sink aggregates the repeats of
//! a held Machine into one Event with a count, as Kubernetes does. Pure.

use inplace_agent_api::HoldReason;

use super::request::UpdateAnswer;
use crate::dispatch::floor::hold::hold_on;
use crate::dispatch::floor::outbox::Reason;
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::RunOutcome;
use crate::dispatch::floor::run_view::RunView;

/// `run 1a2b3c4d5e6f recorded: 3 steps: 1. <description>; 2. …`: what will change.
pub fn recorded_note(run_id: &str, run: &RunView) -> String {
    let total = run.plan.steps.len();
    let steps = run
        .plan
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| format!("{}. {}", i + 1, step.description))
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "run {} recorded: {total} step{}: {steps}",
        run_id.chars().take(12).collect::<String>(),
        if total == 1 { "" } else { "s" }
    )
}

/// The hold UpdateMachine's answer for `record`'s `run` at `now_ms` is made of, when it is one an Event names
/// (an operator's cancel is not a hold to wait out).
pub fn held(record: &MachineRecord, run: &RunView, now_ms: u64) -> Option<Reason> {
    let outcome = run.outcome();
    if outcome.is_failure() || matches!(outcome, RunOutcome::Done | RunOutcome::RollingBack { .. })
    {
        return None;
    }
    let hold = hold_on(
        record,
        &record.run_id,
        false,
        run.cancelled.as_ref().map(|c| &c.value),
        // The guard's own hold is not the operator's: its Events are the guard's.
        None,
        now_ms,
    )?;
    match hold.reason {
        HoldReason::Paused { .. } => Some(Reason::HeldByPause),
        HoldReason::Window { .. } => Some(Reason::HeldByWindow),
        HoldReason::Cancelled { .. } | HoldReason::RemediationGuard { .. } | HoldReason::Other => {
            None
        }
    }
}

/// The message of an answer, which an Event's note repeats.
pub fn message(answer: &UpdateAnswer) -> &str {
    match answer {
        UpdateAnswer::InProgress { message, .. }
        | UpdateAnswer::Done { message }
        | UpdateAnswer::Failed { message }
        | UpdateAnswer::Refused { message, .. } => message,
    }
}
