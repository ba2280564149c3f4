//! Log output off the request path: every line is handed to a queue and written to stderr by a thread of its
//! own ([`tracing_appender::non_blocking`]), so a hook call never waits on a `write(2)` — and a stderr nobody
//! reads fast enough (a stalled container log pipe) cannot stall the server. The queue holds at most
//! [`LOG_BUFFER_LINES`] lines; past that, lines are dropped rather than blocking, and counted in
//! `inplace_updater_log_lines_dropped_total`.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// Lines the log queue holds before new ones are dropped (about 10 s of the busiest hook load measured here,
/// at one line per call).
pub const LOG_BUFFER_LINES: usize = 131_072;

/// Kept until [`flush`]: dropping it writes out what is queued.
static GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);
/// Lines dropped because the queue was full.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// A writer for the log subscriber that queues lines for a thread writing them to `out`. Call once per
/// process (later calls get a writer of their own, but the dropped-lines metric follows the first).
pub fn off_request_path<W: Write + Send + 'static>(out: W) -> NonBlocking {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .thread_name("log-writer")
        .finish(out);
    let _ = DROPPED.set(writer.error_counter());
    let mut slot = GUARD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if slot.is_none() {
        *slot = Some(guard);
    }
    writer
}

/// Writes out every queued line (waits for the log thread, which tracing-appender bounds at 1 s). Call before
/// the process exits: `std::process::exit` runs no destructors.
pub fn flush() {
    let guard = GUARD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    drop(guard);
}

/// Lines dropped so far because the queue was full.
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64)
}

/// Exports [`dropped_lines`] as `log_lines_dropped_total` (under the registry's prefix).
#[derive(Debug, Default)]
pub struct LogCollector;

impl Collector for LogCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dropped = ConstCounter::new(dropped_lines());
        let metric = encoder.encode_descriptor(
            "log_lines_dropped",
            "Log lines dropped because stderr was not read fast enough (the queue holds LOG_BUFFER_LINES)",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A stderr whose reader has stopped: every write blocks until released.
    struct Stalled(Arc<AtomicBool>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while !self.0.load(Ordering::SeqCst) {
                std::thread::park_timeout(std::time::Duration::from_millis(5));
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stderr_drops_and_counts_lines_instead_of_blocking_the_caller() {
        let released = Arc::new(AtomicBool::new(false));
        let writer = off_request_path(Stalled(released.clone()));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        let lines = LOG_BUFFER_LINES + 1_000;
        // The caller returns although nothing can be written: the lines past the queue are dropped.
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..lines {
                tracing::info!(i, "hook answered");
            }
        });
        assert!(
            dropped_lines() >= 999,
            "{} lines dropped of {lines} written into a queue of {LOG_BUFFER_LINES}",
            dropped_lines()
        );
        let mut registry = prometheus_client::registry::Registry::with_prefix("inplace_updater");
        registry.register_collector(Box::new(LogCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(&format!(
                "inplace_updater_log_lines_dropped_total {}",
                dropped_lines()
            )),
            "{text}"
        );
        released.store(true, Ordering::SeqCst);
        flush();
    }
}
