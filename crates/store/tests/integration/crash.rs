//! `kill -9` at random moments: a child process (this test binary, re-executed with
//! [`CHILD_ENV`] set) hammers compare-and-swap writes on an embedded store from several tasks, and
//! multi-key transactions (each writes one counter value to the [`TXN_KEYS`] keys of a group) from
//! others, and reports each write before trying it and after it was acknowledged; the parent SIGKILLs
//! it after a random number of acknowledgements, reopens the store and checks that it opens, that
//! every acknowledged write is there (or was superseded by a later write), that nothing but attempted
//! values is stored, that every transaction is all or nothing (a group's keys agree), and that
//! revisions keep increasing across the crashes. Several rounds on the same database.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use inplace_store::file::FileStore;
use inplace_store::{Precondition, Revision, Store, TxnOp, TxnOutcome, Write};
use rand::{Rng, SeedableRng};

/// Set (to the store directory) in the child process.
const CHILD_ENV: &str = "INPLACE_STORE_CRASH_CHILD";
/// Seed for the child's writers.
const SEED_ENV: &str = "INPLACE_STORE_CRASH_SEED";
/// Crash/reopen cycles.
const ROUNDS: usize = 10;
/// Keys the writers fight over.
const KEYS: usize = 8;
/// Concurrent single-key writer tasks in the child.
const WRITERS: usize = 4;
/// Concurrent transaction writer tasks in the child.
const TXN_WRITERS: usize = 2;
/// Key groups the transaction writers fight over (`g0/…`, `g1/…`).
const GROUPS: usize = 2;
/// The keys of every group, all written by each transaction.
const TXN_KEYS: [&str; 3] = ["a", "b", "c"];
/// The kill comes after a random number of acknowledgements in this range.
const ACKS_BEFORE_KILL: std::ops::Range<usize> = 5..400;
/// Value sizes vary so commits touch different numbers of pages.
const VALUE_PADDING: std::ops::Range<usize> = 0..6000;
/// Extra random delay (µs) between the chosen acknowledgement and the SIGKILL.
const KILL_JITTER_US: std::ops::Range<u64> = 0..3000;

/// The test's name in the integration binary (module path included), for the child's `--exact`.
const TEST_NAME: &str = "crash::kill_9_at_random_moments_loses_no_acknowledged_write";

