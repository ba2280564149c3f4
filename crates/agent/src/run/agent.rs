//! The pull loop: run the current plan's next step when there is one, otherwise deliver
//! reports, send the inventory when due, and long-poll the server for work. Network failures
//! never stop the agent: it backs off (capped, jittered) and tries again.

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{
    AckResponse, AgentIdentity, INVENTORY_PATH, POLL_GRACE_SECONDS, POLL_PATH, Plan, PlanStatus,
    PollRequest, PollResponse, REPORT_PATH, validate_plan_structure,
};
use tokio::time::Instant;

use crate::attempt::host::StepHost;
use crate::backoff::Backoff;
use crate::config::agent::AgentConfig;
use crate::config::{ConfigError, DriverConfig};
use crate::net::client::{ClientError, ServerClient};
use crate::os::driver_env::DriverEnv;
use crate::os::inventory;
use crate::run::executor::run_step;
use crate::shutdown::{Shutdown, pause};
use crate::state::{LocalStepStatus, StateError, StateStore, report_for};

/// Timeout of a report or inventory request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long start-up waits for the state dir lock. Another process can hold it for a moment
/// without being an agent: a command forked by this process inherits the descriptor until it
/// execs. A second real agent holds it for good and is refused after this long.
pub const STATE_LOCK_WAIT: Duration = Duration::from_secs(3);
/// Pause between tries for the state dir lock.
const STATE_LOCK_RETRY: Duration = Duration::from_millis(50);

/// An empty poll answer that came back faster than this (a server that does not hold polls)
/// is followed by a pause of the remainder, so the agent never spins.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why the agent could not start (everything after start is retried, never fatal).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The driver config is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state dir is unusable.
    #[error(transparent)]
    State(#[from] StateError),
    /// Server URL, CA file or TLS setup is unusable.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `--root` is not a directory.
    #[error("--root {0}: not a directory")]
    Root(String),
    /// No `--config`, or one without the commands of a Kubernetes version step, while they are required.
    #[error("{0}")]
    NoKubernetesSteps(String),
}

/// A running agent.
pub(crate) struct Agent {
    pub identity: AgentIdentity,
    pub env: Arc<DriverEnv>,
    pub client: ServerClient,
    pub store: StateStore,
    pub backoff: Backoff,
    pub inventory_due: bool,
    pub poll_wait_seconds: u32,
    /// Reports are not retried before this instant after a failed delivery.
    pub next_flush_at: Instant,
    /// Whether the last exchange with the server worked (`None` before the first).
    pub connected: Option<bool>,
    /// Whether the server said "no hold" on the current plan since the last step started or ended (and since
    /// this process started): a step that has not begun starts only then (see [`Agent::may_start`]).
    pub go_ahead: bool,
    /// Its own executable and where its last self-upgrade stands.
    pub me: crate::upkeep::self_upgrade::SelfBinary,
    /// An upgrade that failed to download or install is not tried again before this instant.
    pub upgrade_not_before: Option<Instant>,
    /// When the server's CA bundle may next be tried after a failed update.
    pub ca_follower: crate::upkeep::ca_update::CaFollower,
    /// Since when an offered plan could not be stored because the state dir is full.
    pub plan_waited_for_room: Option<Instant>,
}

impl Agent {
    /// Checks the config, opens the state dir and builds the client.
    pub async fn start(config: AgentConfig) -> Result<Self, AgentError> {
        if !config.root.is_dir() {
            return Err(AgentError::Root(config.root.display().to_string()));
        }
        let driver_config = match &config.driver_config {
            Some(path) => DriverConfig::load(path)?,
            None => DriverConfig::default(),
        };
        if config.require_kubernetes_steps {
            config
                .check_kubernetes_steps(&driver_config)
                .map_err(AgentError::NoKubernetesSteps)?;
        }
        let lock_deadline = Instant::now() + STATE_LOCK_WAIT;
        let store = loop {
            match StateStore::open(&config.state_dir) {
                Err(StateError::Locked(_)) if Instant::now() < lock_deadline => {
                    tokio::time::sleep(STATE_LOCK_RETRY).await;
                }
                other => break other?,
            }
        };
        let client = ServerClient::new(
            &config.server,
            &config.ca_file,
            &config.token_file,
            config.tls_server_name.as_deref(),
        )?;
        let me =
            crate::upkeep::self_upgrade::SelfBinary::load(config.binary.clone(), &config.state_dir);
        let env = Arc::new(DriverEnv::new(
            config.root.clone(),
            driver_config,
            config.state_dir.clone(),
        ));
        crate::upkeep::node_sweep::sweep_now(&env, &store.state);
        Ok(Self {
            identity: config.identity,
            env,
            client,
            store,
            backoff: Backoff::default(),
            inventory_due: true,
            poll_wait_seconds: config.poll_wait_seconds,
            next_flush_at: Instant::now(),
            connected: None,
            go_ahead: false,
            me,
            upgrade_not_before: None,
            ca_follower: Default::default(),
            plan_waited_for_room: None,
        })
    }

