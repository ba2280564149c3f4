//! Scenario `hooks`: our hook server (started in-process through `inplace_updater::server::run`, the default
//! embedded `file:` store in a temporary directory unless `--store memory`, built-in policy) and the bare axum + rustls ceiling, each on its own runtime, driven in turn by the same
//! closed-loop client: N kept-alive HTTP/1.1 connections over TLS posting the same bodies to the same paths.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inplace_updater::api::Hook;
use inplace_updater::dispatch::{DispatchConfig, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::tls::TlsFiles;
use inplace_updater::server::{
    self, ConnLimits, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_SHUTDOWN_GRACE, DEFAULT_TLS_RELOAD_INTERVAL, Listeners,
    Metrics, Readiness, ServeConfig, Services,
};
use tokio_util::sync::CancellationToken;

use crate::ceiling::Ceiling;
use crate::net::{Conn, connector};
use crate::payloads::{self, UpdateTemplate};
use crate::stats::{Summary, Table, ms, summarize};

/// Time each run spends before measuring (connections warm, caches and pools filled).
const WARMUP: Duration = Duration::from_millis(300);
/// Machines the "in progress" UpdateMachine row cycles through (each recorded once, then re-asked).
const STEADY_MACHINES: usize = 256;
/// Throughput target: ours ≥ this share of the ceiling.
const TARGET_THROUGHPUT_RATIO: f64 = 0.8;
/// Latency target: our p99 ≤ this multiple of the ceiling's.
const TARGET_P99_RATIO: f64 = 2.0;

#[derive(clap::Args)]
pub struct HooksArgs {
    /// Kept-alive client connections (CAPI's controllers call with about this many workers).
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Measured seconds per request kind, per server, per round.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds; the order ceiling/ours alternates between rounds so drift hits both alike.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Upper bound on requests per run, whatever the time.
    #[arg(long, default_value_t = 100_000)]
    max_requests: usize,
    /// Worker threads of each server's runtime (the binary uses one per core).
    #[arg(long, default_value_t = 2)]
    server_threads: usize,
    /// Don't log: by default our server logs one JSON line per call to /dev/null, as in production.
    #[arg(long)]
    no_log: bool,
    /// Only the request kinds whose name contains this (e.g. `worst`, `MachineSet`).
    #[arg(long)]
    only: Option<String>,
    /// Offer no ALPN protocol: both servers then detect HTTP/1.1 from the first bytes.
    #[arg(long)]
    no_alpn: bool,
    /// Drive only our server (for profiling it alone; no ratios then).
    #[arg(long)]
    ours_only: bool,
    /// The ceiling to compare with: `parse` (bare server that parses each body into a `serde_json::Value`; the
    /// targets are set against it) or `constant` (it only reads the body).
    #[arg(long, value_enum, default_value_t = Ceiling::Parse)]
    ceiling: Ceiling,
    /// Our server's store: `file` (the default store, a fresh redb file in a temporary directory) or `memory`.
    #[arg(long, default_value = "file", value_parser = ["file", "memory"])]
    store: String,
}

/// Where a request kind's bodies come from.
enum Bodies {
    /// These, round robin.
    Cycle(Vec<Bytes>),
    /// UpdateMachine for a Machine never seen before (records a new run).
    Fresh(UpdateTemplate),
    /// UpdateMachine for one of `STEADY_MACHINES` already recorded (CAPI re-asking while in progress).
    Steady(Vec<Bytes>),
}

struct Workload {
    name: &'static str,
    path: String,
    bodies: Bodies,
    next: AtomicUsize,
}

/// Names of fresh machines never repeat across runs and rounds.
static FRESH: AtomicUsize = AtomicUsize::new(0);

impl Workload {
    fn new(name: &'static str, hook: Hook, bodies: Bodies) -> Workload {
        Workload {
            name,
            path: format!("{}?timeout=10s", hook.path()),
            bodies,
            next: AtomicUsize::new(0),
        }
    }

    fn body(&self) -> Bytes {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.bodies {
            Bodies::Cycle(bodies) | Bodies::Steady(bodies) => bodies[i % bodies.len()].clone(),
            Bodies::Fresh(template) => {
                let n = FRESH.fetch_add(1, Ordering::Relaxed);
                Bytes::from(template.body(&format!("fresh-{n:07}"), "edge-01"))
            }
        }
    }

    fn mean_body_kib(&self) -> f64 {
        let sizes: Vec<usize> = match &self.bodies {
            Bodies::Cycle(b) | Bodies::Steady(b) => b.iter().map(Bytes::len).collect(),
            Bodies::Fresh(t) => vec![t.body("fresh-0000000", "edge-01").len()],
        };
        sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64 / 1024.0
    }
}

fn workloads() -> anyhow::Result<Vec<Workload>> {
    let fixtures = |names: &[&str]| -> anyhow::Result<Vec<Bytes>> {
        names
            .iter()
            .map(|n| payloads::fixture(n).map(Bytes::from))
            .collect()
    };
    let steady = UpdateTemplate::worker()?;
    let steady_bodies = (0..STEADY_MACHINES)
        .map(|i| Bytes::from(steady.body(&format!("steady-{i:04}"), "edge-01")))
        .collect();
    Ok(vec![
        Workload::new(
            "Discovery (the fixed cost of a call)",
            Hook::Discovery,
            Bodies::Cycle(fixtures(&["discovery-request.json"])?),
        ),
        Workload::new(
            "CanUpdateMachine (4 KCP fixtures)",
            Hook::CanUpdateMachine,
            Bodies::Cycle(fixtures(&[
                "can-update-machine-kcp-version.json",
                "can-update-machine-kcp-files-keys.json",
                "can-update-machine-kcp-mixed.json",
                "can-update-machine-unknown-infra.json",
            ])?),
        ),
        Workload::new(
            "CanUpdateMachineSet (MD fixture)",
            Hook::CanUpdateMachineSet,
            Bodies::Cycle(fixtures(&["can-update-machineset-md.json"])?),
        ),
        Workload::new(
            "UpdateMachine, new run each call",
            Hook::UpdateMachine,
            Bodies::Fresh(UpdateTemplate::worker()?),
        ),
        Workload::new(
            "UpdateMachine, run in progress",
            Hook::UpdateMachine,
            Bodies::Steady(steady_bodies),
        ),
        Workload::new(
            "CanUpdateMachine worst case (200×10 KiB files, 20 changed)",
            Hook::CanUpdateMachine,
            Bodies::Cycle(vec![Bytes::from(payloads::worst_can_update_machine()?)]),
        ),
    ])
}

/// One measured run.
#[derive(Default)]
struct Run {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    errors: usize,
    not_success: usize,
}

impl Run {
    fn absorb(&mut self, other: Run) {
        self.requests += other.requests;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.not_success += other.not_success;
    }
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Whether an answer's `status` is `Success`.
fn is_success(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v["status"] == "Success")
}

async fn measure(
    addr: SocketAddr,
    tls: &tokio_rustls::TlsConnector,
    workload: Arc<Workload>,
    connections: usize,
    window: Duration,
    max_requests: usize,
) -> anyhow::Result<Run> {
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(tls, addr, None, None).await?);
    }
    let started = Instant::now();
    let measure_from = started + WARMUP;
    let stop_at = measure_from + window;
    let issued = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let workload = workload.clone();
        let issued = issued.clone();
        tasks.spawn(async move {
            let mut run = Run::default();
            loop {
                let now = Instant::now();
                if now >= stop_at || issued.load(Ordering::Relaxed) >= max_requests {
                    break;
                }
                let body = workload.body();
                let sent = Instant::now();
                let reply = conn.post(&workload.path, body).await;
                let took = sent.elapsed();
                if sent < measure_from {
                    continue;
                }
                issued.fetch_add(1, Ordering::Relaxed);
                run.requests += 1;
                run.latencies.push(took);
                match reply {
                    Ok(reply) if reply.status == 200 => {
                        if !is_success(&reply.body) {
                            run.not_success += 1;
                        }
                    }
                    Ok(_) => run.errors += 1,
                    Err(_) => {
                        run.errors += 1;
                        break;
                    }
                }
            }
            run
        });
    }
    let mut total = Run::default();
    while let Some(done) = tasks.join_next().await {
        let run = done?;
        total.requests += run.requests;
        total.latencies.extend(run.latencies);
        total.errors += run.errors;
        total.not_success += run.not_success;
    }
    total.elapsed = Instant::now().saturating_duration_since(measure_from);
    Ok(total)
}