#[test]
fn kill_9_at_random_moments_loses_no_acknowledged_write() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        let seed = std::env::var(SEED_ENV).unwrap().parse().unwrap();
        hammer(Path::new(&dir), seed); // runs until killed
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let seed: u64 = rand::rng().random();
    eprintln!("crash test seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut history = History::default();
    for round in 0..ROUNDS {
        let kill_after = rng.random_range(ACKS_BEFORE_KILL);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .env(SEED_ENV, (seed ^ round as u64).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acks = 0;
        let mut round_acks = Vec::new();
        // Read until the kill moment, then SIGKILL, then drain what the child wrote before dying.
        let mut killed = false;
        for line in lines {
            let line = line.unwrap();
            if let Some(ack) = history.record(&line) {
                round_acks.push(ack);
                acks += 1;
                if acks == kill_after && !killed {
                    // A random moment after that ack: the other writers are somewhere in their
                    // transactions or fsyncs.
                    std::thread::sleep(Duration::from_micros(rng.random_range(KILL_JITTER_US)));
                    child.kill().unwrap(); // SIGKILL
                    killed = true;
                }
            }
        }
        let status = child.wait().unwrap();
        assert!(
            killed,
            "round {round}: child exited by itself ({status}) after {acks} acks"
        );
        eprintln!("round {round}: killed after {kill_after} acks ({acks} read in total)");
        runtime.block_on(history.verify(&dir, round, &round_acks));
    }
}

/// What the children said, over all rounds.
#[derive(Default)]
struct History {
    /// Values tried per key: id → padding length.
    tried: HashMap<String, HashMap<String, usize>>,
    /// Per key: the acknowledged write with the highest revision (id, revision).
    last_ack: HashMap<String, (String, Revision)>,
    /// Every acknowledged revision, to prove none repeats.
    revisions: HashSet<Revision>,
    /// The highest revision the store held at the previous verification.
    high_water: Revision,
    /// Per group: the highest counter a transaction tried.
    txn_tried: HashMap<String, u64>,
    /// Per group: the acknowledged transaction with the highest revision (counter, revision).
    txn_acked: HashMap<String, (u64, Revision)>,
}

impl History {
    /// Parses one child line; returns the revision of an acknowledgement.
    fn record(&mut self, line: &str) -> Option<Revision> {
        // libtest prints `test NAME ... ` without a newline before the test runs, so the child's first
        // line arrives after it on the same line: read from the first `TRY `/`ACK ` on.
        let start = ["TRY ", "ACK ", "BEGIN ", "COMMIT "]
            .iter()
            .filter_map(|tag| line.find(tag))
            .min()?;
        let parts: Vec<&str> = line[start..].split(' ').collect();
        match parts.as_slice() {
            ["TRY", key, id, len] => {
                self.tried
                    .entry(key.to_string())
                    .or_default()
                    .insert(id.to_string(), len.parse().unwrap());
                None
            }
            ["ACK", key, id, rev] => {
                let rev = self.acknowledged(rev);
                latest(&mut self.last_ack, key, (id.to_string(), rev));
                Some(rev)
            }
            ["BEGIN", group, counter] => {
                let tried = self.txn_tried.entry(group.to_string()).or_default();
                *tried = (*tried).max(counter.parse().unwrap());
                None
            }
            ["COMMIT", group, counter, rev] => {
                let rev = self.acknowledged(rev);
                latest(&mut self.txn_acked, group, (counter.parse().unwrap(), rev));
                Some(rev)
            }
            _ => None, // libtest's own output
        }
    }

    /// The revision of an acknowledgement, which no other acknowledgement may have.
    fn acknowledged(&mut self, rev: &str) -> Revision {
        let rev = Revision(rev.parse().unwrap());
        assert!(
            self.revisions.insert(rev),
            "revision {rev} acknowledged twice"
        );
        rev
    }

    async fn verify(&mut self, dir: &Path, round: usize, acks: &[Revision]) {
        let store = FileStore::open(dir)
            .await
            .unwrap_or_else(|e| panic!("round {round}: store does not reopen after kill -9: {e}"));
        for &rev in acks {
            assert!(
                rev > self.high_water,
                "round {round}: revision {rev} not above the {} stored before this round",
                self.high_water
            );
        }
        for (key, (id, rev)) in &self.last_ack {
            let entry = store
                .get(key)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: acknowledged {key} is gone"));
            assert!(
                entry.revision >= *rev,
                "round {round}: {key} went back from acknowledged revision {rev} to {}",
                entry.revision
            );
            let (stored_id, padding) = split_value(&entry.value);
            assert_eq!(
                self.tried[key].get(stored_id),
                Some(&padding),
                "round {round}: {key} holds a value never written whole"
            );
            if entry.revision == *rev {
                assert_eq!(
                    stored_id, id,
                    "round {round}: {key} at {rev} has another value"
                );
            }
        }
        for group in 0..GROUPS {
            self.verify_group(&store, round, &format!("g{group}")).await;
        }
        let all = store.list("").await.unwrap();
        assert!(all.len() <= KEYS + GROUPS * TXN_KEYS.len());
        let stored_max = all.iter().map(|e| e.revision).max().unwrap_or(Revision(0));
        // The next revision handed out is above everything ever acknowledged.
        let probe = match store.put("probe", vec![], Precondition::Any).await.unwrap() {
            Write::Done(r) => r,
            other => panic!("{other:?}"),
        };
        let acked_max = self.revisions.iter().max().copied().unwrap_or(Revision(0));
        assert!(
            probe > acked_max && probe > stored_max,
            "round {round}: counter went back"
        );
        store.delete("probe", Precondition::Any).await.unwrap();
        self.high_water = probe.max(stored_max);
        drop(store);
    }
}

impl History {
    /// A group's keys are all there with one value and one revision, or all absent; what they hold
    /// was tried, and is no older than the last acknowledged transaction.
    async fn verify_group(&self, store: &FileStore, round: usize, group: &str) {
        let mut stored = Vec::new();
        for key in TXN_KEYS {
            let entry = store.get(&format!("{group}/{key}")).await.unwrap();
            stored.push(entry.map(|e| (e.value, e.revision)));
        }
        assert!(
            stored.windows(2).all(|w| w[0] == w[1]),
            "round {round}: a transaction on {group} was applied in part: {stored:?}"
        );
        let acked = self.txn_acked.get(group);
        let Some((value, revision)) = &stored[0] else {
            assert!(
                acked.is_none(),
                "round {round}: acknowledged {group} is gone"
            );
            return;
        };
        let (counter, _) = split_value(value);
        let counter: u64 = counter.parse().unwrap();
        assert!(
            counter <= self.txn_tried[group],
            "round {round}: {group} holds counter {counter}, never tried"
        );
        if let Some(&(acked_counter, acked_revision)) = acked {
            assert!(
                *revision >= acked_revision && counter >= acked_counter,
                "round {round}: {group} went back from acknowledged {acked_counter} at \
                 {acked_revision} to {counter} at {revision}"
            );
            if *revision == acked_revision {
                assert_eq!(
                    counter, acked_counter,
                    "round {round}: {group} at {revision}"
                );
            }
        }
    }
}

/// Keeps `acked` as `key`'s acknowledgement if its revision is the highest seen.
fn latest<T>(last: &mut HashMap<String, (T, Revision)>, key: &str, acked: (T, Revision)) {
    match last.get(key) {
        Some((_, rev)) if *rev > acked.1 => {}
        _ => {
            last.insert(key.to_owned(), acked);
        }
    }
}

/// `id|xxxx…` → (id, padding length); padding must be all `x`.
fn split_value(value: &[u8]) -> (&str, usize) {
    let text = std::str::from_utf8(value).expect("stored value is not what we wrote");
    let (id, padding) = text
        .split_once('|')
        .expect("stored value lost its separator");
    assert!(
        padding.bytes().all(|b| b == b'x'),
        "stored value padding damaged"
    );
    (id, padding.len())
}

/// The child: writers doing read-modify-CAS loops until the process is killed.
fn hammer(dir: &Path, seed: u64) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(FileStore::open(dir).await.unwrap());
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let (store, out) = (store.clone(), out.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(writer as u64));
                let say = |line: String| say(&out, &line);
                for seq in 0u64.. {
                    let key = format!("k{}", rng.random_range(0..KEYS));
                    let id = format!("s{seed}-w{writer}-{seq}");
                    let padding = rng.random_range(VALUE_PADDING);
                    let value = format!("{id}|{}", "x".repeat(padding)).into_bytes();
                    let precondition = match store.get(&key).await.unwrap() {
                        None => Precondition::Absent,
                        Some(e) => Precondition::Revision(e.revision),
                    };
                    say(format!("TRY {key} {id} {padding}\n"));
                    if let Write::Done(rev) = store.put(&key, value, precondition).await.unwrap() {
                        say(format!("ACK {key} {id} {rev}\n"));
                    }
                }
            }));
        }
        for writer in 0..TXN_WRITERS {
            let (store, out) = (store.clone(), out.clone());
            let seed = seed.wrapping_add((WRITERS + writer) as u64);
            tasks.push(tokio::spawn(transact(store, out, seed)));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// Writes one line to the parent at once.
fn say(out: &std::sync::Mutex<std::io::Stdout>, line: &str) {
    let mut out = out.lock().unwrap();
    out.write_all(line.as_bytes()).unwrap();
    out.flush().unwrap();
}

/// A transaction writer: reads a random group, writes the next counter to all its keys with a
/// compare-and-swap on each, until the process is killed.
async fn transact(store: Arc<dyn Store>, out: Arc<std::sync::Mutex<std::io::Stdout>>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let say = |line: String| say(&out, &line);
    loop {
        let group = format!("g{}", rng.random_range(0..GROUPS));
        let mut counter = 0;
        let mut preconditions = Vec::new();
        for key in TXN_KEYS {
            preconditions.push(match store.get(&format!("{group}/{key}")).await.unwrap() {
                None => Precondition::Absent,
                Some(e) => {
                    counter = split_value(&e.value).0.parse::<u64>().unwrap();
                    Precondition::Revision(e.revision)
                }
            });
        }
        counter += 1;
        let value = format!("{counter}|{}", "x".repeat(rng.random_range(VALUE_PADDING)));
        let ops = TXN_KEYS
            .iter()
            .zip(preconditions)
            .map(|(key, pre)| TxnOp::put(format!("{group}/{key}"), value.clone().into_bytes(), pre))
            .collect();
        say(format!("BEGIN {group} {counter}\n"));
        if let TxnOutcome::Done(rev) = store.commit(ops).await.unwrap() {
            say(format!("COMMIT {group} {counter} {rev}\n"));
        }
    }
}
