//! A run's transitions: reports and progress move it forward, repeats and stale reports change nothing.

use super::*;
use inplace_agent_api::{AgentIdentity, MachineRef, Step, StepAction};

fn plan(steps: usize) -> Plan {
    Plan {
        id: "run-1".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: (0..steps)
            .map(|i| Step {
                index: i as u32,
                description: format!("step {i}"),
                timeout_seconds: 60,
                action: StepAction::Ntp {
                    servers: vec![],
                    enabled: None,
                },
            })
            .collect(),
        control_plane: false,
    }
}

fn report(index: u32, status: StepStatus, attempt: u32) -> StepReport {
    StepReport {
        agent: AgentIdentity::Machine(MachineRef::new("default", "m")),
        plan_id: "run-1".into(),
        step_index: index,
        status,
        attempt,
        started_at_unix_ms: Some(1),
        finished_at_unix_ms: None,
        exit_code: None,
        stderr_tail: None,
        message: None,
        undo: false,
        rollback: None,
    }
}

#[test]
fn reports_move_a_run_forward_and_repeats_are_no_ops() {
    let mut run = UpdateRecord::new(plan(2), 0);
    assert_eq!(run.outcome(), RunOutcome::Waiting);
    assert!(
        run.apply_report(&report(0, StepStatus::Running, 1), 1)
            .unwrap()
    );
    assert_eq!(run.outcome(), RunOutcome::InProgress { index: 0 });
    assert!(
        run.apply_report(&report(0, StepStatus::Succeeded, 1), 2)
            .unwrap()
    );
    assert!(
        !run.apply_report(&report(0, StepStatus::Succeeded, 1), 3)
            .unwrap()
    );
    assert!(
        !run.apply_report(&report(0, StepStatus::Running, 1), 3)
            .unwrap(),
        "late running report ignored"
    );
    assert_eq!(run.outcome(), RunOutcome::InProgress { index: 1 });
    assert!(
        run.apply_report(&report(1, StepStatus::Succeeded, 1), 4)
            .unwrap()
    );
    assert_eq!(run.outcome(), RunOutcome::Done);
    assert_eq!(run.finished_ms, Some(4));
    assert_eq!(
        run.apply_report(&report(7, StepStatus::Running, 1), 5),
        Err(ReportRejection::NoSuchStep(7))
    );
}

#[test]
fn a_failed_run_stays_failed() {
    let mut run = UpdateRecord::new(plan(3), 0);
    run.apply_report(&report(0, StepStatus::Succeeded, 1), 1)
        .unwrap();
    let mut failed = report(1, StepStatus::Failed, 1);
    failed.stderr_tail = Some("x".repeat(10_000));
    run.apply_report(&failed, 2).unwrap();
    assert_eq!(run.outcome(), RunOutcome::Failed { index: 1 });
    assert!(run.steps[1].stderr_tail.as_ref().unwrap().len() <= KEPT_STDERR_BYTES);
    assert!(
        !run.apply_report(&report(2, StepStatus::Succeeded, 1), 3)
            .unwrap()
    );
    assert!(
        !run.apply_report(&report(1, StepStatus::Succeeded, 1), 3)
            .unwrap()
    );
    assert_eq!(run.outcome(), RunOutcome::Failed { index: 1 });
}

#[test]
fn a_restarted_attempt_may_rerun_an_interrupted_step() {
    let mut run = UpdateRecord::new(plan(1), 0);
    run.apply_report(&report(0, StepStatus::Running, 1), 1)
        .unwrap();
    assert!(
        run.apply_report(&report(0, StepStatus::Running, 2), 2)
            .unwrap()
    );
    assert_eq!(run.steps[0].attempt, 2);
    assert!(
        run.apply_report(&report(0, StepStatus::Succeeded, 2), 3)
            .unwrap()
    );
    assert_eq!(run.outcome(), RunOutcome::Done);
}

#[test]
fn agent_progress_recovers_lost_reports() {
    let mut run = UpdateRecord::new(plan(3), 0);
    let progress = PlanProgress {
        plan_id: "run-1".into(),
        status: PlanStatus::Succeeded,
        succeeded_steps: 3,
        total_steps: 3,
        failed_step: None,
        hold: None,
        rollback: None,
    };
    assert!(run.agent_needs_plan(None));
    assert!(run.apply_progress(&progress, 9));
    assert_eq!(run.outcome(), RunOutcome::Done);
    assert!(!run.agent_needs_plan(Some(&progress)));
    let other = PlanProgress {
        plan_id: "old".into(),
        ..progress
    };
    assert!(!run.apply_progress(&other, 10));
}
