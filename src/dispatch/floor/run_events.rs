//! Which Events a run's transition is worth (issue 40): a step failed, the rollback started or ended, the run is
//! done — judged from the run before and after one report or progress, so each is posted once, by the call that
//! made it true, whichever of the agent's reports or its progress summary brought it. Pure.

use inplace_agent_api::RollbackState;

use super::outbox::Reason;
use super::run::{RunOutcome, UpdateRecord};

/// The Events `after` is worth, given the run was `before`, in the order they happened.
pub fn between(before: &UpdateRecord, after: &UpdateRecord) -> Vec<(Reason, String)> {
    let mut events = Vec::new();
    let was = before.outcome();
    let now = after.outcome();
    let failed_at = |outcome: &RunOutcome| match outcome {
        RunOutcome::Failed { index } | RunOutcome::RollingBack { index } => Some(*index),
        _ => None,
    };
    if let (None, Some(index)) = (failed_at(&was), failed_at(&now)) {
        events.push((Reason::StepFailed, failed_step(after, index)));
    }
    if let (None, Some(rollback)) = (&before.rollback, &after.rollback) {
        events.push((
            Reason::RollbackStarted,
            format!(
                "rolling back the steps before step {} (onFailure rollback)",
                rollback.failed_step + 1
            ),
        ));
    }
    if let Some(rollback) = after.rollback_ended_since(before.rollback_state()) {
        let reason = match rollback.state {
            RollbackState::RolledBack => Reason::RolledBack,
            _ => Reason::RollbackFailed,
        };
        events.push((reason, rollback.summary()));
    }
    if now == RunOutcome::Done && was != RunOutcome::Done {
        let total = after.plan.steps.len();
        events.push((
            Reason::UpdateDone,
            format!(
                "in-place update done: {total} step{} on {}",
                if total == 1 { "" } else { "s" },
                after.plan.machine
            ),
        ));
    }
    events
}

/// `step 3/5: <description> failed (exit 1): <agent's message>`, as UpdateMachine's Failure starts.
fn failed_step(run: &UpdateRecord, index: usize) -> String {
    let description = run
        .plan
        .steps
        .get(index)
        .map(|s| s.description.as_str())
        .unwrap_or_default();
    let mut message = format!(
        "step {}/{}: {description} failed",
        index + 1,
        run.plan.steps.len()
    );
    if let Some(step) = run.steps.get(index) {
        if let Some(code) = step.exit_code {
            message.push_str(&format!(" (exit {code})"));
        }
        if let Some(text) = &step.message {
            message.push_str(&format!(": {text}"));
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use inplace_agent_api::{
        AgentIdentity, MachineRef, Plan, RollbackProgress, Step, StepAction, StepReport, StepStatus,
    };

    use super::*;

    fn two_step_plan() -> Plan {
        Plan {
            id: "run-1".into(),
            machine: MachineRef::new("default", "m"),
            cluster: "c".into(),
            steps: (0..2)
                .map(|i| Step {
                    index: i,
                    description: format!("set ntp {i}"),
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

    fn report(index: u32, status: StepStatus) -> StepReport {
        StepReport {
            agent: AgentIdentity::Machine(MachineRef::new("default", "m")),
            plan_id: "run-1".into(),
            step_index: index,
            status,
            attempt: 1,
            started_at_unix_ms: Some(1),
            finished_at_unix_ms: Some(2),
            exit_code: None,
            stderr_tail: None,
            message: Some("exit status 3".into()),
            undo: false,
            rollback: None,
        }
    }

    fn rollback(
        state: RollbackState,
        failed_step: u32,
        undone: u32,
        message: &str,
    ) -> Option<RollbackProgress> {
        Some(RollbackProgress {
            state,
            failed_step,
            undone,
            message: message.into(),
        })
    }

    fn reasons(events: &[(Reason, String)]) -> Vec<Reason> {
        events.iter().map(|(r, _)| *r).collect()
    }

    #[test]
    fn a_run_that_succeeds_says_done_once() {
        let mut run = UpdateRecord::new(two_step_plan(), 1);
        let mut seen = Vec::new();
        for (index, status) in [
            (0, StepStatus::Running),
            (0, StepStatus::Succeeded),
            (1, StepStatus::Succeeded),
            (1, StepStatus::Succeeded),
        ] {
            let before = run.clone();
            run.apply_report(&report(index, status), 2)
                .expect("applies");
            seen.extend(between(&before, &run));
        }
        assert_eq!(reasons(&seen), [Reason::UpdateDone]);
        assert!(seen[0].1.starts_with("in-place update done: 2 steps on "));
    }

    #[test]
    fn a_failure_then_its_rollback_each_say_so_once_in_order() {
        let mut run = UpdateRecord::new(two_step_plan(), 1);
        run.apply_report(&report(0, StepStatus::Succeeded), 2)
            .expect("applies");
        let before = run.clone();
        let mut failed = report(1, StepStatus::Failed);
        failed.rollback = rollback(RollbackState::RollingBack, 1, 0, "");
        run.apply_report(&failed, 3).expect("applies");
        let first = between(&before, &run);
        assert_eq!(
            reasons(&first),
            [Reason::StepFailed, Reason::RollbackStarted]
        );
        assert!(first[0].1.starts_with("step 2/2: "), "{}", first[0].1);
        assert!(
            first[0].1.ends_with("failed: exit status 3"),
            "{}",
            first[0].1
        );
        // The same report again is no news.
        let again = run.clone();
        run.apply_report(&failed, 4).expect("applies");
        assert!(between(&again, &run).is_empty());
        let before = run.clone();
        let mut done = failed.clone();
        done.rollback = rollback(RollbackState::RolledBack, 1, 1, "node back at v1.33.1");
        run.apply_report(&done, 5).expect("applies");
        let end = between(&before, &run);
        assert_eq!(reasons(&end), [Reason::RolledBack]);
        assert!(end[0].1.contains("node back at v1.33.1"), "{}", end[0].1);
    }

    #[test]
    fn a_failed_rollback_is_a_warning() {
        let mut run = UpdateRecord::new(two_step_plan(), 1);
        let before = run.clone();
        let mut failed = report(0, StepStatus::Failed);
        failed.rollback = rollback(RollbackState::Failed, 0, 0, "undo of step 1 failed");
        run.apply_report(&failed, 2).expect("applies");
        let events = between(&before, &run);
        assert_eq!(
            reasons(&events),
            [
                Reason::StepFailed,
                Reason::RollbackStarted,
                Reason::RollbackFailed
            ]
        );
        assert_eq!(
            Reason::RollbackFailed.event_type(),
            super::super::outbox::EventType::Warning
        );
    }
}
