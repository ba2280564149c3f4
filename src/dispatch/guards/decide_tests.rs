//! The remediation guard's decisions, table-tested over runs at each point of an OS image plan (files, drain,
//! osImage, waitNodeReady, uncordon).

use inplace_agent_api::{MachineRef, Plan, Step, StepAction};

use super::*;
use crate::dispatch::floor::guard::{GuardRecord, GuardWant, LiftReason, guard_value};
use crate::dispatch::floor::run::{StepState, UpdateRecord};
use crate::dispatch::floor::run_view::RunView;

const START: u64 = 1_796_000_000_000;
const RUN: &str = "run-1";

fn machine() -> MachineRef {
    MachineRef::new("default", "edge-01")
}

fn step(index: u32, action: StepAction) -> Step {
    Step {
        index,
        description: format!("step {index}"),
        timeout_seconds: 600,
        action,
    }
}

/// files, drainNode, osImage, waitNodeReady, uncordonNode.
fn run() -> UpdateRecord {
    let plan = Plan {
        id: RUN.into(),
        machine: machine(),
        cluster: "edge".into(),
        steps: vec![
            step(0, StepAction::Files { files: vec![] }),
            step(
                1,
                StepAction::DrainNode {
                    delete_empty_dir_data: false,
                    force_unmanaged: false,
                },
            ),
            step(
                2,
                StepAction::OsImage {
                    image: "os:2".into(),
                },
            ),
            step(
                3,
                StepAction::WaitNodeReady {
                    kubelet_version: None,
                },
            ),
            step(4, StepAction::UncordonNode),
        ],
        control_plane: false,
    };
    UpdateRecord::new(plan, START)
}

/// The run with steps before `index` succeeded and `index` running since `START`.
fn at(index: usize) -> RunView {
    let mut run = run();
    for (i, step) in run.steps.iter_mut().enumerate() {
        if i < index {
            step.state = StepState::Succeeded;
            step.started_ms = Some(START);
        } else if i == index {
            step.state = StepState::Running;
            step.started_ms = Some(START);
        }
    }
    RunView::of(&run)
}

fn record(want: GuardWant, applied: bool) -> GuardRecord {
    GuardRecord {
        machine: machine(),
        run_id: RUN.into(),
        value: guard_value(RUN),
        want,
        applied,
        step: Some(2),
        deadline_ms: Some(START + 600_000),
        lifted: (want == GuardWant::Off).then_some(LiftReason::NodeBack),
        operator_value: false,
        kept_past_deadline: false,
        updated_ms: START,
    }
}

#[test]
fn the_guard_is_needed_from_the_start_until_the_last_step_that_takes_the_node_down() {
    let deadline = Some(START + 600_000);
    let table: [(RunView, Need); 6] = [
        (
            RunView::of(&run()),
            Need::On {
                step: 0,
                deadline_ms: None,
            },
        ),
        (
            at(0),
            Need::On {
                step: 0,
                deadline_ms: None,
            },
        ),
        (
            at(1),
            Need::On {
                step: 1,
                deadline_ms: deadline,
            },
        ),
        (
            at(2),
            Need::On {
                step: 2,
                deadline_ms: deadline,
            },
        ),
        (
            at(3),
            Need::On {
                step: 3,
                deadline_ms: deadline,
            },
        ),
        (at(4), Need::Off(LiftReason::NodeBack)),
    ];
    for (i, (run, wanted)) in table.iter().enumerate() {
        assert_eq!(&need(Some(run), START + 1, false), wanted, "row {i}");
    }
    let mut ended = run();
    ended.finished_ms = Some(START);
    assert_eq!(
        need(Some(&RunView::of(&ended)), START, false),
        Need::Off(LiftReason::RunEnded)
    );
    assert_eq!(need(None, START, false), Need::Off(LiftReason::RunEnded));
    let mut no_disruption = run();
    no_disruption.plan.steps.truncate(1);
    no_disruption.steps.truncate(1);
    assert_eq!(
        need(Some(&RunView::of(&no_disruption)), START, false),
        Need::Off(LiftReason::NodeBack)
    );
}

#[test]
fn past_the_steps_deadline_the_guard_is_lifted_unless_kept() {
    let past = START + 600_000;
    assert_eq!(
        need(Some(&at(2)), past - 1, false),
        Need::On {
            step: 2,
            deadline_ms: Some(past)
        }
    );
    assert_eq!(
        need(Some(&at(2)), past, false),
        Need::Off(LiftReason::Deadline)
    );
    assert_eq!(
        need(Some(&at(2)), past, true),
        Need::On {
            step: 2,
            deadline_ms: Some(past)
        }
    );
}

