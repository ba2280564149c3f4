//! Capped exponential back-off with jitter for reconnects and retries.

use std::time::Duration;

/// First delay after a failure.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// Delays never exceed this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Each failure multiplies the delay by this much.
const BACKOFF_FACTOR: u32 = 2;

/// Back-off state: `delay = min(BACKOFF_MAX, BACKOFF_INITIAL * 2^failures)`, of which a random
/// 50–100 % is slept ("equal jitter"), so a thousand agents cut off together do not come back in
/// lockstep.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    /// Forget past failures.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// The next delay to sleep, counting one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let exp =
            BACKOFF_INITIAL.saturating_mul(BACKOFF_FACTOR.saturating_pow(self.failures.min(16)));
        let cap = exp.min(BACKOFF_MAX);
        self.failures = self.failures.saturating_add(1);
        let half = cap / 2;
        half + half.mul_f64(random_unit())
    }
}

/// A uniform number in [0, 1) from the TLS provider's system RNG (falls back to 0.5).
pub(crate) fn random_unit() -> f64 {
    let mut bytes = [0u8; 8];
    match rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
    {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
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
