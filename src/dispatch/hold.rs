//! Operator holds: pause (a Machine annotation or the ExtensionConfig `paused` setting) and cancel (a Machine
//! annotation). UpdateMachine records them in the Machine record by compare-and-swap, so every replica and a
//! restarted server agree; agents learn them from poll answers and report acks ([`Hold`]) and confirm them
//! with their progress, and only then does UpdateMachine say the run is paused (or cancelled) "after step N".
//!
//! The agent finishes the step it is running, starts no other, and keeps its progress; removing the pause
//! lifts the hold and it continues with the next step. A cancel ends the run once the agent confirms it
//! stopped: it counts as failed, so the operator retry starts it again. A further hold reason (a closed
//! maintenance window) is one more arm of [`hold_for`].

use inplace_agent_api::{Hold, HoldReason, MachineRef};
use inplace_core::window::Gate;

use super::records::{CancelMark, MachineRecord, RunView, StepState, UpdateRecord, machine_key};
use super::{DispatchError, Dispatcher, UpdateAnswer};

/// The Machine annotation that pauses its updates (any non-empty value: the reason, shown in messages).
pub const PAUSE_ANNOTATION: &str = "inplace-updater.dev/paused";
/// The Machine annotation whose every new value cancels the current run once.
pub const CANCEL_ANNOTATION: &str = "inplace-updater.dev/cancel";
/// The ExtensionConfig setting that pauses every Machine of a registration.
pub const PAUSED_SETTING: &str = "paused";
/// Longest pause or cancel annotation value accepted (it is kept in the Machine record).
pub const MAX_HOLD_VALUE_BYTES: usize = 256;

/// What the desired Machine and the settings ask for, read on every UpdateMachine call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorHolds {
    /// Who paused, as said in messages (`annotation inplace-updater.dev/paused=...`).
    pub paused: Option<String>,
    /// The cancel annotation's value, when non-empty.
    pub cancel: Option<String>,
    /// The maintenance window in force (the Machine's annotation, else the ExtensionConfig setting).
    pub window: Option<inplace_core::Window>,
}

impl OperatorHolds {
    /// Reads the pause and cancel annotations of the desired Machine's JSON and the `paused` setting (the
    /// annotation wins: it names the Machine).
    pub fn read(machine: &str, paused_setting: Option<&str>) -> Result<Self, DispatchError> {
        let paused = match annotation(machine, PAUSE_ANNOTATION)? {
            Some(value) => Some(format!("annotation {PAUSE_ANNOTATION}={value}")),
            None => paused_setting
                .filter(|v| !v.is_empty())
                .map(|v| format!("ExtensionConfig setting {PAUSED_SETTING}={v}")),
        };
        Ok(Self {
            paused,
            cancel: annotation(machine, CANCEL_ANNOTATION)?,
            window: None,
        })
    }
}

/// A non-empty string annotation of a Machine's JSON, bounded by [`MAX_HOLD_VALUE_BYTES`].
pub(super) fn annotation(machine: &str, name: &str) -> Result<Option<String>, DispatchError> {
    #[derive(serde::Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Metadata,
    }
    #[derive(Default, serde::Deserialize)]
    struct Metadata {
        #[serde(default)]
        annotations: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    }
    let object: Object = serde_json::from_str(machine)
        .map_err(|err| DispatchError::BadRequest(format!("machine: {err}")))?;
    match object.metadata.annotations.and_then(|mut a| a.remove(name)) {
        None => Ok(None),
        Some(serde_json::Value::String(text)) if text.is_empty() => Ok(None),
        Some(serde_json::Value::String(text)) if text.len() > MAX_HOLD_VALUE_BYTES => {
            Err(DispatchError::BadRequest(format!(
                "the {name} value is {} bytes, over the limit of {MAX_HOLD_VALUE_BYTES}",
                text.len()
            )))
        }
        Some(serde_json::Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(DispatchError::BadRequest(format!(
            "annotation {name} must be a string, not {other}"
        ))),
    }
}

/// The hold on `run` given its Machine's record at `now_ms` (Unix ms, the dispatcher's clock): cancelled (recorded
/// or asked for) before paused before a shut maintenance window; none once the run ended otherwise.
pub fn hold_for(record: &MachineRecord, run: &UpdateRecord, now_ms: u64) -> Option<Hold> {
    hold_on(
        record,
        &run.plan.id,
        run.finished_ms.is_some(),
        run.cancelled.as_ref().map(|c| &c.value),
        now_ms,
    )
}

