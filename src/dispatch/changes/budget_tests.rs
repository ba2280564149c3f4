//! The budget's decisions over pools as loaded: a full pool makes a new run wait with an answer naming the
//! holders, a holder keeps its slot, a per-label budget counts per label value (a Machine without the label
//! under the empty value), a run's end gives back every slot of its Machine and no other, renewal moves only
//! live holds, the sweep frees only expired ones; and the flag's `KEY=N` refuses what it cannot use.

use inplace_store::{Precondition, Revision, TxnAction};

use super::*;
use crate::dispatch::floor::config::{LabelBudgetError, MAX_CONCURRENT_UPDATES_LIMIT};
use crate::dispatch::floor::keys::valid_segment;

const MIN: u64 = 60_000;
const NOW: u64 = 1_000 * MIN;

fn hold(pool: &str, index: u32, holder: &str, taken_ms: u64, revision: u64) -> (String, Slot) {
    (
        pool.to_owned(),
        Slot {
            index,
            hold: Some(SlotHold {
                holder: holder.into(),
                taken_ms,
                expires_ms: NOW + 60 * MIN,
            }),
            revision: Revision(revision),
        },
    )
}

fn view(slots: Vec<(String, Slot)>) -> BudgetView {
    let mut view = BudgetView::default();
    for (pool, slot) in slots {
        view.pools.entry(pool).or_default().slots.push(slot);
    }
    view
}

