//! Automatic retries of a sequence's `retryable` commands: the sequence's `retry` policy (attempts,
//! initial and maximum delay) and the jittered exponential delay between attempts. Only a command the
//! operator marked `retryable: true` is retried, and only when it exited non-zero: a transient download
//! (`apt-get update`, `dnf`, `curl`) is worth another try, while a timeout (the step's deadline is
//! spent), a signal (someone stopped it on purpose) or a program that cannot start are not.

use std::time::Duration;

use serde::Deserialize;

/// Most attempts a retry policy may ask for (the first run included).
pub const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Longest delay between two attempts a retry policy may ask for.
pub const MAX_RETRY_DELAY_SECONDS: u32 = 3600;

/// `retry:` of a command sequence: how often, and how far apart, its `retryable` commands run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first run included (2..=[`MAX_RETRY_ATTEMPTS`]).
    pub attempts: u32,
    /// Delay before the second attempt; each later one doubles it, up to `maxDelaySeconds`.
    pub initial_delay_seconds: u32,
    /// Cap of the delay (<= [`MAX_RETRY_DELAY_SECONDS`]).
    pub max_delay_seconds: u32,
}

impl RetryPolicy {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=MAX_RETRY_ATTEMPTS).contains(&self.attempts) {
            return Err(format!(
                "retry.attempts is {}; it counts the first run too, so 2 to {MAX_RETRY_ATTEMPTS}",
                self.attempts
            ));
        }
        if self.max_delay_seconds > MAX_RETRY_DELAY_SECONDS {
            return Err(format!(
                "retry.maxDelaySeconds is {}, over the limit of {MAX_RETRY_DELAY_SECONDS}",
                self.max_delay_seconds
            ));
        }
        if self.initial_delay_seconds > self.max_delay_seconds {
            return Err(format!(
                "retry.initialDelaySeconds ({}) is over retry.maxDelaySeconds ({})",
                self.initial_delay_seconds, self.max_delay_seconds
            ));
        }
        Ok(())
    }

    /// The delay before the next attempt after `failures` failed ones (1 = the first run failed):
    /// `min(max, initial * 2^(failures-1))`, of which a random 50–100 % is waited ("equal jitter"), so the
    /// nodes of a rollout that hit one mirror outage do not come back in lockstep.
    pub fn delay_after(&self, failures: u32) -> Duration {
        use backon::BackoffBuilder as _;
        let max = Duration::from_secs(u64::from(self.max_delay_seconds));
        let initial = Duration::from_secs(u64::from(self.initial_delay_seconds));
        // The failure count survives a restart (it is in the step's progress), so the sequence is
        // walked from its start each time rather than kept.
        crate::backoff::equal_jitter(initial, max)
            .build()
            .nth(failures.saturating_sub(1).min(31) as usize)
            .unwrap_or(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_with_jitter() {
        let policy = RetryPolicy {
            attempts: 5,
            initial_delay_seconds: 10,
            max_delay_seconds: 30,
        };
        for (failures, cap) in [(1, 10), (2, 20), (3, 30), (4, 30), (40, 30)] {
            let delay = policy.delay_after(failures);
            let cap = Duration::from_secs(cap);
            assert!(delay >= cap / 2 && delay <= cap, "{failures}: {delay:?}");
        }
        assert!(
            (0..20)
                .map(|_| policy.delay_after(3))
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1,
            "jittered"
        );
    }

    #[test]
    fn bounds_are_checked() {
        let ok = RetryPolicy {
            attempts: 3,
            initial_delay_seconds: 10,
            max_delay_seconds: 300,
        };
        assert_eq!(ok.validate(), Ok(()));
        for bad in [
            RetryPolicy { attempts: 1, ..ok },
            RetryPolicy {
                attempts: MAX_RETRY_ATTEMPTS + 1,
                ..ok
            },
            RetryPolicy {
                max_delay_seconds: MAX_RETRY_DELAY_SECONDS + 1,
                ..ok
            },
            RetryPolicy {
                initial_delay_seconds: 301,
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