/// A server on its own runtime in its own thread; dropped = stopped.
struct Hosted {
    addr: SocketAddr,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Hosted {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn host<F, Fut>(threads: usize, start: F) -> anyhow::Result<Hosted>
where
    F: FnOnce(std::sync::mpsc::Sender<SocketAddr>, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    let token = stop.clone();
    let thread = std::thread::spawn(move || runtime.block_on(start(tx, token)));
    let addr = rx.recv_timeout(Duration::from_secs(20))?;
    Ok(Hosted {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn start_ours(
    certs: &inplace_updater::cmd::certs::DevCertPaths,
    threads: usize,
    store_dir: Option<std::path::PathBuf>,
) -> anyhow::Result<Hosted> {
    let config = ServeConfig {
        tls: TlsFiles {
            cert: certs.server_cert.clone(),
            key: certs.server_key.clone(),
        },
        client_ca: None,
        tls_reload_interval: DEFAULT_TLS_RELOAD_INTERVAL,
        limits: ConnLimits {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        },
    };
    host(threads, move |tx, stop| async move {
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let Ok(listeners) = Listeners::bind(loopback, loopback, loopback).await else {
            return;
        };
        let Ok((hooks, _, _)) = listeners.local_addrs() else {
            return;
        };
        let store: Arc<dyn inplace_store::Store> = match store_dir {
            None => Arc::new(inplace_store::memory::MemoryStore::new()),
            Some(dir) => match inplace_store::file::FileStore::open(&dir).await {
                Ok(store) => Arc::new(store),
                Err(err) => {
                    eprintln!("our server's store: {err}");
                    return;
                }
            },
        };
        let dispatcher = Dispatcher::new(store, DispatchConfig::default(), stop.clone());
        let services = Services {
            engine: Arc::new(Engine {
                policy: inplace_core::Policy::builtin(),
                dispatcher,
            }),
            tokens: Arc::new(inplace_updater::server::auth::AgentTokens::none()),
        };
        let _ = tx.send(hooks);
        if let Err(err) = server::run(
            config,
            listeners,
            services,
            Arc::new(Metrics::new()),
            Readiness::default(),
            stop,
        )
        .await
        {
            eprintln!("our server stopped: {err}");
        }
    })
}

fn start_ceiling(
    certs: &inplace_updater::cmd::certs::DevCertPaths,
    threads: usize,
    kind: Ceiling,
) -> anyhow::Result<Hosted> {
    let config = crate::ceiling::tls_config(&certs.server_cert, &certs.server_key)?;
    host(threads, move |tx, stop| async move {
        let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await else {
            return;
        };
        let Ok(addr) = listener.local_addr() else {
            return;
        };
        let _ = tx.send(addr);
        crate::ceiling::serve(listener, config, stop, kind).await;
    })
}

fn install_logging() {
    // One JSON line per call, written to /dev/null with a real write(2) by the log thread, as the binary
    // writes to stderr.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(inplace_updater::observe::logs::off_request_path(null))
            .try_init();
    }
}

pub fn run(args: &HooksArgs) -> anyhow::Result<()> {
    if !args.no_log {
        install_logging();
    }
    let dir = tempfile::tempdir()?;
    let spec =
        inplace_updater::cmd::certs::DevCertsSpec::with_defaults(dir.path().into(), vec![], vec![]);
    let certs = inplace_updater::cmd::certs::write_dev_certs(&spec)?;
    let store_dir = (args.store == "file").then(|| dir.path().join("store"));
    let ours = start_ours(&certs, args.server_threads, store_dir)?;
    let ceiling = start_ceiling(&certs, args.server_threads, args.ceiling)?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tls = connector(&certs.ca_cert, !args.no_alpn)?;
    let workloads: Vec<Arc<Workload>> = workloads()?
        .into_iter()
        .filter(|w| {
            args.only
                .as_deref()
                .is_none_or(|only| w.name.contains(only))
        })
        .map(Arc::new)
        .collect();
    let window = Duration::from_secs_f64(args.seconds.clamp(0.2, 120.0));
    println!(
        "hooks: {} connections, HTTP/1.1 keep-alive over TLS, {} round(s) × {:.1} s per kind per server; \
         ours in-process (server::run, {} store, built-in policy, {} worker threads, logging {}), \
         ceiling: bare axum + rustls, {}",
        args.connections,
        args.rounds,
        window.as_secs_f64(),
        args.store,
        args.server_threads,
        if args.no_log { "off" } else { "on" },
        match args.ceiling {
            Ceiling::Parse => "parses each hook body into a serde_json::Value, answers a constant",
            Ceiling::Constant => "reads each body, answers a constant",
        }
    );
    let mut results: Vec<(Run, Run)> = workloads.iter().map(|_| Default::default()).collect();
    client.block_on(async {
        // The MachineDeployment's question before it moves Machines (the UpdateMachine bodies' MachineSet),
        // and the steady Machines' runs, once, on both servers alike.
        let judge = format!("{}?timeout=10s", Hook::CanUpdateMachineSet.path());
        for addr in [ours.addr, ceiling.addr] {
            let mut conn = Conn::open(&tls, addr, None, None).await?;
            conn.post(&judge, payloads::can_update_machine_set("edge-01")?.into())
                .await?;
        }
        if let Some(steady) = workloads
            .iter()
            .find(|w| matches!(w.bodies, Bodies::Steady(_)))
        {
            for addr in [ours.addr, ceiling.addr] {
                let mut conn = Conn::open(&tls, addr, None, None).await?;
                for _ in 0..STEADY_MACHINES {
                    conn.post(&steady.path, steady.body()).await?;
                }
            }
        }
        for round in 0..args.rounds.clamp(1, 20) {
            for (i, workload) in workloads.iter().enumerate() {
                let order = if round % 2 == 0 {
                    [(true, ceiling.addr), (false, ours.addr)]
                } else {
                    [(false, ours.addr), (true, ceiling.addr)]
                };
                for (is_ceiling, addr) in order {
                    if is_ceiling && args.ours_only {
                        continue;
                    }
                    let run = measure(
                        addr,
                        &tls,
                        workload.clone(),
                        args.connections.clamp(1, 1024),
                        window,
                        args.max_requests,
                    )
                    .await?;
                    let slot = &mut results[i];
                    if is_ceiling {
                        slot.0.absorb(run);
                    } else {
                        slot.1.absorb(run);
                    }
                }
            }
        }
        anyhow::Ok(())
    })?;
    print_table(&workloads, results);
    drop(ours);
    drop(ceiling);
    Ok(())
}

fn print_table(workloads: &[Arc<Workload>], results: Vec<(Run, Run)>) {
    let mut table = Table::new(&[
        "request",
        "body",
        "ceiling req/s",
        "ours req/s",
        "ours/ceiling",
        "ceiling p50",
        "ours p50",
        "ceiling p99",
        "ours p99",
        "p99 ours/ceiling",
        "errors",
        "targets",
    ]);
    for (workload, (ceiling, ours)) in workloads.iter().zip(results) {
        let (c_rps, o_rps) = (ceiling.rps(), ours.rps());
        let errors = ceiling.errors + ours.errors + ours.not_success;
        let c: Summary = summarize(ceiling.latencies);
        let o: Summary = summarize(ours.latencies);
        let throughput = o_rps / c_rps.max(1e-9);
        let p99 = o.p99.as_secs_f64() / c.p99.as_secs_f64().max(1e-9);
        let met = throughput >= TARGET_THROUGHPUT_RATIO && p99 <= TARGET_P99_RATIO;
        let measured = c.count > 0;
        let ratio = |text: String| if measured { text } else { "-".to_string() };
        table.row(vec![
            workload.name.to_string(),
            format!("{:.1} KiB", workload.mean_body_kib()),
            format!("{c_rps:.0}"),
            format!("{o_rps:.0}"),
            ratio(format!("{throughput:.2}×")),
            ms(c.p50),
            ms(o.p50),
            ms(c.p99),
            ms(o.p99),
            ratio(format!("{p99:.2}×")),
            format!("{errors}"),
            ratio(if met { "met" } else { "missed" }.to_string()),
        ]);
    }
    println!();
    table.print();
    println!(
        "\ntargets: ours ≥ {TARGET_THROUGHPUT_RATIO}× ceiling throughput and p99 ≤ {TARGET_P99_RATIO}× ceiling p99; \
         errors = transport errors, non-200 answers, and (ours) answers whose status is not Success"
    );
}
