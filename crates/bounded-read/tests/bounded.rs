//! The bounded reads against sources with no size: a FIFO, `/dev/zero`, a pipe as `/dev/fd/N` (what `<(…)` and
//! `/dev/stdin` are), and a regular file at and past the limit.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::Path;

use inplace_bounded_read::testing::{assert_refused, fifo_with, peak_rss_bytes, zero_at};
use inplace_bounded_read::{ReadError, read, read_optional, read_to_string};

const LIMIT: u64 = 4 * 1024 * 1024;

#[test]
fn a_regular_file_is_read_up_to_its_limit_and_refused_one_byte_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, vec![b'a'; 100]).unwrap();
    assert_eq!(read(&path, 100).unwrap().len(), 100);
    let err = read(&path, 99).unwrap_err();
    assert!(
        matches!(err, ReadError::TooLarge { limit: 99, .. }),
        "{err}"
    );
    assert_refused(&err.to_string(), &path.display().to_string(), 99);
    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    assert!(matches!(
        read_to_string(&path, 10),
        Err(ReadError::NotUtf8 { .. })
    ));
    assert_eq!(
        read_optional(&dir.path().join("missing"), 10).unwrap(),
        None
    );
    let err = read(dir.path(), 10).unwrap_err();
    assert!(err.to_string().starts_with("cannot read"), "{err}");
}

#[test]
fn dev_zero_is_refused_at_the_limit() {
    let started = peak_rss_bytes();
    let err = read(Path::new("/dev/zero"), LIMIT).unwrap_err();
    assert!(matches!(err, ReadError::TooLarge { .. }), "{err}");
    assert_refused(&err.to_string(), "/dev/zero", LIMIT);
    assert!(peak_rss_bytes() < started.max(1) + 3 * LIMIT + 64 * 1024 * 1024);
    let dir = tempfile::tempdir().unwrap();
    let link = zero_at(&dir.path().join("state.json"));
    assert!(matches!(
        read_optional(&link, LIMIT),
        Err(ReadError::TooLarge { .. })
    ));
}

#[test]
fn a_fifo_is_read_when_it_fits_and_refused_when_it_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let small = fifo_with(&dir.path().join("small"), 1000);
    assert_eq!(read(&small, 1000).unwrap().len(), 1000);
    let big = fifo_with(&dir.path().join("big"), LIMIT + 5 * 1024 * 1024);
    let err = read(&big, LIMIT).unwrap_err();
    assert_refused(&err.to_string(), &big.display().to_string(), LIMIT);
}

#[test]
fn a_pipe_seen_as_dev_fd_is_refused_like_a_process_substitution() {
    let (reader, writer) = rustix::pipe::pipe().unwrap();
    let feeder = std::thread::spawn(move || {
        use std::io::Write as _;
        let mut writer = std::fs::File::from(writer);
        let chunk = vec![b'y'; 64 * 1024];
        for _ in 0..(LIMIT / chunk.len() as u64 + 16) {
            if writer.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    use std::os::fd::AsRawFd as _;
    let path = format!("/dev/fd/{}", reader.as_raw_fd());
    let err = read(Path::new(&path), LIMIT).unwrap_err();
    assert_refused(&err.to_string(), &path, LIMIT);
    drop(reader);
    feeder.join().unwrap();
}
