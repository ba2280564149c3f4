//! One conformance suite, run against every backend (memory, embedded redb, a real etcd): the
//! semantics dispatch relies on must not depend on `--store`.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::next_change;
use inplace_store::{
    Change, Entry, MAX_VALUE_BYTES, Precondition, Revision, Store, StoreError, Write,
};

pub(crate) fn done(w: Write) -> Revision {
    match w {
        Write::Done(r) => r,
        Write::Conflict(e) => panic!("expected Done, got Conflict({e:?})"),
    }
}

fn conflict(w: Write) -> Option<Entry> {
    match w {
        Write::Conflict(e) => e,
        Write::Done(r) => panic!("expected Conflict, got Done({r:?})"),
    }
}

mod suite {
    use super::*;

    pub async fn put_then_get_returns_value_and_revision(store: Arc<dyn Store>) {
        assert_eq!(store.get("updates/ns/m1").await.unwrap(), None);
        let r = done(
            store
                .put("updates/ns/m1", b"{\"step\":1}".to_vec(), Precondition::Any)
                .await
                .unwrap(),
        );
        assert!(r > Revision(0));
        let entry = store.get("updates/ns/m1").await.unwrap().unwrap();
        assert_eq!(
            entry,
            Entry {
                key: "updates/ns/m1".into(),
                value: b"{\"step\":1}".to_vec(),
                revision: r
            }
        );
    }

