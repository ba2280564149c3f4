//! The hold on a run: why its agent must start no new step (an operator cancel, a pause, a shut maintenance
//! window, its remediation guard not settled yet), judged from the Machine record and the run at an instant. Pure: the poll, the report ack, the
//! UpdateMachine answer and `status` all ask this one function.

use inplace_agent_api::{Hold, HoldReason};
use inplace_core::window::Gate;

use super::records::MachineRecord;
use super::run::UpdateRecord;

/// `unix_ms` as a timestamp (Unix epoch itself when out of range, which no clock reading is).
pub fn timestamp(unix_ms: u64) -> jiff::Timestamp {
    i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// The hold on `run` given its Machine's record at `now_ms` (Unix ms): cancelled (recorded or asked for)
/// before paused before a shut maintenance window before a pending remediation guard; none once the run ended otherwise.
pub fn hold_for(record: &MachineRecord, run: &UpdateRecord, now_ms: u64) -> Option<Hold> {
    hold_on(
        record,
        &run.plan.id,
        run.finished_ms.is_some(),
        run.cancelled.as_ref().map(|c| &c.value),
        run.guard_pending.as_deref(),
        now_ms,
    )
}

/// [`hold_for`] from the parts of a run it needs.
pub fn hold_on(
    record: &MachineRecord,
    run_id: &str,
    finished: bool,
    cancelled: Option<&String>,
    guard_pending: Option<&str>,
    now_ms: u64,
) -> Option<Hold> {
    let reason = if let Some(value) = cancelled {
        HoldReason::Cancelled {
            value: value.clone(),
        }
    } else if finished {
        return None;
    } else if let Some(mark) = record.cancel.as_ref().filter(|m| m.run_id == run_id) {
        HoldReason::Cancelled {
            value: mark.value.clone(),
        }
    } else if let Some(by) = &record.paused {
        HoldReason::Paused { by: by.clone() }
    } else if let Some(window) = &record.window
        && let Gate::Closed { opens, .. } = window.gate(timestamp(now_ms))
    {
        HoldReason::Window {
            opens_at_unix_ms: opens
                .and_then(|at| u64::try_from(at.timestamp().as_millisecond()).ok()),
        }
    } else if let Some(value) = guard_pending {
        HoldReason::RemediationGuard {
            value: value.to_owned(),
        }
    } else {
        return None;
    };
    Some(Hold {
        plan_id: run_id.to_owned(),
        reason,
    })
}
