//! The embedded redb backend across restarts and against bad files, and group commit of concurrent
//! writes and transactions.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use inplace_store::file::FILE_NAME;
use inplace_store::{
    EtcdOptions, MAX_TXN_OPS, Precondition, Revision, StoreError, StoreUrl, TxnOp, TxnOutcome,
    Write,
};

async fn open(
    dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn inplace_store::Store>, StoreError> {
    inplace_store::open(&StoreUrl::File(dir.to_owned()), &EtcdOptions::default()).await
}

fn done(w: Write) -> Revision {
    match w {
        Write::Done(r) => r,
        Write::Conflict(e) => panic!("expected Done, got Conflict({e:?})"),
    }
}

#[tokio::test]
async fn data_and_the_revision_counter_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nested/state");
    let store = open(&dir).await.unwrap();
    assert_eq!(
        store.describe(),
        format!("embedded redb at {}", dir.join(FILE_NAME).display())
    );
    let mut last = Revision(0);
    for i in 0..5u8 {
        last = done(
            store
                .put(&format!("k{i}"), vec![i], Precondition::Absent)
                .await
                .unwrap(),
        );
    }
    // The highest revision belongs to a key that is then deleted: the counter must still not
    // hand it out again after the restart.
    let deleted = done(
        store
            .delete("k4", Precondition::Revision(last))
            .await
            .unwrap(),
    );
    drop(store);

    let store = open(&dir).await.unwrap();
    let listed = store.list("k").await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| (e.key.as_str(), e.value[0]))
            .collect::<Vec<_>>(),
        [("k0", 0), ("k1", 1), ("k2", 2), ("k3", 3)]
    );
    let next = done(
        store
            .put("k4", vec![9], Precondition::Absent)
            .await
            .unwrap(),
    );
    assert!(next > deleted, "{next:?} must be after {deleted:?}");
}

#[tokio::test]
async fn a_second_server_on_the_same_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let first = open(tmp.path()).await.unwrap();
    let err = match open(tmp.path()).await {
        Ok(_) => panic!("opened the same redb file twice"),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::InUse { .. }), "{err}");
    assert!(err.to_string().contains(FILE_NAME), "{err}");
    assert!(
        err.to_string().contains("etcd"),
        "points at the HA option: {err}"
    );
    // The first one is unaffected.
    done(first.put("k", vec![], Precondition::Any).await.unwrap());
}

#[tokio::test]
async fn a_file_that_is_not_ours_is_refused_and_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(FILE_NAME);
    let garbage: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = match open(tmp.path()).await {
        Ok(store) => panic!("opened garbage as {}", store.describe()),
        Err(e) => e,
    };
    assert!(!err.is_retryable());
    assert!(err.to_string().contains(FILE_NAME), "names the file: {err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "nothing overwritten"
    );
}

#[tokio::test]
async fn a_directory_that_cannot_be_created_is_an_io_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("plain-file");
    std::fs::write(&blocker, b"x").unwrap();
    let err = match open(&blocker.join("state")).await {
        Ok(_) => panic!("opened a store below a regular file"),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("plain-file"), "{err}");
}

/// Writes that arrive together are committed together (one transaction, one fsync): each must still
/// keep its own outcome — racing creates of one key have exactly one winner and every loser is told
/// the winner's entry, distinct keys all land, revisions are distinct and the change feed is in
/// revision order — and every acknowledged write is there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_committed_together_keep_their_own_outcomes() {
    const WRITERS: usize = 200;
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path()).await.unwrap();
    let mut feed = store.subscribe();
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Even writers race to create one key; odd writers each create their own.
            let key = if i % 2 == 0 {
                "contended".to_owned()
            } else {
                format!("own/{i:03}")
            };
            let written = store
                .put(&key, format!("{i}").into_bytes(), Precondition::Absent)
                .await
                .unwrap();
            (i, key, written)
        }));
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    let mut revisions = std::collections::BTreeSet::new();
    for task in tasks {
        let (i, key, written) = task.await.unwrap();
        match written {
            Write::Done(revision) => {
                assert!(
                    revisions.insert(revision),
                    "revision {revision} handed out twice"
                );
                if key == "contended" {
                    winners.push((i, revision));
                }
            }
            Write::Conflict(now) => {
                assert_eq!(key, "contended", "writer {i} on its own key was refused");
                losers.push(now.expect("a refused create is told the entry that exists"));
            }
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one create of the contended key wins"
    );
    let (winner, winning_revision) = winners[0];
    assert_eq!(losers.len(), WRITERS / 2 - 1);
    for entry in &losers {
        assert_eq!(entry.revision, winning_revision);
        assert_eq!(entry.value, format!("{winner}").into_bytes());
    }
    let mut fed = Vec::new();
    while fed.len() < revisions.len() {
        fed.push(feed.recv().await.unwrap().revision);
    }
    assert!(
        fed.windows(2).all(|w| w[0] < w[1]),
        "feed out of order: {fed:?}"
    );
    assert_eq!(
        fed.into_iter().collect::<std::collections::BTreeSet<_>>(),
        revisions
    );
    drop(feed);
    drop(store);

    let store = open(tmp.path()).await.unwrap();
    assert_eq!(store.list("own/").await.unwrap().len(), WRITERS / 2);
    let contended = store.get("contended").await.unwrap().unwrap();
    assert_eq!(contended.revision, winning_revision);
}