fn budget(total: Option<u32>, per_label: &[&str]) -> UpdateBudget {
    UpdateBudget {
        total,
        per_label: per_label.iter().map(|l| l.parse().unwrap()).collect(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn admit(
    budget: &UpdateBudget,
    labels: &BTreeMap<String, String>,
    view: &BudgetView,
    holder: &str,
) -> Admission {
    decide_admission(
        &demands(budget, labels),
        view,
        holder,
        NOW,
        NOW + 90 * MIN,
        7,
    )
    .unwrap()
}

#[test]
fn a_full_budget_makes_a_new_run_wait_naming_the_oldest_holders() {
    let full = view(vec![
        hold(UPDATES_POOL, 0, "other/b", NOW - MIN, 3),
        hold(UPDATES_POOL, 1, "default/a", NOW - 4 * MIN, 2),
    ]);
    let Admission::Wait(waiting) = admit(&budget(Some(2), &[]), &labels(&[]), &full, "default/c")
    else {
        panic!("admitted into a full pool")
    };
    assert_eq!(
        waiting,
        Waiting {
            message: "waiting for a fleet-wide update slot: 2 of 2 runs in progress (default/a 4m, other/b 60s)"
                .into(),
            retry_after_seconds: 7,
        }
    );
    // Many holders: the oldest BUDGET_HOLDERS_SHOWN are named, the rest counted.
    let many = view(
        (0..8)
            .map(|i| {
                hold(
                    UPDATES_POOL,
                    i,
                    &format!("default/m-{i}"),
                    NOW - u64::from(i) * MIN,
                    1,
                )
            })
            .collect(),
    );
    let Admission::Wait(waiting) = admit(&budget(Some(8), &[]), &labels(&[]), &many, "default/x")
    else {
        panic!()
    };
    assert!(
        waiting.message.ends_with("(default/m-7 7m, default/m-6 6m, default/m-5 5m, default/m-4 4m, default/m-3 3m, 3 more)"),
        "{}",
        waiting.message
    );
    // An expired hold is a free slot: taken by compare-and-swap on the expired record.
    let mut expired = full.clone();
    expired.pools.get_mut(UPDATES_POOL).unwrap().slots[0]
        .hold
        .as_mut()
        .unwrap()
        .expires_ms = NOW;
    let Admission::Admitted(ops) =
        admit(&budget(Some(2), &[]), &labels(&[]), &expired, "default/c")
    else {
        panic!("an expired hold still counted")
    };
    assert_eq!(ops.len(), 1);
    assert_eq!(
        (ops[0].key.as_str(), ops[0].precondition),
        ("slots/updates/0", Precondition::Revision(Revision(3)))
    );
}

#[test]
fn a_machine_holding_a_slot_keeps_it_for_its_new_run_and_an_unlimited_budget_asks_for_nothing() {
    let full = view(vec![
        hold(UPDATES_POOL, 0, "default/a", NOW - 4 * MIN, 2),
        hold(UPDATES_POOL, 1, "default/b", NOW - MIN, 3),
    ]);
    let Admission::Admitted(ops) = admit(&budget(Some(2), &[]), &labels(&[]), &full, "default/a")
    else {
        panic!("the holder's new run waited for its own slot")
    };
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].key, "slots/updates/0");
    assert_eq!(ops[0].precondition, Precondition::Revision(Revision(2)));
    let TxnAction::Put(value) = &ops[0].action else {
        panic!()
    };
    let kept: SlotHold = serde_json::from_slice(value).unwrap();
    assert_eq!(
        kept,
        SlotHold {
            holder: "default/a".into(),
            taken_ms: NOW - 4 * MIN,
            expires_ms: NOW + 90 * MIN
        },
        "taken when the first run started, held until the new run's expiry"
    );
    assert_eq!(
        admit(&UpdateBudget::default(), &labels(&[]), &full, "default/c"),
        Admission::Admitted(Vec::new())
    );
}

#[test]
fn a_per_label_budget_counts_per_value_and_a_machine_without_the_label_under_the_empty_value() {
    const ZONE: &str = "topology.kubernetes.io/zone";
    let zone_a = label_pool(ZONE, "a");
    let unset = label_pool(ZONE, "");
    for pool in [&zone_a, &unset] {
        assert!(valid_segment(pool), "{pool}");
    }
    assert_ne!(zone_a, unset);
    assert_ne!(zone_a, label_pool(ZONE, "b"));
    let per_zone = budget(Some(10), &["topology.kubernetes.io/zone=1"]);
    let used = view(vec![
        hold(UPDATES_POOL, 0, "default/a", NOW - MIN, 2),
        hold(&zone_a, 0, "default/a", NOW - MIN, 2),
    ]);
    let Admission::Wait(waiting) = admit(&per_zone, &labels(&[(ZONE, "a")]), &used, "default/c")
    else {
        panic!("zone a is full")
    };
    assert_eq!(
        waiting.message,
        "waiting for an update slot for topology.kubernetes.io/zone=a: 1 of 1 runs in progress (default/a 60s)"
    );
    // Zone b and a Machine without the label each have a slot of their own; both pools are taken in one go.
    for (labels, pool) in [
        (labels(&[(ZONE, "b")]), label_pool(ZONE, "b")),
        (labels(&[]), unset.clone()),
    ] {
        let Admission::Admitted(ops) = admit(&per_zone, &labels, &used, "default/c") else {
            panic!("{pool}")
        };
        let keys: Vec<&str> = ops.iter().map(|op| op.key.as_str()).collect();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys[0].starts_with("slots/updates/"), "{keys:?}");
        assert!(keys[1].starts_with(&format!("slots/{pool}/")), "{keys:?}");
    }
    // A per-label budget alone (no fleet-wide limit) takes only its label's slot.
    let Admission::Admitted(ops) = admit(
        &budget(None, &["topology.kubernetes.io/zone=1"]),
        &labels(&[]),
        &used,
        "default/c",
    ) else {
        panic!()
    };
    assert_eq!(ops.len(), 1);
    assert!(ops[0].key.starts_with(&format!("slots/{unset}/")));
}

