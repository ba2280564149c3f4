//! The aggregation's table: what each occurrence becomes, over a clock the test moves.

use inplace_agent_api::MachineRef;

use super::*;
use crate::mgmt::events::rate::{FLEET_EVENT_BURST, MACHINE_EVENT_BURST};

const S: u64 = 1000;

fn event(machine: &str, reason: Reason) -> MachineEvent {
    MachineEvent::new(
        &MachineRef::new("default", machine),
        Some("uid-1"),
        reason,
        format!("{} on {machine}", reason.as_str()),
    )
}

/// Observes and confirms every write, returning what each occurrence became.
fn run(agg: &mut Aggregator, events: &[(u64, &str, Reason)]) -> Vec<Observed> {
    events
        .iter()
        .map(|(at, machine, reason)| {
            let observed = agg.observe(event(machine, *reason), *at);
            if let Observed::Write(write) = &observed {
                assert_eq!(agg.written(write, Outcome::Written, *at), None);
            }
            observed
        })
        .collect()
}

fn kinds(observed: &[Observed]) -> Vec<&'static str> {
    observed
        .iter()
        .map(|o| match o {
            Observed::Write(Write::Create(e)) if e.series.is_some() => "recreate",
            Observed::Write(Write::Create(_)) => "create",
            Observed::Write(Write::Patch { .. }) => "patch",
            Observed::Counted => "counted",
            Observed::Dropped(d) => d.as_str(),
        })
        .collect()
}

#[test]
fn repeats_of_one_reason_are_one_event_whose_count_is_patched_not_one_event_each() {
    let mut agg = Aggregator::new(0);
    let calls: Vec<(u64, &str, Reason)> = (0..1000)
        .map(|i| (i * 10, "m1", Reason::HeldByWindow))
        .collect();
    let observed = run(&mut agg, &calls);
    let kinds = kinds(&observed);
    assert_eq!(kinds[0], "create");
    assert_eq!(kinds[1], "patch");
    assert!(kinds[2..].iter().all(|k| *k == "counted"), "{kinds:?}");
    assert_eq!(agg.len(), 1);
    // 9.99 s in: not yet due; once SERIES_PATCH_INTERVAL passed since the last write, the count is.
    assert_eq!(agg.tick(9_990), vec![]);
    let due = agg.tick(SERIES_PATCH_INTERVAL.as_millis() as u64 + 20);
    let [Write::Patch { series, .. }] = due.as_slice() else {
        panic!("one patch due: {due:?}")
    };
    assert_eq!(
        *series,
        Series {
            count: 1000,
            last_observed_ms: 9_990
        }
    );
}

#[test]
fn each_reason_and_each_machine_is_its_own_series() {
    let mut agg = Aggregator::new(0);
    let observed = run(
        &mut agg,
        &[
            (0, "m1", Reason::UpdateRecorded),
            (1, "m1", Reason::HeldByWindow),
            (2, "m2", Reason::HeldByWindow),
            (3, "m1", Reason::HeldByWindow),
            (4, "m1", Reason::StepFailed),
            (5, "m2", Reason::HeldByWindow),
            (6, "m2", Reason::HeldByWindow),
        ],
    );
    assert_eq!(
        kinds(&observed),
        [
            "create", "create", "create", "patch", "create", "patch", "counted"
        ]
    );
}

#[test]
fn a_series_ends_after_a_quiet_spell_and_its_last_count_is_written_before_it_is_forgotten() {
    let finish = SERIES_FINISH_AFTER.as_millis() as u64;
    let mut agg = Aggregator::new(0);
    run(
        &mut agg,
        &[
            (0, "m1", Reason::HeldByPause),
            (S, "m1", Reason::HeldByPause),
            (2 * S, "m1", Reason::HeldByPause),
        ],
    );
    // Count 3 is unwritten; the series ends at 2 s + finish: the last patch is due then, even within the interval.
    let due = agg.tick(2 * S + finish);
    assert!(
        matches!(due.as_slice(), [Write::Patch { series, .. }] if series.count == 3),
        "{due:?}"
    );
    assert_eq!(agg.written(&due[0], Outcome::Written, 2 * S + finish), None);
    assert_eq!(agg.tick(2 * S + finish + 1), vec![]);
    assert!(agg.is_empty());
    // The same hold later is a new Event.
    let again = run(&mut agg, &[(3 * finish, "m1", Reason::HeldByPause)]);
    assert_eq!(kinds(&again), ["create"]);
}

