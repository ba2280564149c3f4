//! Scenarios `fleet` and `dispatch`: the real server binary (separate process, so /proc tells its RSS and CPU),
//! a fleet of simulated agents long-polling it over TLS with per-cluster bearer tokens, and a CAPI-style caller
//! that creates work for some of them with UpdateMachine and re-asks after `retryAfterSeconds` until Done.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use inplace_agent_api::{DEFAULT_WAIT_SECONDS, MachineRef};
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use tokio::sync::Semaphore;

use crate::agents::{self, Agent, Shared};
use crate::capi::{self, CapiResult, Target};
use crate::net::connector;
use crate::process::{ServerProcess, default_binary, server_args};
use crate::stats::{ProcSample, proc_sample};

/// Descriptors besides the agent connections (listeners, epoll, store, logs, CAPI's connections, stdio).
pub const FD_HEADROOM: usize = 100;
/// Agents sharing one loopback source address (each address has ~28 000 ephemeral ports to the server).
const AGENTS_PER_SOURCE_IP: usize = 10_000;
/// Longest the whole fleet may take to connect and send its first poll.
const CONNECT_DEADLINE: Duration = Duration::from_secs(600);
/// Longest from the first UpdateMachine call until every target has its plan.
const PLAN_DEADLINE: Duration = Duration::from_secs(120);
/// Extra time, after the plans, for CAPI to see every update Done.
const DONE_DEADLINE: Duration = Duration::from_secs(120);
/// How often progress is checked while waiting.
const TICK: Duration = Duration::from_millis(100);
/// Target: server RSS with the whole fleet connected.
const TARGET_RSS_MIB: f64 = 300.0;
/// Target: dispatch latency p99.
const TARGET_P99: Duration = Duration::from_secs(1);

#[derive(clap::Args, Clone)]
pub struct Common {
    /// Concurrent UpdateMachine callers (CAPI's controllers reconcile with about this many workers).
    #[arg(long, default_value_t = 10)]
    capi_workers: usize,
    /// Store of the server: `memory:`, `file` (a fresh redb file in a temporary directory) or any `--store` URL.
    #[arg(long, default_value = "memory:")]
    store: String,
    /// The server binary (default: target/release/inplace-updater next to this example).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// `waitSeconds` of each poll (the agent's default).
    #[arg(long, default_value_t = DEFAULT_WAIT_SECONDS)]
    wait_seconds: u32,
    /// Machines per cluster; each cluster has its own agent token.
    #[arg(long, default_value_t = 1_000)]
    agents_per_cluster: usize,
    /// The server's `--retry-after-seconds`.
    #[arg(long, default_value_t = 5)]
    retry_after_seconds: u32,
    /// Seconds the connected fleet is held before work is created (default: one poll cycle plus 5 s, so every
    /// agent's long-poll expires and is renewed inside the window).
    #[arg(long)]
    idle_seconds: Option<f64>,
    /// Agents offer no ALPN protocol (the server then detects HTTP/1.1 from the first bytes, as every
    /// connection was served before it chose the connection type from ALPN).
    #[arg(long)]
    no_alpn: bool,
    /// TLS handshakes in flight at once while the fleet connects.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,
    #[command(flatten)]
    pace: agents::Pace,
}

#[derive(clap::Args)]
pub struct FleetArgs {
    /// Agents long-polling the server.
    #[arg(long, default_value_t = 5_000)]
    agents: usize,
    /// Agents that get work through UpdateMachine.
    #[arg(long, default_value_t = 1_000)]
    targets: usize,
    /// Also hold the same fleet on the bare axum + rustls ceiling (its own process) and compare memory.
    #[arg(long)]
    compare_ceiling: bool,
    #[command(flatten)]
    common: Common,
}

/// Which server the fleet connects to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Against {
    /// `inplace-updater serve`, the real binary.
    Ours,
    /// `load ceiling-serve`: long-polls held and answered "nothing", no work ever.
    Ceiling,
}

#[derive(clap::Args)]
pub struct DispatchArgs {
    /// Agents connected; every one of them gets work.
    #[arg(long, default_value_t = 1_000)]
    agents: usize,
    #[command(flatten)]
    common: Common,
}

pub fn run_fleet(args: &FleetArgs) -> anyhow::Result<()> {
    let outcome = run(
        args.agents,
        args.targets.min(args.agents),
        &args.common,
        Against::Ours,
    )?;
    let ceiling = if args.compare_ceiling {
        Some(run(args.agents, 0, &args.common, Against::Ceiling)?)
    } else {
        None
    };
    outcome.print_fleet(ceiling.as_ref());
    Ok(())
}

pub fn run_dispatch(args: &DispatchArgs) -> anyhow::Result<()> {
    let common = Common {
        // Issue 4's benchmark is about waking connected agents; no need to wait a whole poll cycle first.
        idle_seconds: Some(args.common.idle_seconds.unwrap_or(2.0)),
        ..args.common.clone()
    };
    let outcome = run(args.agents, args.agents, &common, Against::Ours)?;
    outcome.print_dispatch();
    Ok(())
}

