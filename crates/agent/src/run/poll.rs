//! The idle round of the pull loop: between steps the agent saves what a full state dir held back, delivers
//! reports, sends the inventory when due, and long-polls the server; an answer may carry a plan (validated and
//! accepted here), a hold, a successor token, an upgrade or a new CA bundle.

use std::time::Duration;

use inplace_agent_api::{
    AckResponse, AgentIdentity, INVENTORY_PATH, POLL_GRACE_SECONDS, POLL_PATH, Plan, PlanStatus,
    PollRequest, PollResponse, validate_plan_structure,
};
use tokio::time::Instant;

use crate::attempt::host::StepHost;
use crate::net::client::ClientError;
use crate::os::inventory;
use crate::run::agent::{Agent, MIN_POLL_INTERVAL, REQUEST_TIMEOUT, Round};
use crate::shutdown::{Shutdown, pause};
use crate::state::{LocalStepStatus, StateError, report_for};

impl Agent {
    /// Reports, inventory, then one poll (none when the acks gave the go-ahead for the next step).
    pub(crate) async fn idle_round(
        &mut self,
        shutdown: &mut Shutdown,
    ) -> Result<Round, ClientError> {
        // A save that failed (a full state dir) left memory ahead of the disk: put it there once it fits.
        if self.store.unsaved()
            && let Err(e) = self.store.save()
        {
            tracing::debug!(error = %e, "the state is still not on disk");
        }
        tokio::select! {
            result = self.flush_outbox() => result?,
            () = &mut *shutdown => return Ok(Round::Stop),
        }
        if self.inventory_due {
            let report = inventory::gather(
                &self.env,
                self.identity.clone(),
                self.progress(),
                self.facts(),
            )
            .await;
            tokio::select! {
                result = self.client.post::<_, AckResponse>(INVENTORY_PATH, &report, REQUEST_TIMEOUT) => { result?; }
                () = &mut *shutdown => return Ok(Round::Stop),
            }
            self.inventory_due = false;
            self.mark_connected();
            self.me.connected();
        }
        if self
            .next_runnable_step()
            .is_some_and(|index| self.may_start(index))
        {
            self.mark_connected();
            return Ok(Round::Continue);
        }
        let request = PollRequest {
            agent: self.identity.clone(),
            current: self.progress(),
            wait_seconds: self.poll_wait_seconds,
            facts: Some(self.facts()),
        };
        let timeout = Duration::from_secs(u64::from(self.poll_wait_seconds + POLL_GRACE_SECONDS));
        let started = Instant::now();
        let answer: PollResponse = tokio::select! {
            result = self.client.post(POLL_PATH, &request, timeout) => result?,
            () = &mut *shutdown => return Ok(Round::Stop),
        };
        self.backoff.reset();
        self.mark_connected();
        self.me.connected();
        self.me
            .outcome_seen(request.facts.as_ref().and_then(|f| f.upgrade.as_ref()));
        if let Some(offer) = &answer.token
            && let Err(e) = self.client.keep_successor(&offer.token)
        {
            tracing::warn!(error = %e, "cannot keep the successor token the server offered; the current one stays in use");
        }
        if let Some(upgrade) = &answer.agent_upgrade
            && answer.plan.is_none()
            && let Round::Restart = self.take_upgrade(upgrade).await
        {
            return Ok(Round::Restart);
        }
        let check = || PollRequest {
            agent: self.identity.clone(),
            current: self.store.state.current.as_ref().map(|c| c.progress()),
            wait_seconds: 0,
            facts: None,
        };
        if self
            .ca_follower
            .follow(&mut self.client, check, &answer)
            .await
        {
            self.inventory_due = true;
        }
        let offered = answer.plan.is_some();
        let carries_setting = offered || answer.hold.is_some();
        let on_failure = answer.on_failure;
        if let Some(plan) = answer.plan
            && let Round::Stop = self.accept(plan, shutdown).await?
        {
            return Ok(Round::Stop);
        }
        // The answer's hold (or its absence) is the server's word on the plan we hold now.
        if let Some(plan_id) = self.store.state.current.as_ref().map(|c| c.plan_id.clone())
            && self.note_hold(&plan_id, answer.hold)
            && let Err(e) = self.store.save()
        {
            tracing::error!(error = %e, "cannot save the hold; it stays in force in memory");
        }
        // `onFailure` rides every answer carrying a plan or a hold (absent there: roll back).
        if carries_setting {
            crate::rollback::note_on_failure(&mut self.store, on_failure);
        }
        let held = self
            .store
            .state
            .current
            .as_ref()
            .is_some_and(|c| c.hold.is_some());
        // Never spin: an empty answer, or one that only repeats a hold, that came back fast is followed by a
        // pause of the remainder.
        let elapsed = started.elapsed();
        if (!offered || held)
            && elapsed < MIN_POLL_INTERVAL
            && pause(MIN_POLL_INTERVAL - elapsed, shutdown).await
        {
            return Ok(Round::Stop);
        }
        Ok(Round::Continue)
    }

