//! The change admission table-tested: canaries alone, the soak, the gates, the brake, the operator controls.

use inplace_agent_api::MachineRef;
use inplace_core::pacing::Pacing;

use super::control::{ChangeRow, Control, apply};
use super::decide::{Admission, Asked, GateOutcome, RunEnd, Verdict, admit};
use super::identity::ChangeId;
use super::record::{ChangeRecord, Halt, Member};

const MIN: u64 = 60_000;

fn m(name: &str) -> MachineRef {
    MachineRef {
        namespace: "default".into(),
        name: name.into(),
    }
}

fn pacing(pairs: &[(&str, &str)]) -> Pacing {
    let mut p = Pacing::default();
    for (k, v) in pairs {
        p.set(k, v).unwrap();
    }
    p
}

fn change() -> ChangeId {
    ChangeId::from_label("v1.34.1+os-image:node-os:2.0".into())
}

fn ask(
    record: Option<&ChangeRecord>,
    ends: &[(Member, RunEnd)],
    machine: &str,
    p: &Pacing,
    gates: &[GateOutcome],
    now: u64,
) -> Admission {
    let machine = m(machine);
    let run_id = format!("run-{}", machine.name);
    let change = change();
    admit(
        record,
        ends,
        &Asked {
            machine: &machine,
            run_id: &run_id,
            change: &change,
            pacing: p,
            gates,
            now_ms: now,
            retry_after_seconds: 30,
            skip_soak: machine.name.ends_with("-skips"),
        },
    )
}

fn member(record: &ChangeRecord, name: &str) -> Member {
    record
        .running
        .iter()
        .find(|r| r.machine.name == name)
        .unwrap()
        .clone()
}

fn waits(a: &Admission) -> &str {
    match &a.verdict {
        Verdict::Wait { message, .. } => message,
        Verdict::Go { .. } => panic!("went: {a:?}"),
    }
}

#[test]
fn the_first_canary_goes_alone_and_the_others_wait_for_it() {
    let p = pacing(&[("soak", "10m")]);
    let first = ask(None, &[], "a", &p, &[], 0);
    assert_eq!(first.verdict, Verdict::Go { canary: true });
    assert!(first.changed);
    let second = ask(Some(&first.record), &[], "b", &p, &[], 1000);
    assert_eq!(
        waits(&second),
        "waiting for change v1.34.1+os-image:node-os:2.0 to prove itself on its canaries: default/a running"
    );
    assert!(!second.changed, "a wait with nothing new writes nothing");
}

#[test]
fn after_the_canary_is_done_the_change_soaks_then_goes_on() {
    let p = pacing(&[("soak", "10m")]);
    let rec = ask(None, &[], "a", &p, &[], 0).record;
    let done = [(member(&rec, "a"), RunEnd::Done { ms: 5 * MIN })];
    let soaking = ask(Some(&rec), &done, "b", &p, &[], 9 * MIN);
    let message = waits(&soaking);
    assert!(
        message.starts_with("waiting for change v1.34.1+os-image:node-os:2.0 to soak until 00:15:00 UTC after default/a finished (1 done, 0 running)"),
        "{message}"
    );
    assert!(matches!(
        soaking.verdict,
        Verdict::Wait {
            retry_after_seconds: 30,
            ..
        }
    ));
    assert!(soaking.changed, "the finish is folded and written");
    let near = ask(Some(&soaking.record), &[], "b", &p, &[], 15 * MIN - 5_000);
    assert!(
        matches!(
            near.verdict,
            Verdict::Wait {
                retry_after_seconds: 5,
                ..
            }
        ),
        "{near:?}"
    );
    let skips = ask(Some(&soaking.record), &[], "b-skips", &p, &[], 9 * MIN);
    assert_eq!(
        skips.verdict,
        Verdict::Go { canary: false },
        "the skip-soak annotation"
    );
    let after = ask(Some(&soaking.record), &[], "b", &p, &[], 15 * MIN);
    assert_eq!(after.verdict, Verdict::Go { canary: false });
    // Each later start soaks after the latest finish.
    let rec = after.record;
    let done = [(member(&rec, "b"), RunEnd::Done { ms: 20 * MIN })];
    let c = ask(Some(&rec), &done, "c", &p, &[], 21 * MIN);
    assert!(
        waits(&c).contains("until 00:30:00 UTC after default/b finished (2 done"),
        "{c:?}"
    );
}

