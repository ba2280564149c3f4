//! The slot decisions over pools as loaded: who takes which slot under which condition, when a pool is full,
//! what expiry gives back, and that a transaction built from them is refused by a real (memory) store when
//! another writer took the slot in between.

use super::*;
use inplace_store::TxnAction;

const POOL: Pool = Pool {
    name: "p",
    limit: 2,
};

fn slot(index: u32, holder: &str, expires_ms: u64, revision: u64) -> Slot {
    Slot {
        index,
        hold: Some(SlotHold {
            holder: holder.into(),
            taken_ms: 0,
            expires_ms,
        }),
        revision: Revision(revision),
    }
}

fn view(slots: Vec<Slot>) -> PoolView {
    PoolView { slots }
}

fn key_and_condition(op: &TxnOp) -> (&str, Precondition) {
    (op.key.as_str(), op.precondition)
}

#[test]
fn take_release_and_sweep_over_pools_as_loaded() {
    // (what, pool, holder, now) → expected: Taken at which key under which condition, Held, or Full.
    enum Want {
        Taken(&'static str, Precondition),
        Held(&'static str, Precondition),
        Full(u32),
    }
    let cases: Vec<(&str, PoolView, &str, Want)> = vec![
        (
            "an empty pool: a slot is created",
            view(vec![]),
            "a",
            Want::Taken("", Precondition::Absent),
        ),
        (
            "one held, one expired: the expired one is taken by compare-and-swap",
            view(vec![slot(0, "b", 500, 7), slot(1, "c", 50, 8)]),
            "a",
            Want::Taken("slots/p/1", Precondition::Revision(Revision(8))),
        ),
        (
            "both held by others: full",
            view(vec![slot(0, "b", 500, 7), slot(1, "c", 500, 8)]),
            "a",
            Want::Full(2),
        ),
        (
            "the holder's own live slot: held, the same key guarded",
            view(vec![slot(0, "b", 500, 7), slot(1, "a", 500, 8)]),
            "a",
            Want::Held("slots/p/1", Precondition::Revision(Revision(8))),
        ),
        (
            "the holder's own slot expired and the pool full of others: full",
            view(vec![
                slot(0, "b", 500, 7),
                slot(1, "c", 500, 8),
                slot(2, "a", 50, 9),
            ]),
            "a",
            Want::Full(2),
        ),
        (
            "an unreadable slot is free: replaced by compare-and-swap",
            view(vec![
                slot(0, "b", 500, 7),
                Slot {
                    index: 1,
                    hold: None,
                    revision: Revision(3),
                },
            ]),
            "a",
            Want::Taken("slots/p/1", Precondition::Revision(Revision(3))),
        ),
        (
            "a hold above a lowered limit still counts",
            view(vec![slot(0, "b", 500, 7), slot(5, "c", 500, 8)]),
            "a",
            Want::Full(2),
        ),
    ];
    for (what, pool_view, holder, want) in cases {
        let got = decide_take(&POOL, &pool_view, holder, 100, 1_000).unwrap();
        match (want, got) {
            (Want::Taken(key, condition), Take::Taken(op)) => {
                let (got_key, got_condition) = key_and_condition(&op);
                if !key.is_empty() {
                    assert_eq!(got_key, key, "{what}");
                }
                assert!(got_key.starts_with("slots/p/"), "{what}: {got_key}");
                assert_eq!(got_condition, condition, "{what}");
                let TxnAction::Put(value) = &op.action else {
                    panic!("{what}: not a put")
                };
                let hold: SlotHold = serde_json::from_slice(value).unwrap();
                assert_eq!(
                    (hold.holder.as_str(), hold.taken_ms, hold.expires_ms),
                    (holder, 100, 1_000),
                    "{what}"
                );
            }
            (Want::Held(key, condition), Take::Held(op)) => {
                assert_eq!(key_and_condition(&op), (key, condition), "{what}");
            }
            (Want::Full(held), Take::Full { held: got }) => assert_eq!(got, held, "{what}"),
            (_, got) => panic!("{what}: {got:?}"),
        }
    }
}

#[test]
fn holders_start_their_search_at_different_slots() {
    let pool = Pool {
        name: "p",
        limit: 8,
    };
    let starts: std::collections::BTreeSet<String> = (0..16)
        .map(|i| {
            let Take::Taken(op) =
                decide_take(&pool, &PoolView::default(), &format!("m-{i}"), 0, 1).unwrap()
            else {
                panic!("an empty pool is not full")
            };
            op.key
        })
        .collect();
    assert!(starts.len() > 2, "{starts:?}");
}

#[test]
fn release_gives_back_every_slot_of_the_holder_and_the_sweep_only_free_ones() {
    let pool_view = view(vec![
        slot(0, "a", 500, 7),
        slot(1, "b", 50, 8),
        slot(3, "a", 50, 9),
        Slot {
            index: 4,
            hold: None,
            revision: Revision(2),
        },
    ]);
    let released: Vec<_> = decide_release(&POOL, &pool_view, "a")
        .iter()
        .map(|op| (op.key.clone(), op.precondition, op.action.clone()))
        .collect();
    assert_eq!(
        released,
        [
            (
                "slots/p/0".to_string(),
                Precondition::Revision(Revision(7)),
                TxnAction::Delete
            ),
            (
                "slots/p/3".to_string(),
                Precondition::Revision(Revision(9)),
                TxnAction::Delete
            ),
        ]
    );
    assert!(decide_release(&POOL, &pool_view, "z").is_empty());
    let swept: Vec<_> = decide_sweep(&POOL, &pool_view, 100)
        .into_iter()
        .map(|op| op.key)
        .collect();
    assert_eq!(swept, ["slots/p/1", "slots/p/3", "slots/p/4"]);
    assert_eq!(pool_view.held(100), 1);
    assert_eq!(pool_view.held_by_others("a", 100), 0);
    assert_eq!(pool_view.held_by_others("b", 40), 2);
}

#[tokio::test]
async fn two_takers_of_the_last_slot_one_wins_in_the_store() {
    let store = inplace_store::memory::MemoryStore::new();
    let pool = Pool {
        name: "p",
        limit: 1,
    };
    let before = load(&store, "p").await.unwrap();
    // Both decide from the same view (two replicas at one instant); the store lets one through.
    let mut outcomes = Vec::new();
    for holder in ["a", "b"] {
        let Take::Taken(op) = decide_take(&pool, &before, holder, 0, 1_000).unwrap() else {
            panic!("free")
        };
        outcomes.push(matches!(
            store.commit(vec![op]).await.unwrap(),
            inplace_store::TxnOutcome::Done(_)
        ));
    }
    assert_eq!(outcomes, [true, false]);
    let after = load(&store, "p").await.unwrap();
    assert!(matches!(
        decide_take(&pool, &after, "b", 1, 1_000).unwrap(),
        Take::Full { held: 1 }
    ));
    // Past the hold's expiry the slot is free again, for the other holder, by compare-and-swap.
    let Take::Taken(op) = decide_take(&pool, &after, "b", 1_000, 2_000).unwrap() else {
        panic!("expired")
    };
    assert!(matches!(
        store.commit(vec![op]).await.unwrap(),
        inplace_store::TxnOutcome::Done(_)
    ));
    assert_eq!(load(&store, "p").await.unwrap().held(1_500), 1);
}