struct Phase {
    name: String,
    wall: Duration,
    before: ProcSample,
    after: ProcSample,
}

struct FleetOutcome {
    agents: usize,
    targets: usize,
    store: String,
    pid: u32,
    phases: Vec<Phase>,
    baseline: ProcSample,
    connected: ProcSample,
    peak: ProcSample,
    harness_peak: ProcSample,
    shared: Arc<Shared>,
    target_indices: Vec<usize>,
    capi: CapiResult,
    oldest_poll_seen: Duration,
    wait_seconds: u32,
    plans_logged: usize,
}

pub(crate) fn source_ip(index: usize) -> IpAddr {
    let n = 2 + (index / AGENTS_PER_SOURCE_IP) as u8;
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

pub(crate) fn machine_name(cluster: usize, index: usize) -> String {
    format!("edge-{cluster:03}-md-0-{index:05}")
}

fn run(
    agent_count: usize,
    target_count: usize,
    common: &Common,
    against: Against,
) -> anyhow::Result<FleetOutcome> {
    anyhow::ensure!(
        (1..=100_000).contains(&agent_count),
        "--agents must be 1..=100000"
    );
    // Both this process and the server child hold one descriptor per agent connection.
    let needed = (agent_count + common.capi_workers + FD_HEADROOM) as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    anyhow::ensure!(
        limit >= needed,
        "{agent_count} agents need about {needed} open files in this process and in the server, but the \
         limit is {limit} and could not be raised (setrlimit needs CAP_SYS_RESOURCE past the hard limit); \
         run with --agents {} or raise the limit",
        limit.saturating_sub((common.capi_workers + FD_HEADROOM) as u64)
    );
    let dir = tempfile::tempdir()?;
    let spec =
        inplace_updater::cmd::certs::DevCertsSpec::with_defaults(dir.path().into(), vec![], vec![]);
    let certs = inplace_updater::cmd::certs::write_dev_certs(&spec)?;
    let per_cluster = common.agents_per_cluster.max(1);
    let clusters = agent_count.div_ceil(per_cluster);
    let mut lines = String::new();
    let mut tokens: Vec<Arc<str>> = Vec::new();
    for cluster in 0..clusters {
        let scope = AgentScope::Cluster {
            namespace: "default".into(),
            cluster: format!("edge-{cluster:03}"),
        };
        let token = create_token(&scope, None).map_err(|err| anyhow::anyhow!("token: {err}"))?;
        lines.push_str(&token.line);
        lines.push('\n');
        tokens.push(token.token.into());
    }
    let token_file = dir.path().join("agent-tokens");
    std::fs::write(&token_file, lines)?;
    let store = match common.store.as_str() {
        "file" => format!("file:{}", dir.path().join("data").display()),
        other => other.to_string(),
    };
    let binary = match &common.server_bin {
        Some(path) => path.clone(),
        None => default_binary()?,
    };
    let mut server_args = server_args(&certs, &token_file, &store);
    server_args.extend([
        "--retry-after-seconds".into(),
        common.retry_after_seconds.to_string(),
    ]);
    if let Some(mode) = &common.pace.retry_after {
        server_args.extend(["--retry-after".into(), mode.clone()]);
    }
    let mut server = match against {
        Against::Ours => ServerProcess::start(&binary, &server_args, dir.path())?,
        Against::Ceiling => {
            ServerProcess::start_ceiling(&certs.server_cert, &certs.server_key, dir.path())?
        }
    };
    let binary = match against {
        Against::Ours => binary,
        Against::Ceiling => std::env::current_exe()?,
    };
    let pid = server.pid();
    let addr: SocketAddr = server.hooks;
    let tls = connector(&certs.ca_cert, !common.no_alpn)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared::new(agent_count));
    let target_indices: Vec<usize> = (0..target_count)
        .map(|k| k * agent_count / target_count.max(1))
        .collect();
    let idle = Duration::from_secs_f64(
        common
            .idle_seconds
            .unwrap_or(f64::from(common.wait_seconds) + 5.0)
            .clamp(0.0, 600.0),
    );
    println!(
        "{agent_count} agents ({clusters} clusters, one token each) long-polling pid {pid} ({}, --store {store}), \
         waitSeconds {}, work for {target_count} of them from {} CAPI workers",
        binary.display(),
        common.wait_seconds,
        common.capi_workers
    );

    let mut phases = Vec::new();
    let mut oldest_poll_seen = Duration::ZERO;
    let baseline = proc_sample(pid)?;
    let (capi, connected) = runtime.block_on(async {
        // Connect the fleet.
        let started = Instant::now();
        let gate = Arc::new(Semaphore::new(common.connect_concurrency.clamp(1, 4096)));
        let mut fleet = tokio::task::JoinSet::new();
        for index in 0..agent_count {
            let cluster = index / per_cluster;
            let agent = Agent {
                index,
                machine: MachineRef::new("default", machine_name(cluster, index)),
                token: tokens[cluster].clone(),
                source: source_ip(index),
            };
            fleet.spawn(agents::run(
                agent,
                agents::Route::single(addr),
                tls.clone(),
                gate.clone(),
                common.wait_seconds,
                shared.clone(),
                common.pace.clone(),
            ));
        }
        while shared.first_polls.load(Ordering::Relaxed) < agent_count {
            anyhow::ensure!(
                started.elapsed() < CONNECT_DEADLINE,
                "only {} of {agent_count} agents connected within {CONNECT_DEADLINE:?} (errors: {})",
                shared.first_polls.load(Ordering::Relaxed),
                shared.errors.load(Ordering::Relaxed)
            );
            tokio::time::sleep(TICK).await;
        }
        let connected = proc_sample(pid)?;
        phases.push(Phase {
            name: format!("connect {agent_count} agents (TLS handshake + first poll)"),
            wall: started.elapsed(),
            before: baseline,
            after: connected,
        });

        // Hold the fleet: every agent waits in its long-poll, then renews it.
        let held = Instant::now();
        let before = proc_sample(pid)?;
        while held.elapsed() < idle {
            oldest_poll_seen = oldest_poll_seen.max(shared.oldest_poll());
            tokio::time::sleep(TICK.max(Duration::from_millis(500))).await;
        }
        let after_idle = proc_sample(pid)?;
        phases.push(Phase {
            name: format!("hold {agent_count} agents long-polling, no work"),
            wall: held.elapsed(),
            before,
            after: after_idle,
        });

        if target_count == 0 {
            shared.stop.cancel();
            fleet.abort_all();
            while fleet.join_next().await.is_some() {}
            return anyhow::Ok((CapiResult::default(), connected));
        }
        // The MachineDeployment of each cluster with targets asks about its new MachineSet once (as CAPI
        // does before it moves Machines), then CAPI creates work for the targets.
        let with_targets: std::collections::BTreeSet<usize> =
            target_indices.iter().map(|&index| index / per_cluster).collect();
        capi::judge_machine_sets(
            addr,
            &tls,
            with_targets.iter().map(|cluster| format!("edge-{cluster:03}")),
        )
        .await
        .context("CanUpdateMachineSet")?;
        let work = Instant::now();
        let before = proc_sample(pid)?;
        let template = crate::payloads::UpdateTemplate::worker()?;
        let targets: Vec<Target> = target_indices
            .iter()
            .map(|&index| {
                let cluster = index / per_cluster;
                Target {
                    index,
                    body: template
                        .body(&machine_name(cluster, index), &format!("edge-{cluster:03}"))
                        .into(),
                    replicas: vec![0],
                }
            })
            .collect();
        let driver = tokio::spawn(capi::drive(
            vec![addr],
            tls.clone(),
            targets,
            common.capi_workers.clamp(1, 256),
            shared.clone(),
            PLAN_DEADLINE + DONE_DEADLINE,
            Duration::from_secs_f64(common.pace.stagger_seconds.clamp(0.0, 600.0)),
        ));
        let planned = || {
            target_indices
                .iter()
                .filter(|&&i| shared.plan_received[i].load(Ordering::Acquire) != 0)
                .count()
        };
        let stagger = Duration::from_secs_f64(common.pace.stagger_seconds.clamp(0.0, 600.0));
        while planned() < target_count && work.elapsed() < PLAN_DEADLINE + stagger {
            oldest_poll_seen = oldest_poll_seen.max(shared.oldest_poll());
            tokio::time::sleep(TICK).await;
        }
        let capi = driver.await.context("CAPI driver")?;
        oldest_poll_seen = oldest_poll_seen.max(shared.oldest_poll());
        let after = proc_sample(pid)?;
        phases.push(Phase {
            name: format!("UpdateMachine for {target_count} Machines until all Done"),
            wall: work.elapsed(),
            before,
            after,
        });
        shared.stop.cancel();
        fleet.abort_all();
        while fleet.join_next().await.is_some() {}
        anyhow::Ok((capi, connected))
    })?;
    let peak = proc_sample(pid)?;
    let harness_peak = proc_sample(std::process::id())?;
    let plans_logged = server.log_lines_with("plan handed to agent");
    server.stop();
    Ok(FleetOutcome {
        agents: agent_count,
        targets: target_count,
        store,
        pid,
        phases,
        baseline,
        connected,
        peak,
        harness_peak,
        shared,
        target_indices,
        capi,
        oldest_poll_seen,
        wait_seconds: common.wait_seconds,
        plans_logged,
    })
}

#[path = "fleet_report.rs"]
mod report;
