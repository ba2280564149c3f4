//! Log output off the request path: every line is handed to a queue and written to stderr by a thread of its
//! own ([`tracing_appender::non_blocking`]), so a hook call never waits on a `write(2)` — and a stderr nobody
//! reads fast enough (a stalled container log pipe) cannot stall the server. The queue holds at most
//! [`LOG_BUFFER_LINES`] lines; past that, lines are dropped rather than blocking, and counted in
//! `inplace_updater_log_lines_dropped_total`. The thread writes whatever is queued when it wakes with one
//! `write(2)` (up to [`LOG_WRITE_BYTES`]) and flushes as soon as the queue is empty: under load that is one
//! system call for many lines instead of one per line, and a line never waits for more to come.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// Lines the log queue holds before new ones are dropped (about 10 s of the busiest hook load measured here,
/// at one line per call).
pub const LOG_BUFFER_LINES: usize = 131_072;

/// Most bytes of queued lines the log thread gathers into one `write(2)`: lines queued when it wakes are written
/// together, flushed once the queue is empty or this much is gathered.
pub const LOG_WRITE_BYTES: usize = 64 * 1024;

/// Kept until [`flush`]: dropping it writes out what is queued.
static GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);
/// Lines dropped because the queue was full.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// A writer for the log subscriber that queues lines for a thread writing them to `out`. Call once per
/// process (later calls get a writer of their own, but the dropped-lines metric follows the first).
pub fn off_request_path<W: Write + Send + 'static>(out: W) -> NonBlocking {
    let (writer, guard) = queued(out);
    let _ = DROPPED.set(writer.error_counter());
    let mut slot = GUARD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if slot.is_none() {
        *slot = Some(guard);
    }
    writer
}

/// The queue and its thread, writing to `out`.
fn queued<W: Write + Send + 'static>(out: W) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .thread_name("log-writer")
        // tracing-appender's thread drains its queue into the writer, then flushes it.
        .finish(std::io::BufWriter::with_capacity(LOG_WRITE_BYTES, out))
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

    /// An output that counts its `write(2)`s and keeps the bytes; each write waits until `open`.
    #[derive(Clone, Default)]
    struct Counted {
        seen: Arc<Mutex<(usize, Vec<u8>)>>,
        open: Arc<AtomicBool>,
    }

    impl Write for Counted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            {
                let mut seen = self.seen.lock().unwrap();
                seen.0 += 1;
                seen.1.extend_from_slice(buf);
            }
            while !self.open.load(Ordering::SeqCst) {
                std::thread::park_timeout(std::time::Duration::from_millis(1));
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_lone_line_is_written_at_once_and_lines_queued_meanwhile_share_writes() {
        let out = Counted::default();
        let (writer, guard) = queued(out.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("first line");
            // Written without a flush and without more lines to fill the buffer (the write then waits).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !String::from_utf8_lossy(&out.seen.lock().unwrap().1).contains("first line") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a lone line waited for more"
                );
                std::thread::yield_now();
            }
            // Queued while that write is on its way.
            for i in 0..2_000 {
                tracing::info!(i, "hook answered");
            }
        });
        out.open.store(true, Ordering::SeqCst);
        drop(guard);
        let (writes, bytes) = &*out.seen.lock().unwrap();
        let text = String::from_utf8_lossy(bytes);
        assert_eq!(text.lines().count(), 2_001, "every line whole");
        assert!(text.lines().all(|line| line.contains("INFO")), "{text}");
        assert!(
            *writes <= 1 + 2 * (bytes.len() / LOG_WRITE_BYTES + 1),
            "{writes} writes for 2 001 lines ({} bytes): queued lines are written together",
            bytes.len()
        );
    }

    #[test]
    fn a_stalled_stderr_drops_and_counts_lines_instead_of_blocking_the_caller() {
        let released = Arc::new(AtomicBool::new(false));
        let writer = off_request_path(Stalled(released.clone()));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        // The log thread holds what fits its write buffer (lines of at least 16 bytes) and blocks.
        let lines = LOG_BUFFER_LINES + LOG_WRITE_BYTES / 16 + 1_000;
        // The caller returns although nothing can be written: the lines past the queue are dropped.
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..lines {
                tracing::info!(i, "hook answered");
            }
        });
        assert!(
            dropped_lines() >= 999,
            "{} lines dropped of {lines} written into a queue of {LOG_BUFFER_LINES} and a buffer of {LOG_WRITE_BYTES} bytes",
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
