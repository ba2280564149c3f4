//! Reports and the server's word on holds: delivering the outbox in order, taking the hold an ack or a poll
//! answer carries, and the agent as the executor and the rollback see it ([`StepHost`]).

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{AckResponse, AgentIdentity, REPORT_PATH};
use tokio::time::Instant;

use crate::attempt::host::StepHost;
use crate::net::client::ClientError;
use crate::os::driver_env::DriverEnv;
use crate::run::agent::{Agent, REQUEST_TIMEOUT};
use crate::state::StateStore;

impl Agent {
    /// Takes the server's word on the hold of plan `plan_id` (from a report's ack or a poll answer): kept in
    /// the current plan's record when it is that plan (the caller saves). Returns whether it changed.
    pub(crate) fn note_hold(
        &mut self,
        plan_id: &str,
        hold: Option<inplace_agent_api::Hold>,
    ) -> bool {
        let Some(record) = self
            .store
            .state
            .current
            .as_mut()
            .filter(|r| r.plan_id == plan_id)
        else {
            return false;
        };
        let hold = hold.filter(|h| h.plan_id == plan_id);
        self.go_ahead = hold.is_none();
        if record.hold == hold {
            return false;
        }
        let next = record.next_step().map_or(0, |i| i + 1);
        let total = record.steps.len();
        match &hold {
            Some(h) if h.cancels() => {
                tracing::warn!(plan = %plan_id, reason = %h, step = next, total, "plan cancelled by the server: no new step starts; the plan ends here")
            }
            Some(h) => {
                tracing::warn!(plan = %plan_id, reason = %h, step = next, total, "plan held: no new step starts until the server lifts the hold")
            }
            None => tracing::info!(plan = %plan_id, step = next, total, "hold lifted: continuing"),
        }
        record.hold = hold;
        true
    }

    /// Delivers queued reports in order. A 400/404/409 answer drops the report (it cannot
    /// become acceptable); anything else stops delivery until the next try.
    pub async fn flush_outbox(&mut self) -> Result<(), ClientError> {
        while let Some(report) = self.store.state.outbox.first().cloned() {
            let result = self
                .client
                .post::<_, AckResponse>(REPORT_PATH, &report, REQUEST_TIMEOUT)
                .await;
            match result {
                // The ack's hold is saved below in the same write that drops the report.
                Ok(ack) => {
                    self.note_hold(&report.plan_id, ack.hold);
                }
                Err(ClientError::Status {
                    status: status @ (400 | 404 | 409),
                    message,
                    ..
                }) => {
                    tracing::warn!(plan = %report.plan_id, step = report.step_index, status, %message, "server refused a report; dropping it");
                }
                Err(e) => return Err(e),
            }
            if let Some(pos) = self.store.state.outbox.iter().position(|r| *r == report) {
                self.store.state.outbox.remove(pos);
            }
            if let Err(e) = self.store.save() {
                tracing::error!(error = %e, "cannot save state after delivering a report");
            }
        }
        Ok(())
    }
}

/// The executor's view of the agent: the state, and the server's go-ahead and report delivery.
impl StepHost for Agent {
    fn store(&mut self) -> &mut StateStore {
        &mut self.store
    }

    fn identity(&self) -> &AgentIdentity {
        &self.identity
    }

    fn env(&self) -> Arc<DriverEnv> {
        self.env.clone()
    }

    fn step_boundary(&mut self) {
        self.go_ahead = false;
    }

    fn plan_ended(&mut self) {
        self.inventory_due = true;
        crate::upkeep::node_sweep::sweep_now(&self.env, &self.store.state);
    }

    fn next_delay(&mut self) -> Duration {
        self.backoff.next_delay()
    }

    fn reports_due_at(&self) -> Instant {
        self.next_flush_at
    }

    async fn deliver_reports(&mut self) {
        if self.flush_outbox().await.is_err() {
            self.next_flush_at = Instant::now() + self.backoff.next_delay();
        }
    }

    async fn send_report(&mut self, report: inplace_agent_api::StepReport) -> bool {
        let sent = self
            .client
            .post::<_, AckResponse>(REPORT_PATH, &report, REQUEST_TIMEOUT)
            .await;
        match sent {
            // The hold it acks is kept in memory, saved with the next write that gets through.
            Ok(ack) => {
                self.note_hold(&report.plan_id, ack.hold);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the server why the agent waits");
                false
            }
        }
    }
}