#[test]
fn a_run_end_gives_back_every_slot_of_its_machine_and_renewal_moves_only_live_holds() {
    let zone = label_pool("zone", "a");
    let mut stale = hold(UPDATES_POOL, 3, "default/a", NOW - 90 * MIN, 9);
    stale.1.hold.as_mut().unwrap().expires_ms = NOW - MIN;
    let slots = view(vec![
        hold(UPDATES_POOL, 0, "default/a", NOW - MIN, 2),
        hold(UPDATES_POOL, 1, "default/b", NOW - MIN, 3),
        hold(&zone, 0, "default/a", NOW - MIN, 4),
        stale,
    ]);
    let released: Vec<(String, Precondition, bool)> = decide_end(&slots, "default/a")
        .into_iter()
        .map(|op| (op.key, op.precondition, op.action == TxnAction::Delete))
        .collect();
    assert_eq!(
        released,
        [
            (
                "slots/updates/0".to_owned(),
                Precondition::Revision(Revision(2)),
                true
            ),
            (
                "slots/updates/3".to_owned(),
                Precondition::Revision(Revision(9)),
                true
            ),
            (
                format!("slots/{zone}/0"),
                Precondition::Revision(Revision(4)),
                true
            ),
        ]
    );
    assert!(decide_end(&slots, "default/z").is_empty());
    let renewed = decide_renew(&slots, "default/a", NOW, NOW + 99 * MIN).unwrap();
    let keys: Vec<&str> = renewed.iter().map(|op| op.key.as_str()).collect();
    assert_eq!(
        keys,
        ["slots/updates/0".to_owned(), format!("slots/{zone}/0")]
    );
    for op in &renewed {
        let TxnAction::Put(value) = &op.action else {
            panic!()
        };
        let hold: SlotHold = serde_json::from_slice(value).unwrap();
        assert_eq!(
            (hold.taken_ms, hold.expires_ms),
            (NOW - MIN, NOW + 99 * MIN)
        );
    }
    // The sweep frees the expired hold only.
    let swept: Vec<String> = decide_sweep(&slots, NOW)
        .into_iter()
        .map(|op| op.key)
        .collect();
    assert_eq!(swept, ["slots/updates/3"]);
}

#[test]
fn a_hold_lasts_the_steps_timeouts_and_the_margin() {
    let step = |index: u32, timeout_seconds: u32| inplace_agent_api::Step {
        index,
        description: format!("step {index}"),
        timeout_seconds,
        action: inplace_agent_api::StepAction::Files { files: Vec::new() },
    };
    let plan = Plan {
        id: "r1".into(),
        machine: inplace_agent_api::MachineRef::new("default", "a"),
        cluster: "c".into(),
        steps: vec![step(0, 60), step(1, 1800)],
        control_plane: false,
    };
    assert_eq!(
        hold_until(&plan, NOW),
        NOW + 1_860_000 + UPDATE_SLOT_MARGIN.as_millis() as u64
    );
}

#[test]
fn the_status_line_says_the_limit_the_holders_and_who_waits() {
    let status = BudgetStatus {
        limit: Some(2),
        holders: vec![
            ("default/a".into(), NOW - 4 * MIN),
            ("other/b".into(), NOW - MIN),
        ],
        per_label: vec!["topology.kubernetes.io/zone=1".into()],
        label_slots: 2,
        waiting: 3,
        limits_unknown: false,
    };
    assert_eq!(
        status.status_line(NOW),
        "update budget: 2 of 2 slots in use (default/a 4m, other/b 60s); per label \
         topology.kubernetes.io/zone=1: 2 slots in use; 3 Machines waiting for a slot"
    );
    assert_eq!(
        BudgetStatus::default().status_line(NOW),
        "update budget: unlimited (no --max-concurrent-updates); 0 slots in use; 0 Machines waiting for a slot"
    );
    let from_store = BudgetStatus {
        limits_unknown: true,
        ..status
    };
    assert_eq!(
        from_store.status_line(NOW),
        "update budget (limits: the servers' --max-concurrent-updates): 2 slots in use (default/a 4m, other/b \
         60s); per label topology.kubernetes.io/zone=1: 2 slots in use"
    );
}

#[test]
fn the_per_label_flag_refuses_what_it_cannot_use() {
    let parsed: LabelBudget = "topology.kubernetes.io/zone=2".parse().unwrap();
    assert_eq!(
        (parsed.key.as_str(), parsed.limit),
        ("topology.kubernetes.io/zone", 2)
    );
    for (text, want) in [
        ("zone", LabelBudgetError::Shape("zone".into())),
        ("=2", LabelBudgetError::Key(String::new())),
        ("zo ne=2", LabelBudgetError::Key("zo ne".into())),
        ("zone=0", LabelBudgetError::Limit("0".into())),
        ("zone=many", LabelBudgetError::Limit("many".into())),
        (
            &format!("zone={}", MAX_CONCURRENT_UPDATES_LIMIT + 1),
            LabelBudgetError::Limit((MAX_CONCURRENT_UPDATES_LIMIT + 1).to_string()),
        ),
    ] {
        assert_eq!(text.parse::<LabelBudget>(), Err(want), "{text}");
    }
}
