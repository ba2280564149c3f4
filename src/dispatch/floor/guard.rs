//! The remediation guard's record: one per Machine whose current run needed (or needs) CAPI's
//! `cluster.x-k8s.io/skip-remediation` annotation, under [`super::keys::guard_key`]. It says what the Machine
//! should carry (the store is the truth; the guard reconcile loop makes the Machine match), whether the
//! Machine was last seen matching, and why a guard was lifted. Written in the transaction that decides it.

use inplace_agent_api::MachineRef;
use serde::{Deserialize, Serialize};

/// CAPI's remediation opt-out: a MachineHealthCheck leaves a Machine with this annotation alone.
pub const SKIP_REMEDIATION_ANNOTATION: &str = "cluster.x-k8s.io/skip-remediation";

/// What the guard's annotation value starts with: the updater's own guards are `inplace-updater:<run id>`.
pub const GUARD_VALUE_PREFIX: &str = "inplace-updater:";

/// The annotation value of run `run_id`'s guard.
pub fn guard_value(run_id: &str) -> String {
    format!("{GUARD_VALUE_PREFIX}{run_id}")
}

/// Whether the Machine should carry the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GuardWant {
    /// The annotation with the record's value.
    On,
    /// Not the record's value (an operator's own value is never touched).
    Off,
}

/// Why a guard is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LiftReason {
    /// Every step of the run that can take the node down is done: the node is back.
    NodeBack,
    /// The run ended (failed, cancelled, rolled back, or another run replaced it).
    RunEnded,
    /// The step had not ended by its deadline: remediation may act.
    Deadline,
}

impl LiftReason {
    /// For operators (`status`, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            LiftReason::NodeBack => "the node is back",
            LiftReason::RunEnded => "the run ended",
            LiftReason::Deadline => "the step's deadline passed",
        }
    }
}

/// One Machine's remediation guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardRecord {
    /// The Machine.
    pub machine: MachineRef,
    /// The run it guards (or guarded).
    pub run_id: String,
    /// The annotation value it sets (`inplace-updater:<run id>`).
    pub value: String,
    /// What the Machine should carry.
    pub want: GuardWant,
    /// Whether the Machine was last seen as `want` says (false: the reconcile loop has work to do).
    pub applied: bool,
    /// The step whose deadline counts (the first unfinished one that can take the node down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// When the guard is lifted unless the Machine's settings keep it (Unix ms); none before the step starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Why it is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifted: Option<LiftReason>,
    /// The Machine carried another value of the annotation when the guard was due (an operator's): it was
    /// left alone, and is never removed by the updater.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator_value: bool,
    /// The step's deadline passed with the guard kept on (the run's `remediationGuardPastDeadline: keep`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept_past_deadline: bool,
    /// When the record last changed (Unix ms).
    pub updated_ms: u64,
}

impl GuardRecord {
    /// Whether the updater holds the guard on the Machine now (wanted on, and seen set with its value).
    pub fn held(&self) -> bool {
        self.want == GuardWant::On && self.applied && !self.operator_value
    }
}
