//! The pull loop: run the current plan's next step when there is one, otherwise deliver
//! reports, send the inventory when due, and long-poll the server for work. Network failures
//! never stop the agent: it backs off (capped, jittered) and tries again.

use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::AgentIdentity;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::config::agent::AgentConfig;
use crate::config::{ConfigError, DriverConfig};
use crate::net::client::{ClientError, ServerClient};
use crate::os::driver_env::DriverEnv;
use crate::run::executor::run_step;
use crate::shutdown::{Shutdown, pause};
use crate::state::{StateError, StateStore};

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
    pub(crate) fn next_runnable_step(&self) -> Option<usize> {
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
