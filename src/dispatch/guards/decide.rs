//! The remediation guard's decisions, pure: whether a Machine's current run needs CAPI's
//! `cluster.x-k8s.io/skip-remediation` guard now ([`need`]), what the guard record becomes ([`decide`]), what
//! the Machine's annotation must become for a record ([`machine_change`]: only the record's own value is ever
//! removed), and when the run's agent may start ([`release_gate`]).

use inplace_agent_api::MachineRef;

use crate::dispatch::floor::guard::{GuardRecord, GuardWant, LiftReason, guard_value};
use crate::dispatch::floor::run::RunOutcome;
use crate::dispatch::floor::run_view::RunView;

/// Whether the guard is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// On, for the run's step `step` (the first unfinished one), lifted at `deadline_ms` unless kept.
    On {
        /// The first unfinished step.
        step: u32,
        /// Its start plus its timeout, once it started and when it can take the node down.
        deadline_ms: Option<u64>,
    },
    /// Off, and why.
    Off(LiftReason),
}

/// Whether run `run` (the Machine's current one; `None`: none) needs the guard at `now_ms`; past a step's
/// deadline it is lifted unless `keep_past_deadline`.
pub fn need(run: Option<&RunView>, now_ms: u64, keep_past_deadline: bool) -> Need {
    let Some(run) = run else {
        return Need::Off(LiftReason::RunEnded);
    };
    if run.finished_ms.is_some() || run.cancelled.is_some() {
        return Need::Off(LiftReason::RunEnded);
    }
    let kinds: Vec<_> = run.plan.steps.iter().map(|s| s.action.kind).collect();
    let Some(last) = kinds.iter().rposition(|k| k.disrupts()) else {
        return Need::Off(LiftReason::NodeBack);
    };
    let index = match run.outcome() {
        RunOutcome::Waiting => 0,
        RunOutcome::InProgress { index } | RunOutcome::RollingBack { index } => index,
        RunOutcome::Done => return Need::Off(LiftReason::NodeBack),
        RunOutcome::Failed { .. } | RunOutcome::Cancelled { .. } => {
            return Need::Off(LiftReason::RunEnded);
        }
    };
    let rolling_back = matches!(run.outcome(), RunOutcome::RollingBack { .. });
    if index > last && !rolling_back {
        return Need::Off(LiftReason::NodeBack);
    }
    let deadline_ms = kinds
        .get(index)
        .filter(|kind| kind.disrupts())
        .and_then(|kind| {
            let started = run.steps.get(index)?.started_ms?;
            let timeout = match run.plan.steps.get(index)?.timeout_seconds {
                0 => kind.timeout_seconds(),
                seconds => seconds,
            };
            Some(started.saturating_add(u64::from(timeout) * 1000))
        });
    if deadline_ms.is_some_and(|deadline| now_ms >= deadline) && !keep_past_deadline {
        return Need::Off(LiftReason::Deadline);
    }
    Need::On {
        step: index as u32,
        deadline_ms,
    }
}

/// What the guard record of `machine` becomes, given the Machine's current run (`run_id`, `run`), its record
/// now (`guard`) and the clock; `None`: unchanged. Kept past a step's deadline (`keep_past_deadline`, the run's
/// setting), the record says so once (`kept_past_deadline`), for the Event. A guard of an earlier run is lifted (and seen lifted) before
/// a new run's is set, so the earlier value never stays behind.
pub fn decide(
    machine: &MachineRef,
    run_id: Option<&str>,
    run: Option<&RunView>,
    guard: Option<&GuardRecord>,
    now_ms: u64,
    keep_past_deadline: bool,
) -> Option<GuardRecord> {
    let need = need(run, now_ms, keep_past_deadline);
    let kept = |deadline_ms: Option<u64>| {
        keep_past_deadline && deadline_ms.is_some_and(|deadline| now_ms >= deadline)
    };
    let off = |record: &GuardRecord, reason: LiftReason| GuardRecord {
        want: GuardWant::Off,
        applied: false,
        lifted: Some(reason),
        kept_past_deadline: false,
        updated_ms: now_ms,
        ..record.clone()
    };
    match (guard, need, run_id) {
        // Another run's guard: lift it first (and see it lifted), then the current run's is decided afresh.
        (Some(g), _, current) if Some(g.run_id.as_str()) != current => match g.want {
            GuardWant::On => Some(off(g, LiftReason::RunEnded)),
            GuardWant::Off if !g.applied => None,
            GuardWant::Off => decide(machine, run_id, run, None, now_ms, keep_past_deadline),
        },
        (Some(g), Need::Off(reason), _) => (g.want == GuardWant::On).then(|| off(g, reason)),
        (None, Need::Off(_), _) | (None, Need::On { .. }, None) => None,
        (None, Need::On { step, deadline_ms }, Some(run_id)) => Some(GuardRecord {
            machine: machine.clone(),
            run_id: run_id.to_owned(),
            value: guard_value(run_id),
            want: GuardWant::On,
            applied: false,
            step: Some(step),
            deadline_ms,
            lifted: None,
            operator_value: false,
            kept_past_deadline: kept(deadline_ms),
            updated_ms: now_ms,
        }),
        (Some(g), Need::On { step, deadline_ms }, _) => {
            if g.want == GuardWant::Off
                && g.lifted == Some(LiftReason::Deadline)
                && g.step == Some(step)
            {
                // Lifted at this step's deadline: it stays off until the run moves on.
                return None;
            }
            let next = GuardRecord {
                want: GuardWant::On,
                applied: g.applied && g.want == GuardWant::On,
                step: Some(step),
                deadline_ms,
                lifted: None,
                operator_value: g.operator_value && g.want == GuardWant::On,
                kept_past_deadline: kept(deadline_ms),
                updated_ms: now_ms,
                ..g.clone()
            };
            let same = next.want == g.want
                && next.step == g.step
                && next.deadline_ms == g.deadline_ms
                && next.applied == g.applied
                && next.kept_past_deadline == g.kept_past_deadline;
            (!same).then_some(next)
        }
    }
}

/// What the Machine's annotation must become for `record`, given its value now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineChange {
    /// Set it to the record's value.
    Set(String),
    /// Remove it (it holds the record's own value).
    Remove,
    /// Leave it: it is as wanted, or it holds another value (`operator: true`), which is never touched.
    Nothing {
        /// The annotation holds a value that is not the record's.
        operator: bool,
    },
}

/// The change to the Machine for `record` when its annotation is `current`.
pub fn machine_change(current: Option<&str>, record: &GuardRecord) -> MachineChange {
    match (record.want, current) {
        (GuardWant::On, None) => MachineChange::Set(record.value.clone()),
        (GuardWant::On, Some(value)) => MachineChange::Nothing {
            operator: value != record.value,
        },
        (GuardWant::Off, Some(value)) if value == record.value => MachineChange::Remove,
        (GuardWant::Off, current) => MachineChange::Nothing {
            operator: current.is_some(),
        },
    }
}

/// Whether a run waiting for its guard (`pending`, the value) may start: its guard record is this value's and
/// settled (seen on the Machine, or an operator's guard there, or not needed after all), or setting it failed
/// (`failed`: the update goes on unguarded rather than wait on the management cluster).
pub fn release_gate(pending: Option<&str>, guard: Option<&GuardRecord>, failed: bool) -> bool {
    let Some(value) = pending else {
        return false;
    };
    match guard {
        _ if failed => true,
        Some(g) if g.value == value => g.applied || g.want == GuardWant::Off,
        _ => false,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
