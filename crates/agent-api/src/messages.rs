//! Requests and answers of the three agent endpoints (poll, report, inventory).

use serde::{Deserialize, Serialize};

use crate::{AgentFacts, AgentUpgrade, MachineRef, Plan, TokenOffer};

/// Who an agent is: its Machine, or the provider id matched against the Machine's
/// `spec.providerID`. JSON: `{"machine": {"namespace": "ns", "name": "m"}}` or
/// `{"providerID": "aws:///eu-west-1a/i-0abc"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AgentIdentity {
    /// The Machine `namespace/name`.
    #[serde(rename = "machine")]
    Machine(MachineRef),
    /// The node's provider id.
    #[serde(rename = "providerID")]
    ProviderId(String),
}

impl std::fmt::Display for AgentIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Machine(machine) => write!(f, "machine {machine}"),
            Self::ProviderId(id) => write!(f, "providerID {id}"),
        }
    }
}

/// Where the agent is with the plan it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PlanStatus {
    /// Steps remain to be run (or one is running).
    Running,
    /// Every step succeeded.
    Succeeded,
    /// A step failed; the plan stopped there and stays failed for this id.
    Failed,
}

/// Summary of the agent's current plan, sent with every poll and inventory report so the server
/// can recover progress it missed (the per-step detail comes in [`StepReport`]s).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanProgress {
    /// The plan id.
    pub plan_id: String,
    /// Overall status.
    pub status: PlanStatus,
    /// Steps finished with success.
    pub succeeded_steps: u32,
    /// Steps in the plan.
    pub total_steps: u32,
    /// Index of the failed step, when `status` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<u32>,
    /// The hold the agent is honouring for this plan: it runs no step and starts none until the server
    /// lifts it (absent: not held). Lets the server say "paused after step N" only once it is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Where the rollback of this plan is, once a step failed and the agent rolls back (absent: no rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackProgress>,
}

/// What the agent does when a step fails (after its own retries), or the node is not Ready at the target
/// kubelet version by `waitNodeReady`'s deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Undo the finished steps back to the last point of no return, in reverse order, verify the node is as it
    /// was, and uncordon only a cordon the plan made (the default).
    #[default]
    Rollback,
    /// Leave the node as it failed, for inspection (cordon kept).
    Hold,
}

impl OnFailure {
    /// The setting and annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Rollback => "rollback",
            OnFailure::Hold => "hold",
        }
    }
}

/// Where a rollback is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RollbackState {
    /// Undoing steps (or verifying the node afterwards).
    RollingBack,
    /// Every step back to the last point of no return was undone and the node verified as it was.
    RolledBack,
    /// An undo failed, or the verification did: the node is left cordoned; `message` says where and why.
    Failed,
}

/// The agent's account of a plan's rollback, sent with every poll and inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackProgress {
    /// Where it is.
    pub state: RollbackState,
    /// The step whose failure started it.
    pub failed_step: u32,
    /// How many steps were undone so far (from the failed one backwards).
    pub undone: u32,
    /// For operators: what the node is now (`node … is at v1.33.4 and Ready; files restored`), or where and why
    /// the rollback failed; at most [`crate::MESSAGE_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The server holding a plan: the agent finishes the step it is running, starts no other, keeps its
/// progress and polls. A hold that cancels ends the plan there. Absent (old servers, or nothing held):
/// go on. A hold is for one plan id; the agent ignores it for any other plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// The plan it holds.
    pub plan_id: String,
    /// Why.
    pub reason: HoldReason,
}

impl Hold {
    /// Whether the hold ends the plan (cancel) rather than pausing it.
    pub fn cancels(&self) -> bool {
        matches!(self.reason, HoldReason::Cancelled { .. })
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reason.fmt(f)
    }
}

/// Why a plan is held. JSON: `{"kind": "paused", "by": "..."}`, `{"kind": "window", "opensAtUnixMs": ...}`,
/// `{"kind": "cancelled", "value": "..."}`, `{"kind": "remediationGuard", "value": "..."}`; a kind this agent does not know holds without cancelling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum HoldReason {
    /// An operator paused it; `by` names how (`annotation inplace-updater.dev/paused=...`).
    Paused {
        /// The annotation or setting and its value.
        by: String,
    },
    /// Outside the maintenance window; no step starts before it opens.
    Window {
        /// When the window next opens (Unix ms), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opens_at_unix_ms: Option<u64>,
    },
    /// An operator cancelled it (`inplace-updater.dev/cancel=value`): it stops after the running step.
    Cancelled {
        /// The cancel annotation's value.
        value: String,
    },
    /// The server is setting CAPI's `cluster.x-k8s.io/skip-remediation` guard on the Machine (to `value`) before
    /// a step that can take the node down starts.
    RemediationGuard {
        /// The annotation value the server sets (`inplace-updater:<run id>`).
        value: String,
    },
    /// A reason a newer server sent that this version does not know: held, not cancelled.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for HoldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Paused { by } => write!(f, "paused by {by}"),
            Self::Window {
                opens_at_unix_ms: Some(at),
            } => write!(f, "outside the maintenance window (opens at Unix ms {at})"),
            Self::Window { .. } => write!(f, "outside the maintenance window"),
            Self::Cancelled { value } => write!(f, "cancelled by operator ({value})"),
            Self::RemediationGuard { value } => write!(
                f,
                "waiting for the remediation guard (cluster.x-k8s.io/skip-remediation={value}) on the Machine"
            ),
            Self::Other => write!(f, "held by the server"),
        }
    }
}

