//! The agents' side of dispatch: long-poll for the current run, step reports, inventory. Every call is scoped
//! by the caller's token: an agent never sees (or learns of) a run outside its cluster or machine.

use std::time::Duration;

use inplace_agent_api::{
    AgentIdentity, Hold, InventoryReport, MAX_WAIT_SECONDS, MachineRef, PlanProgress, PollRequest,
    PollResponse, StepReport, StepStatus, validate_report,
};

use super::hold::hold_for;
use super::pace::StepKind;
use super::records::{
    MachineRecord, ProviderIndex, RunOutcome, UpdateRecord, machine_key, provider_key, update_key,
    valid_segment,
};
use super::{DispatchError, Dispatcher};

/// What a verified agent token allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AgentScope {
    /// Every Machine of one cluster.
    Cluster {
        /// The cluster's namespace.
        namespace: String,
        /// The cluster's name.
        cluster: String,
    },
    /// One Machine.
    Machine(MachineRef),
}

impl std::fmt::Display for AgentScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentScope::Cluster { namespace, cluster } => {
                write!(f, "cluster {namespace}/{cluster}")
            }
            AgentScope::Machine(machine) => write!(f, "machine {machine}"),
        }
    }
}

impl AgentScope {
    /// Whether a Machine (with the cluster its record names, when known) is inside this scope.
    fn covers(&self, machine: &MachineRef, cluster: Option<&str>) -> bool {
        match self {
            AgentScope::Machine(allowed) => allowed == machine,
            AgentScope::Cluster {
                namespace,
                cluster: allowed,
            } => namespace == &machine.namespace && cluster.is_none_or(|c| c == allowed),
        }
    }
}

fn forbidden(scope: &AgentScope, machine: &MachineRef) -> DispatchError {
    DispatchError::Forbidden(format!(
        "this token is scoped to {scope}; it does not cover machine {machine}"
    ))
}

impl Dispatcher {
    /// Resolves who the agent is. A provider id the server has not seen yet resolves to nothing (`None`).
    async fn resolve(&self, identity: &AgentIdentity) -> Result<Option<MachineRef>, DispatchError> {
        match identity {
            AgentIdentity::Machine(machine) => {
                if !valid_segment(&machine.namespace) || !valid_segment(&machine.name) {
                    return Err(DispatchError::BadRequest(format!(
                        "agent.machine {:?}/{:?} is not a valid namespace/name",
                        truncate(&machine.namespace),
                        truncate(&machine.name)
                    )));
                }
                Ok(Some(machine.clone()))
            }
            AgentIdentity::ProviderId(id) => {
                if id.is_empty() || id.len() > 512 {
                    return Err(DispatchError::BadRequest(
                        "agent.providerID must be 1..512 bytes".into(),
                    ));
                }
                Ok(self
                    .read::<ProviderIndex>(&provider_key(id))
                    .await?
                    .map(|(index, _)| index.machine))
            }
        }
    }

    /// Scope check against the Machine's record; returns the record (if any) when allowed.
    async fn scoped_machine(
        &self,
        scope: &AgentScope,
        machine: &MachineRef,
    ) -> Result<Option<MachineRecord>, DispatchError> {
        if !scope.covers(machine, None) {
            return Err(forbidden(scope, machine));
        }
        let record = self
            .read::<MachineRecord>(&machine_key(machine))
            .await?
            .map(|(r, _)| r);
        if let Some(record) = &record {
            if !scope.covers(machine, Some(&record.cluster)) {
                return Err(forbidden(scope, machine));
            }
        }
        Ok(record)
    }

    /// Folds the agent's own summary into the run it names (recovers reports lost in a crash).
    /// A hold in it counts only when it is the hold the server puts on that run (`record`: the Machine's
    /// record): an agent confirms holds, it cannot make them up.
    async fn absorb_progress(
        &self,
        machine: &MachineRef,
        progress: &PlanProgress,
        record: Option<&MachineRecord>,
    ) -> Result<(), DispatchError> {
        let key = update_key(machine, &progress.plan_id);
        let now = self.clock.now_ms();
        let window_now = self.clock.now_ms();
        let mut failed_kind = None;
        self.update(&key, |current: Option<&UpdateRecord>| {
            failed_kind = None;
            let Some(run) = current else { return Ok(None) };
            let was_failed = run.outcome().is_failure();
            let expected = record.and_then(|r| hold_for(r, run, window_now));
            let mut progress = progress.clone();
            progress.hold = progress.hold.filter(|h| Some(h) == expected.as_ref());
            let mut run = run.clone();
            if !run.apply_progress(&progress, now) {
                return Ok(None);
            }
            if let (RunOutcome::Failed { index }, false) = (run.outcome(), was_failed) {
                failed_kind = run.plan.steps.get(index).map(|step| step.action.kind());
            }
            Ok(Some(run))
        })
        .await?;
        if let Some(kind) = failed_kind {
            // Its report was lost: no duration, but the failure counts.
            self.metrics.step_finished(kind, None, true);
        }
        Ok(())
    }

    /// The run the agent should execute now, if any (already scope-checked), with the hold on it.
    async fn pending_plan(
        &self,
        scope: &AgentScope,
        machine: &MachineRef,
        current: Option<&PlanProgress>,
    ) -> Result<Option<(inplace_agent_api::Plan, Option<Hold>)>, DispatchError> {
        let Some(record) = self.scoped_machine(scope, machine).await? else {
            return Ok(None);
        };
        let Some((run, _)) = self
            .read::<UpdateRecord>(&update_key(machine, &record.run_id))
            .await?
        else {
            return Ok(None);
        };
        let hold = hold_for(&record, &run, self.clock.now_ms());
        Ok(run.agent_needs_plan(current).then_some((run.plan, hold)))
    }