#[test]
fn a_machine_past_its_burst_drops_new_events_and_repeats_still_count() {
    let mut agg = Aggregator::new(0);
    // Every reason's first occurrence is a new Event: 17 reasons, then new series after each finishes.
    let mut creates = 0;
    let mut dropped = 0;
    let finish = SERIES_FINISH_AFTER.as_millis() as u64;
    for round in 0..3u64 {
        for reason in Reason::ALL {
            match agg.observe(event("m1", reason), round * finish) {
                Observed::Write(write) => {
                    agg.written(&write, Outcome::Written, round * finish);
                    creates += 1;
                }
                Observed::Dropped(Dropped::MachineRate) => dropped += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    // 12 minutes refill two more tokens (one per 5 minutes).
    assert_eq!(creates, MACHINE_EVENT_BURST + 2);
    assert_eq!(dropped, 3 * Reason::ALL.len() as u32 - creates);
    // A series that exists still counts (its first repeat patched): no new Event needed.
    let Observed::Write(patch @ Write::Patch { .. }) =
        agg.observe(event("m1", Reason::UpdateRecorded), 2 * finish + 1)
    else {
        panic!("the first repeat is patched")
    };
    agg.written(&patch, Outcome::Written, 2 * finish + 1);
    assert_eq!(
        agg.observe(event("m1", Reason::UpdateRecorded), 2 * finish + 2),
        Observed::Counted
    );
}

#[test]
fn the_fleet_bound_drops_new_events_past_its_burst() {
    let mut agg = Aggregator::new(0);
    let calls: Vec<(u64, String)> = (0..FLEET_EVENT_BURST + 10)
        .map(|i| (0, format!("m{i}")))
        .collect();
    let observed: Vec<Observed> = calls
        .iter()
        .map(|(at, m)| agg.observe(event(m, Reason::UpdateRecorded), *at))
        .collect();
    let dropped = observed
        .iter()
        .filter(|o| **o == Observed::Dropped(Dropped::FleetRate))
        .count();
    assert_eq!(dropped, 10);
}

#[test]
fn a_patch_that_finds_its_event_gone_creates_it_again_with_its_count() {
    let mut agg = Aggregator::new(0);
    let observed = run(&mut agg, &[(0, "m1", Reason::HeldByBudget)]);
    let Observed::Write(Write::Create(first)) = &observed[0] else {
        panic!()
    };
    let Observed::Write(patch) = agg.observe(event("m1", Reason::HeldByBudget), S) else {
        panic!("the first repeat is patched at once")
    };
    let Some(Write::Create(again)) = agg.written(&patch, Outcome::Gone, S) else {
        panic!("a gone Event is created again")
    };
    assert_ne!(again.name, first.name);
    assert_eq!(again.event_time_ms, 0);
    assert_eq!(
        again.series,
        Some(Series {
            count: 2,
            last_observed_ms: S
        })
    );
    assert_eq!(again.note, first.note);
}

#[test]
fn a_failed_create_forgets_the_series_and_a_failed_patch_is_tried_again() {
    let mut agg = Aggregator::new(0);
    let Observed::Write(create) = agg.observe(event("m1", Reason::StepFailed), 0) else {
        panic!()
    };
    assert_eq!(agg.written(&create, Outcome::Failed, 0), None);
    assert!(agg.is_empty());
    let again = run(&mut agg, &[(S, "m1", Reason::StepFailed)]);
    assert_eq!(kinds(&again), ["create"]);
    let Observed::Write(patch) = agg.observe(event("m1", Reason::StepFailed), 2 * S) else {
        panic!()
    };
    assert_eq!(agg.written(&patch, Outcome::Failed, 2 * S), None);
    let due = agg.tick(2 * S + SERIES_PATCH_INTERVAL.as_millis() as u64);
    assert!(
        matches!(due.as_slice(), [Write::Patch { series, .. }] if series.count == 2),
        "{due:?}"
    );
}

#[test]
fn flush_writes_every_unwritten_count_at_once() {
    let mut agg = Aggregator::new(0);
    run(
        &mut agg,
        &[
            (0, "m1", Reason::HeldByWindow),
            (1, "m1", Reason::HeldByWindow),
            (2, "m1", Reason::HeldByWindow),
            (3, "m2", Reason::HeldByGate),
            (4, "m2", Reason::HeldByGate),
            (5, "m2", Reason::HeldByGate),
            (6, "m3", Reason::UpdateDone),
        ],
    );
    assert_eq!(agg.tick(10), vec![]);
    let mut counts: Vec<u32> = agg
        .flush(10)
        .iter()
        .map(|w| match w {
            Write::Patch { series, .. } => series.count,
            Write::Create(_) => 0,
        })
        .collect();
    counts.sort();
    assert_eq!(counts, [3, 3]);
}

#[test]
fn a_machine_recreated_under_the_same_name_starts_a_new_series() {
    let mut agg = Aggregator::new(0);
    run(&mut agg, &[(0, "m1", Reason::HeldByWindow)]);
    let mut other = event("m1", Reason::HeldByWindow);
    other.uid = Some("uid-2".into());
    let Observed::Write(Write::Create(created)) = agg.observe(other, S) else {
        panic!("a new object is a new Event")
    };
    assert_eq!(created.uid.as_deref(), Some("uid-2"));
}

#[test]
fn notes_are_cut_to_the_api_bound_on_a_character_boundary_and_names_fit() {
    let long = "é".repeat(NOTE_MAX_BYTES);
    let note = bounded_note(&long);
    assert!(note.len() <= NOTE_MAX_BYTES, "{}", note.len());
    assert!(note.ends_with('…'));
    assert_eq!(bounded_note("short"), "short");
    let mut agg = Aggregator::new(0);
    let Observed::Write(Write::Create(created)) =
        agg.observe(event(&"m".repeat(253), Reason::UpdateDone), 0)
    else {
        panic!()
    };
    assert!(created.name.len() <= 253, "{}", created.name.len());
}

#[test]
fn the_series_kept_in_memory_are_bounded() {
    let mut agg = Aggregator::new(0);
    // Spread over time so neither bound refuses: every Machine's first Event, one per fleet refill.
    let step = 1000 / u64::from(crate::mgmt::events::rate::FLEET_EVENTS_PER_SECOND);
    for i in 0..(MAX_SERIES as u64 + 5) {
        let observed = agg.observe(event(&format!("m{i}"), Reason::UpdateRecorded), i * step);
        if let Observed::Write(write) = observed {
            agg.written(&write, Outcome::Written, i * step);
        }
    }
    assert!(agg.len() <= MAX_SERIES, "{}", agg.len());
}
