//! What running a step (an undo, the rollback's end) needs from the agent around it: the one trait the
//! executor, the rollback and the full-state-dir wait know the agent by (the pull loop implements it; the
//! tests, a host without a server).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{AgentIdentity, StepReport};
use tokio::time::Instant;

use crate::os::driver_env::DriverEnv;
use crate::state::StateStore;

/// What running a step needs from the agent around it.
pub(crate) trait StepHost {
    /// The state dir: the current plan, its progress, the outbox.
    fn store(&mut self) -> &mut StateStore;
    /// Who this agent is (reports name it).
    fn identity(&self) -> &AgentIdentity;
    /// The drivers' environment.
    fn env(&self) -> Arc<DriverEnv>;
    /// A step started or ended: the next one starts only after a fresh "no hold" from the server.
    fn step_boundary(&mut self);
    /// The plan ended: the inventory is due.
    fn plan_ended(&mut self);
    /// The next back-off delay after a failure.
    fn next_delay(&mut self) -> Duration;
    /// When queued reports may next be delivered (a failed delivery backs off).
    fn reports_due_at(&self) -> Instant;
    /// Delivers queued reports; a failure sets the next due time a back-off delay away.
    fn deliver_reports(&mut self) -> impl Future<Output = ()> + Send;
    /// Sends one report at once, outside the outbox (which holds only what is on disk): why a step waits for
    /// room in a full state dir. True when the server took it.
    fn send_report(&mut self, report: StepReport) -> impl Future<Output = bool> + Send;
}
