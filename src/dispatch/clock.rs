//! The one clock dispatch reads: every time it records, compares or answers with (run and verdict times,
//! agents' last-seen, refusals, maintenance windows, adaptive `retryAfterSeconds`) comes from the
//! [`Dispatcher`]'s [`Clock`]. It is the system clock, unless a test pins it (then it moves only when the test
//! advances it), or the hidden test-only serve flag `--test-window-clock-file` points it at a file.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Dispatcher, now_ms};

/// The clock dispatch reads. Only tests set it; otherwise it is the system clock ([`now_ms`]).
#[derive(Debug, Default)]
pub struct Clock {
    /// Pinned Unix ms; 0 means "not pinned".
    pinned_ms: AtomicU64,
    /// Test-only: a file holding the Unix ms to use, read at every look.
    file: OnceLock<PathBuf>,
}

impl Clock {
    /// Now, in Unix ms.
    pub fn now_ms(&self) -> u64 {
        if let Some(path) = self.file.get() {
            // A file a test is rewriting may be caught empty: then the system clock, as without one.
            let pinned = std::fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok());
            if let Some(pinned) = pinned {
                return pinned;
            }
        }
        match self.pinned_ms.load(Ordering::Relaxed) {
            0 => now_ms(),
            pinned => pinned,
        }
    }

    /// Test-only: read the instant (Unix ms, decimal) from `path` at every look.
    pub fn follow_file_for_tests(&self, path: PathBuf) {
        let _ = self.file.set(path);
    }

    /// Test-only: it is `unix_ms` from now on, until pinned again or advanced (0: back to the system clock).
    pub fn pin_for_tests(&self, unix_ms: u64) {
        self.pinned_ms.store(unix_ms, Ordering::Relaxed);
    }

    /// Test-only: moves the clock `by` forward (from the system clock's now when it was not pinned) and
    /// keeps it pinned there. Returns the new instant (Unix ms).
    pub fn advance_for_tests(&self, by: Duration) -> u64 {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let mut next = 0;
        let _ = self
            .pinned_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |pinned| {
                let from = if pinned == 0 { now_ms() } else { pinned };
                next = from.saturating_add(by);
                Some(next)
            });
        next
    }
}

impl Dispatcher {
    /// The clock dispatch reads (tests pin and advance it).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_clock_moves_only_when_advanced() {
        let clock = Clock::default();
        clock.pin_for_tests(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        assert_eq!(clock.advance_for_tests(Duration::from_millis(2_500)), 3_500);
        assert_eq!(clock.now_ms(), 3_500);
        clock.pin_for_tests(0);
        let system = clock.now_ms();
        assert!(system > 3_500, "back on the system clock: {system}");
        // Advancing an unpinned clock pins it that far past the system clock's now.
        let pinned = clock.advance_for_tests(Duration::from_secs(3600));
        assert!(pinned >= system + 3_600_000, "{pinned} vs {system}");
        assert_eq!(clock.now_ms(), pinned);
    }
}
