//! Operator retry: a fresh run of the same desired state for a Machine whose current run failed, started by
//! a new value of the Machine's `inplace-updater.dev/retry` annotation (seen by UpdateMachine) or by
//! `inplace-updater retry` (written into the store directly). Each value acts at most once: it is recorded
//! in the Machine record by the same compare-and-swap that makes the fresh run current, so two replicas
//! (or a replica and the CLI) seeing one value cannot both start a run.
//!
//! The fresh run is the failed run's plan under a new run id, so it converges to exactly the state that was
//! licensed: it keeps the Machine record's licence and needs no new CanUpdate verdict. The agent sees a new
//! plan id and runs every step again; steps whose effects are in place converge at once (drivers are
//! idempotent).

use inplace_agent_api::MachineRef;
use inplace_store::{Precondition, Write};

use super::records::{MachineRecord, RetryMark, RunOutcome, UpdateRecord, machine_key, update_key};
use super::{CAS_ATTEMPTS, DispatchError, Dispatcher};

/// The annotation whose every new value restarts a failed run once.
pub const RETRY_ANNOTATION: &str = "inplace-updater.dev/retry";
/// Longest retry value accepted (it is kept in the Machine record).
pub const MAX_RETRY_VALUE_BYTES: usize = 256;

/// What a retry value did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOutcome {
    /// A fresh run of the failed run's desired state is now current.
    Started {
        /// Its run id (what the agent sees as the plan id).
        run_id: String,
    },
    /// Recorded, nothing started: the current run has not failed.
    Ignored {
        /// Where the current run is (`in progress`, `done`, ...).
        state: &'static str,
    },
    /// This value was handled before (by this or another replica, or an earlier call).
    AlreadySeen,
    /// The Machine's recorded desired state is not the one the caller asked about: the caller's new desired
    /// state gets its own run instead.
    OtherState,
    /// No update was ever recorded for this Machine.
    NoRecord,
}

/// The command an operator runs to retry a failed run of `machine`.
pub fn retry_command(machine: &MachineRef) -> String {
    format!(
        "kubectl annotate machine -n {} {} {RETRY_ANNOTATION}=$(date +%s) --overwrite",
        machine.namespace, machine.name
    )
}

/// Checks a retry value from an annotation or the command line.
pub fn check_retry_value(value: &str) -> Result<(), DispatchError> {
    if value.len() > MAX_RETRY_VALUE_BYTES {
        return Err(DispatchError::BadRequest(format!(
            "the {RETRY_ANNOTATION} value is {} bytes, over the limit of {MAX_RETRY_VALUE_BYTES}; use e.g. $(date +%s)",
            value.len()
        )));
    }
    Ok(())
}

/// The desired Machine's [`RETRY_ANNOTATION`] value, if it has a non-empty one.
pub(super) fn retry_value(machine: &str) -> Result<Option<String>, DispatchError> {
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
    let Some(value) = object
        .metadata
        .annotations
        .and_then(|mut a| a.remove(RETRY_ANNOTATION))
    else {
        return Ok(None);
    };
    match value {
        serde_json::Value::String(text) if text.is_empty() => Ok(None),
        serde_json::Value::String(text) => {
            check_retry_value(&text)?;
            Ok(Some(text))
        }
        other => Err(DispatchError::BadRequest(format!(
            "annotation {RETRY_ANNOTATION} must be a string, not {other}"
        ))),
    }
}

fn describe(outcome: &RunOutcome) -> &'static str {
    match outcome {
        RunOutcome::Waiting => "waiting for its agent",
        RunOutcome::InProgress { .. } => "in progress",
        RunOutcome::Done => "done",
        RunOutcome::Failed { .. } => "failed",
        RunOutcome::Cancelled { .. } => "cancelled",
    }
}

