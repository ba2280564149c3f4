//! What an offer and an outcome write, case by case: the slot and the record always together, nothing when the
//! pool is full, nothing when the agent upgrades and holds its slot already.

use super::*;
use inplace_agent_api::UpgradeOutcome;
use inplace_store::{Revision, TxnAction};

use crate::dispatch::floor::slots::{Slot, SlotHold};

const NEW: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const OLDER: &str = "3333333333333333333333333333333333333333333333333333333333333333";
const POOL: Pool = Pool {
    name: UPGRADE_POOL,
    limit: 1,
};
const KEY: &str = "agent-upgrades/default/m-1";

fn record(target: &str, state: UpgradeState, started_ms: u64) -> UpgradeRecord {
    UpgradeRecord {
        target_sha256: target.into(),
        target_version: "0.2.0".into(),
        from_sha256: None,
        from_version: "0.1.0".into(),
        started_ms,
        state,
        ended_ms: None,
        message: None,
    }
}

fn held_by(holder: &str, expires_ms: u64) -> PoolView {
    PoolView {
        slots: vec![Slot {
            index: 0,
            hold: Some(SlotHold {
                holder: holder.into(),
                taken_ms: 0,
                expires_ms,
            }),
            revision: Revision(4),
        }],
    }
}

/// (key, condition, the hold's expiry or the record's state) of each op.
fn shape(ops: &[TxnOp]) -> Vec<(String, Precondition, String)> {
    ops.iter()
        .map(|op| {
            let what = match &op.action {
                TxnAction::Delete => "delete".to_string(),
                TxnAction::Put(value) => {
                    let json: serde_json::Value = serde_json::from_slice(value).unwrap();
                    match json.get("expiresMs") {
                        Some(expires) => format!("hold until {expires}"),
                        None => format!("record {} from {}", json["state"], json["startedMs"]),
                    }
                }
            };
            (op.key.clone(), op.precondition, what)
        })
        .collect()
}

fn offer(view: &PoolView, stored: StoredRecord) -> Option<Vec<(String, Precondition, String)>> {
    let fresh = record(NEW, UpgradeState::Upgrading, 5_000);
    offer_ops(&POOL, view, "default/m-1", KEY.into(), stored, &fresh)
        .unwrap()
        .map(|ops| shape(&ops))
}

#[test]
fn an_offer_takes_a_slot_and_writes_the_record_in_one_transaction() {
    let deadline = 5_000 + UPGRADE_REPORT_DEADLINE_MS;
    let slot = "slots/agent-upgrades/0".to_string();
    // No record, a free pool: the slot created and the record created.
    assert_eq!(
        offer(&PoolView::default(), None),
        Some(vec![
            (
                slot.clone(),
                Precondition::Absent,
                format!("hold until {deadline}")
            ),
            (
                KEY.into(),
                Precondition::Absent,
                "record \"upgrading\" from 5000".into()
            ),
        ])
    );
    // The pool held by another agent: nothing.
    assert_eq!(offer(&held_by("default/m-2", deadline), None), None);
    // A record that ended (failed to another binary): replaced by compare-and-swap with the slot.
    let failed = record(OLDER, UpgradeState::Failed, 0);
    let offered = offer(
        &PoolView::default(),
        Some((&failed, Precondition::Revision(Revision(9)))),
    )
    .unwrap();
    assert_eq!(offered[1].1, Precondition::Revision(Revision(9)));
    // Upgrading to this binary and holding the slot: said again, nothing written.
    let upgrading = record(NEW, UpgradeState::Upgrading, 4_000);
    let said_again = offer(
        &held_by("default/m-1", 4_000 + UPGRADE_REPORT_DEADLINE_MS),
        Some((&upgrading, Precondition::Revision(Revision(9)))),
    );
    assert_eq!(said_again, Some(vec![]));
    // Upgrading to this binary without a slot (a record from before the pool): the slot is taken until the
    // record's own deadline, and the record written unchanged as the guard.
    let without = offer(
        &PoolView::default(),
        Some((&upgrading, Precondition::Revision(Revision(9)))),
    )
    .unwrap();
    assert_eq!(
        without,
        [
            (
                slot.clone(),
                Precondition::Absent,
                format!("hold until {}", 4_000 + UPGRADE_REPORT_DEADLINE_MS)
            ),
            (
                KEY.into(),
                Precondition::Revision(Revision(9)),
                "record \"upgrading\" from 4000".into()
            ),
        ]
    );
    // Upgrading to an older release while holding the slot: the slot kept, its hold moved to the new deadline.
    let older = record(OLDER, UpgradeState::Upgrading, 4_000);
    let moved = offer(
        &held_by("default/m-1", 4_000 + UPGRADE_REPORT_DEADLINE_MS),
        Some((&older, Precondition::Revision(Revision(9)))),
    )
    .unwrap();
    assert_eq!(
        moved[0],
        (
            slot,
            Precondition::Revision(Revision(4)),
            format!("hold until {deadline}")
        )
    );
}

