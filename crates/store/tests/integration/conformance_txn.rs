//! Multi-key transactions (`Store::commit`), the same cases on every backend (memory, embedded redb,
//! a real etcd): all or nothing, one revision per transaction, one change per key, bad input refused.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::conformance::done as put_done;
use common::next_change;
use inplace_store::{
    Change, Entry, MAX_KEY_BYTES, MAX_TXN_BYTES, MAX_TXN_OPS, MAX_VALUE_BYTES, Precondition,
    Revision, Store, StoreError, TxnOp, TxnOutcome, TxnProblem, Write,
};
use tokio::sync::broadcast;

fn done(outcome: TxnOutcome) -> Revision {
    match outcome {
        TxnOutcome::Done(r) => r,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn conflict(outcome: TxnOutcome) -> (String, Option<Entry>) {
    match outcome {
        TxnOutcome::Conflict { key, current } => (key, current),
        other => panic!("expected Conflict, got {other:?}"),
    }
}

/// Every key with its value and revision.
async fn snapshot(store: &dyn Store) -> BTreeMap<String, (Vec<u8>, Revision)> {
    let all = store.list("").await.unwrap();
    all.into_iter()
        .map(|e| (e.key, (e.value, e.revision)))
        .collect()
}

/// Asserts that nothing reached `feed` since it was last read: writes a marker key and expects its
/// change to be the next one.
async fn feed_is_quiet(store: &dyn Store, feed: &mut broadcast::Receiver<Change>, marker: &str) {
    let r = put_done(store.put(marker, vec![], Precondition::Any).await.unwrap());
    let next = next_change(feed).await;
    assert_eq!(
        (next.key.as_str(), next.revision),
        (marker, r),
        "a change before the marker"
    );
}

mod suite {
    use super::*;

    pub async fn txn_conflict_on_any_op_writes_nothing(store: Arc<dyn Store>) {
        let mut feed = store.subscribe();
        let mut revisions = Vec::new();
        for key in ["a", "b", "c"] {
            let w = store.put(key, b"v1".to_vec(), Precondition::Absent);
            revisions.push(put_done(w.await.unwrap()));
            next_change(&mut feed).await;
        }
        let before = snapshot(store.as_ref()).await;
        for stale in 0..3 {
            let ops: Vec<TxnOp> = ["a", "b", "c"]
                .iter()
                .zip(&revisions)
                .enumerate()
                .map(|(i, (key, r))| {
                    let pre = if i == stale {
                        Precondition::Absent
                    } else {
                        Precondition::Revision(*r)
                    };
                    TxnOp::put(*key, b"v2".to_vec(), pre)
                })
                .collect();
            let (key, current) = conflict(store.commit(ops).await.unwrap());
            let want = ["a", "b", "c"][stale];
            assert_eq!(key, want, "the failing op is named");
            let current = current.unwrap();
            assert_eq!(
                (current.key.as_str(), current.value.as_slice()),
                (want, &b"v1"[..])
            );
            assert_eq!(current.revision, revisions[stale]);
        }
        // A revision no store hands out never holds; an earlier failing op is still the one named.
        let never = [
            TxnOp::put("new", vec![], Precondition::Absent),
            TxnOp::delete("a", Precondition::Revision(revisions[0])),
            TxnOp::put("b", vec![], Precondition::Revision(Revision(0))),
        ];
        let (key, current) = conflict(store.commit(never.to_vec()).await.unwrap());
        assert_eq!(
            (key.as_str(), current.unwrap().revision),
            ("b", revisions[1])
        );
        let mut both = never.to_vec();
        both[1].precondition = Precondition::Revision(revisions[2]);
        let (key, current) = conflict(store.commit(both).await.unwrap());
        assert_eq!(
            (key.as_str(), current.unwrap().revision),
            ("a", revisions[0])
        );
        // On an absent key: the conflict carries None.
        let missing = vec![
            TxnOp::put("a", vec![], Precondition::Any),
            TxnOp::delete("gone", Precondition::Revision(revisions[0])),
        ];
        assert_eq!(
            conflict(store.commit(missing).await.unwrap()),
            ("gone".to_owned(), None)
        );
        assert_eq!(snapshot(store.as_ref()).await, before, "nothing written");
        feed_is_quiet(store.as_ref(), &mut feed, "marker").await;
    }

    pub async fn txn_creates_several_keys_only_once(store: Arc<dyn Store>) {
        let create = |suffix: &str| -> Vec<TxnOp> {
            ["m/1", "m/2", "m/3"]
                .iter()
                .map(|k| {
                    TxnOp::put(
                        *k,
                        format!("{k}{suffix}").into_bytes(),
                        Precondition::Absent,
                    )
                })
                .collect()
        };
        let r = done(store.commit(create("")).await.unwrap());
        assert!(r > Revision(0));
        for key in ["m/1", "m/2", "m/3"] {
            let entry = store.get(key).await.unwrap().unwrap();
            assert_eq!((entry.value, entry.revision), (key.as_bytes().to_vec(), r));
        }
        let (key, current) = conflict(store.commit(create("again")).await.unwrap());
        assert_eq!(key, "m/1");
        assert_eq!(
            current.map(|e| (e.value, e.revision)),
            Some((b"m/1".to_vec(), r))
        );
        // Two new keys and one that exists: neither new key is created.
        let mixed = vec![
            TxnOp::put("n/1", vec![1], Precondition::Absent),
            TxnOp::put("n/2", vec![2], Precondition::Absent),
            TxnOp::put("m/3", vec![3], Precondition::Absent),
        ];
        assert_eq!(conflict(store.commit(mixed).await.unwrap()).0, "m/3");
        assert!(store.list("n/").await.unwrap().is_empty());
        assert_eq!(store.get("m/3").await.unwrap().unwrap().value, b"m/3");
    }

    pub async fn txn_deletes_and_puts_together(store: Arc<dyn Store>) {
        let mut feed = store.subscribe();
        let ra = put_done(
            store
                .put("a", b"1".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        next_change(&mut feed).await;
        let ops = vec![
            TxnOp::delete("a", Precondition::Revision(ra)),
            TxnOp::put("b", b"2".to_vec(), Precondition::Absent),
            // Already absent: fine with Any and Absent, changes nothing.
            TxnOp::delete("c", Precondition::Any),
            TxnOp::delete("d", Precondition::Absent),
        ];
        let r = done(store.commit(ops).await.unwrap());
        assert!(r > ra);
        assert_eq!(store.get("a").await.unwrap(), None);
        assert_eq!(store.get("b").await.unwrap().unwrap().revision, r);
        let changes = [next_change(&mut feed).await, next_change(&mut feed).await];
        assert_eq!(
            changes,
            [
                Change {
                    key: "a".into(),
                    revision: r,
                    deleted: true
                },
                Change {
                    key: "b".into(),
                    revision: r,
                    deleted: false
                },
            ]
        );
        // Only deletes of absent keys: done at the current revision, nothing emitted.
        let noop = vec![
            TxnOp::delete("a", Precondition::Absent),
            TxnOp::delete("zz", Precondition::Any),
        ];
        assert!(done(store.commit(noop).await.unwrap()) >= r);
        feed_is_quiet(store.as_ref(), &mut feed, "marker").await;
        // A delete on a stale revision stops the whole transaction.
        let rb = store.get("b").await.unwrap().unwrap().revision;
        let stale = vec![
            TxnOp::put("e", vec![], Precondition::Any),
            TxnOp::delete("b", Precondition::Revision(Revision(rb.0 - 1))),
        ];
        assert_eq!(conflict(store.commit(stale).await.unwrap()).0, "b");
        assert_eq!(store.get("e").await.unwrap(), None);
        assert_eq!(store.get("b").await.unwrap().unwrap().revision, rb);
    }

    pub async fn txn_keys_share_one_revision_and_one_change_each(store: Arc<dyn Store>) {
        let mut feed = store.subscribe();
        let before = put_done(store.put("x", vec![], Precondition::Any).await.unwrap());
        next_change(&mut feed).await;
        let keys = ["t/d", "t/a", "t/c", "t/b"];
        let ops = keys
            .iter()
            .map(|k| TxnOp::put(*k, k.as_bytes().to_vec(), Precondition::Any))
            .collect();
        let r = done(store.commit(ops).await.unwrap());
        assert!(r > before);
        for key in keys {
            // In op order, all at the transaction's revision.
            assert_eq!(
                next_change(&mut feed).await,
                Change {
                    key: key.into(),
                    revision: r,
                    deleted: false
                }
            );
        }
        let listed = store.list("t/").await.unwrap();
        assert!(listed.iter().all(|e| e.revision == r), "{listed:?}");
        let after = put_done(store.put("x", vec![], Precondition::Any).await.unwrap());
        assert!(after > r, "the next write gets a later revision");
        assert_eq!(next_change(&mut feed).await.revision, after);
    }

    pub async fn bad_transactions_are_refused_and_change_nothing(store: Arc<dyn Store>) {
        let mut feed = store.subscribe();
        put_done(
            store
                .put("keep", b"safe".to_vec(), Precondition::Any)
                .await
                .unwrap(),
        );
        next_change(&mut feed).await;
        let before = snapshot(store.as_ref()).await;
        let fine = |key: &str| TxnOp::put(key, b"x".to_vec(), Precondition::Any);
        let too_many: Vec<TxnOp> = (0..=MAX_TXN_OPS).map(|i| fine(&format!("k{i}"))).collect();
        let big = |key: &str| TxnOp::put(key, vec![0; MAX_VALUE_BYTES], Precondition::Any);
        let cases: Vec<(&str, Vec<TxnOp>)> = vec![
            ("no ops", vec![]),
            ("too many ops", too_many),
            ("too many bytes", vec![fine("a"), big("b"), big("c")]),
            (
                "a key twice",
                vec![
                    fine("a"),
                    fine("keep"),
                    TxnOp::delete("a", Precondition::Any),
                ],
            ),
            ("a bad key", vec![fine("a"), fine("bad\nkey")]),
            (
                "a bad deleted key",
                vec![fine("a"), TxnOp::delete("", Precondition::Any)],
            ),
            (
                "a long key",
                vec![fine("a"), fine(&"k".repeat(MAX_KEY_BYTES + 1))],
            ),
            (
                "a value too large",
                vec![
                    fine("a"),
                    TxnOp::put("b", vec![0; MAX_VALUE_BYTES + 1], Precondition::Any),
                ],
            ),
        ];
        for (what, ops) in cases {
            let err = store.commit(ops).await.unwrap_err();
            let named = match what {
                "no ops" => matches!(err, StoreError::InvalidTransaction(TxnProblem::Empty)),
                "too many ops" => matches!(
                    err,
                    StoreError::InvalidTransaction(TxnProblem::TooManyOps { ops, limit })
                        if ops == MAX_TXN_OPS + 1 && limit == MAX_TXN_OPS
                ),
                "too many bytes" => matches!(
                    err,
                    StoreError::InvalidTransaction(TxnProblem::TooManyBytes { limit, .. })
                        if limit == MAX_TXN_BYTES
                ),
                "a key twice" => matches!(
                    &err,
                    StoreError::InvalidTransaction(TxnProblem::DuplicateKey { key }) if key == "a"
                ),
                "a value too large" => matches!(err, StoreError::TooLarge { .. }),
                _ => matches!(err, StoreError::InvalidKey { .. }),
            };
            assert!(named, "{what}: {err}");
            assert!(!err.is_retryable(), "{what}: {err}");
        }
        assert_eq!(snapshot(store.as_ref()).await, before, "nothing written");
        feed_is_quiet(store.as_ref(), &mut feed, "marker").await;
        // The largest transaction allowed goes through.
        let most: Vec<TxnOp> = (0..MAX_TXN_OPS)
            .map(|i| TxnOp::put(format!("most/{i:02}"), vec![1; 1000], Precondition::Absent))
            .collect();
        let r = done(store.commit(most).await.unwrap());
        let listed = store.list("most/").await.unwrap();
        assert_eq!(listed.len(), MAX_TXN_OPS);
        assert!(listed.iter().all(|e| e.revision == r));
    }

    /// Transactions over three counters race single-key increments of each: every write is a CAS
    /// (retried on conflict), so each (key, revision) a write started from is consumed by at most
    /// one winner, and the counters end up as some serial order of the winners would leave them.
    pub async fn txns_racing_single_puts_lose_no_update(store: Arc<dyn Store>) {
        const KEYS: [&str; 3] = ["c/x", "c/y", "c/z"];
        const TXN_TASKS: usize = 3;
        const SINGLE_TASKS: usize = 3;
        const ROUNDS: usize = 8;
        for key in KEYS {
            put_done(
                store
                    .put(key, 0u64.to_be_bytes().to_vec(), Precondition::Absent)
                    .await
                    .unwrap(),
            );
        }
        let read = |e: &Entry| u64::from_be_bytes(e.value.as_slice().try_into().unwrap());
        let mut tasks = Vec::new();
        for task in 0..TXN_TASKS + SINGLE_TASKS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                // Every precondition that won: (key, revision it replaced).
                let mut won = Vec::new();
                let mut singles = [0u64; 3];
                for round in 0..ROUNDS {
                    loop {
                        if task < TXN_TASKS {
                            let mut ops = Vec::new();
                            let mut claimed = Vec::new();
                            for key in KEYS {
                                let e = store.get(key).await.unwrap().unwrap();
                                let pre = Precondition::Revision(e.revision);
                                ops.push(TxnOp::put(
                                    key,
                                    (read(&e) + 1).to_be_bytes().to_vec(),
                                    pre,
                                ));
                                claimed.push((key.to_owned(), e.revision));
                            }
                            if let TxnOutcome::Done(_) = store.commit(ops).await.unwrap() {
                                won.extend(claimed);
                                break;
                            }
                        } else {
                            let i = (task + round) % KEYS.len();
                            let e = store.get(KEYS[i]).await.unwrap().unwrap();
                            let value = (read(&e) + 1).to_be_bytes().to_vec();
                            let pre = Precondition::Revision(e.revision);
                            if let Write::Done(_) = store.put(KEYS[i], value, pre).await.unwrap() {
                                won.push((KEYS[i].to_owned(), e.revision));
                                singles[i] += 1;
                                break;
                            }
                        }
                    }
                }
                (won, singles)
            }));
        }
        let mut claimed = HashSet::new();
        let mut singles = [0u64; 3];
        for task in tasks {
            let (won, counted) = task.await.unwrap();
            for claim in won {
                assert!(claimed.insert(claim.clone()), "two winners from {claim:?}");
            }
            for (total, n) in singles.iter_mut().zip(counted) {
                *total += n;
            }
        }
        let txns = (TXN_TASKS * ROUNDS) as u64;
        for (key, single) in KEYS.iter().zip(singles) {
            let value = read(&store.get(key).await.unwrap().unwrap());
            assert_eq!(value, txns + single, "{key}: every increment counted once");
        }
    }
}

super::conformance::conformance!(
    txn_conflict_on_any_op_writes_nothing,
    txn_creates_several_keys_only_once,
    txn_deletes_and_puts_together,
    txn_keys_share_one_revision_and_one_change_each,
    bad_transactions_are_refused_and_change_nothing,
    txns_racing_single_puts_lose_no_update,
);
