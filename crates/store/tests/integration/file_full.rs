//! The `file:` store on a full disk (issue 43.7): the store lives on a small tmpfs mounted in a private mount
//! namespace (the outer test starts this test binary again under `unshare -m`), filled so that only `k` pages are
//! left, for k = 0, 1, 2, … past what a commit needs: a hook's commit then fails at each of redb's writes in
//! turn. Every failed commit names the cause, so does every write while the disk stays full (never "until the
//! process restarts"), a commit answered "failed" is not stored, the reads and the change feed go on, and once
//! the space is freed the next commit succeeds with everything stored before it intact. Needs root and `unshare`: skipped,
//! saying why, where a mount namespace cannot be made.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use inplace_store::file::FileStore;
use inplace_store::{Precondition, Store, StoreError, TxnOp, TxnOutcome};

/// Set for the test binary started inside the namespace.
const INSIDE_ENV: &str = "INPLACE_STORE_FULL_TEST";
/// Bound on the namespace run (a failure bound).
const NAMESPACE_LIMIT: Duration = Duration::from_secs(300);
/// The tmpfs page.
const PAGE: u64 = 4096;
/// The largest number of free pages tried: more than one commit of this test needs (about 40).
const MAX_FREE_PAGES: u64 = 64;

#[test]
fn a_full_disk_fails_each_commit_naming_the_cause_and_the_store_recovers_once_there_is_room() {
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!(
                "SKIPPED store-full test: cannot make a private mount namespace here (`unshare -m` needs root \
                 or CAP_SYS_ADMIN): {other:?}"
            );
            return;
        }
    }
    let started = std::time::Instant::now();
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "file_full::inside_",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INSIDE_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waited.is_finished() {
        assert!(
            started.elapsed() < NAMESPACE_LIMIT,
            "the namespace run took longer than {NAMESPACE_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waited.join().unwrap();
    let shown = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inside the namespace:\n{shown}");
    assert!(shown.contains("store full: passed"), "{shown}");
    eprintln!(
        "store-full namespace run: {:?}\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fills the filesystem of `dir` to the last byte with `<dir>/filler`, then gives `pages` pages back.
fn fill_leaving(dir: &Path, pages: u64) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    for chunk in [4 * 1024 * 1024, 4096, 1] {
        let zeros = vec![0u8; chunk];
        while matches!(file.write(&zeros), Ok(n) if n > 0) {}
    }
    let len = file.metadata().unwrap().len();
    file.set_len(len.saturating_sub(pages * PAGE)).unwrap();
    filler
}

/// One hook's commit: three records (a desired state with inline files can be this large), new keys each round
/// so that every commit needs new pages of the file (redb reuses the pages it freed).
fn commit_of(round: u64) -> Vec<TxnOp> {
    (0..3)
        .map(|i| {
            TxnOp::put(
                format!("runs/m-{round}/{i}"),
                vec![b'a' + (i as u8) + (round % 7) as u8; 50_000],
                Precondition::Absent,
            )
        })
        .collect()
}

fn no_space(err: &StoreError) -> bool {
    err.to_string().contains("No space left on device")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_full_disk_fails_each_commit_naming_the_cause_and_the_store_recovers_once_there_is_room inside its namespace"]
async fn inside_a_small_tmpfs() {
    assert!(
        std::env::var_os(INSIDE_ENV).is_some(),
        "{INSIDE_ENV} is not set: this test runs only inside the namespace its outer test makes"
    );
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("fs");
    std::fs::create_dir(&dir).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(mount.status.success(), "mount: {mount:?}");
    let data = dir.join("data");
    let store = FileStore::open(&data).await.unwrap();
    let mut feed = store.subscribe();
    // What is stored before the disk fills, and every commit that went through since: never lost.
    let mut stored = Vec::new();
    for round in 0..20 {
        assert!(matches!(
            store.commit(commit_of(round)).await.unwrap(),
            TxnOutcome::Done(_)
        ));
        stored.push(round);
    }
    let mut table = Vec::new();
    let mut failures = 0;
    let mut example = None;
    for pages in 0..=MAX_FREE_PAGES {
        let round = 100 + pages;
        let filler = fill_leaving(&dir, pages);
        let mut line = format!("{pages:>3} pages free: ");
        let mut committed = match store.commit(commit_of(round)).await {
            Ok(TxnOutcome::Done(_)) => true,
            Ok(other) => panic!("{pages} pages free: {other:?}"),
            Err(err) => {
                failures += 1;
                assert!(no_space(&err), "{pages} pages free: {err}");
                line.push_str("failed (no space), ");
                example.get_or_insert(err.to_string());
                false
            }
        };
        if !committed {
            // While the disk stays full, a write names the cause, never a restart; a failed commit left nothing
            // (a conflict here would be a "failed" write that is stored).
            match store.commit(commit_of(round)).await {
                Ok(TxnOutcome::Done(_)) => {
                    committed = true;
                    line.push_str("again: committed, ");
                }
                Ok(other) => panic!("{pages} pages free, again: {other:?}"),
                Err(again) => {
                    assert!(
                        no_space(&again) || matches!(again, StoreError::Unavailable { .. }),
                        "{pages} pages free, again: {again}"
                    );
                    assert!(!again.to_string().contains("restart"), "{again}");
                    line.push_str("again: failed (no space), ");
                    if let Ok(listed) = store.list(&format!("runs/m-{round}/")).await {
                        assert!(listed.is_empty(), "{pages} pages free: {listed:?}");
                    }
                }
            }
        }
        std::fs::remove_file(&filler).unwrap();
        if !committed {
            // Room again: the same commit goes through, no restart.
            assert!(matches!(
                store.commit(commit_of(round)).await.unwrap(),
                TxnOutcome::Done(_)
            ));
            line.push_str("after freeing: ");
        }
        line.push_str("committed");
        table.push(line);
        stored.push(round);
    }
    assert!(failures > 0, "the disk never filled: {table:?}");
    eprintln!("what a failed commit says: {}", example.unwrap_or_default());
    assert!(
        table
            .iter()
            .rev()
            .take(8)
            .all(|t| t.ends_with("pages free: committed")),
        "the last commits did not fit in their room: {table:?}"
    );
    // Everything stored is there, byte for byte, and the change feed saw the commits after the failures.
    for round in &stored {
        let expected = commit_of(*round);
        for op in expected {
            let entry = store.get(&op.key).await.unwrap().unwrap();
            let inplace_store::TxnAction::Put(value) = op.action else {
                unreachable!()
            };
            assert_eq!(entry.value, value, "{}", op.key);
        }
    }
    let mut seen = 0;
    while let Ok(change) = feed.try_recv() {
        seen += 1;
        assert!(change.key.starts_with("runs/m-"));
    }
    assert_eq!(seen, stored.len() * 3, "the change feed");
    // The file opens again as it is: what a restarted server would read.
    drop(store);
    let reopened = FileStore::open(&data).await.unwrap();
    assert_eq!(
        reopened.list("runs/").await.unwrap().len(),
        stored.len() * 3
    );
    drop(reopened);
    let _ = Command::new("umount").arg(&dir).output();
    eprintln!("{}", table.join("\n"));
    eprintln!(
        "store full: passed ({failures} write points failed, {} commits kept)",
        stored.len()
    );
}
