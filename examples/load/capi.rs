//! The CAPI side of the fleet scenarios: each Machine given work is driven as the Machine controller does —
//! UpdateMachine, then again after `retryAfterSeconds`, until Done or Failure — through a small pool of
//! kept-alive connections (the controller's workers), to one server or, in turn, to several replicas behind
//! the same address list.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inplace_updater::api::Hook;
use tokio::sync::Mutex;
use tokio_rustls::TlsConnector;

use crate::agents::Shared;
use crate::net::Conn;

/// Most UpdateMachine calls for one Machine in one run.
const MAX_CALLS_PER_MACHINE: usize = 100;
/// Longest any retryAfterSeconds is honoured (the server caps it lower).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// One Machine given work.
pub struct Target {
    pub index: usize,
    pub body: Bytes,
    /// Servers (indices into `drive`'s addresses) this Machine's calls go to in turn: call `n` goes to
    /// `replicas[n % len]` (empty: the first server).
    pub replicas: Vec<usize>,
}

impl Target {
    fn replica(&self, call: usize) -> usize {
        self.replicas
            .get(call % self.replicas.len().max(1))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Default)]
pub struct CapiResult {
    /// Latency of each Machine's first UpdateMachine call.
    pub first_calls: Vec<Duration>,
    /// From each Machine's first call until the call that answered Done.
    pub done_after: Vec<Duration>,
    /// From the ack of the agent's last step report until CAPI had the answer Done (the rollout's wait).
    pub done_delays: Vec<Duration>,
    /// UpdateMachine calls of each Machine that reached Done.
    pub calls_per_update: Vec<usize>,
    pub calls: usize,
    pub failures: usize,
    pub errors: usize,
    /// What each error was (transport error, or HTTP status and the start of the body), counted.
    pub error_kinds: std::collections::BTreeMap<String, usize>,
}

/// The workers' kept-alive connections, per server; `gate` bounds the calls in flight over all servers.
struct Pool {
    conns: Vec<Mutex<Vec<Conn>>>,
    gate: tokio::sync::Semaphore,
    addrs: Vec<SocketAddr>,
    tls: TlsConnector,
}

impl Pool {
    async fn call(
        &self,
        server: usize,
        path: &str,
        body: Bytes,
        mut before_send: impl FnMut(),
    ) -> anyhow::Result<(u16, Bytes)> {
        let _permit = self.gate.acquire().await?;
        let server = server.min(self.addrs.len().saturating_sub(1));
        let (Some(idle), Some(&addr)) = (self.conns.get(server), self.addrs.get(server)) else {
            anyhow::bail!("no server to call");
        };
        // A kept-alive connection the server closed while it sat idle takes the request nowhere; it goes
        // again on a new connection, once, as Go's `net/http` sends CAPI's (see `Conn::post_unless_closed`).
        let reused = idle.lock().await.pop();
        if let Some(mut conn) = reused {
            before_send();
            if let Some(reply) = conn.post_unless_closed(path, body.clone()).await? {
                idle.lock().await.push(conn);
                return Ok((reply.status, reply.body));
            }
        }
        let mut conn = Conn::open(&self.tls, addr, None, None).await?;
        before_send();
        let reply = conn.post(path, body).await?;
        idle.lock().await.push(conn);
        Ok((reply.status, reply.body))
    }
}

enum Answer {
    Done,
    Retry(Duration),
    Failure,
}

fn decode(status: u16, body: &[u8]) -> Option<Answer> {
    if status != 200 {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let retry = value["retryAfterSeconds"].as_u64().unwrap_or(0);
    match value["status"].as_str()? {
        "Success" if retry == 0 => Some(Answer::Done),
        "Success" => Some(Answer::Retry(
            Duration::from_secs(retry).min(MAX_RETRY_AFTER),
        )),
        _ => Some(Answer::Failure),
    }
}

/// CanUpdateMachineSet for each cluster's new MachineSet, one after another on one connection (the
/// MachineDeployment controller asks once per MachineSet); every answer must be `Success`.
pub async fn judge_machine_sets(
    addr: SocketAddr,
    tls: &TlsConnector,
    clusters: impl Iterator<Item = String>,
) -> anyhow::Result<()> {
    let path = format!("{}?timeout=10s", Hook::CanUpdateMachineSet.path());
    let mut conn = Conn::open(tls, addr, None, None).await?;
    for cluster in clusters {
        let reply = conn
            .post(
                &path,
                crate::payloads::can_update_machine_set(&cluster)?.into(),
            )
            .await?;
        let answer: serde_json::Value = serde_json::from_slice(&reply.body)?;
        anyhow::ensure!(
            reply.status == 200 && answer["status"] == "Success",
            "CanUpdateMachineSet for {cluster}: {answer}"
        );
    }
    Ok(())
}

/// What judging MachineSets took: the Failure answers CAPI had to ask again after, and each call's latency.
#[derive(Default)]
pub struct Judged {
    pub failures: usize,
    pub calls: Vec<Duration>,
}

/// CanUpdateMachineSet for each cluster's new MachineSet on one connection, each asked again after a Failure
/// answer (as the MachineDeployment controller does on its next reconcile), at most `attempts` times.
pub async fn judge_machine_sets_retrying(
    addr: SocketAddr,
    tls: &TlsConnector,
    clusters: impl Iterator<Item = String>,
    attempts: usize,
) -> anyhow::Result<Judged> {
    let path = format!("{}?timeout=10s", Hook::CanUpdateMachineSet.path());
    let mut conn = Conn::open(tls, addr, None, None).await?;
    let mut judged = Judged::default();
    for cluster in clusters {
        let body: Bytes = crate::payloads::can_update_machine_set(&cluster)?.into();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = Instant::now();
            let reply = conn.post(&path, body.clone()).await?;
            judged.calls.push(sent.elapsed());
            let answer: serde_json::Value = serde_json::from_slice(&reply.body)?;
            if reply.status == 200 && answer["status"] == "Success" {
                break;
            }
            judged.failures += 1;
            anyhow::ensure!(
                attempt < attempts,
                "CanUpdateMachineSet for {cluster}, {attempt} times: {answer}"
            );
        }
    }
    Ok(judged)
}

