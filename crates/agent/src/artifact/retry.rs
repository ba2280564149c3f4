//! Retrying a fetch through a registry outage (issue 43.5): which failures are transient — no connection or a
//! dropped one, a 5xx, a 429, a token endpoint that is down, a request that timed out, a body cut short — and
//! how long to wait before the next attempt: the policy's jittered exponential back-off, or the server's
//! `Retry-After` when that is longer (at most [`MAX_FETCH_RETRY_AFTER`]). A 401, a 404, a digest mismatch, a
//! certificate the CA file does not vouch for or an artifact over the size limit is an answer a retry would
//! only repeat: those fail at once.

use std::time::Duration;

use super::error::FetchErrorKind;
use crate::retry::RetryPolicy;

/// The retries of a fetch when the agent config sets no `artifacts.retry`: 6 attempts in all, 1 s before the
/// second, doubling up to 30 s between two (each jittered to 50–100 %): about a minute of registry outage is
/// ridden out, always within the step's timeout.
pub const DEFAULT_FETCH_RETRY: RetryPolicy = RetryPolicy {
    attempts: 6,
    initial_delay_seconds: 1,
    max_delay_seconds: 30,
};

/// Longest `Retry-After` (of a 429 or a 5xx) the fetcher waits for; a longer one is waited for this long.
pub const MAX_FETCH_RETRY_AFTER: Duration = Duration::from_secs(300);

impl FetchErrorKind {
    /// Whether another attempt may succeed: the registry (or the network to it) was unavailable, not wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport { transient, .. } | Self::Token { transient, .. } => *transient,
            // 501 Not Implemented and 505 HTTP Version Not Supported say the same thing every time.
            Self::Server { status, .. } => !matches!(status, 501 | 505),
            Self::Status { status, .. } => matches!(status, 408 | 429),
            Self::Timeout { .. } | Self::Truncated { .. } => true,
            _ => false,
        }
    }

    /// The `Retry-After` the answer asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Server { retry_after, .. } | Self::Status { retry_after, .. } => {
                retry_after.map(Duration::from_secs)
            }
            _ => None,
        }
    }
}

/// The wait before the next attempt after `failures` failed ones, the last of them with `cause`.
pub(crate) fn delay(policy: &RetryPolicy, failures: u32, cause: &FetchErrorKind) -> Duration {
    let backoff = policy.delay_after(failures);
    match cause.retry_after() {
        Some(asked) => backoff.max(asked.min(MAX_FETCH_RETRY_AFTER)),
        None => backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status: u16, retry_after: Option<u64>) -> FetchErrorKind {
        FetchErrorKind::Server {
            url: "https://r.example/v2/k/blobs/sha256:ab".into(),
            status,
            message: String::new(),
            retry_after,
        }
    }

    fn status(status: u16, retry_after: Option<u64>) -> FetchErrorKind {
        FetchErrorKind::Status {
            url: "https://r.example/v2/k/manifests/sha256:ab".into(),
            status,
            message: String::new(),
            retry_after,
        }
    }

    #[test]
    fn an_outage_is_transient_a_wrong_answer_is_not() {
        let transport = |transient| FetchErrorKind::Transport {
            url: "https://r.example/v2/".into(),
            reason: "connection refused".into(),
            transient,
        };
        for transient in [
            server(503, None),
            server(500, None),
            status(429, Some(1)),
            status(408, None),
            transport(true),
            FetchErrorKind::Truncated {
                got: 5,
                expected: 10,
            },
            FetchErrorKind::Timeout {
                what: "https://r.example/v2/".into(),
                seconds: 30,
            },
        ] {
            assert!(transient.is_transient(), "{transient}");
        }
        for permanent in [
            FetchErrorKind::Unauthorized {
                url: "u".into(),
                hint: "h".into(),
            },
            FetchErrorKind::NotFound {
                url: "u".into(),
                message: "MANIFEST_UNKNOWN".into(),
            },
            FetchErrorKind::DigestMismatch {
                expected: "a".into(),
                actual: "b".into(),
            },
            FetchErrorKind::TooLarge { size: 2, limit: 1 },
            status(403, None),
            status(416, None),
            server(501, None),
            transport(false),
        ] {
            assert!(!permanent.is_transient(), "{permanent}");
        }
    }

    #[test]
    fn retry_after_is_honoured_when_longer_than_the_backoff_up_to_its_cap() {
        let policy = RetryPolicy {
            attempts: 5,
            initial_delay_seconds: 1,
            max_delay_seconds: 4,
        };
        let asked = delay(&policy, 1, &status(429, Some(20)));
        assert_eq!(asked, Duration::from_secs(20));
        let short = delay(&policy, 3, &server(503, Some(0)));
        assert!(short >= Duration::from_secs(2) && short <= Duration::from_secs(4));
        let capped = delay(&policy, 1, &server(503, Some(100_000)));
        assert_eq!(capped, MAX_FETCH_RETRY_AFTER);
        let plain = delay(&policy, 1, &server(502, None));
        assert!(plain <= Duration::from_secs(1));
    }
}