impl Dispatcher {
    /// Handles retry `value` for `machine`: when its current run failed and the value is new, makes a fresh
    /// run of the same desired state current; a new value on a run that did not fail is recorded and
    /// ignored. With `expected_state`, acts only while the Machine record is on that desired state.
    pub async fn retry(
        &self,
        machine: &MachineRef,
        value: &str,
        expected_state: Option<&str>,
    ) -> Result<RetryOutcome, DispatchError> {
        check_retry_value(value)?;
        let key = machine_key(machine);
        for _ in 0..CAS_ATTEMPTS {
            let Some((record, entry)) = self.read::<MachineRecord>(&key).await? else {
                return Ok(RetryOutcome::NoRecord);
            };
            if record.retry.as_ref().is_some_and(|m| m.value == value) {
                return Ok(RetryOutcome::AlreadySeen);
            }
            if expected_state.is_some_and(|state| state != record.state_hash) {
                return Ok(RetryOutcome::OtherState);
            }
            let run = self
                .read::<UpdateRecord>(&update_key(machine, &record.run_id))
                .await?
                .map(|(run, _)| run);
            let now = self.clock.now_ms();
            let (next, outcome) = match run {
                Some(run) if run.outcome().is_failure() => {
                    let fresh_id = super::update::run_id(&record.state_hash, Some(&record.run_id));
                    let mut plan = run.plan;
                    plan.id = fresh_id.clone();
                    self.record_run(machine, &UpdateRecord::new(plan, now))
                        .await?;
                    let next = MachineRecord {
                        run_id: fresh_id.clone(),
                        since_ms: now,
                        retry: Some(RetryMark {
                            value: value.to_owned(),
                            run_id: fresh_id.clone(),
                            ignored: false,
                        }),
                        ..record.clone()
                    };
                    (next, RetryOutcome::Started { run_id: fresh_id })
                }
                run => {
                    let state = run.map_or("not recorded", |run| describe(&run.outcome()));
                    let next = MachineRecord {
                        retry: Some(RetryMark {
                            value: value.to_owned(),
                            run_id: record.run_id.clone(),
                            ignored: true,
                        }),
                        ..record.clone()
                    };
                    (next, RetryOutcome::Ignored { state })
                }
            };
            let bytes = serde_json::to_vec(&next).map_err(|err| DispatchError::Corrupt {
                key: key.clone(),
                detail: err.to_string(),
            })?;
            match self
                .store
                .put(&key, bytes, Precondition::Revision(entry.revision))
                .await?
            {
                Write::Done(_) => {
                    match &outcome {
                        RetryOutcome::Started { run_id } => tracing::warn!(
                            %machine,
                            value,
                            run = %run_id.chars().take(12).collect::<String>(),
                            "operator retry: a fresh run of the failed update started"
                        ),
                        RetryOutcome::Ignored { state } => tracing::info!(
                            %machine,
                            value,
                            state,
                            "operator retry ignored: the current run has not failed"
                        ),
                        _ => {}
                    }
                    // Local polls wake now; other replicas wake from the change feed.
                    self.wake(machine);
                    return Ok(outcome);
                }
                // Someone else changed the record: look again (a racing retry of the same value then
                // finds it recorded and does nothing).
                Write::Conflict(_) => continue,
            }
        }
        Err(DispatchError::Contention(key))
    }

    /// Writes a fresh run record unless one with its id exists (a racing replica, or an earlier attempt that
    /// lost its compare-and-swap, wrote the same plan under the same id).
    async fn record_run(
        &self,
        machine: &MachineRef,
        run: &UpdateRecord,
    ) -> Result<(), DispatchError> {
        let key = update_key(machine, &run.plan.id);
        let bytes = serde_json::to_vec(run).map_err(|err| DispatchError::Corrupt {
            key: key.clone(),
            detail: err.to_string(),
        })?;
        match self.store.put(&key, bytes, Precondition::Absent).await? {
            Write::Done(_) | Write::Conflict(_) => Ok(()),
        }
    }
}
