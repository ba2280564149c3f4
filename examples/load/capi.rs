//! The CAPI side of the fleet scenarios: each Machine given work is driven as the Machine controller does —
//! UpdateMachine, then again after `retryAfterSeconds`, until Done or Failure — through a small pool of
//! kept-alive connections (the controller's workers).

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
}

struct Pool {
    conns: Mutex<Vec<Conn>>,
    gate: tokio::sync::Semaphore,
    addr: SocketAddr,
    tls: TlsConnector,
}

impl Pool {
    async fn call(
        &self,
        path: &str,
        body: Bytes,
        before_send: impl FnOnce(),
    ) -> anyhow::Result<(u16, Bytes)> {
        let _permit = self.gate.acquire().await?;
        let conn = self.conns.lock().await.pop();
        let mut conn = match conn {
            Some(conn) => conn,
            None => Conn::open(&self.tls, self.addr, None, None).await?,
        };
        before_send();
        let reply = conn.post(path, body).await?;
        self.conns.lock().await.push(conn);
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

/// Drives every target until Done, Failure, or `deadline` from now; the first calls spread evenly over
/// `stagger` (target k of n starts after k/n of it).
pub async fn drive(
    addr: SocketAddr,
    tls: TlsConnector,
    targets: Vec<Target>,
    workers: usize,
    shared: Arc<Shared>,
    deadline: Duration,
    stagger: Duration,
) -> CapiResult {
    let pool = Arc::new(Pool {
        conns: Mutex::new(Vec::new()),
        gate: tokio::sync::Semaphore::new(workers),
        addr,
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
            let mut made = 0;
            for _ in 0..MAX_CALLS_PER_MACHINE {
                made += 1;
                if Instant::now() >= until {
                    break;
                }
                let mut sent = Instant::now();
                let reply = pool
                    .call(&path, target.body.clone(), || {
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
                let answer = match reply {
                    Ok((status, body)) => decode(status, &body),
                    Err(_) => None,
                };
                if is_first && answer.is_some() {
                    result.first_calls.push(took);
                }
                match answer {
                    Some(Answer::Done) => {
                        result.done_after.push(started.elapsed());
                        result.calls_per_update.push(made);
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
        } else {
            total.errors += 1;
        }
    }
    total.calls = calls.load(Ordering::Relaxed);
    total
}
