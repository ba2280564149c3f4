//! Maintenance windows in dispatch, judged by the dispatcher's clock (`clock`): whether a call would start a
//! new run (which waits for the window), and UpdateMachine's answers while a new run waits or a run in
//! progress is held (the hold itself is one arm of `hold::hold_on`, judged again at every poll and report).

use inplace_core::window::{Gate, Window};

use inplace_agent_api::{Hold, KubeadmUpgradeMode};

use super::hold::held_answer;
use super::records::{MachineRecord, RunOutcome, RunView, update_key};
use super::{DispatchError, Dispatcher, UpdateAnswer, UpdateRequest, plan_for};

/// `unix_ms` as a timestamp (Unix epoch itself when out of range, which no clock reading is).
pub(super) fn timestamp(unix_ms: u64) -> jiff::Timestamp {
    i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

impl Dispatcher {
    /// When `window` is closed now: the InProgress answer saying when it opens, with `retryAfterSeconds` the
    /// normal one or the wait until it opens, whichever is shorter (at least 1 s).
    pub(super) fn window_closed(&self, window: &Window, waiting_for: &str) -> Option<UpdateAnswer> {
        // `waiting_for`: "the update" (a new run) or "the next step" (a held run).
        let now = self.clock.now_ms();
        let Gate::Closed { opens, message } = window.gate(timestamp(now)) else {
            return None;
        };
        let normal = self.config.retry_after_seconds;
        let retry_after_seconds = match opens {
            Some(opens) => {
                let wait_ms = opens
                    .timestamp()
                    .as_millisecond()
                    .saturating_sub(now as i64);
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

    /// UpdateMachine's answer for a run held by its shut window: the window's own words (when it opens) and a
    /// retry-after no later than that.
    pub(super) fn window_held(
        &self,
        record: &MachineRecord,
        run: &RunView,
        hold: &Hold,
    ) -> UpdateAnswer {
        match record
            .window
            .as_ref()
            .and_then(|w| self.window_closed(w, "the next step"))
        {
            Some(UpdateAnswer::InProgress {
                message,
                retry_after_seconds,
            }) => held_answer(run, hold, Some(&message), retry_after_seconds),
            _ => held_answer(run, hold, None, self.config.retry_after_seconds),
        }
    }

    /// Whether this call would make a new run current: another desired state than the recorded one, or a
    /// retry value not seen before while the recorded run has failed.
    pub(super) async fn would_start_run(
        &self,
        request: &UpdateRequest,
        existing: Option<&MachineRecord>,
        mode: KubeadmUpgradeMode,
        change: &inplace_core::drain::NodeChange,
    ) -> Result<bool, DispatchError> {
        let Some(record) = existing else {
            return Ok(true);
        };
        let plan = plan_for(request, mode, change)?;
        if !record.converges_to(&plan.id, || {
            super::planning::plan_id_without_node_steps(request, mode)
        }) {
            return Ok(true);
        }
        let Some(value) = super::retry::retry_value(request.machine.get())? else {
            return Ok(false);
        };
        if record.retry.as_ref().is_some_and(|m| m.value == value) {
            return Ok(false);
        }
        let run = self
            .read::<RunView>(&update_key(&request.facts.machine, &record.run_id))
            .await?;
        Ok(run.is_some_and(|(run, _)| matches!(run.outcome(), RunOutcome::Failed { .. })))
    }
}
