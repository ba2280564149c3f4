//! Simulated agents: each one a kept-alive TLS connection long-polling `/agent/v1/poll` with its bearer token,
//! exactly as `inplace-updater agent` does, and, when a plan arrives, reporting each step started and done
//! (the steps themselves take no time here) before polling again with its progress.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inplace_agent_api::{
    AgentIdentity, MachineRef, POLL_PATH, PlanProgress, PlanStatus, PollRequest, PollResponse,
    REPORT_PATH, StepReport, StepStatus,
};
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

use crate::net::Conn;

/// Upper bound on polls per agent in one run (a run lasts minutes; an agent polls every ~25 s).
const MAX_POLLS_PER_AGENT: usize = 1_000;
/// Upper bound on connection attempts per agent.
const MAX_CONNECT_ATTEMPTS: usize = 50;
/// Back-off after a failed request or connect.
const BACKOFF: Duration = Duration::from_millis(500);

/// What every agent writes and the scenario reads. Instants are nanoseconds since `epoch`, plus one, so 0
/// means "not yet".
pub struct Shared {
    pub epoch: Instant,
    pub update_sent: Vec<AtomicU64>,
    pub plan_received: Vec<AtomicU64>,
    pub step_started: Vec<AtomicU64>,
    /// When the agent's outstanding poll was sent (0: none outstanding).
    pub poll_since: Vec<AtomicU64>,
    pub connected: AtomicUsize,
    pub first_polls: AtomicUsize,
    pub idle_polls: AtomicU64,
    pub longest_idle_poll_ns: AtomicU64,
    pub errors: AtomicU64,
    pub reconnects: AtomicU64,
    pub plans_without_work: AtomicU64,
    /// Polls answered with another status than 200, by status (a subset of `errors`).
    pub refusals: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
    pub stop: CancellationToken,
}

impl Shared {
    pub fn new(agents: usize) -> Shared {
        let slots = || (0..agents).map(|_| AtomicU64::new(0)).collect();
        Shared {
            epoch: Instant::now(),
            update_sent: slots(),
            plan_received: slots(),
            step_started: slots(),
            poll_since: slots(),
            connected: AtomicUsize::new(0),
            first_polls: AtomicUsize::new(0),
            idle_polls: AtomicU64::new(0),
            longest_idle_poll_ns: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            plans_without_work: AtomicU64::new(0),
            refusals: std::sync::Mutex::default(),
            stop: CancellationToken::new(),
        }
    }

    pub fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    pub fn now(&self) -> u64 {
        self.stamp(Instant::now())
    }

    /// Sets a slot once.
    pub fn mark(&self, slots: &[AtomicU64], index: usize) {
        let _ = slots[index].compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// `to - from` of two slots, when both are set.
    pub fn between(from: &AtomicU64, to: &AtomicU64) -> Option<Duration> {
        let (a, b) = (from.load(Ordering::Acquire), to.load(Ordering::Acquire));
        (a != 0 && b != 0).then(|| Duration::from_nanos(b.saturating_sub(a)))
    }

    /// How long the oldest outstanding poll has been waiting.
    pub fn oldest_poll(&self) -> Duration {
        let now = self.now();
        let oldest = self
            .poll_since
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&s| s != 0)
            .min();
        oldest.map_or(Duration::ZERO, |s| {
            Duration::from_nanos(now.saturating_sub(s))
        })
    }
}

/// Who one agent is and where it connects from.
pub struct Agent {
    pub index: usize,
    pub machine: MachineRef,
    pub token: Arc<str>,
    pub source: IpAddr,
}

fn report(agent: &AgentIdentity, plan_id: &str, step: u32, status: StepStatus) -> Bytes {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let report = StepReport {
        agent: agent.clone(),
        plan_id: plan_id.to_string(),
        step_index: step,
        status,
        attempt: 1,
        started_at_unix_ms: Some(now_ms),
        finished_at_unix_ms: (status != StepStatus::Running).then_some(now_ms),
        exit_code: (status != StepStatus::Running).then_some(0),
        stderr_tail: None,
        message: None,
    };
    Bytes::from(serde_json::to_vec(&report).unwrap_or_default())
}

/// Reports every step of `plan` started and succeeded; returns the progress to poll with next.
async fn execute(
    conn: &mut Conn,
    agent: &Agent,
    identity: &AgentIdentity,
    plan: &inplace_agent_api::Plan,
    shared: &Shared,
) -> anyhow::Result<PlanProgress> {
    for step in &plan.steps {
        let started = conn
            .post(
                REPORT_PATH,
                report(identity, &plan.id, step.index, StepStatus::Running),
            )
            .await?;
        anyhow::ensure!(started.status == 200, "report: HTTP {}", started.status);
        if step.index == 0 {
            shared.mark(&shared.step_started, agent.index);
        }
        let done = conn
            .post(
                REPORT_PATH,
                report(identity, &plan.id, step.index, StepStatus::Succeeded),
            )
            .await?;
        anyhow::ensure!(done.status == 200, "report: HTTP {}", done.status);
    }
    Ok(PlanProgress {
        plan_id: plan.id.clone(),
        status: PlanStatus::Succeeded,
        succeeded_steps: plan.steps.len() as u32,
        total_steps: plan.steps.len() as u32,
        failed_step: None,
        hold: None,
    })
}

/// One agent's life: connect, long-poll until `shared.stop`, bounded in polls and connection attempts.
pub async fn run(
    agent: Agent,
    addr: SocketAddr,
    tls: TlsConnector,
    connect_gate: Arc<Semaphore>,
    wait_seconds: u32,
    shared: Arc<Shared>,
) {
    let identity = AgentIdentity::Machine(agent.machine.clone());
    let mut conn: Option<Conn> = None;
    let mut current: Option<PlanProgress> = None;
    let mut attempts = 0;
    let mut first = true;
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
                    Conn::open(&tls, addr, Some(agent.source), Some(&agent.token)).await
                };
                match opened {
                    Ok(live) => {
                        if attempts == 1 {
                            shared.connected.fetch_add(1, Ordering::Relaxed);
                        } else {
                            shared.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        live
                    }
                    Err(_) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(BACKOFF).await;
                        continue;
                    }
                }
            }
        };
        let body = PollRequest {
            agent: identity.clone(),
            current: current.clone(),
            wait_seconds,
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
                shared.errors.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut refusals) = shared.refusals.lock() {
                    *refusals.entry(refused.status).or_default() += 1;
                }
                conn = Some(live);
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        let answer: PollResponse = match serde_json::from_slice(&reply.body) {
            Ok(answer) => answer,
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
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
                match execute(&mut live, &agent, &identity, &plan, &shared).await {
                    Ok(progress) => current = Some(progress),
                    Err(_) => {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
        }
        conn = Some(live);
    }
}
