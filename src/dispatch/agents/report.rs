//! Step reports and inventories: a report is applied to the run it names, which must be the Machine's current
//! run, and acknowledged with the hold on that run; an inventory is persisted per agent and its plan summary
//! folded into the run it names. A step's end is counted (and its duration learned) once.

use inplace_agent_api::{
    Hold, InventoryReport, MachineRef, StepReport, StepStatus, validate_report,
};

use super::Agents;
use super::poll::truncate;
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::hold::hold_for;
use crate::dispatch::floor::keys::machine_key;
use crate::dispatch::floor::outbox::{MachineEvent, Reason};
use crate::dispatch::floor::records::MachineRecord;
use crate::dispatch::floor::run::{RunRollback, UpdateRecord};
use crate::dispatch::floor::run_events;
use crate::dispatch::upkeep::tokens::AgentScope;
use inplace_agent_api::RollbackState;

impl Agents {
    /// One step report: applied to the run it names, which must be the Machine's current run. Answers the hold
    /// on that run, if any: the agent starts no step after an ack that carries one.
    pub async fn report(
        &self,
        scope: &AgentScope,
        report: &StepReport,
    ) -> Result<Option<Hold>, DispatchError> {
        validate_report(report).map_err(|err| DispatchError::BadRequest(err.to_string()))?;
        let Some(machine) = self.resolve(&report.agent).await? else {
            return Err(DispatchError::Conflict(
                "no run is recorded for this provider id".into(),
            ));
        };
        let record = self.scoped_machine(scope, &machine).await?;
        let Some(record) = record.filter(|r| r.run_id == report.plan_id) else {
            return Err(DispatchError::Conflict(format!(
                "plan {} is not the current run of machine {machine}",
                truncate(&report.plan_id)
            )));
        };
        self.seen.mark(&machine);
        let now = self.floor.now_ms();
        let mut rejection = None;
        let mut ended = None;
        let mut rollback_end = None;
        let mut happened = Vec::new();
        // The update budget's slots go with the run record: renewed by the report, given back when it ends the run.
        let run = self
            .budget
            .update_run(
                &machine,
                &report.plan_id,
                true,
                |current: Option<&UpdateRecord>| {
                    (ended, rollback_end, happened) = (None, None, Vec::new());
                    let Some(was) = current else { return Ok(None) };
                    let before = was.rollback_state();
                    let mut run = was.clone();
                    match run.apply_report(report, now) {
                        Ok(true) => {
                            happened = run_events::between(was, &run);
                            ended = run
                                .plan
                                .steps
                                .get(report.step_index as usize)
                                .filter(|_| !report.undo)
                                .map(|step| (step.action.step_kind(), step.description.clone()));
                            rollback_end = run.rollback_ended_since(before).cloned();
                            Ok(Some(run))
                        }
                        Ok(false) => Ok(None),
                        Err(err) => {
                            rejection = Some(err);
                            Ok(None)
                        }
                    }
                },
            )
            .await?;
        if let Some((kind, description)) = ended {
            self.step_ended(&machine, report, kind, &description);
        }
        if let Some(rollback) = rollback_end {
            self.rollback_ended(&machine, &report.plan_id, &rollback);
        }
        self.post(&machine, record.uid.as_deref(), happened);
        if let Some(err) = rejection {
            return Err(DispatchError::BadRequest(err.to_string()));
        }
        // The Machine record is read again: a hold recorded while this report was applied is in this ack.
        let record = self
            .floor
            .db
            .value::<MachineRecord>(&machine_key(&machine))
            .await?
            .unwrap_or(record);
        let now = self.floor.now_ms();
        Ok(run.and_then(|run| hold_for(&record, &run, now)))
    }

    /// Posts what a run's transition was worth (the run's end, its failed step, its rollback) as Events.
    pub(super) fn post(
        &self,
        machine: &MachineRef,
        uid: Option<&str>,
        happened: Vec<(Reason, String)>,
    ) {
        for (reason, note) in happened {
            self.floor
                .outbox
                .post(MachineEvent::new(machine, uid, reason, note));
        }
    }

    /// Counts a step that just ended (first report of its end) and logs a failure.
    fn step_ended(
        &self,
        machine: &MachineRef,
        report: &StepReport,
        kind: inplace_agent_api::StepKind,
        description: &str,
    ) {
        let failed = match report.status {
            StepStatus::Running => return,
            StepStatus::Succeeded => false,
            StepStatus::Failed => true,
        };
        let millis = report
            .started_at_unix_ms
            .zip(report.finished_at_unix_ms)
            .map(|(start, end)| end.saturating_sub(start));
        self.fleet.step_finished(kind, millis, failed);
        if failed {
            tracing::error!(
                %machine,
                run = %report.plan_id.chars().take(12).collect::<String>(),
                step = report.step_index + 1,
                kind = kind.wire(),
                description,
                exit_code = ?report.exit_code,
                detail = report.message.as_deref().unwrap_or_default(),
                "step failed; the update stops here"
            );
        }
    }

    /// Counts a rollback that just ended (the first report or progress that said so) and logs it.
    pub(super) fn rollback_ended(
        &self,
        machine: &MachineRef,
        run_id: &str,
        rollback: &RunRollback,
    ) {
        let rolled_back = rollback.state == RollbackState::RolledBack;
        self.fleet.rollback_ended(rolled_back);
        let run = run_id.chars().take(12).collect::<String>();
        let summary = rollback.summary();
        if rolled_back {
            tracing::warn!(%machine, %run, failed_step = rollback.failed_step + 1, %summary, "update rolled back");
        } else {
            tracing::error!(%machine, %run, failed_step = rollback.failed_step + 1, %summary, "rollback failed: node left cordoned");
        }
    }

    /// Inventory: persisted per agent, and its plan summary folded into the run it names.
    pub async fn inventory(
        &self,
        scope: &AgentScope,
        report: &InventoryReport,
    ) -> Result<(), DispatchError> {
        let Some(machine) = self.resolve(&report.agent).await? else {
            return Ok(());
        };
        let record = self.scoped_machine(scope, &machine).await?;
        self.seen.mark(&machine);
        self.seen.persist(&machine, report.clone()).await?;
        if let Some(progress) = &report.current {
            self.absorb_progress(&machine, progress, record.as_ref())
                .await?;
        }
        Ok(())
    }
}