/// Body of `POST /agent/v1/poll`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollRequest {
    /// Who is asking.
    pub agent: AgentIdentity,
    /// The plan the agent holds, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<PlanProgress>,
    /// How long the agent is willing to wait for work, in seconds; the server caps it at
    /// [`crate::MAX_WAIT_SECONDS`]. 0 asks for an immediate answer.
    #[serde(default)]
    pub wait_seconds: u32,
    /// What the agent says about itself (absent from agents before 0.2: they are offered no upkeep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<AgentFacts>,
}

/// Answer of `POST /agent/v1/poll` (HTTP 200). `plan` is present when there is a plan for that
/// machine that the agent has not finished (its id differs from `current.planId`, or the agent
/// reported it `running`); absent means "nothing to do, poll again".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollResponse {
    /// The plan to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// The hold on the agent's current plan (or on `plan`), if any: start no new step of it. Absent
    /// means go on (and lifts a hold the agent had).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// What to do when a step of the plan fails; absent (older servers, or the default): roll back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// Run this agent executable instead (only while no plan step is running or unreported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_upgrade: Option<AgentUpgrade>,
    /// The successor of the token this request used: write it, then use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<TokenOffer>,
    /// SHA-256 of the CA bundle the agent should trust; when it differs from the agent's, the agent fetches
    /// [`crate::CA_PATH`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_sha256: Option<String>,
}

impl PollResponse {
    /// The "nothing to do" answer.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// An answer carrying a plan.
    pub fn with_plan(plan: Plan) -> Self {
        Self {
            plan: Some(plan),
            ..Self::default()
        }
    }
}

/// State of one step in a [`StepReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepStatus {
    /// Started, not finished.
    Running,
    /// Finished; the desired state holds.
    Succeeded,
    /// Finished with an error; the plan stops here.
    Failed,
}

/// Body of `POST /agent/v1/report`: one step's progress or result. Reports are idempotent: the
/// agent re-sends a report until it gets a 2xx, so the server may see the same one twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReport {
    /// Who is reporting.
    pub agent: AgentIdentity,
    /// The plan id the step belongs to.
    pub plan_id: String,
    /// The step's index in that plan.
    pub step_index: u32,
    /// Running, succeeded or failed.
    pub status: StepStatus,
    /// How many times the agent started this step (more than 1 after an agent restart or a node
    /// reboot interrupted it).
    #[serde(default = "one")]
    pub attempt: u32,
    /// When the step (this attempt) started, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_unix_ms: Option<u64>,
    /// When it finished, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_unix_ms: Option<u64>,
    /// Exit code of the command that ended the step, when a command ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Last bytes of that command's stderr, at most [`crate::STDERR_TAIL_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// What happened, for operators (`already at v1.34.1`, `timed out after 600 s`, the error),
    /// at most [`crate::MESSAGE_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// True when the report is about undoing step `step_index` during a rollback, not about running it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub undo: bool,
    /// The rollback's summary, on the report of the failed step that started a rollback and on every undo's
    /// report, so the server knows a rollback is under way before the next poll (absent: no rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackProgress>,
}

fn one() -> u32 {
    1
}

/// Body of `POST /agent/v1/inventory`: facts about the node, sent when the agent starts, after
/// each reconnect and when a fact changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    /// Who is reporting.
    pub agent: AgentIdentity,
    /// The agent's own version.
    pub agent_version: String,
    /// Output of the configured kubelet version command (e.g. `v1.34.1`), when it worked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// Output of the configured kubeadm version command, when it worked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeadm_version: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`: changes on every reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The node's hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The plan the agent holds, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<PlanProgress>,
    /// What the agent says about itself (absent from agents before 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<AgentFacts>,
    /// What the node's container runtime reports (its agent config's `runtime.versions` commands; absent from
    /// agents that do not know the containerRuntime step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeVersions>,
}

/// The container runtime's versions as the node's version commands print them (their first line), each absent
/// when its command failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeVersions {
    /// `containerd --version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd: Option<String>,
    /// `runc --version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runc: Option<String>,
    /// The CNI plugins' version command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_plugins: Option<String>,
}

/// Answer of `report` and `inventory` on success (HTTP 200, `{}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckResponse {
    /// On a report's ack: the hold on the reported plan, if any (absent: go on). The agent starts the
    /// next step only after the previous step's report was acked without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// Body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// What was wrong, for the agent's log (never secrets).
    pub message: String,
}