    /// One line when the server answers again (or for the first time), none while it keeps answering.
    pub(crate) fn mark_connected(&mut self) {
        if self.connected != Some(true) {
            tracing::info!(agent = %self.identity, server = %self.client.base(), "connected to the server");
            self.connected = Some(true);
        }
    }

    pub(crate) fn progress(&self) -> Option<inplace_agent_api::PlanProgress> {
        self.store.state.current.as_ref().map(|c| c.progress())
    }

    /// Takes a plan from a poll answer.
    pub(crate) async fn accept(
        &mut self,
        plan: Plan,
        shutdown: &mut Shutdown,
    ) -> Result<Round, ClientError> {
        let refuse = |reason: String| {
            tracing::error!(agent = %self.identity, plan = %plan.id, %reason, "refusing plan from server");
        };
        if let Err(e) = validate_plan_structure(&plan) {
            refuse(e.to_string());
            return Ok(self.pause_after_useless_answer(shutdown).await);
        }
        if let AgentIdentity::Machine(machine) = &self.identity
            && plan.machine != *machine
        {
            refuse(format!(
                "plan is for machine {}, this agent is {machine}",
                plan.machine
            ));
            return Ok(self.pause_after_useless_answer(shutdown).await);
        }
        let current = self.store.state.current.as_ref();
        let same_id = current.is_some_and(|c| c.plan_id == plan.id);
        if same_id {
            if self.store.plan.is_none() {
                tracing::info!(plan = %plan.id, "server re-sent the current plan's body");
                if let Err(e) = self.store.adopt(plan) {
                    tracing::error!(error = %e, "cannot store plan");
                }
                return Ok(Round::Continue);
            }
            // Our running plan offered again: the answer to a poll for the next step's go-ahead.
            if current.is_some_and(|c| c.status() == PlanStatus::Running) {
                return Ok(Round::Continue);
            }
            // We already finished this id: the server missed our reports. Send them again and
            // never re-run anything.
            let record = self.store.state.current.clone();
            if let Some(record) = record.filter(|r| r.status() != PlanStatus::Running) {
                tracing::info!(plan = %record.plan_id, "server still offers a plan finished here; re-sending its reports");
                for (index, step) in record.steps.iter().enumerate() {
                    if matches!(
                        step.status,
                        LocalStepStatus::Succeeded | LocalStepStatus::Failed
                    ) {
                        let report = report_for(&self.identity, &record.plan_id, index, step);
                        self.store.enqueue(report);
                    }
                }
                for report in crate::rollback::finished_undo_reports(&self.identity, &record) {
                    self.store.enqueue(report);
                }
                if let Err(e) = self.store.save() {
                    tracing::error!(error = %e, "cannot save state");
                }
            }
            return Ok(self.pause_after_useless_answer(shutdown).await);
        }
        tracing::info!(agent = %self.identity, plan = %plan.id, steps = plan.steps.len(), "new plan");
        let id = plan.id.clone();
        let first_step = crate::attempt::state_full::plan_waiting_report(&self.identity, &plan);
        match self.store.adopt(plan) {
            Ok(()) => {
                if self.plan_waited_for_room.take().is_some() {
                    tracing::info!(plan = %id, "room in the state dir again: plan stored");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot store the new plan; will take it again on the next poll");
                // A full state dir is said where the Machine's message shows it: as the first step's.
                if let (StateError::Full { .. }, Some(report)) = (&e, first_step) {
                    let since = *self.plan_waited_for_room.get_or_insert_with(Instant::now);
                    self.send_report(report(&e, since.elapsed())).await;
                }
                return Ok(self.pause_after_useless_answer(shutdown).await);
            }
        }
        if let Err(e) = self.env.backups.prune(&id) {
            tracing::warn!(error = %e, "cannot prune old backups");
        }
        if let Err(e) = crate::drivers::prune_undo_snapshots(&self.env, &id) {
            tracing::warn!(error = %e, "cannot prune the undo snapshots of earlier plans");
        }
        Ok(Round::Continue)
    }

    pub(crate) async fn pause_after_useless_answer(&mut self, shutdown: &mut Shutdown) -> Round {
        if pause(self.backoff.next_delay(), shutdown).await {
            Round::Stop
        } else {
            Round::Continue
        }
    }
}