#[test]
fn a_failed_canary_brakes_the_change_for_everyone_who_has_not_started_it() {
    let p = pacing(&[("canary", "2")]);
    let rec = ask(None, &[], "a", &p, &[], 0).record;
    let rec = ask(Some(&rec), &[], "b", &p, &[], 1).record;
    assert_eq!(rec.canaries.len(), 2);
    let failed = [(
        member(&rec, "a"),
        RunEnd::Failed {
            reason: "step 3/6 kubeadm upgrade apply (v1.34.1) failed".into(),
        },
    )];
    let held = ask(Some(&rec), &failed, "c", &p, &[], 2);
    let message = waits(&held);
    let id = change().id;
    assert_eq!(
        message,
        format!(
            "change v1.34.1+os-image:node-os:2.0 is halted by the failure brake after 1 failed Machine(s) (bound 1): \
             default/a: step 3/6 kubeadm upgrade apply (v1.34.1) failed; Machines that have not started it wait. \
             Release it with `inplace-updater change release {id}`"
        )
    );
    assert!(
        held.changed,
        "the brake is written even though nothing starts"
    );
    // The other canary started: it goes on. The failed one may be retried.
    let b = ask(Some(&held.record), &[], "b", &p, &[], 3);
    assert_eq!(b.verdict, Verdict::Go { canary: false });
    let a = ask(Some(&held.record), &[], "a", &p, &[], 3);
    assert_eq!(a.verdict, Verdict::Go { canary: false });
    // Released: the brake counts only new failures, and the failed canary's place goes to the next Machine.
    let released = apply(&held.record, Control::Release, 4).unwrap();
    assert_eq!(released.halted, None);
    let c = ask(Some(&released), &[], "c", &p, &[], 5);
    assert_eq!(c.verdict, Verdict::Go { canary: true });
    let d = ask(Some(&c.record), &[], "d", &p, &[], 6);
    assert!(
        waits(&d).ends_with("canaries: default/b running, default/c running"),
        "{d:?}"
    );
}

#[test]
fn past_the_canaries_max_failures_bounds_the_failures() {
    let p = pacing(&[("canary", "0"), ("maxFailures", "2")]);
    let mut rec = ask(None, &[], "a", &p, &[], 0).record;
    for name in ["b", "c"] {
        rec = ask(Some(&rec), &[], name, &p, &[], 1).record;
    }
    assert_eq!(rec.running.len(), 3);
    let fail = |r: &ChangeRecord, n: &str| {
        (
            member(r, n),
            RunEnd::Failed {
                reason: "step 1/2 files failed".into(),
            },
        )
    };
    let one = ask(Some(&rec), &[fail(&rec, "a")], "d", &p, &[], 2);
    assert_eq!(
        one.verdict,
        Verdict::Go { canary: false },
        "one failure of two allowed"
    );
    let two = ask(
        Some(&one.record),
        &[fail(&one.record, "b")],
        "e",
        &p,
        &[],
        3,
    );
    assert!(
        waits(&two).contains("after 2 failed Machine(s) (bound 2)"),
        "{two:?}"
    );
}

