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
/// How often an agent's last-seen time is persisted at most (each replica keeps the exact time in memory).
pub const LAST_SEEN_PERSIST_INTERVAL: Duration = Duration::from_secs(60);

/// How `retryAfterSeconds` is chosen while a run is in progress (`--retry-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RetryAfterMode {
    /// From the run's expected remaining time, between [`MIN_RETRY_AFTER_SECONDS`] and the maximum.
    #[default]
    Adaptive,
    /// Always `--retry-after-seconds` (the behaviour before adaptive answers).
    Fixed,
}

/// Tunables of dispatch.
#[derive(Debug, Clone, Copy)]
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
        }
    }
}
