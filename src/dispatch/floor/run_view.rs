//! The lighter view of an update run UpdateMachine answers from ([`RunView`]): the same JSON as an
//! [`UpdateRecord`], without the steps' desired states (file contents, keys), which a status answer never needs
//! and which are most of a record's bytes. Pure.

use inplace_agent_api::{Hold, MachineRef, StepKind};
use serde::Deserialize;

use super::run::{CancelledRun, RunOutcome, RunRollback, RunStepRecord, UpdateRecord};

/// What UpdateMachine reads of an [`UpdateRecord`] to answer: the same JSON, without the steps' desired
/// states (file contents, keys), which a status answer never needs and which are most of a record's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    /// The plan's Machine and step descriptions.
    pub plan: PlanView,
    /// One record per plan step.
    pub steps: Vec<RunStepRecord>,
    /// The hold the agent confirmed it honours.
    #[serde(default)]
    pub held: Option<Hold>,
    /// Set once the run was cancelled.
    #[serde(default)]
    pub cancelled: Option<CancelledRun>,
    /// Set once its agent reported a rollback.
    #[serde(default)]
    pub rollback: Option<RunRollback>,
    /// When the run ended, by the server's clock (Unix ms).
    #[serde(default)]
    pub finished_ms: Option<u64>,
    /// The remediation guard's value while the run waits for it to be settled.
    #[serde(default)]
    pub guard_pending: Option<String>,
    /// The run is under a remediation guard.
    #[serde(default)]
    pub guarded: bool,
    /// Its guard stays on past a step's deadline.
    #[serde(default)]
    pub guard_kept_past_deadline: bool,
}

/// The parts of a [`Plan`] a [`RunView`] keeps.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlanView {
    /// The Machine.
    pub machine: MachineRef,
    /// The steps' descriptions, in order.
    pub steps: Vec<StepView>,
}

/// The part of a plan step a [`RunView`] keeps.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StepView {
    /// Operator-facing summary.
    pub description: String,
    /// The step's kind, for the run's pace (its other fields are not decoded).
    #[serde(default)]
    pub action: ActionView,
    /// The step's timeout: past it from the attempt's start, a silent rebooting node "has not returned".
    #[serde(default, rename = "timeoutSeconds")]
    pub timeout_seconds: u32,
}

/// The part of a step's action a [`RunView`] keeps: its kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct ActionView {
    /// The kind (`files`, `kubeadmUpgrade`, …).
    #[serde(default)]
    pub kind: StepKind,
}

impl RunView {
    /// The view of a record at hand.
    pub fn of(record: &UpdateRecord) -> RunView {
        RunView {
            plan: PlanView {
                machine: record.plan.machine.clone(),
                steps: record
                    .plan
                    .steps
                    .iter()
                    .map(|step| StepView {
                        description: step.description.clone(),
                        action: ActionView {
                            kind: step.action.step_kind(),
                        },
                        timeout_seconds: step.timeout_seconds,
                    })
                    .collect(),
            },
            steps: record.steps.clone(),
            held: record.held.clone(),
            cancelled: record.cancelled.clone(),
            rollback: record.rollback.clone(),
            finished_ms: record.finished_ms,
            guard_pending: record.guard_pending.clone(),
            guarded: record.guarded,
            guard_kept_past_deadline: record.guard_kept_past_deadline,
        }
    }

    /// Where the run is.
    pub fn outcome(&self) -> RunOutcome {
        RunOutcome::of_run(&self.steps, self.cancelled.as_ref(), self.rollback.as_ref())
    }
}
