//! The long-poll: who the agent is (its Machine, or its provider id through the index), whether its token
//! covers that Machine, the agent's own progress summary folded into its run, and the run it should execute
//! now with the hold on it — at once when there is one, else when one is recorded (by any replica) or the
//! poll's wait ends.

use std::time::Duration;

use tokio::sync::Notify;

use inplace_agent_api::{
    AgentIdentity, Hold, MAX_WAIT_SECONDS, MachineRef, OnFailure, Plan, PlanProgress, PollRequest,
    PollResponse,
};

use super::Agents;
use super::quiet::Quiet;
use crate::dispatch::floor::DispatchError;
use crate::dispatch::floor::hold::hold_for;
use crate::dispatch::floor::keys::{
    agent_upgrade_key, machine_key, provider_key, update_key, valid_segment,
};
use crate::dispatch::floor::records::{MachineRecord, ProviderIndex};
use crate::dispatch::floor::run::{RunOutcome, UpdateRecord};
use crate::dispatch::floor::run_events;
use crate::dispatch::upkeep::tokens::AgentScope;

/// The refusal of an agent whose token does not cover the Machine it claims.
fn forbidden(scope: &AgentScope, machine: &MachineRef) -> DispatchError {
    DispatchError::Forbidden(format!(
        "this token is scoped to {scope}; it does not cover machine {machine}"
    ))
}

/// A run the agent should execute now: its plan, the hold on it and the Machine's onFailure.
type Pending = (Plan, Option<Hold>, Option<OnFailure>);

pub(super) fn truncate(text: &str) -> String {
    text.chars().take(80).collect()
}