    /// The main loop, until `shutdown` completes.
    pub async fn run(mut self, mut shutdown: Shutdown) -> crate::Stopped {
        tracing::info!(agent = %self.identity, state_dir = %self.store.dir().display(), "agent started");
        let mut stopped = crate::Stopped::Shutdown;
        loop {
            if self.trial_over() {
                tracing::error!(
                    "this agent binary is on trial and has not reached the server in time; exiting so that agent-start restores the previous one"
                );
                stopped = crate::Stopped::Restart;
                break;
            }
            // A rollback under way runs before anything else: the node is half changed until it ends.
            if let Some(flow) = crate::rollback::run_next(&mut self, &mut shutdown).await {
                if flow.is_break() {
                    break;
                }
                continue;
            }
            if let Some(index) = self.next_runnable_step()
                && self.may_start(index)
            {
                if run_step(&mut self, index, &mut shutdown).await.is_break() {
                    break;
                }
                continue;
            }
            match self.idle_round(&mut shutdown).await {
                Ok(Round::Continue) => {}
                Ok(Round::Stop) => break,
                Ok(Round::Restart) => {
                    stopped = crate::Stopped::Restart;
                    break;
                }
                Err(error) => {
                    self.inventory_due = true;
                    let delay = self.backoff.next_delay();
                    self.connected = Some(false);
                    crate::net::diagnose::log_failure(&error, self.client.base(), delay).await;
                    if pause(delay, &mut shutdown).await {
                        break;
                    }
                }
            }
        }
        tracing::info!(agent = %self.identity, "agent stopped");
        stopped
    }

    /// The step to run next: the first unfinished step of a running plan whose body we hold.
    fn next_runnable_step(&self) -> Option<usize> {
        self.store.plan.as_ref()?;
        self.store.state.current.as_ref()?.next_step()
    }

    /// Whether step `index` of the current plan may start now. A step that began (it was running when a hold
    /// came, or a crash or reboot interrupted it) always finishes. Any other starts only when no hold is held,
    /// every report was acked, and since the last step started or ended the server said "no hold" (a report's
    /// ack or a poll answer). So no step starts after an ack that carried a hold, even across a crash: the
    /// hold is saved in the same write that drops the acked report, and a restarted agent asks first.
    pub(crate) fn may_start(&self, index: usize) -> bool {
        let Some(record) = self.store.state.current.as_ref() else {
            return false;
        };
        if record.steps.get(index).is_some_and(|s| s.began()) {
            return true;
        }
        record.hold.is_none() && self.go_ahead && self.store.state.outbox.is_empty()
    }

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

    /// Reports, inventory, then one poll (none when the acks gave the go-ahead for the next step).
    async fn idle_round(&mut self, shutdown: &mut Shutdown) -> Result<Round, ClientError> {
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
    fn mark_connected(&mut self) {
        if self.connected != Some(true) {
            tracing::info!(agent = %self.identity, server = %self.client.base(), "connected to the server");
            self.connected = Some(true);
        }
    }

    fn progress(&self) -> Option<inplace_agent_api::PlanProgress> {
        self.store.state.current.as_ref().map(|c| c.progress())
    }

    /// Takes a plan from a poll answer.
    async fn accept(&mut self, plan: Plan, shutdown: &mut Shutdown) -> Result<Round, ClientError> {
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

    async fn pause_after_useless_answer(&mut self, shutdown: &mut Shutdown) -> Round {
        if pause(self.backoff.next_delay(), shutdown).await {
            Round::Stop
        } else {
            Round::Continue
        }
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

/// What the loop does next.
pub(crate) enum Round {
    /// Go on.
    Continue,
    /// Shutdown requested.
    Stop,
    /// The agent's binary was replaced: exit so that the unit starts the new one.
    Restart,
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
