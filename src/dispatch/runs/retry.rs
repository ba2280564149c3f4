//! Operator retry: a fresh run of the same desired state for a Machine whose current run failed, started by a
//! new value of the Machine's `inplace-updater.dev/retry` annotation (seen by UpdateMachine) or by
//! `inplace-updater retry` (written into the store directly). Each value acts at most once: it is recorded in
//! the Machine record in the same transaction that makes the fresh run current, so two replicas (or a replica
//! and the CLI) seeing one value cannot both start a run.
//!
//! The fresh run is the failed run's plan under a new run id, so it converges to exactly the state that was
//! licensed: it keeps the Machine record's licence and needs no new CanUpdate verdict. The agent sees a new
//! plan id and runs every step again; steps whose effects are in place converge at once (drivers are
//! idempotent). Pure: the wing loads and commits around [`retry`].

use inplace_agent_api::{MachineRef, Plan};
use inplace_core::knobs::RETRY_ANNOTATION;

use super::request::run_id;
use crate::dispatch::floor::records::{MachineRecord, RetryMark};
use crate::dispatch::floor::run::{RunOutcome, UpdateRecord};

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

fn describe(outcome: Option<&RunOutcome>) -> &'static str {
    match outcome {
        None => "not recorded",
        Some(RunOutcome::Waiting) => "waiting for its agent",
        Some(RunOutcome::InProgress { .. }) => "in progress",
        Some(RunOutcome::Done) => "done",
        Some(RunOutcome::Failed { .. }) => "failed",
        Some(RunOutcome::RollingBack { .. }) => {
            "rolling back (set a new retry value once the rollback ended)"
        }
        Some(RunOutcome::Cancelled { .. }) => "cancelled",
    }
}

/// The Machine record after retry `value` was handled, and the fresh run it starts, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retried {
    /// The record to write.
    pub record: MachineRecord,
    /// The fresh run to record with it.
    pub fresh: Option<UpdateRecord>,
    /// What the value did.
    pub outcome: RetryOutcome,
}

/// Handles retry `value` for a Machine on `record`, whose current run is where `outcome` says (`None`: not
/// recorded): when that run failed (or was cancelled), a fresh run of `plan` (the failed run's plan) under a new
/// run id becomes current; a value on a run that did not fail is recorded as ignored. `None` when the value was
/// handled before.
pub fn retry(
    record: &MachineRecord,
    outcome: Option<&RunOutcome>,
    plan: impl FnOnce() -> Option<Plan>,
    value: &str,
    now_ms: u64,
) -> Option<Retried> {
    if record.retry.as_ref().is_some_and(|m| m.value == value) {
        return None;
    }
    let failed = outcome.is_some_and(RunOutcome::is_failure);
    if failed && let Some(mut plan) = plan() {
        let fresh_id = run_id(&record.state_hash, Some(&record.run_id));
        plan.id = fresh_id.clone();
        return Some(Retried {
            record: MachineRecord {
                run_id: fresh_id.clone(),
                since_ms: now_ms,
                retry: Some(RetryMark {
                    value: value.to_owned(),
                    run_id: fresh_id.clone(),
                    ignored: false,
                }),
                ..record.clone()
            },
            fresh: Some(UpdateRecord::new(plan, now_ms)),
            outcome: RetryOutcome::Started { run_id: fresh_id },
        });
    }
    Some(Retried {
        record: MachineRecord {
            retry: Some(RetryMark {
                value: value.to_owned(),
                run_id: record.run_id.clone(),
                ignored: true,
            }),
            ..record.clone()
        },
        fresh: None,
        outcome: RetryOutcome::Ignored {
            state: describe(outcome),
        },
    })
}

/// Logs what a handled retry value did.
pub fn log(machine: &MachineRef, value: &str, outcome: &RetryOutcome) {
    match outcome {
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
}
