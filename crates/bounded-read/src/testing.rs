//! Test support (feature `test-support`): sources with more bytes than a reader's limit and no size to
//! look at — a FIFO fed by a thread, `/dev/zero` — and the process's peak memory, so every crate's reader
//! tests show a refusal with bounded memory.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Bytes written per chunk into a FIFO.
const CHUNK: usize = 64 * 1024;

/// Makes a FIFO at `path` and a thread that writes `bytes` bytes of `b'x'` into it once a reader opens it
/// (stopping quietly when the reader closes early). Returns the path.
pub fn fifo_with(path: &Path, bytes: u64) -> PathBuf {
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        path,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap_or_else(|err| panic!("mkfifo {}: {err}", path.display()));
    let writer_path = path.to_owned();
    std::thread::spawn(move || {
        let Ok(mut fifo) = std::fs::OpenOptions::new().write(true).open(&writer_path) else {
            return;
        };
        let chunk = vec![b'x'; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
            // A reader that stopped at its limit closes the pipe: EPIPE ends the writer.
            if fifo.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n as u64;
        }
    });
    path.to_owned()
}

/// Points `path` at `/dev/zero` (endless, no size).
pub fn zero_at(path: &Path) -> PathBuf {
    std::os::unix::fs::symlink("/dev/zero", path)
        .unwrap_or_else(|err| panic!("symlink {}: {err}", path.display()));
    path.to_owned()
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Asserts that a reader refused an over-limit source with an error naming the file and the limit, and
/// that the process's peak memory stayed under `limit * 3` plus 256 MiB of everything else.
pub fn assert_refused(message: &str, shown_path: &str, limit: u64) {
    assert!(
        message.contains(shown_path) && message.contains(&limit.to_string()),
        "the error names the file ({shown_path}) and the limit ({limit}): {message}"
    );
    let peak = peak_rss_bytes();
    assert!(
        peak < limit * 3 + 256 * 1024 * 1024,
        "peak memory {peak} bytes for a {limit}-byte limit"
    );
}