impl Agents {
    /// Resolves who the agent is. A provider id the server has not seen yet resolves to nothing (`None`).
    pub(super) async fn resolve(
        &self,
        identity: &AgentIdentity,
    ) -> Result<Option<MachineRef>, DispatchError> {
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
                let key = provider_key(id);
                let index = self.floor.db.value::<ProviderIndex>(&key).await;
                Ok(self
                    .noted("provider index", &key, index)?
                    .map(|index| index.machine))
            }
        }
    }

    /// Scope check against the Machine's record; returns the record (if any) when allowed.
    pub(super) async fn scoped_machine(
        &self,
        scope: &AgentScope,
        machine: &MachineRef,
    ) -> Result<Option<MachineRecord>, DispatchError> {
        if !scope.covers(machine, None) {
            return Err(forbidden(scope, machine));
        }
        let key = machine_key(machine);
        let record = self.noted(
            "machine record",
            &key,
            self.floor.db.value::<MachineRecord>(&key).await,
        )?;
        if let Some(record) = &record
            && !scope.covers(machine, Some(&record.cluster))
        {
            return Err(forbidden(scope, machine));
        }
        Ok(record)
    }

    /// Folds the agent's own summary into the run it names (recovers reports lost in a crash). Returns whether
    /// it changed the run.
    /// A hold in it counts only when it is the hold the server puts on that run (`record`: the Machine's
    /// record): an agent confirms holds, it cannot make them up.
    pub(super) async fn absorb_progress(
        &self,
        machine: &MachineRef,
        progress: &PlanProgress,
        record: Option<&MachineRecord>,
    ) -> Result<bool, DispatchError> {
        let now = self.floor.now_ms();
        let mut wrote = false;
        let mut failed_kind = None;
        let mut rollback_end = None;
        let mut happened = Vec::new();
        // Progress that ends the run (its last report was lost) gives the update budget's slots back with it.
        self.budget
            .update_run(
                machine,
                &progress.plan_id,
                false,
                |current: Option<&UpdateRecord>| {
                    (wrote, failed_kind, rollback_end, happened) = (false, None, None, Vec::new());
                    let Some(was) = current else { return Ok(None) };
                    let was_failed = failed_at(&was.outcome()).is_some();
                    let before = was.rollback_state();
                    let expected = record.and_then(|r| hold_for(r, was, now));
                    let mut progress = progress.clone();
                    progress.hold = progress.hold.filter(|h| Some(h) == expected.as_ref());
                    let mut run = was.clone();
                    if !run.apply_progress(&progress, now) {
                        return Ok(None);
                    }
                    happened = run_events::between(was, &run);
                    if let (Some(index), false) = (failed_at(&run.outcome()), was_failed) {
                        failed_kind = run
                            .plan
                            .steps
                            .get(index)
                            .map(|step| step.action.step_kind());
                    }
                    rollback_end = run.rollback_ended_since(before).cloned();
                    wrote = true;
                    Ok(Some(run))
                },
            )
            .await?;
        self.post(machine, record.and_then(|r| r.uid.as_deref()), happened);
        if let Some(kind) = failed_kind {
            // Its report was lost: no duration, but the failure counts.
            self.fleet.step_finished(kind, None, true);
        }
        if let Some(rollback) = rollback_end {
            self.rollback_ended(machine, &progress.plan_id, &rollback);
        }
        Ok(wrote)
    }

    /// The run the agent should execute now, if any, with the hold on it: the run `record` (the Machine's
    /// record, already scope-checked) points at.
    async fn pending_plan(
        &self,
        machine: &MachineRef,
        record: Option<MachineRecord>,
        current: Option<&PlanProgress>,
    ) -> Result<Option<Pending>, DispatchError> {
        let Some(record) = record else {
            return Ok(None);
        };
        let key = update_key(machine, &record.run_id);
        let run = self.floor.db.value::<UpdateRecord>(&key).await;
        let Some(run) = self.noted("update record", &key, run)? else {
            return Ok(None);
        };
        let hold = hold_for(&record, &run, self.floor.now_ms());
        Ok(run
            .agent_needs_plan(current)
            .then_some((run.plan, hold, record.on_failure)))
    }

    /// The run the agent should execute now, if any, with the hold on it. From this replica's quiet look of the
    /// Machine when one answers (no store read: [`super::quiet`]); else the Machine's record (scope-checked)
    /// and its run are read, at most [`POLL_LOOKS_IN_FLIGHT`] polls at a time on this replica (a fleet
    /// connecting at once queues here instead of piling its reads onto the store until they time out), and at a
    /// poll's `first` look the agent's summary `current` is folded in. A look that finds nothing to do is kept.
    ///
    /// [`POLL_LOOKS_IN_FLIGHT`]: super::POLL_LOOKS_IN_FLIGHT
    async fn look(
        &self,
        scope: &AgentScope,
        machine: &MachineRef,
        current: Option<&PlanProgress>,
        first: bool,
    ) -> Result<Option<Pending>, DispatchError> {
        if !scope.covers(machine, None) {
            return Err(forbidden(scope, machine));
        }
        let now = self.floor.now_ms();
        if let Some(quiet) = self.quiet.kept(machine, current, now) {
            if let Some(cluster) = &quiet.cluster
                && !scope.covers(machine, Some(cluster))
            {
                return Err(forbidden(scope, machine));
            }
            if first {
                self.seen.mark(machine);
            }
            return Ok(None);
        }
        let ticket = self.quiet.ticket(machine);
        let (record, mut pending) = {
            // Never closed: the semaphore lives as long as the wing.
            let _permit = self.looks.acquire().await.ok();
            let record = self.scoped_machine(scope, machine).await?;
            let pending = self.pending_plan(machine, record.clone(), current).await?;
            (record, pending)
        };
        if first {
            // In memory only: other replicas learn it from this replica's presence (no store write per poll).
            self.seen.mark(machine);
        }
        let mut wrote = false;
        if let Some(progress) = current.filter(|_| first) {
            let absorbed = self
                .absorb_progress(machine, progress, record.as_ref())
                .await;
            let key = update_key(machine, &progress.plan_id);
            wrote = self.noted("run progress", &key, absorbed)?;
            // Folding the progress in may have changed the run: look at it as it is now.
            pending = self.pending_plan(machine, record.clone(), current).await?;
        }
        // Kept only what this look absorbed: a later look of the poll did not fold `current` in again.
        let absorbed_here = first || current.is_none();
        if let Some(ticket) = ticket
            && pending.is_none()
            && !wrote
            && absorbed_here
            && Quiet::worth_keeping(current)
        {
            let quiet = Quiet {
                cluster: record.map(|record| record.cluster),
                absorbed: current.cloned(),
                at_ms: now,
            };
            self.quiet.keep(machine, ticket, quiet);
        }
        Ok(pending)
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
        // Joined before the first look, so the scope check's read of the Machine's record is also the first
        // look's: one read per look, and a run recorded after it still wakes this poll.
        let notify = self.waiters.join(&machine);
        let answer = self.answer(scope, request, &machine, &notify).await;
        self.waiters.leave(&machine, notify);
        // Only agents that say what they trust are offered a CA bundle (0.1 agents send no facts).
        answer.map(|answer| PollResponse {
            ca_bundle_sha256: request
                .facts
                .as_ref()
                .and_then(|_| self.upkeep.served_ca.sha256()),
            ..answer
        })
    }

    /// The long-poll's answer for `machine`, woken by `notify`.
    async fn answer(
        &self,
        scope: &AgentScope,
        request: &PollRequest,
        machine: &MachineRef,
        notify: &Notify,
    ) -> Result<PollResponse, DispatchError> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs(u64::from(request.wait_seconds.min(MAX_WAIT_SECONDS)));
        // The hold both sides agree on while the agent waits out a hold (said again when the poll times out).
        let mut agreed: Option<Hold>;
        // The Machine's onFailure, said with every answer that carries a plan or a hold.
        let mut on_failure: Option<OnFailure> = None;
        // Its own upgrade: noted at every poll, offered only when the Machine has no plan for it, at the first look.
        let mut upgrade = None;
        let mut first = true;
        loop {
            // Register interest before looking, so a run recorded in between is not missed.
            let for_machine = notify.notified();
            let for_everyone = self.waiters.everyone().notified();
            tokio::pin!(for_machine, for_everyone);
            for_machine.as_mut().enable();
            for_everyone.as_mut().enable();
            // Against the Machine's record, not just the namespace: a cluster token of the same namespace must
            // be refused before its `current` progress is folded into another cluster's run.
            let pending = self
                .look(scope, machine, request.current.as_ref(), first)
                .await?;
            if std::mem::take(&mut first)
                && let Some(facts) = &request.facts
            {
                let noted = self.upkeep.rollout.note_upgrade(machine, facts).await;
                let key = agent_upgrade_key(machine);
                let noted = self.noted("agent upgrade", &key, noted)?;
                upgrade = Some((facts, noted));
            }
            match pending {
                Some((plan, hold, said)) => {
                    on_failure = said;
                    // An agent already honouring this very hold waits here until it changes; any other agent
                    // gets the plan (its go-ahead, or the plan to adopt) with the hold now.
                    let honoured = request
                        .current
                        .as_ref()
                        .filter(|c| c.plan_id == plan.id)
                        .and_then(|c| c.hold.as_ref());
                    if hold.is_none() || honoured != hold.as_ref() {
                        return Ok(PollResponse {
                            plan: Some(plan),
                            hold,
                            on_failure,
                            ..PollResponse::default()
                        });
                    }
                    agreed = hold;
                }
                None => {
                    agreed = None;
                    if let Some((facts, record)) = upgrade.take()
                        && let Some(upgrade) = self
                            .upkeep
                            .rollout
                            .offer_upgrade(machine, facts, request.current.as_ref(), record)
                            .await?
                    {
                        return Ok(PollResponse {
                            agent_upgrade: Some(upgrade),
                            ..PollResponse::default()
                        });
                    }
                }
            }
            tokio::select! {
                () = &mut for_machine => {}
                () = &mut for_everyone => {}
                () = tokio::time::sleep_until(deadline) => return Ok(held(agreed, on_failure)),
                // Shutting down: answer now so the drain is not held up by idle polls.
                () = self.floor.shutdown.cancelled() => return Ok(held(agreed, on_failure)),
            }
        }
    }
}

/// The answer without a plan: the agreed hold, and with it the Machine's onFailure (an answer carrying neither
/// says nothing about it).
fn held(hold: Option<Hold>, on_failure: Option<OnFailure>) -> PollResponse {
    PollResponse {
        on_failure: on_failure.filter(|_| hold.is_some()),
        plan: None,
        hold,
        ..PollResponse::default()
    }
}

/// The failed step of a run that failed (whether or not it is being rolled back).
fn failed_at(outcome: &RunOutcome) -> Option<usize> {
    match outcome {
        RunOutcome::Failed { index } | RunOutcome::RollingBack { index } => Some(*index),
        _ => None,
    }
}
