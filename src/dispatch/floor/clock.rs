//! The clock every wing reads: the system clock, or an instant a test pins (or reads from a file, for the
//! end-to-end tests' server processes). One clock, so runs, holds, windows, verdicts and last-seen times all
//! agree on "now".

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Milliseconds since the Unix epoch, by the system clock.
pub fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The clock dispatch judges by. Only tests set it (a pinned instant, or the hidden test-only serve flag
/// `--test-window-clock-file`); otherwise it is the system clock.
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
            0 => system_ms(),
            pinned => pinned,
        }
    }

    /// Test-only: read the instant (Unix ms, decimal) from `path` at every look.
    pub fn follow_file_for_tests(&self, path: PathBuf) {
        let _ = self.file.set(path);
    }

    /// Test-only: judge as if it were `unix_ms` from now on (0: back to the system clock).
    pub fn pin_for_tests(&self, unix_ms: u64) {
        self.pinned_ms.store(unix_ms, Ordering::Relaxed);
    }

    /// Test-only: moves a pinned clock `by` forward.
    pub fn advance_for_tests(&self, by: std::time::Duration) {
        self.pinned_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}