    pub async fn absent_creates_only_once(store: Arc<dyn Store>) {
        let r = done(
            store
                .put("k", b"first".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        let now = conflict(
            store
                .put("k", b"second".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        assert_eq!(
            now.map(|e| (e.value, e.revision)),
            Some((b"first".to_vec(), r))
        );
        assert_eq!(store.get("k").await.unwrap().unwrap().value, b"first");
    }

    pub async fn cas_succeeds_only_on_the_current_revision(store: Arc<dyn Store>) {
        let r1 = done(
            store
                .put("k", b"v1".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        let r2 = done(
            store
                .put("k", b"v2".to_vec(), Precondition::Revision(r1))
                .await
                .unwrap(),
        );
        assert!(r2 > r1);
        // A writer still holding r1 loses and learns the current state.
        let now = conflict(
            store
                .put("k", b"stale".to_vec(), Precondition::Revision(r1))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!((now.value.as_slice(), now.revision), (&b"v2"[..], r2));
        // CAS on a key that does not exist, and on revision 0, conflict with "absent".
        let missing = store
            .put("nope", b"x".to_vec(), Precondition::Revision(r2))
            .await
            .unwrap();
        assert_eq!(conflict(missing), None);
        let zero = store
            .put("nope", b"x".to_vec(), Precondition::Revision(Revision(0)))
            .await
            .unwrap();
        assert_eq!(conflict(zero), None);
        assert_eq!(store.get("nope").await.unwrap(), None);
        assert_eq!(store.get("k").await.unwrap().unwrap().value, b"v2");
    }

    pub async fn revisions_strictly_increase_across_keys(store: Arc<dyn Store>) {
        let mut last = Revision(0);
        for i in 0..20 {
            let key = format!("k{}", i % 3);
            let r = done(store.put(&key, vec![i], Precondition::Any).await.unwrap());
            assert!(r > last, "{r:?} after {last:?}");
            last = r;
        }
        let deleted = done(store.delete("k0", Precondition::Any).await.unwrap());
        assert!(deleted > last);
        let again = done(store.put("k0", vec![], Precondition::Absent).await.unwrap());
        assert!(again > deleted, "a re-created key gets a new revision");
    }

    pub async fn delete_honours_preconditions(store: Arc<dyn Store>) {
        let r1 = done(
            store
                .put("k", b"v1".to_vec(), Precondition::Any)
                .await
                .unwrap(),
        );
        let r2 = done(
            store
                .put("k", b"v2".to_vec(), Precondition::Any)
                .await
                .unwrap(),
        );
        // Stale revision: refused, value kept.
        let now = conflict(store.delete("k", Precondition::Revision(r1)).await.unwrap()).unwrap();
        assert_eq!(now.revision, r2);
        // "Absent" on a present key: refused.
        let now = conflict(store.delete("k", Precondition::Absent).await.unwrap()).unwrap();
        assert_eq!(now.revision, r2);
        assert_eq!(store.get("k").await.unwrap().unwrap().value, b"v2");
        // Current revision: deleted.
        let rd = done(store.delete("k", Precondition::Revision(r2)).await.unwrap());
        assert!(rd > r2);
        assert_eq!(store.get("k").await.unwrap(), None);
        // Already absent: Any and Absent succeed without a new revision, Revision conflicts.
        let ra = done(store.delete("k", Precondition::Any).await.unwrap());
        assert!(ra >= rd);
        done(store.delete("k", Precondition::Absent).await.unwrap());
        assert_eq!(
            conflict(store.delete("k", Precondition::Revision(rd)).await.unwrap()),
            None
        );
    }

    pub async fn list_is_sorted_and_bounded_by_prefix(store: Arc<dyn Store>) {
        let keys = [
            "updates/ns/m3",
            "updates/ns/m1",
            "updates/ns2/m1",
            "updates/ns/m2/x",
            "updates/ns",
            "updatesX",
            "agents/n1",
            "updates/ns/m10",
        ];
        for key in keys {
            done(
                store
                    .put(key, key.as_bytes().to_vec(), Precondition::Absent)
                    .await
                    .unwrap(),
            );
        }
        let listed: Vec<String> = store
            .list("updates/ns/")
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                assert_eq!(e.value, e.key.as_bytes(), "value belongs to its key");
                e.key
            })
            .collect();
        assert_eq!(
            listed,
            [
                "updates/ns/m1",
                "updates/ns/m10",
                "updates/ns/m2/x",
                "updates/ns/m3"
            ]
        );
        let all: Vec<String> = store
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        let mut sorted: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        sorted.sort();
        assert_eq!(all, sorted);
        assert!(store.list("nothing/").await.unwrap().is_empty());
    }

    pub async fn list_pages_through_many_keys(store: Arc<dyn Store>) {
        // More than one etcd list page (LIST_PAGE_KEYS = 100).
        for i in 0..250u32 {
            let key = format!("many/{i:04}");
            done(
                store
                    .put(&key, i.to_be_bytes().to_vec(), Precondition::Absent)
                    .await
                    .unwrap(),
            );
        }
        let listed = store.list("many/").await.unwrap();
        assert_eq!(listed.len(), 250);
        for (i, e) in listed.iter().enumerate() {
            assert_eq!(e.key, format!("many/{i:04}"));
            assert_eq!(e.value, (i as u32).to_be_bytes());
        }
    }

    pub async fn change_feed_delivers_every_write(store: Arc<dyn Store>) {
        let mut rx = store.subscribe();
        let ra = done(
            store
                .put("feed/a", b"1".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        let rb = done(
            store
                .put("feed/b", b"2".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        // A refused write changes nothing and emits nothing: the next change is the delete.
        conflict(
            store
                .put("feed/a", b"x".to_vec(), Precondition::Absent)
                .await
                .unwrap(),
        );
        let rd = done(
            store
                .delete("feed/a", Precondition::Revision(ra))
                .await
                .unwrap(),
        );
        let expected = [
            Change {
                key: "feed/a".into(),
                revision: ra,
                deleted: false,
            },
            Change {
                key: "feed/b".into(),
                revision: rb,
                deleted: false,
            },
            Change {
                key: "feed/a".into(),
                revision: rd,
                deleted: true,
            },
        ];
        for want in expected {
            assert_eq!(next_change(&mut rx).await, want);
        }
        // A second subscriber sees later writes too.
        let mut rx2 = store.subscribe();
        let rc = done(
            store
                .put("feed/c", vec![], Precondition::Any)
                .await
                .unwrap(),
        );
        for rx in [&mut rx, &mut rx2] {
            let got = next_change(rx).await;
            assert_eq!((got.key.as_str(), got.revision), ("feed/c", rc));
        }
    }

    pub async fn racing_cas_loses_no_update(store: Arc<dyn Store>) {
        const WRITERS: u64 = 4;
        const INCREMENTS: u64 = 15;
        let mut tasks = Vec::new();
        for _ in 0..WRITERS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut conflicts = 0u64;
                for _ in 0..INCREMENTS {
                    loop {
                        let current = store.get("counter").await.unwrap();
                        let (n, pre) = match &current {
                            None => (0, Precondition::Absent),
                            Some(e) => (
                                u64::from_be_bytes(e.value.as_slice().try_into().unwrap()),
                                Precondition::Revision(e.revision),
                            ),
                        };
                        match store
                            .put("counter", (n + 1).to_be_bytes().to_vec(), pre)
                            .await
                            .unwrap()
                        {
                            Write::Done(_) => break,
                            Write::Conflict(_) => conflicts += 1,
                        }
                    }
                }
                conflicts
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let entry = store.get("counter").await.unwrap().unwrap();
        let n = u64::from_be_bytes(entry.value.as_slice().try_into().unwrap());
        assert_eq!(
            n,
            WRITERS * INCREMENTS,
            "every increment is counted exactly once"
        );
    }

    pub async fn bad_input_is_refused_and_changes_nothing(store: Arc<dyn Store>) {
        let r = done(
            store
                .put("keep", b"safe".to_vec(), Precondition::Any)
                .await
                .unwrap(),
        );
        let big = vec![7u8; MAX_VALUE_BYTES + 1];
        let err = store.put("keep", big, Precondition::Any).await.unwrap_err();
        assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
        for key in ["", "bad\0key", "new\nline"] {
            let err = store.put(key, vec![], Precondition::Any).await.unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidKey { .. }),
                "{key:?}: {err}"
            );
            assert!(!err.is_retryable());
            let err = store.delete(key, Precondition::Any).await.unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidKey { .. }),
                "{key:?}: {err}"
            );
            assert!(store.get(key).await.is_err());
        }
        let entry = store.get("keep").await.unwrap().unwrap();
        assert_eq!((entry.value.as_slice(), entry.revision), (&b"safe"[..], r));
        // The largest allowed value is fine.
        done(
            store
                .put("keep", vec![1; MAX_VALUE_BYTES], Precondition::Revision(r))
                .await
                .unwrap(),
        );
    }

    pub async fn values_are_opaque_bytes_and_keys_unicode(store: Arc<dyn Store>) {
        let binary: Vec<u8> = (0..=255).collect();
        for (key, value) in [
            ("bin", binary.clone()),
            ("empty", Vec::new()),
            ("clusters/ümlaut/节点", b"x".to_vec()),
        ] {
            done(
                store
                    .put(key, value.clone(), Precondition::Absent)
                    .await
                    .unwrap(),
            );
            assert_eq!(store.get(key).await.unwrap().unwrap().value, value, "{key}");
        }
        let keys: BTreeSet<String> = store
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert!(keys.contains("clusters/ümlaut/节点"));
        assert!(!store.describe().is_empty());
    }
}

/// The test functions `memory::CASE`, `file::CASE` and `etcd::CASE` for each case of the invoking
/// module's `suite`.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test]
            async fn $case() {
                let backend = crate::common::memory().await;
                super::suite::$case(backend.store.clone()).await;
            })*
        }
        mod file {
            $(#[tokio::test]
            async fn $case() {
                let backend = crate::common::file().await;
                super::suite::$case(backend.store.clone()).await;
            })*
        }
        mod etcd {
            $(#[tokio::test]
            async fn $case() {
                let backend = crate::common::etcd().await;
                super::suite::$case(backend.store.clone()).await;
            })*
        }
    };
}
pub(crate) use conformance;

conformance!(
    put_then_get_returns_value_and_revision,
    absent_creates_only_once,
    cas_succeeds_only_on_the_current_revision,
    revisions_strictly_increase_across_keys,
    delete_honours_preconditions,
    list_is_sorted_and_bounded_by_prefix,
    list_pages_through_many_keys,
    change_feed_delivers_every_write,
    racing_cas_loses_no_update,
    bad_input_is_refused_and_changes_nothing,
    values_are_opaque_bytes_and_keys_unicode,
);