#[test]
fn kept_past_the_deadline_the_record_says_so_once_and_stays_on_and_applied() {
    let m = machine();
    let held = GuardRecord {
        step: Some(2),
        ..record(GuardWant::On, true)
    };
    let late = START + 600_000;
    assert_eq!(
        decide(&m, Some(RUN), Some(&at(2)), Some(&held), late - 1, true),
        None,
        "before the deadline nothing changes"
    );
    let kept = decide(&m, Some(RUN), Some(&at(2)), Some(&held), late, true).unwrap();
    assert_eq!(
        (
            kept.want,
            kept.applied,
            kept.kept_past_deadline,
            kept.lifted
        ),
        (GuardWant::On, true, true, None),
        "still on, nothing to patch: only the record (and its Event) says it was kept"
    );
    assert_eq!(
        decide(
            &m,
            Some(RUN),
            Some(&at(2)),
            Some(&kept),
            late + 60_000,
            true
        ),
        None,
        "said once"
    );
    let off = decide(&m, Some(RUN), Some(&at(4)), Some(&kept), late + 1, true).unwrap();
    assert_eq!(
        (off.want, off.lifted, off.kept_past_deadline),
        (GuardWant::Off, Some(LiftReason::NodeBack), false),
        "the node back after all: lifted as usual"
    );
}

#[test]
fn the_record_follows_the_need_and_a_lifted_deadline_stays_lifted_at_that_step() {
    let m = machine();
    let set = decide(&m, Some(RUN), Some(&at(0)), None, START, false).unwrap();
    assert_eq!(
        (set.want, set.applied, set.value.as_str()),
        (GuardWant::On, false, "inplace-updater:run-1")
    );
    // Applied and unchanged: nothing to write.
    let held = GuardRecord {
        step: Some(2),
        ..record(GuardWant::On, true)
    };
    assert_eq!(
        decide(&m, Some(RUN), Some(&at(2)), Some(&held), START + 1, false),
        None
    );
    // The node is back: off, to be removed.
    let off = decide(&m, Some(RUN), Some(&at(4)), Some(&held), START + 1, false).unwrap();
    assert_eq!(
        (off.want, off.applied, off.lifted),
        (GuardWant::Off, false, Some(LiftReason::NodeBack))
    );
    // The deadline: off; the same step later stays off; the next step that takes the node down sets it again.
    let late = START + 600_000;
    let lifted = decide(&m, Some(RUN), Some(&at(2)), Some(&held), late, false).unwrap();
    assert_eq!(lifted.lifted, Some(LiftReason::Deadline));
    let lifted = GuardRecord {
        applied: true,
        ..lifted
    };
    assert_eq!(
        decide(&m, Some(RUN), Some(&at(2)), Some(&lifted), late + 1, false),
        None
    );
    let mut next_step = at(3);
    next_step.steps[3].started_ms = Some(late);
    let again = decide(
        &m,
        Some(RUN),
        Some(&next_step),
        Some(&lifted),
        late + 1,
        false,
    )
    .unwrap();
    assert_eq!(
        (again.want, again.applied, again.step),
        (GuardWant::On, false, Some(3))
    );
}

#[test]
fn another_runs_guard_is_lifted_and_seen_lifted_before_the_new_one_is_set() {
    let m = machine();
    let old = record(GuardWant::On, true);
    let lifted = decide(&m, Some("run-2"), Some(&at(1)), Some(&old), START, false).unwrap();
    assert_eq!(
        (lifted.run_id.as_str(), lifted.want, lifted.lifted),
        (RUN, GuardWant::Off, Some(LiftReason::RunEnded))
    );
    assert_eq!(
        decide(&m, Some("run-2"), Some(&at(1)), Some(&lifted), START, false),
        None,
        "not yet seen lifted"
    );
    let seen = GuardRecord {
        applied: true,
        ..lifted
    };
    let new = decide(&m, Some("run-2"), Some(&at(1)), Some(&seen), START, false).unwrap();
    assert_eq!(
        (new.run_id.as_str(), new.want, new.value.as_str()),
        ("run-2", GuardWant::On, "inplace-updater:run-2")
    );
}

#[test]
fn only_the_records_own_value_is_ever_removed() {
    let on = record(GuardWant::On, false);
    let off = record(GuardWant::Off, false);
    let ours = guard_value(RUN);
    let table = [
        (&on, None, MachineChange::Set(ours.clone())),
        (
            &on,
            Some(ours.as_str()),
            MachineChange::Nothing { operator: false },
        ),
        (
            &on,
            Some("ops:ticket-9"),
            MachineChange::Nothing { operator: true },
        ),
        (&off, Some(ours.as_str()), MachineChange::Remove),
        (
            &off,
            Some("ops:ticket-9"),
            MachineChange::Nothing { operator: true },
        ),
        (
            &off,
            Some("inplace-updater:another-run"),
            MachineChange::Nothing { operator: true },
        ),
        (&off, None, MachineChange::Nothing { operator: false }),
    ];
    for (i, (record, current, wanted)) in table.into_iter().enumerate() {
        assert_eq!(machine_change(current, record), wanted, "row {i}");
    }
}

#[test]
fn a_run_starts_once_its_guard_is_settled_or_could_not_be_set() {
    let value = guard_value(RUN);
    let pending = Some(value.as_str());
    assert!(!release_gate(pending, None, false));
    assert!(!release_gate(
        pending,
        Some(&record(GuardWant::On, false)),
        false
    ));
    assert!(release_gate(
        pending,
        Some(&record(GuardWant::On, true)),
        false
    ));
    assert!(release_gate(
        pending,
        Some(&record(GuardWant::Off, false)),
        false
    ));
    assert!(
        release_gate(pending, Some(&record(GuardWant::On, false)), true),
        "fails open"
    );
    assert!(
        !release_gate(None, Some(&record(GuardWant::On, true)), false),
        "nothing pending"
    );
}
