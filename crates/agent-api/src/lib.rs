//! The agent ⇄ server protocol of inplace-updater, shared by both sides and nothing else.
//!
//! Wire types only: serde derives, named limits, the table of step kinds ([`StepKind`]) and pure
//! validation helpers. No I/O.
//! JSON field names are camelCase (Kubernetes style). Every request carries
//! `Authorization: Bearer <token>`; the server checks it. See `README.md` for the full contract.

mod kinds;
mod messages;
mod plan;
mod secret;
mod upkeep;
mod validate;

pub use kinds::{StepKind, UNSUPPORTED_GUESS_SECONDS, Undo};
pub use messages::{
    AckResponse, AgentIdentity, ErrorResponse, Hold, HoldReason, InventoryReport, OnFailure,
    PlanProgress, PlanStatus, PollRequest, PollResponse, RollbackProgress, RollbackState,
    RuntimeVersions, StepReport, StepStatus,
};
pub use plan::{
    FileEncoding, FileSpec, KubeadmUpgradeMode, KubeletArg, MachineRef, Plan, RebootWhen, SshUser,
    Step, StepAction,
};
pub use secret::SecretString;
pub use upkeep::{
    AgentFacts, AgentUpgrade, BINARY_PATH, CA_PATH, MAX_AGENT_BINARY_BYTES, MAX_CA_BUNDLE_BYTES,
    TokenOffer, UpgradeOutcome, go_arch, is_sha256_hex,
};
pub use validate::{
    PlanError, ReportError, is_valid_kubernetes_version, parse_mode, truncate_tail,
    validate_action, validate_plan, validate_plan_structure, validate_report,
};

/// Common prefix of every agent endpoint.
pub const API_PREFIX: &str = "/agent/v1";
/// `POST`: long-poll for work. Body [`PollRequest`], answer [`PollResponse`].
pub const POLL_PATH: &str = "/agent/v1/poll";
/// `POST`: one step's progress or result. Body [`StepReport`], answer [`AckResponse`].
pub const REPORT_PATH: &str = "/agent/v1/report";
/// `POST`: facts about the node. Body [`InventoryReport`], answer [`AckResponse`].
pub const INVENTORY_PATH: &str = "/agent/v1/inventory";

/// Longest a poll may be held open by the server, in seconds. The server answers at once when
/// there is a plan the agent has not finished, else "nothing" after at most
/// `min(request.wait_seconds, MAX_WAIT_SECONDS)`.
pub const MAX_WAIT_SECONDS: u32 = 30;
/// The wait an agent asks for by default (a little under [`MAX_WAIT_SECONDS`] so proxies with a
/// 30 s idle timeout never cut an idle poll).
pub const DEFAULT_WAIT_SECONDS: u32 = 25;
/// Extra time a client waits beyond `wait_seconds` before it calls a poll dead.
pub const POLL_GRACE_SECONDS: u32 = 15;

/// Bound on the stderr tail in a [`StepReport`], in bytes (the last bytes are kept).
pub const STDERR_TAIL_MAX_BYTES: usize = 4096;
/// Bound on the free-text `message` of a [`StepReport`], in bytes.
pub const MESSAGE_MAX_BYTES: usize = 1024;
/// Largest request body an agent sends (poll, report, inventory); the server may refuse more.
pub const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024;
/// Largest poll answer (a plan with file contents) an agent accepts.
pub const MAX_POLL_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// Most steps one plan may hold.
pub const MAX_STEPS: usize = 64;
/// Longest timeout one step may ask for, in seconds (1 h: a kubeadm upgrade plus image pulls).
pub const MAX_STEP_TIMEOUT_SECONDS: u32 = 3600;
/// Shortest timeout one step may ask for, in seconds.
pub const MIN_STEP_TIMEOUT_SECONDS: u32 = 1;
/// Timeout a server should give a step when it has no better idea, in seconds.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: u32 = 600;
/// Longest OS image name in an `osImage` step, in bytes (an image URL with its query, a registry reference
/// with its digest).
pub const MAX_OS_IMAGE_BYTES: usize = 2048;
/// Longest plan id accepted, in bytes (ids are hashes, e.g. 64 hex digits).
pub const MAX_PLAN_ID_BYTES: usize = 128;