    /// Long-poll: answers at once with the Machine's current run when the agent has not finished it, else
    /// waits until one is recorded (by any replica) or `min(wait_seconds, 30)` passes.
    pub async fn poll(
        &self,
        scope: &AgentScope,
        request: &PollRequest,
    ) -> Result<PollResponse, DispatchError> {
        let Some(machine) = self.resolve(&request.agent).await? else {
            // Unknown provider id: nothing to do yet; the agent polls again.
            tokio::time::sleep(Duration::from_secs(u64::from(
                request.wait_seconds.min(MAX_WAIT_SECONDS),
            )))
            .await;
            return Ok(PollResponse::nothing());
        };
        // Against the Machine's record, not just the namespace: a cluster token of the same namespace must be
        // refused before its `current` progress is folded into another cluster's run.
        let record = self.scoped_machine(scope, &machine).await?;
        // Persisted (when due) by a background task: the poll never waits on a store write for it.
        self.mark_seen(&machine);
        if let Some(progress) = &request.current {
            self.absorb_progress(&machine, progress, record.as_ref())
                .await?;
        }
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs(u64::from(request.wait_seconds.min(MAX_WAIT_SECONDS)));
        let notify = self.waiter(&machine);
        // The hold both sides agree on while the agent waits out a hold (said again when the poll times out).
        let mut agreed: Option<Hold>;
        let answer = loop {
            // Register interest before looking, so a run recorded in between is not missed.
            let for_machine = notify.notified();
            let for_everyone = self.everyone.notified();
            tokio::pin!(for_machine, for_everyone);
            for_machine.as_mut().enable();
            for_everyone.as_mut().enable();
            match self
                .pending_plan(scope, &machine, request.current.as_ref())
                .await
            {
                Ok(Some((plan, hold))) => {
                    // An agent already honouring this very hold waits here until it changes; any other agent
                    // gets the plan (its go-ahead, or the plan to adopt) with the hold now.
                    let honoured = request
                        .current
                        .as_ref()
                        .filter(|c| c.plan_id == plan.id)
                        .and_then(|c| c.hold.as_ref());
                    if hold.is_none() || honoured != hold.as_ref() {
                        break Ok(PollResponse {
                            plan: Some(plan),
                            hold,
                        });
                    }
                    agreed = hold;
                }
                Ok(None) => agreed = None,
                Err(err) => break Err(err),
            }
            tokio::select! {
                () = &mut for_machine => {}
                () = &mut for_everyone => {}
                () = tokio::time::sleep_until(deadline) => break Ok(PollResponse { plan: None, hold: agreed }),
                // Shutting down: answer now so the drain is not held up by idle polls.
                () = self.shutdown.cancelled() => break Ok(PollResponse { plan: None, hold: agreed }),
            }
        };
        self.release_waiter(&machine, notify);
        answer
    }

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
        self.mark_seen(&machine);
        let now = self.clock.now_ms();
        let mut rejection = None;
        let mut ended = None;
        let run = self
            .update(
                &update_key(&machine, &report.plan_id),
                |current: Option<&UpdateRecord>| {
                    ended = None;
                    let Some(run) = current else { return Ok(None) };
                    let mut run = run.clone();
                    match run.apply_report(report, now) {
                        Ok(true) => {
                            ended = run
                                .plan
                                .steps
                                .get(report.step_index as usize)
                                .map(|step| (step.action.kind(), step.description.clone()));
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
        if let Some(err) = rejection {
            return Err(DispatchError::BadRequest(err.to_string()));
        }
        // The Machine record is read again: a hold recorded while this report was applied is in this ack.
        let record = self
            .read::<MachineRecord>(&machine_key(&machine))
            .await?
            .map_or(record, |(r, _)| r);
        let now = self.clock.now_ms();
        Ok(run.and_then(|run| hold_for(&record, &run, now)))
    }

    /// Counts a step that just ended (first report of its end) and logs a failure.
    fn step_ended(
        &self,
        machine: &MachineRef,
        report: &StepReport,
        kind: &'static str,
        description: &str,
    ) {
        let failed = match report.status {
            StepStatus::Running => return,
            StepStatus::Succeeded => false,
            StepStatus::Failed => true,
        };
        let seconds = report
            .started_at_unix_ms
            .zip(report.finished_at_unix_ms)
            .map(|(start, end)| end.saturating_sub(start) as f64 / 1000.0);
        self.metrics.step_finished(kind, seconds, failed);
        if let (false, Some((start, end))) = (
            failed,
            report.started_at_unix_ms.zip(report.finished_at_unix_ms),
        ) {
            self.step_durations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .learn(StepKind::of_wire(kind), end.saturating_sub(start));
        }
        if failed {
            tracing::error!(
                %machine,
                run = %report.plan_id.chars().take(12).collect::<String>(),
                step = report.step_index + 1,
                kind,
                description,
                exit_code = ?report.exit_code,
                detail = report.message.as_deref().unwrap_or_default(),
                "step failed; the update stops here"
            );
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
        self.mark_seen(&machine);
        self.persist_seen(&machine, Some(report.clone())).await?;
        if let Some(progress) = &report.current {
            self.absorb_progress(&machine, progress, record.as_ref())
                .await?;
        }
        Ok(())
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(80).collect()
}
