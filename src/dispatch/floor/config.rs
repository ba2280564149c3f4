//! Dispatch's tunables and their defaults.

use std::time::Duration;

/// Default `retryAfterSeconds` while an update is in progress with `--retry-after fixed`; with `adaptive` (the
/// default), the answer while waiting for an agent not connected, while held, and the most answered while a
/// remaining step's duration is still a guess.
pub const DEFAULT_RETRY_AFTER_SECONDS: i32 = 5;
/// Default longest adaptive `retryAfterSeconds` (`--retry-after-max-seconds`).
pub const DEFAULT_RETRY_AFTER_MAX_SECONDS: i32 = 30;
/// Largest value `--retry-after-max-seconds` accepts.
pub const RETRY_AFTER_MAX_SECONDS_LIMIT: i32 = 300;
/// Smallest `retryAfterSeconds` answered while in progress (0 would mean "done" to CAPI).
pub const MIN_RETRY_AFTER_SECONDS: i32 = 1;
/// Default time finished updates are kept before retention deletes them.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default time a verdict is kept: longer than CAPI's 24 h cache of CanUpdateMachineSet answers.
pub const DEFAULT_VERDICT_RETENTION: Duration = Duration::from_secs(72 * 3600);
/// Default `--agent-token-grace`: how long a rotated agent token keeps working after its successor was first
/// used (a request already under way with the old token, an agent restarted between its two files).
pub const DEFAULT_AGENT_TOKEN_GRACE: Duration = Duration::from_secs(3600);
/// How often each replica publishes its presence: a heartbeat ("alive at T"), and its membership (the agents it
/// serves) when that changed since. A connected agent's last contact, as other replicas read it, is its
/// replica's last heartbeat: exact to this interval (its own replica knows it to the millisecond).
pub const PRESENCE_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// A replica whose heartbeat is older than this is dead: the agents it listed count as not connected (their
/// last contact stays its last heartbeat) until they reach another replica, which takes them over.
pub const PRESENCE_STALE_AFTER: Duration = Duration::from_secs(30);
/// A dead replica's presence is swept this long after its last heartbeat, once its agents' last contact is
/// written to their own records (those no live replica lists).
pub const PRESENCE_SWEEP_AFTER: Duration = Duration::from_secs(600);

/// How `retryAfterSeconds` is chosen while a run is in progress (`--retry-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RetryAfterMode {
    /// From the run's expected remaining time, between [`MIN_RETRY_AFTER_SECONDS`] and the maximum.
    #[default]
    Adaptive,
    /// Always `--retry-after-seconds` (the behaviour before adaptive answers).
    Fixed,
}

/// Largest `--max-concurrent-updates` (and per-label limit) accepted: a pool's slots are walked one by one.
pub const MAX_CONCURRENT_UPDATES_LIMIT: u32 = super::slots::MAX_SLOTS;

/// `--max-concurrent-updates-per-label KEY=N`: at most `limit` runs in progress per value of the Machine label
/// `key` (a Machine without the label counts under the empty value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelBudget {
    /// The Machine label's key, e.g. `topology.kubernetes.io/zone`.
    pub key: String,
    /// Most runs in progress per value of it.
    pub limit: u32,
}

/// Why a `--max-concurrent-updates-per-label` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelBudgetError {
    /// Not `KEY=N`.
    #[error("{0:?}: expected KEY=N, e.g. topology.kubernetes.io/zone=2")]
    Shape(String),
    /// The key is not a Kubernetes label key.
    #[error(
        "{0:?}: not a label key (at most 317 characters of letters, digits, '-', '_', '.', '/')"
    )]
    Key(String),
    /// The limit is not a number from 1 to [`MAX_CONCURRENT_UPDATES_LIMIT`].
    #[error("{0:?}: the limit must be a number from 1 to {MAX_CONCURRENT_UPDATES_LIMIT}")]
    Limit(String),
}

impl std::str::FromStr for LabelBudget {
    type Err = LabelBudgetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (key, limit) = text
            .rsplit_once('=')
            .ok_or_else(|| LabelBudgetError::Shape(text.to_owned()))?;
        let key_ok = !key.is_empty()
            && key.len() <= 317
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !key_ok {
            return Err(LabelBudgetError::Key(key.to_owned()));
        }
        let limit = limit
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_CONCURRENT_UPDATES_LIMIT).contains(n))
            .ok_or_else(|| LabelBudgetError::Limit(limit.to_owned()))?;
        Ok(LabelBudget {
            key: key.to_owned(),
            limit,
        })
    }
}

/// The fleet-wide update budget: how many runs may be in progress at once across every cluster and replica.
/// The default (no limit at all) admits every run, as before the budget existed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpdateBudget {
    /// `--max-concurrent-updates`: most runs in progress fleet-wide; `None`: unlimited.
    pub total: Option<u32>,
    /// `--max-concurrent-updates-per-label`: most runs in progress per value of a Machine label.
    pub per_label: Vec<LabelBudget>,
}

impl UpdateBudget {
    /// Whether any limit is set (else runs are admitted without reading a slot).
    pub fn limited(&self) -> bool {
        self.total.is_some() || !self.per_label.is_empty()
    }
}

/// Tunables of dispatch.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// `retryAfterSeconds` while in progress with [`RetryAfterMode::Fixed`]; see [`DEFAULT_RETRY_AFTER_SECONDS`].
    pub retry_after_seconds: i32,
    /// Fixed or adaptive `retryAfterSeconds`.
    pub retry_after: RetryAfterMode,
    /// Longest adaptive `retryAfterSeconds`.
    pub retry_after_max_seconds: i32,
    /// How long finished runs are kept.
    pub retention: Duration,
    /// How long CanUpdate verdicts (and UpdateMachine refusals) are kept.
    pub verdict_retention: Duration,
    /// How long a rotated agent token keeps working after its successor was first used.
    pub agent_token_grace: Duration,
    /// The fleet-wide update budget (default: unlimited).
    pub budget: UpdateBudget,
    /// Whether runs are guarded from remediation (a management-cluster client is configured): a new run whose
    /// plan can take the node down starts no step until the guard reconcile loop settled its guard.
    pub remediation_guard: bool,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            retry_after_seconds: DEFAULT_RETRY_AFTER_SECONDS,
            retry_after: RetryAfterMode::default(),
            retry_after_max_seconds: DEFAULT_RETRY_AFTER_MAX_SECONDS,
            retention: DEFAULT_RETENTION,
            verdict_retention: DEFAULT_VERDICT_RETENTION,
            agent_token_grace: DEFAULT_AGENT_TOKEN_GRACE,
            budget: UpdateBudget::default(),
            remediation_guard: false,
        }
    }
}
