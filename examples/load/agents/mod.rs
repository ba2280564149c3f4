//! Simulated agents: each one a kept-alive TLS connection long-polling `/agent/v1/poll` with its bearer token,
//! exactly as `inplace-updater agent` does, and, when a plan arrives, reporting each step started and done
//! (each step takes `--step-millis`, no time by default) before polling again with its progress. A failed
//! request or connect is followed by the real agent's own back-off ([`inplace_agent::Backoff`]) and a new
//! connection, after one that broke or was refused, to another replica of its [`Route`] (as a Kubernetes
//! Service sends a new connection to a live endpoint), whose first request is an inventory report, as the real
//! agent's is after every reconnect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inplace_agent::Backoff;
use inplace_agent_api::{
    AgentIdentity, INVENTORY_PATH, InventoryReport, MachineRef, POLL_PATH, PlanProgress,
    PlanStatus, PollRequest, PollResponse, REPORT_PATH, StepReport, StepStatus,
};
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

use crate::net::Conn;

mod shared;

pub use shared::Shared;

/// Upper bound on polls per agent in one run (a run lasts minutes; an agent polls every ~25 s).
const MAX_POLLS_PER_AGENT: usize = 1_000;
/// Upper bound on connection attempts per agent.
const MAX_CONNECT_ATTEMPTS: usize = 50;

/// How the simulated updates are paced (`--step-millis`, `--stagger-seconds`, the server's `--retry-after`).
#[derive(clap::Args, Clone, Debug)]
pub struct Pace {
    /// How long each simulated step takes, `MIN-MAX` milliseconds (or one value): each agent's step is drawn
    /// uniformly from it, the same draw for the same agent and step on every run.
    #[arg(long, default_value = "0", value_parser = parse_step_millis)]
    pub step_millis: (u64, u64),
    /// The server's `--retry-after` (`adaptive` or `fixed`); the server's default when absent.
    #[arg(long)]
    pub retry_after: Option<String>,
    /// Spread the Machines' first UpdateMachine calls evenly over this many seconds (a rollout moving
    /// Machines in batches), instead of all at once.
    #[arg(long, default_value_t = 0.0)]
    pub stagger_seconds: f64,
}

fn parse_step_millis(text: &str) -> Result<(u64, u64), String> {
    let (low, high) = text.split_once('-').unwrap_or((text, text));
    let parse = |t: &str| t.trim().parse::<u64>().map_err(|e| format!("{t:?}: {e}"));
    let (low, high) = (parse(low)?, parse(high)?);
    if low > high || high > 600_000 {
        return Err("want MIN-MAX with MIN <= MAX <= 600000".into());
    }
    Ok((low, high))
}

impl Pace {
    /// Steps that take no time, every Machine at once, the server's default `--retry-after`.
    pub fn instant() -> Pace {
        Pace {
            step_millis: (0, 0),
            retry_after: None,
            stagger_seconds: 0.0,
        }
    }

    /// How long step `step` of agent `agent` takes (a fixed pseudo-random draw from `--step-millis`).
    pub fn step_duration(&self, agent: usize, step: u32) -> Duration {
        let (low, high) = self.step_millis;
        let z = mix(agent, step);
        Duration::from_millis(low + z % (high - low + 1))
    }
}