/// Drives every target until Done, Failure, or `deadline` from now; each target's calls go to the servers its
/// `replicas` names, in turn; the first calls spread evenly over `stagger` (target k of n starts after k/n of
/// it).
pub async fn drive(
    addrs: Vec<SocketAddr>,
    tls: TlsConnector,
    targets: Vec<Target>,
    workers: usize,
    shared: Arc<Shared>,
    deadline: Duration,
    stagger: Duration,
) -> CapiResult {
    let pool = Arc::new(Pool {
        conns: addrs.iter().map(|_| Mutex::new(Vec::new())).collect(),
        gate: tokio::sync::Semaphore::new(workers),
        addrs,
        tls,
    });
    let path: Arc<str> = format!("{}?timeout=10s", Hook::UpdateMachine.path()).into();
    let calls = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + deadline + stagger;
    let count = targets.len().max(1) as u32;
    let mut tasks = tokio::task::JoinSet::new();
    for (k, target) in targets.into_iter().enumerate() {
        let (pool, path, shared, calls) =
            (pool.clone(), path.clone(), shared.clone(), calls.clone());
        let delay = stagger * k as u32 / count;
        tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            let mut result = CapiResult::default();
            let mut first: Option<Instant> = None;
            for call in 0..MAX_CALLS_PER_MACHINE {
                if Instant::now() >= until {
                    break;
                }
                let mut sent = Instant::now();
                let reply = pool
                    .call(target.replica(call), &path, target.body.clone(), || {
                        sent = Instant::now();
                        if first.is_none() {
                            shared.mark(&shared.update_sent, target.index);
                        }
                    })
                    .await;
                calls.fetch_add(1, Ordering::Relaxed);
                let took = sent.elapsed();
                let is_first = first.is_none();
                let started = *first.get_or_insert(sent);
                let answer = match &reply {
                    Ok((status, body)) => decode(*status, body),
                    Err(_) => None,
                };
                if answer.is_none() {
                    let kind = match &reply {
                        Ok((status, body)) => format!(
                            "HTTP {status}: {}",
                            String::from_utf8_lossy(body)
                                .chars()
                                .take(120)
                                .collect::<String>()
                        ),
                        Err(err) => format!("transport: {err:#}"),
                    };
                    *result.error_kinds.entry(kind).or_default() += 1;
                }
                if is_first && answer.is_some() {
                    result.first_calls.push(took);
                }
                match answer {
                    Some(Answer::Done) => {
                        result.done_after.push(started.elapsed());
                        result.calls_per_update.push(call + 1);
                        let acked = shared.last_step_acked[target.index].load(Ordering::Acquire);
                        if acked != 0 {
                            result
                                .done_delays
                                .push(Duration::from_nanos(shared.now().saturating_sub(acked)));
                        }
                        break;
                    }
                    Some(Answer::Retry(after)) => tokio::time::sleep(after).await,
                    Some(Answer::Failure) => {
                        result.failures += 1;
                        break;
                    }
                    None => {
                        result.errors += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            result
        });
    }
    let mut total = CapiResult::default();
    while let Some(done) = tasks.join_next().await {
        if let Ok(result) = done {
            total.first_calls.extend(result.first_calls);
            total.done_after.extend(result.done_after);
            total.done_delays.extend(result.done_delays);
            total.calls_per_update.extend(result.calls_per_update);
            total.failures += result.failures;
            total.errors += result.errors;
            for (kind, count) in result.error_kinds {
                *total.error_kinds.entry(kind).or_default() += count;
            }
        } else {
            total.errors += 1;
        }
    }
    total.calls = calls.load(Ordering::Relaxed);
    total
}