#[test]
fn a_failing_gate_holds_the_change_and_restarts_the_soak() {
    let p = pacing(&[("soak", "10m"), ("healthGates", "storage")]);
    let bad = [GateOutcome {
        name: "storage".into(),
        passed: false,
        message: "gate storage (prometheus http://127.0.0.1:9090): query returned 1 series: site_storage_degraded = 1".into(),
    }];
    let first = ask(None, &[], "a", &p, &bad, 0);
    assert_eq!(
        waits(&first),
        "change v1.34.1+os-image:node-os:2.0 is held by its health gates: gate storage (prometheus \
         http://127.0.0.1:9090): query returned 1 series: site_storage_degraded = 1"
    );
    assert!(
        first.record.canaries.is_empty(),
        "a held change starts no canary"
    );
    let good = [GateOutcome {
        name: "storage".into(),
        passed: true,
        message: "gate storage: passed".into(),
    }];
    // The soak counts from the failing gate: passing again is not enough at once.
    let canary = ask(Some(&first.record), &[], "a", &p, &good, MIN);
    assert!(
        waits(&canary).contains("soak until 00:10:00 UTC after a health gate failed"),
        "{canary:?}"
    );
    let later = ask(Some(&first.record), &[], "a", &p, &good, 10 * MIN);
    assert_eq!(later.verdict, Verdict::Go { canary: true });
}

#[test]
fn promote_skips_canaries_and_soak_and_halt_holds_newcomers() {
    let p = pacing(&[("soak", "1h"), ("canary", "3")]);
    let rec = ask(None, &[], "a", &p, &[], 0).record;
    let promoted = apply(&rec, Control::Promote, 1).unwrap();
    assert_eq!(
        apply(&promoted, Control::Promote, 2),
        None,
        "promoting twice changes nothing"
    );
    let b = ask(Some(&promoted), &[], "b", &p, &[], 2);
    assert_eq!(b.verdict, Verdict::Go { canary: false });
    let halted = apply(&b.record, Control::Halt, 3).unwrap();
    let c = ask(Some(&halted), &[], "c", &p, &[], 4);
    assert!(
        waits(&c).contains("is halted by an operator; Machines that have not started it wait"),
        "{c:?}"
    );
    let row = ChangeRow::of(&halted);
    assert_eq!(row.state, "halted");
    assert_eq!(row.running, 2);
    assert_eq!(row.canaries, ["default/a running"]);
}

#[test]
fn a_canary_whose_run_is_gone_leaves_its_place() {
    let p = pacing(&[("canary", "1")]);
    let rec = ask(None, &[], "a", &p, &[], 0).record;
    let gone = [(member(&rec, "a"), RunEnd::Gone)];
    let b = ask(Some(&rec), &gone, "b", &p, &[], 1);
    assert_eq!(b.verdict, Verdict::Go { canary: true });
    assert_eq!(b.record.canaries.len(), 1);
    assert_eq!(b.record.canaries[0].member.machine, m("b"));
}

#[test]
fn the_gates_are_asked_only_when_their_outcome_decides() {
    let p = pacing(&[("soak", "10m"), ("healthGates", "storage")]);
    // A first Machine would start: the gates decide.
    let first = ask(None, &[], "a", &p, &[], 0);
    assert!(first.gated);
    let rec = first.record;
    // Waiting for the canary: the gates cannot change that.
    let waiting = ask(Some(&rec), &[], "b", &p, &[], MIN);
    assert!(!waiting.gated, "{waiting:?}");
    // The canary itself, asking again: it is in the change already.
    assert!(!ask(Some(&rec), &[], "a", &p, &[], MIN).gated);
    // Soaking after the canary finished: a failing gate restarts the soak, so they are asked.
    let done = [(member(&rec, "a"), RunEnd::Done { ms: 2 * MIN })];
    let soaking = ask(Some(&rec), &done, "b", &p, &[], 3 * MIN);
    assert!(waits(&soaking).contains("to soak until"), "{soaking:?}");
    assert!(soaking.gated);
    // A halted change holds whatever the gates say.
    let mut halted = soaking.record.clone();
    halted.halted = Some(Halt::Operator { ms: 3 * MIN });
    assert!(!ask(Some(&halted), &[], "b", &p, &[], 4 * MIN).gated);
}
