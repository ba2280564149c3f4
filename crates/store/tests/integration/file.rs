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