/// [`hold_for`] from the parts of a run it needs.
pub(super) fn hold_on(
    record: &MachineRecord,
    run_id: &str,
    finished: bool,
    cancelled: Option<&String>,
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
        && let Gate::Closed { opens, .. } = window.gate(super::window::timestamp(now_ms))
    {
        HoldReason::Window {
            opens_at_unix_ms: opens
                .and_then(|at| u64::try_from(at.timestamp().as_millisecond()).ok()),
        }
    } else {
        return None;
    };
    Some(Hold {
        plan_id: run_id.to_owned(),
        reason,
    })
}

/// The command an operator runs to resume `machine` after pausing it by annotation.
pub fn resume_command(machine: &MachineRef) -> String {
    format!(
        "kubectl annotate machine -n {} {} {PAUSE_ANNOTATION}-",
        machine.namespace, machine.name
    )
}

/// UpdateMachine's answer for a run under `hold`: InProgress (CAPI keeps polling), saying who holds it, after
/// which step, and whether a step is still finishing; "after step N of M" once the agent confirmed it stopped.
/// `window_message` is the shut window's own words (when it opens), said instead of the hold's reason.
pub(super) fn held_answer(
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

impl Dispatcher {
    /// Records what `wanted` asks for in the Machine record, if it differs: the pause as it is now, and a
    /// cancel value not seen before (for the run current now). Returns the record as stored afterwards.
    pub(super) async fn record_holds(
        &self,
        machine: &MachineRef,
        record: MachineRecord,
        wanted: &OperatorHolds,
    ) -> Result<MachineRecord, DispatchError> {
        let differs = |r: &MachineRecord| {
            r.paused != wanted.paused
                || r.window != wanted.window
                || wanted
                    .cancel
                    .as_ref()
                    .is_some_and(|v| r.cancel.as_ref().is_none_or(|m| &m.value != v))
        };
        if !differs(&record) {
            return Ok(record);
        }
        let stored = self
            .update(&machine_key(machine), |current: Option<&MachineRecord>| {
                let Some(current) = current.filter(|r| differs(r)) else {
                    return Ok(None);
                };
                let mut next = current.clone();
                next.paused = wanted.paused.clone();
                next.window = wanted.window.clone();
                if let Some(value) = &wanted.cancel
                    && next.cancel.as_ref().is_none_or(|m| &m.value != value)
                {
                    next.cancel = Some(CancelMark {
                        value: value.clone(),
                        run_id: next.run_id.clone(),
                    });
                }
                Ok(Some(next))
            })
            .await?
            .ok_or_else(|| DispatchError::Contention(machine_key(machine)))?;
        if stored.paused != record.paused {
            match &stored.paused {
                Some(by) => tracing::warn!(%machine, by, "updates paused: no new step starts"),
                None => tracing::info!(%machine, "pause lifted: the update continues"),
            }
        }
        if stored.cancel != record.cancel
            && let Some(mark) = &stored.cancel
        {
            tracing::warn!(
                %machine,
                value = mark.value,
                run = %mark.run_id.chars().take(12).collect::<String>(),
                "operator cancel: the run stops after its running step"
            );
        }
        self.wake(machine);
        Ok(stored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(annotations: &str) -> String {
        format!(r#"{{"metadata":{{"name":"m","annotations":{{{annotations}}}}}}}"#)
    }

    #[test]
    fn the_annotation_names_the_pause_and_wins_over_the_setting() {
        let holds = OperatorHolds::read(
            &machine(r#""inplace-updater.dev/paused":"alice: disk check""#),
            Some("freeze"),
        )
        .unwrap();
        assert_eq!(
            holds.paused.as_deref(),
            Some("annotation inplace-updater.dev/paused=alice: disk check")
        );
        let holds = OperatorHolds::read(&machine(""), Some("freeze")).unwrap();
        assert_eq!(
            holds.paused.as_deref(),
            Some("ExtensionConfig setting paused=freeze")
        );
        let holds =
            OperatorHolds::read(&machine(r#""inplace-updater.dev/paused":"""#), None).unwrap();
        assert_eq!(holds, OperatorHolds::default());
    }

    #[test]
    fn bad_values_are_refused_naming_the_annotation() {
        let err = OperatorHolds::read(&machine(r#""inplace-updater.dev/cancel":true"#), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(CANCEL_ANNOTATION) && err.contains("string"),
            "{err}"
        );
        let long = "x".repeat(MAX_HOLD_VALUE_BYTES + 1);
        let err = OperatorHolds::read(
            &machine(&format!(r#""inplace-updater.dev/paused":"{long}""#)),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("over the limit of 256"), "{err}");
    }
}