#[test]
fn an_outcome_ends_the_record_and_gives_the_slot_back_together() {
    let upgrading = record(NEW, UpgradeState::Upgrading, 1_000);
    let facts = |sha: &str, outcome: Option<UpgradeOutcome>| AgentFacts {
        sha256: Some(sha.into()),
        upgrade: outcome,
        ..AgentFacts::default()
    };
    let on_new = ended(&upgrading, &facts(NEW, None), 2_000).unwrap();
    assert_eq!(
        (on_new.state, on_new.ended_ms),
        (UpgradeState::Succeeded, Some(2_000))
    );
    let restored = UpgradeOutcome {
        target_sha256: NEW.into(),
        succeeded: false,
        message: "restored the previous agent binary".into(),
    };
    let failed = ended(&upgrading, &facts(OLDER, Some(restored)), 2_000).unwrap();
    assert_eq!(
        (failed.state, failed.message.as_deref()),
        (
            UpgradeState::Failed,
            Some("restored the previous agent binary")
        )
    );
    assert_eq!(ended(&upgrading, &facts(OLDER, None), 2_000), None);
    let late = ended(
        &upgrading,
        &facts(OLDER, None),
        1_001 + UPGRADE_REPORT_DEADLINE_MS,
    )
    .unwrap();
    assert!(late.message.unwrap().contains("did not come back"));
    assert_eq!(ended(&on_new, &facts(NEW, None), 3_000), None, "ended once");

    let ops = end_ops(
        &POOL,
        &held_by("default/m-1", 9_999),
        "default/m-1",
        KEY.into(),
        &on_new,
        Precondition::Revision(Revision(9)),
    )
    .unwrap();
    assert_eq!(
        shape(&ops),
        [
            (
                KEY.into(),
                Precondition::Revision(Revision(9)),
                "record \"succeeded\" from 1000".into()
            ),
            (
                "slots/agent-upgrades/0".into(),
                Precondition::Revision(Revision(4)),
                "delete".into()
            ),
        ]
    );
}

#[test]
fn upgrade_records_are_swept_once_ended_and_failures_once_their_binary_is_not_the_release() {
    const DAY: u64 = 86_400_000;
    let release = || AgentRelease {
        version: "0.2.0".into(),
        binaries: std::collections::BTreeMap::from([(
            "amd64".to_string(),
            crate::dispatch::upkeep::rollout::release::ReleaseBinary {
                sha256: NEW.into(),
                url: None,
            },
        )]),
        concurrency: 1,
        max_failures: 1,
    };
    let record = |state, started_ms| record(NEW, state, started_ms);
    let ended = |state, ended_ms: Option<u64>| UpgradeRecord {
        ended_ms,
        ..record(state, 0)
    };
    let mut other = release();
    other.binaries.get_mut("amd64").unwrap().sha256 = OLDER.into();
    // (what, record, the release now, now) → sweepable with a horizon one day before now
    let cases = [
        (
            "in flight",
            record(UpgradeState::Upgrading, 9 * DAY),
            Some(release()),
            9 * DAY,
            false,
        ),
        (
            "succeeded two days ago",
            ended(UpgradeState::Succeeded, Some(DAY)),
            Some(release()),
            3 * DAY,
            true,
        ),
        (
            "succeeded an hour ago",
            ended(UpgradeState::Succeeded, Some(3 * DAY)),
            Some(release()),
            3 * DAY + 3_600_000,
            false,
        ),
        (
            "failed to the release",
            ended(UpgradeState::Failed, Some(DAY)),
            Some(release()),
            9 * DAY,
            false,
        ),
        (
            "failed to an older release",
            ended(UpgradeState::Failed, Some(DAY)),
            Some(other.clone()),
            9 * DAY,
            true,
        ),
        (
            "failed, no release known here",
            ended(UpgradeState::Failed, Some(DAY)),
            None,
            9 * DAY,
            false,
        ),
        (
            "never came back, older release",
            record(UpgradeState::Upgrading, 0),
            Some(other),
            9 * DAY,
            true,
        ),
    ];
    for (what, record, release, now, want) in cases {
        assert_eq!(
            sweepable(&record, release.as_ref(), now, now - DAY),
            want,
            "{what}"
        );
    }
}