/// splitmix64 of `(agent, n)`: the same draw on every run, with no RNG dependency.
fn mix(agent: usize, n: u32) -> u64 {
    let mut z = ((agent as u64) << 16 | u64::from(n)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The replicas an agent may reach and the one it starts on (a single-server scenario: one address).
#[derive(Clone)]
pub struct Route {
    pub replicas: Arc<[SocketAddr]>,
    pub home: usize,
}

impl Route {
    /// One server.
    pub fn single(addr: SocketAddr) -> Route {
        Route {
            replicas: Arc::from([addr]),
            home: 0,
        }
    }

    /// Where agent `agent`'s next connection goes after its connection to replica `at` broke or was refused: a
    /// pseudo-random other replica (a Service picks a random live endpoint), so a dead replica's agents spread
    /// over the live ones.
    fn other(&self, at: usize, agent: usize, attempt: usize) -> usize {
        let count = self.replicas.len();
        if count < 2 {
            return at;
        }
        (at + 1 + (mix(agent, attempt as u32) % (count as u64 - 1)) as usize) % count
    }
}

/// Whether a connect failed because nothing listens there any more (a dead replica), not because it was slow:
/// only then does the agent try another replica, so each replica keeps its share of a fleet that connects
/// slowly on a loaded machine.
fn refused(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// Who one agent is and where it connects from.
pub struct Agent {
    pub index: usize,
    pub machine: MachineRef,
    pub token: Arc<str>,
    pub source: IpAddr,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Reports `status` of step `step` of plan `plan_id` on `conn`; any answer but 200 is an error.
async fn report(
    conn: &mut Conn,
    agent: &AgentIdentity,
    plan_id: &str,
    step: u32,
    status: StepStatus,
    started_ms: u64,
) -> anyhow::Result<()> {
    let now_ms = unix_ms();
    let report = StepReport {
        agent: agent.clone(),
        plan_id: plan_id.to_string(),
        step_index: step,
        status,
        attempt: 1,
        started_at_unix_ms: Some(started_ms),
        finished_at_unix_ms: (status != StepStatus::Running).then_some(now_ms),
        exit_code: (status != StepStatus::Running).then_some(0),
        stderr_tail: None,
        message: None,
        undo: false,
        rollback: None,
    };
    let body = Bytes::from(serde_json::to_vec(&report).unwrap_or_default());
    let answer = conn.post(REPORT_PATH, body).await?;
    anyhow::ensure!(answer.status == 200, "report: HTTP {}", answer.status);
    Ok(())
}

/// The report the real agent sends first when it starts and on every new connection after a failure (its
/// inventory is due again); an idle node's, with no plan held.
fn inventory(agent: &AgentIdentity, current: Option<&PlanProgress>) -> Bytes {
    let report = InventoryReport {
        current: current.cloned(),
        ..idle_inventory(agent)
    };
    Bytes::from(serde_json::to_vec(&report).unwrap_or_default())
}

/// The inventory an idle harness agent reports (what `load replicas` stores for each agent before the fleet
/// connects, as a fleet that ran before the measurement left it).
pub fn idle_inventory(agent: &AgentIdentity) -> InventoryReport {
    InventoryReport {
        agent: agent.clone(),
        agent_version: inplace_agent::AGENT_VERSION.to_string(),
        kubelet_version: None,
        kubeadm_version: None,
        boot_id: None,
        hostname: None,
        current: None,
        facts: None,
        runtime: None,
    }
}

/// Reports every step of `plan` started and, `pace` later, succeeded; returns the progress to poll with next.
async fn execute(
    conn: &mut Conn,
    agent: &Agent,
    identity: &AgentIdentity,
    plan: &inplace_agent_api::Plan,
    shared: &Shared,
    pace: &Pace,
) -> anyhow::Result<PlanProgress> {
    for step in &plan.steps {
        let started_ms = unix_ms();
        report(
            conn,
            identity,
            &plan.id,
            step.index,
            StepStatus::Running,
            started_ms,
        )
        .await?;
        if step.index == 0 {
            shared.mark(&shared.step_started, agent.index);
        }
        tokio::select! {
            () = tokio::time::sleep(pace.step_duration(agent.index, step.index)) => {}
            () = shared.stop.cancelled() => anyhow::bail!("stopped"),
        }
        report(
            conn,
            identity,
            &plan.id,
            step.index,
            StepStatus::Succeeded,
            started_ms,
        )
        .await?;
    }
    shared.mark(&shared.last_step_acked, agent.index);
    Ok(PlanProgress {
        plan_id: plan.id.clone(),
        status: PlanStatus::Succeeded,
        succeeded_steps: plan.steps.len() as u32,
        total_steps: plan.steps.len() as u32,
        failed_step: None,
        hold: None,
        rollback: None,
    })
}

/// One agent's life: connect, long-poll until `shared.stop`, bounded in polls and connection attempts. A
/// failed request or connect is followed by the real agent's back-off; a connection that broke or was refused
/// moves the agent to another replica of `route`, where it reports its inventory first.
pub async fn run(
    agent: Agent,
    route: Route,
    tls: TlsConnector,
    connect_gate: Arc<Semaphore>,
    wait_seconds: u32,
    shared: Arc<Shared>,
    pace: Pace,
) {
    let identity = AgentIdentity::Machine(agent.machine.clone());
    let count = route.replicas.len().max(1);
    let mut at = route.home % count;
    let mut backoff = Backoff::default();
    let mut conn: Option<Conn> = None;
    let mut current: Option<PlanProgress> = None;
    let mut attempts = 0;
    let mut first = true;
    // The next connection reports the inventory first: any after a failed request or connect, as the real agent
    // does. Not the first: the harness's agents stand for a fleet that was already running (the real agent
    // reports when it starts), whose inventories `load replicas` stored before they connect.
    let mut inventory_due = false;
    for _ in 0..MAX_POLLS_PER_AGENT {
        if shared.stop.is_cancelled() {
            return;
        }
        let mut live = match conn.take() {
            Some(live) => live,
            None => {
                attempts += 1;
                if attempts > MAX_CONNECT_ATTEMPTS {
                    return;
                }
                let opened = {
                    let Ok(_permit) = connect_gate.acquire().await else {
                        return;
                    };
                    let addr = route.replicas[at];
                    Conn::open(&tls, addr, Some(agent.source), Some(&agent.token)).await
                };
                let mut live = match opened {
                    Ok(live) => live,
                    Err(err) => {
                        shared.failed(at);
                        inventory_due = true;
                        if refused(&err) {
                            at = route.other(at, agent.index, attempts);
                        }
                        pause(&shared, backoff.next_delay()).await;
                        continue;
                    }
                };
                if attempts == 1 {
                    shared.connected.fetch_add(1, Ordering::Relaxed);
                } else {
                    shared.reconnects.fetch_add(1, Ordering::Relaxed);
                }
                if inventory_due {
                    let body = inventory(&identity, current.as_ref());
                    let answered = tokio::select! {
                        answered = live.post(INVENTORY_PATH, body) => answered,
                        () = shared.stop.cancelled() => return,
                    };
                    match answered {
                        Ok(reply) if reply.status == 200 => {
                            inventory_due = false;
                            backoff.reset();
                            shared.served_by[agent.index].store(at, Ordering::Relaxed);
                            shared.served_again[agent.index].store(shared.now(), Ordering::Release);
                        }
                        answered => {
                            if let Ok(refused) = answered
                                && let Ok(mut refusals) = shared.refusals.lock()
                            {
                                *refusals.entry(refused.status).or_default() += 1;
                            }
                            shared.failed(at);
                            pause(&shared, backoff.next_delay()).await;
                            continue;
                        }
                    }
                }
                live
            }
        };
        let body = PollRequest {
            agent: identity.clone(),
            current: current.clone(),
            wait_seconds,
            facts: None,
        };
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let sent = Instant::now();
        shared.poll_since[agent.index].store(shared.stamp(sent), Ordering::Relaxed);
        if first {
            shared.first_polls.fetch_add(1, Ordering::Relaxed);
            first = false;
        }
        let reply = tokio::select! {
            reply = live.post(POLL_PATH, body) => reply,
            () = shared.stop.cancelled() => return,
        };
        shared.poll_since[agent.index].store(0, Ordering::Relaxed);
        let reply = match reply {
            Ok(reply) if reply.status == 200 => reply,
            Ok(refused) => {
                // Refused (e.g. 503): the connection is still good; back off and ask again.
                shared.failed(at);
                if let Ok(mut refusals) = shared.refusals.lock() {
                    *refusals.entry(refused.status).or_default() += 1;
                }
                conn = Some(live);
                pause(&shared, backoff.next_delay()).await;
                continue;
            }
            Err(_) => {
                shared.failed(at);
                inventory_due = true;
                at = route.other(at, agent.index, attempts);
                pause(&shared, backoff.next_delay()).await;
                continue;
            }
        };
        backoff.reset();
        let answer: PollResponse = match serde_json::from_slice(&reply.body) {
            Ok(answer) => answer,
            Err(_) => {
                shared.failed(at);
                continue;
            }
        };
        match answer.plan {
            None => {
                shared.idle_polls.fetch_add(1, Ordering::Relaxed);
                shared
                    .longest_idle_poll_ns
                    .fetch_max(sent.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Some(plan) => {
                if shared.update_sent[agent.index].load(Ordering::Acquire) == 0 {
                    // Work nobody asked for would be a bug (or another run's leftovers).
                    shared.plans_without_work.fetch_add(1, Ordering::Relaxed);
                }
                shared.mark(&shared.plan_received, agent.index);
                match execute(&mut live, &agent, &identity, &plan, &shared, &pace).await {
                    Ok(progress) => current = Some(progress),
                    Err(_) => {
                        shared.failed(at);
                        inventory_due = true;
                        at = route.other(at, agent.index, attempts);
                        pause(&shared, backoff.next_delay()).await;
                        continue;
                    }
                }
            }
        }
        conn = Some(live);
    }
}

/// Sleeps `delay`, or less when the run stops.
async fn pause(shared: &Shared, delay: Duration) {
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        () = shared.stop.cancelled() => {}
    }
}
