//! Capped exponential back-off with jitter for reconnects and retries: `backon`'s exponential builder, set up
//! for "equal jitter" ([`equal_jitter`]).

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

/// First delay after a failure.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// Delays never exceed this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Each failure multiplies the delay by this much.
const BACKOFF_FACTOR: f32 = 2.0;

/// Back-off state: `delay = min(BACKOFF_MAX, BACKOFF_INITIAL * 2^failures)`, of which a random
/// 50–100 % is slept ("equal jitter"), so a thousand agents cut off together do not come back in
/// lockstep.
#[derive(Debug)]
pub struct Backoff {
    delays: ExponentialBackoff,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            delays: equal_jitter(BACKOFF_INITIAL, BACKOFF_MAX).build(),
        }
    }
}

impl Backoff {
    /// Forget past failures.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// The next delay to sleep, counting one more failure.
    pub fn next_delay(&mut self) -> Duration {
        // The builder sets no attempt limit: the sequence never ends.
        self.delays.next().unwrap_or(BACKOFF_MAX)
    }
}

/// Delays `min(max, initial * 2^n)` for n = 0, 1, …, each cut to a random 50–100 % of itself. backon's
/// jitter adds a random 0–100 % of a delay on top of it, so the builder runs on the halves.
pub(crate) fn equal_jitter(initial: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(initial / 2)
        .with_max_delay(max / 2)
        .with_factor(BACKOFF_FACTOR)
        .with_jitter()
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let mut backoff = Backoff::default();
        let first = backoff.next_delay();
        assert!(
            first >= BACKOFF_INITIAL / 2 && first <= BACKOFF_INITIAL,
            "{first:?}"
        );
        let delays: Vec<Duration> = (0..20).map(|_| backoff.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= BACKOFF_MAX));
        assert!(delays[15..].iter().all(|d| *d >= BACKOFF_MAX / 2));
        // Jitter: not all capped delays are equal.
        assert!(delays[15..].windows(2).any(|w| w[0] != w[1]));
        backoff.reset();
        assert!(backoff.next_delay() <= BACKOFF_INITIAL);
    }
}
