//! The small records dispatch keeps per Machine beside its runs: the Machine record (which run is current, what
//! it converges to, the operator's marks), the agent record, the `kubeadm upgrade apply` claim and the provider-id
//! index, and the refusal UpdateMachine last answered for a Machine (written by the licence wing, shown by the
//! fleet's `status`). Stored format version 1 ([`super::format`]): one shape, no fields of earlier versions.

use inplace_agent_api::{InventoryReport, MachineRef};
use inplace_core::drain::NodeChange;
use serde::{Deserialize, Serialize};

/// A Machine's record: the run it is on and what that run converges to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRecord {
    /// Hash of the desired node state (the plan without its run id).
    pub state_hash: String,
    /// Fingerprint of the inputs the plan was last built from ([`crate::dispatch::runs::UpdateRequest`]): a call
    /// with the same fingerprint is a repeat and builds nothing.
    pub input_hash: String,
    /// Fingerprint of the normalised desired objects the current run was licensed for (by a CanUpdate verdict
    /// or the operator).
    pub licensed: String,
    /// The current run id (what agents see as the plan id).
    pub run_id: String,
    /// The cluster the Machine belongs to.
    pub cluster: String,
    /// `spec.providerID`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// When this run became current (Unix ms).
    pub since_ms: u64,
    /// The last operator retry value seen for this Machine (`inplace-updater.dev/retry` or
    /// `inplace-updater retry`): each value acts at most once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryMark>,
    /// Who paused this Machine's updates (`annotation inplace-updater.dev/paused=...` or `ExtensionConfig
    /// setting paused=...`), as the last UpdateMachine saw it: its current run starts no new step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// The last `inplace-updater.dev/cancel` value seen: each value cancels at most the run it came with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelMark>,
    /// The maintenance window in force for this Machine, as the last UpdateMachine saw it: judged again at
    /// every poll and report, so the run is held after its running step while the window is shut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<inplace_core::Window>,
    /// What the run's desired state does to the node, as the verdict that licensed it judged it (or as
    /// assumed without one): rebuilding the plan for the same state decides the same drain.
    pub node_change: NodeChange,
    /// What the agent does when a step fails (`inplace-updater.dev/on-failure`, else the `onFailure` setting;
    /// `None`: roll back), as the last UpdateMachine saw it; sent with every plan and hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<inplace_agent_api::OnFailure>,
    /// The Machine's `metadata.uid` as the last UpdateMachine saw it: the Events on it name it (`kubectl
    /// describe` matches them by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// An operator cancel value as dispatch recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelMark {
    /// The value.
    pub value: String,
    /// The run it cancels (the current one when the value was first seen).
    pub run_id: String,
}

/// An operator retry value as dispatch recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryMark {
    /// The value.
    pub value: String,
    /// The run that was current once the value was handled (the fresh run when it started one).
    pub run_id: String,
    /// True when the value started nothing because that run had not failed.
    #[serde(default)]
    pub ignored: bool,
}

/// What the agent of a Machine last told us.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    /// Last time this agent was heard from, as persisted (Unix ms; persisted at most every few minutes).
    pub last_seen_ms: u64,
    /// The last inventory report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventoryReport>,
}

/// The claim that one Machine runs `kubeadm upgrade apply` for a version in its cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyClaim {
    /// The Machine's name.
    pub machine: String,
    /// When it claimed (Unix ms).
    pub claimed_ms: u64,
}

/// Provider id index entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderIndex {
    /// The Machine with that provider id.
    pub machine: MachineRef,
}

/// Why UpdateMachine refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalReason {
    /// The desired objects differ from what the verdict judged.
    ChangedAfterJudgement,
    /// The verdict sent the change to a rollout.
    NotInPlace,
    /// No verdict is on record.
    NoVerdict,
}

impl RefusalReason {
    /// The metrics label and verdict of the answer.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::ChangedAfterJudgement => "changed-after-judgement",
            RefusalReason::NotInPlace => "not-in-place",
            RefusalReason::NoVerdict => "no-verdict",
        }
    }

    /// Every reason (the metric's label values).
    pub const ALL: [RefusalReason; 3] = [
        RefusalReason::ChangedAfterJudgement,
        RefusalReason::NotInPlace,
        RefusalReason::NoVerdict,
    ];
}

/// The refusal last answered for a Machine, for `status` and to log each refusal once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalRecord {
    /// The Machine.
    pub machine: MachineRef,
    /// Its cluster.
    pub cluster: String,
    /// Why.
    pub reason: RefusalReason,
    /// The Failure message.
    pub message: String,
    /// The refused state's fingerprint (override form).
    pub fingerprint: String,
    /// First refused (Unix ms).
    pub first_ms: u64,
    /// Last logged at WARN (Unix ms).
    pub warned_ms: u64,
}
