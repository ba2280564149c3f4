//! The embedded redb backend across restarts and against bad files.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use inplace_store::file::FILE_NAME;
use inplace_store::{EtcdOptions, Precondition, Revision, StoreError, StoreUrl, Write};

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
