//! Scenario `hooks`: our hook server and three bare ceilings (`servers`), driven in turn by the same
//! closed-loop client: N kept-alive HTTP/1.1 connections over TLS posting the same bodies to the same paths.
//! Each request kind (`workloads`) is held against the ceiling that does the least any correct server must do
//! for it: parse the body (a hook that only reads), or parse it and make one small durable write through the
//! default store's group commit (a hook that records before it answers).

mod servers;
mod workloads;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use inplace_updater::api::Hook;

use crate::ceiling::Ceiling;
use crate::net::{Conn, connector};
use crate::payloads;
use crate::stats::{Summary, Table, ms, summarize};
use servers::{start_ceiling, start_ours};
use workloads::{Against, Bodies, STEADY_MACHINES, Workload};

/// Time each run spends before measuring (connections warm, caches and pools filled).
const WARMUP: Duration = Duration::from_millis(300);
/// Throughput target: ours ≥ this share of the ceiling.
const TARGET_THROUGHPUT_RATIO: f64 = 0.8;
/// Latency target: our p99 ≤ this multiple of the ceiling's.
const TARGET_P99_RATIO: f64 = 2.0;
/// Longest a `--requests` run may take (callgrind runs the servers tens of times slower).
const MAX_EXACT_RUN: Duration = Duration::from_secs(3600);

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
    #[arg(long, conflicts_with = "ceiling_only")]
    ours_only: bool,
    /// Drive only the ceilings (the other half of a per-request instruction count under callgrind).
    #[arg(long)]
    ceiling_only: bool,
    /// Exactly this many requests per run, no warm-up and no time limit (`--seconds` is then ignored): a
    /// fixed amount of work, for counting instructions per request (`valgrind --tool=callgrind`).
    #[arg(long)]
    requests: Option<usize>,
    /// The ceiling the hooks that only read are compared with: `parse` (bare server that parses each body into
    /// a `serde_json::Value`; the targets are set against it) or `constant` (it only reads the body). The hooks
    /// that record are always compared with the durable ceiling (parse, then one small fsync'd write).
    #[arg(long, value_enum, default_value_t = Ceiling::Parse)]
    ceiling: Ceiling,
    /// Our server's store: `file` (the default store, a fresh redb file in a temporary directory) or `memory`.
    /// The durable ceiling always writes to a `file:` store of its own.
    #[arg(long, default_value = "file", value_parser = ["file", "memory"])]
    store: String,
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
    exact: bool,
) -> anyhow::Result<Run> {
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(Conn::open(tls, addr, None, None).await?);
    }
    let started = Instant::now();
    let (measure_from, stop_at) = if exact {
        (started, started + MAX_EXACT_RUN)
    } else {
        (started + WARMUP, started + WARMUP + window)
    };
    let issued = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let workload = workload.clone();
        let issued = issued.clone();
        tasks.spawn(async move {
            let mut run = Run::default();
            loop {
                let now = Instant::now();
                if now >= stop_at
                    || (exact && issued.fetch_add(1, Ordering::Relaxed) >= max_requests)
                    || (!exact && issued.load(Ordering::Relaxed) >= max_requests)
                {
                    break;
                }
                let body = workload.body();
                let sent = Instant::now();
                let reply = conn.post(&workload.path, body).await;
                let took = sent.elapsed();
                if sent < measure_from {
                    continue;
                }
                if !exact {
                    issued.fetch_add(1, Ordering::Relaxed);
                }
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
    let read_ceiling = start_ceiling(&certs, args.server_threads, args.ceiling, None)?;
    let durable_ceiling = start_ceiling(
        &certs,
        args.server_threads,
        Ceiling::Parse,
        Some(dir.path().join("durable-ceiling")),
    )?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tls = connector(&certs.ca_cert, !args.no_alpn)?;
    let workloads: Vec<Arc<Workload>> = workloads::all()?
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
         ceilings: bare axum + rustls; for the hooks that read, {}; for the hooks that record, the durable \
         ceiling (parses, then puts one {}-byte record through a file: store's group commit)",
        args.connections,
        args.rounds,
        window.as_secs_f64(),
        args.store,
        args.server_threads,
        if args.no_log { "off" } else { "on" },
        match args.ceiling {
            Ceiling::Parse => "parses each hook body into a serde_json::Value, answers a constant",
            Ceiling::Constant => "reads each body, answers a constant",
        },
        crate::ceiling::DURABLE_RECORD_BYTES,
    );
    let mut results: Vec<(Run, Run)> = workloads.iter().map(|_| Default::default()).collect();
    client.block_on(async {
        // The MachineDeployment's question before it moves Machines (the UpdateMachine bodies' MachineSet),
        // and the steady Machines' runs, once, on both servers alike.
        let judge = format!("{}?timeout=10s", Hook::CanUpdateMachineSet.path());
        let every = [ours.addr, read_ceiling.addr, durable_ceiling.addr];
        for addr in every {
            let mut conn = Conn::open(&tls, addr, None, None).await?;
            conn.post(&judge, payloads::can_update_machine_set("edge-01")?.into())
                .await?;
        }
        if let Some(steady) = workloads
            .iter()
            .find(|w| matches!(w.bodies, Bodies::Steady(_)))
        {
            for addr in every {
                let mut conn = Conn::open(&tls, addr, None, None).await?;
                for _ in 0..STEADY_MACHINES {
                    conn.post(&steady.path, steady.body()).await?;
                }
            }
        }
        for round in 0..args.rounds.clamp(1, 20) {
            for (i, workload) in workloads.iter().enumerate() {
                let ceiling = match workload.against {
                    Against::Read => &read_ceiling,
                    Against::Durable => &durable_ceiling,
                };
                let order = if round % 2 == 0 {
                    [(true, ceiling.addr), (false, ours.addr)]
                } else {
                    [(false, ours.addr), (true, ceiling.addr)]
                };
                for (is_ceiling, addr) in order {
                    if (is_ceiling && args.ours_only) || (!is_ceiling && args.ceiling_only) {
                        continue;
                    }
                    let run = measure(
                        addr,
                        &tls,
                        workload.clone(),
                        args.connections.clamp(1, 1024),
                        window,
                        args.requests.unwrap_or(args.max_requests),
                        args.requests.is_some(),
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
    print_table(&workloads, results, args.ceiling);
    drop(ours);
    drop(read_ceiling);
    drop(durable_ceiling);
    Ok(())
}

fn print_table(workloads: &[Arc<Workload>], results: Vec<(Run, Run)>, read: Ceiling) {
    let mut table = Table::new(&[
        "request",
        "body",
        "ceiling",
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
        let measured = c.count > 0 && o.count > 0;
        let ratio = |text: String| if measured { text } else { "-".to_string() };
        table.row(vec![
            workload.name.to_string(),
            format!("{:.1} KiB", workload.mean_body_kib()),
            match (workload.against, read) {
                (Against::Durable, _) => "durable",
                (Against::Read, Ceiling::Parse) => "parse",
                (Against::Read, Ceiling::Constant) => "constant",
            }
            .to_string(),
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