/// What one writer of [`transactions_and_single_writes_committed_together_keep_their_own_outcomes`]
/// did, and how it ended.
enum Tried {
    /// A transaction of these keys.
    Txn(Vec<String>, TxnOutcome),
    /// A single put of this key.
    Put(String, Write),
}

/// Transactions queued with single writes share their groups (and group bounds: some transactions
/// hold MAX_TXN_OPS ops, so groups fill up and a transaction starts the next one). Each keeps its own
/// outcome: of everything racing to create one key exactly one wins, and a losing transaction wrote
/// none of its other keys; the keys of a transaction share its revision; the feed carries each
/// change once, in revision order; after a restart everything acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_and_single_writes_committed_together_keep_their_own_outcomes() {
    const WRITERS: usize = 200;
    let tmp = tempfile::tempdir().unwrap();
    let store = open(tmp.path()).await.unwrap();
    let mut feed = store.subscribe();
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let value = format!("{i}").into_bytes();
            let own = |n: usize| -> Vec<String> {
                (0..n).map(|k| format!("own/{i:03}/{k:02}")).collect()
            };
            let keys = match i % 5 {
                0 => std::iter::once("contended".to_owned())
                    .chain(own(2))
                    .collect(),
                1 => vec!["contended".to_owned()],
                2 => own(3),
                3 => vec![format!("own/{i:03}")],
                _ => own(MAX_TXN_OPS),
            };
            if i % 5 == 1 || i % 5 == 3 {
                let key = keys[0].clone();
                let written = store.put(&key, value, Precondition::Absent).await.unwrap();
                return (i, Tried::Put(key, written));
            }
            let ops = keys
                .iter()
                .map(|k| TxnOp::put(k.clone(), value.clone(), Precondition::Absent))
                .collect();
            (i, Tried::Txn(keys, store.commit(ops).await.unwrap()))
        }));
    }
    let mut winners = Vec::new();
    let mut revisions = std::collections::BTreeSet::new();
    let mut changed = std::collections::BTreeMap::new();
    for task in tasks {
        let (i, tried) = task.await.unwrap();
        let (keys, outcome) = match tried {
            Tried::Put(key, Write::Done(r)) => (vec![key], Ok(r)),
            Tried::Put(key, Write::Conflict(now)) => (vec![key.clone()], Err((key, now))),
            Tried::Txn(keys, TxnOutcome::Done(r)) => (keys, Ok(r)),
            Tried::Txn(keys, TxnOutcome::Conflict { key, current }) => (keys, Err((key, current))),
        };
        match outcome {
            Ok(revision) => {
                assert!(
                    revisions.insert(revision),
                    "revision {revision} handed out twice"
                );
                if keys[0] == "contended" {
                    winners.push((i, revision));
                }
                for key in keys {
                    changed.insert(key, (i, revision));
                }
            }
            Err((key, now)) => {
                assert_eq!(
                    (i % 5 < 2, key.as_str()),
                    (true, "contended"),
                    "writer {i} refused"
                );
                assert!(
                    now.is_some(),
                    "a refused create is told the entry that exists"
                );
                for key in &keys[1..] {
                    assert_eq!(
                        store.get(key).await.unwrap(),
                        None,
                        "{key} of a refused transaction"
                    );
                }
            }
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one create of the contended key wins: {winners:?}"
    );
    let contended = store.get("contended").await.unwrap().unwrap();
    assert_eq!(
        (contended.revision, contended.value.clone()),
        (winners[0].1, format!("{}", winners[0].0).into_bytes())
    );
    let mut fed = Vec::new();
    while fed.len() < changed.len() {
        let change = feed.recv().await.unwrap();
        fed.push((change.revision, change.key));
    }
    assert!(
        fed.windows(2).all(|w| w[0].0 <= w[1].0),
        "feed out of revision order"
    );
    let fed: std::collections::BTreeMap<String, Revision> =
        fed.into_iter().map(|(r, k)| (k, r)).collect();
    assert_eq!(fed.len(), changed.len(), "a key's change came twice");
    for (key, (i, revision)) in &changed {
        assert_eq!(fed.get(key), Some(revision), "{key}");
        let entry = store.get(key).await.unwrap().unwrap();
        assert_eq!(
            (entry.revision, entry.value),
            (*revision, format!("{i}").into_bytes())
        );
    }
    let before = store.list("").await.unwrap();
    assert_eq!(
        before.len(),
        changed.len(),
        "nothing but acknowledged writes stored"
    );
    drop(feed);
    drop(store);

    let store = open(tmp.path()).await.unwrap();
    assert_eq!(store.list("").await.unwrap(), before);
}
