//! Scenario `replicas`: a fleet larger than one process can hold, scaled out as users would — one real etcd,
//! N replicas of the real server binary sharing it (same key prefix), agents spread over the replicas (agent
//! `i` on replica `i % N`) and held by child processes of this harness ([`crate::swarm`]), and UpdateMachine
//! sent by the CAPI workers to the *other* replicas in turn, so every plan reaches its agent through etcd's
//! watch. Prints per-replica agents, memory and CPU, etcd's memory, dispatch latency and errors.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use inplace_agent_api::DEFAULT_WAIT_SECONDS;
use inplace_store::testing::Etcd;
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;

use crate::agents::Shared;
use crate::capi::{self, CapiResult, Target};
use crate::fleet::machine_name;
use crate::net::connector;
use crate::process::{ServerProcess, default_binary, server_args};
use crate::stats::{ProcSample, proc_sample};
use crate::store_writes::SteadyWrites;
use crate::swarm::{Counters, MAX_AGENTS_PER_CHILD, SwarmChild, SwarmSpec};

/// Most replicas one run starts.
pub const MAX_REPLICAS: usize = 8;
/// Most agents one run holds.
pub const MAX_AGENTS: usize = 100_000;
/// Longest the whole fleet may take to connect and send its first poll.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(600);
/// Longest from the first UpdateMachine call until every target has its plan.
pub const PLAN_DEADLINE: Duration = Duration::from_secs(120);
/// Extra time, after the plans, for CAPI to see every update Done.
pub const DONE_DEADLINE: Duration = Duration::from_secs(120);
/// How often progress is checked while waiting.
const TICK: Duration = Duration::from_millis(100);
/// Target: dispatch latency p99 (UpdateMachine sent to one replica → the agent's poll on another returns).
pub const TARGET_P99: Duration = Duration::from_secs(1);
/// The gauge each replica keeps of the agents it has heard from recently.
const AGENTS_CONNECTED_METRIC: &str = "inplace_updater_agents_connected";
/// Each replica's count of hook calls, by hook and status.
const HOOK_CALLS_METRIC: &str = "inplace_updater_hook_calls_total";
/// Each replica's store operations (count and summed seconds), by operation.
const STORE_OPS_COUNT: &str = "inplace_updater_store_operation_duration_seconds_count";
const STORE_OPS_SUM: &str = "inplace_updater_store_operation_duration_seconds_sum";
/// Most CanUpdateMachineSet calls per MachineSet (the first, then one more after each Failure answer).
pub const JUDGE_ATTEMPTS: usize = 10;

#[derive(clap::Args)]
pub struct ReplicasArgs {
    /// Server replicas on the one etcd.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Agents long-polling, spread over the replicas (agent i on replica i % replicas).
    #[arg(long, default_value_t = 30_000)]
    agents: usize,
    /// Agents that get work through UpdateMachine (sent to another replica than the agent's).
    #[arg(long, default_value_t = 1_000)]
    targets: usize,
    /// Child processes holding the agents (default: as few as hold at most 15 000 each).
    #[arg(long)]
    children: Option<usize>,
    /// Concurrent UpdateMachine callers (CAPI's controllers reconcile with about this many workers).
    #[arg(long, default_value_t = 10)]
    capi_workers: usize,
    /// The server binary (default: target/release/inplace-updater next to this example).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// `waitSeconds` of each poll (the agent's default).
    #[arg(long, default_value_t = DEFAULT_WAIT_SECONDS)]
    wait_seconds: u32,
    /// Machines per cluster; each cluster has its own agent token.
    #[arg(long, default_value_t = 1_000)]
    agents_per_cluster: usize,
    /// The servers' `--retry-after-seconds`.
    #[arg(long, default_value_t = 5)]
    retry_after_seconds: u32,
    /// Seconds the connected fleet is held before work is created (default: one poll cycle plus 5 s).
    #[arg(long)]
    idle_seconds: Option<f64>,
    /// Seconds of the hold, from the fleet connected, before the store's writes at steady state are counted
    /// (the rest of the hold is the counted window).
    #[arg(long, default_value_t = 0.0)]
    settle_seconds: f64,
    /// Agents offer no ALPN protocol.
    #[arg(long)]
    no_alpn: bool,
    /// TLS handshakes in flight at once per child while the fleet connects.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,
    /// Keep the scratch directory (replica, etcd and child logs) and print its path.
    #[arg(long)]
    keep_dir: bool,
}

/// Samples of one process at each phase boundary.
#[derive(Default, Clone, Copy)]
pub struct Samples {
    pub started: ProcSample,
    pub connected: ProcSample,
    pub held: ProcSample,
    pub updated: ProcSample,
}

/// What one replica did.
pub struct ReplicaOutcome {
    pub pid: u32,
    pub samples: Samples,
    /// Its own `agents_connected` gauge with the fleet connected.
    pub agents_gauge: f64,
    /// Agents assigned to it.
    pub assigned: usize,
    /// UpdateMachine calls it answered (its own counter; 0 when it answered none).
    pub update_calls: f64,
    /// Writes (`put`) it made to etcd, and their summed duration in seconds.
    pub puts: (f64, f64),
    pub plans_logged: usize,
}

/// Wall time of each phase.
#[derive(Default)]
pub struct Walls {
    pub connect: Duration,
    pub hold: Duration,
    pub update: Duration,
}

pub struct ReplicasOutcome {
    pub agents: usize,
    pub targets: usize,
    pub children: Vec<(u32, usize, Counters)>,
    pub replicas: Vec<ReplicaOutcome>,
    pub etcd: Samples,
    pub walls: Walls,
    pub shared: Arc<Shared>,
    pub target_indices: Vec<usize>,
    pub capi: CapiResult,
    pub judged: crate::capi::Judged,
    pub wait_seconds: u32,
    /// etcd's own count of writes (puts and deletes) over the steady-state window of the hold, and the window.
    pub steady_writes: (f64, Duration),
}

/// Processes this run started; every one is killed when this is dropped (children first, then replicas,
/// then etcd), also when the run fails half-way.
struct Processes {
    children: Vec<SwarmChild>,
    replicas: Vec<ServerProcess>,
    etcd: Etcd,
}

fn sample_all(procs: &Processes, etcd_pid: u32) -> anyhow::Result<(Vec<ProcSample>, ProcSample)> {
    let replicas = procs
        .replicas
        .iter()
        .map(|r| proc_sample(r.pid()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((replicas, proc_sample(etcd_pid)?))
}

/// Agent given the `k`-th of `targets` works: evenly spaced over the fleet, each one moved inside its gap so
/// target `k` polls replica `k % replicas` (else every 30th of 30 000 agents would all be on replica 0).
fn target_index(k: usize, targets: usize, agents: usize, replicas: usize) -> usize {
    let base = k * agents / targets.max(1);
    let next = (k + 1) * agents / targets.max(1);
    let replicas = replicas.max(1);
    let shift = (k % replicas + replicas - base % replicas) % replicas;
    if base + shift < next {
        base + shift
    } else {
        base
    }
}

pub fn run(args: &ReplicasArgs) -> anyhow::Result<()> {
    let outcome = run_outcome(args)?;
    outcome.print();
    Ok(())
}

fn run_outcome(args: &ReplicasArgs) -> anyhow::Result<ReplicasOutcome> {
    let agent_count = args.agents;
    anyhow::ensure!(
        (1..=MAX_AGENTS).contains(&agent_count),
        "--agents must be 1..={MAX_AGENTS}"
    );
    anyhow::ensure!(
        (1..=MAX_REPLICAS).contains(&args.replicas),
        "--replicas must be 1..={MAX_REPLICAS}"
    );
    let children = args
        .children
        .unwrap_or_else(|| agent_count.div_ceil(MAX_AGENTS_PER_CHILD))
        .clamp(1, agent_count);
    anyhow::ensure!(
        agent_count.div_ceil(children) <= MAX_AGENTS_PER_CHILD,
        "{children} children would hold more than {MAX_AGENTS_PER_CHILD} agents each"
    );
    let target_count = args.targets.min(agent_count);
    let replica_count = args.replicas;

    let dir = tempfile::tempdir()?;
    if args.keep_dir {
        println!("scratch directory (kept): {}", dir.path().display());
    }
    let spec =
        inplace_updater::cmd::certs::DevCertsSpec::with_defaults(dir.path().into(), vec![], vec![]);
    let certs = inplace_updater::cmd::certs::write_dev_certs(&spec)?;
    let per_cluster = args.agents_per_cluster.max(1);
    let clusters = agent_count.div_ceil(per_cluster);
    let (mut hashed, mut raw) = (String::new(), String::new());
    for cluster in 0..clusters {
        let scope = AgentScope::Cluster {
            namespace: "default".into(),
            cluster: format!("edge-{cluster:03}"),
        };
        let token = create_token(&scope, None).map_err(|err| anyhow::anyhow!("token: {err}"))?;
        hashed.push_str(&token.line);
        hashed.push('\n');
        raw.push_str(&token.token);
        raw.push('\n');
    }
    let token_file = dir.path().join("agent-tokens");
    std::fs::write(&token_file, hashed)?;
    // The children read the raw tokens from a file: no token on a command line.
    let raw_tokens = dir.path().join("agent-tokens.raw");
    std::fs::write(&raw_tokens, raw)?;

    let etcd = Etcd::start().context("starting etcd (apt-get install etcd-server)")?;
    let store = etcd.store_url();
    let binary = match &args.server_bin {
        Some(path) => path.clone(),
        None => default_binary()?,
    };
    let mut server_args = server_args(&certs, &token_file, &store);
    server_args.extend([
        "--retry-after-seconds".into(),
        args.retry_after_seconds.to_string(),
    ]);
    let mut procs = Processes {
        children: Vec::new(),
        replicas: Vec::new(),
        etcd,
    };
    let etcd_pid = procs.etcd.pid().context("etcd is not running")?;
    for replica in 0..replica_count {
        let home = dir.path().join(format!("replica-{replica}"));
        std::fs::create_dir_all(&home)?;
        procs
            .replicas
            .push(ServerProcess::start(&binary, &server_args, &home)?);
    }
    for replica in &procs.replicas {
        replica.wait_ready()?;
    }
    let addrs: Vec<SocketAddr> = procs.replicas.iter().map(|r| r.hooks).collect();
    let idle = Duration::from_secs_f64(
        args.idle_seconds
            .unwrap_or(f64::from(args.wait_seconds) + 5.0)
            .clamp(0.0, 600.0),
    );
    println!(
        "{agent_count} agents ({clusters} clusters, one token each) in {children} child processes, long-polling \
         {replica_count} replicas ({}) on one etcd (pid {etcd_pid}, {store}); waitSeconds {}; work for \
         {target_count} of them from {} CAPI workers, each UpdateMachine sent to another replica than the agent's",
        binary.display(),
        args.wait_seconds,
        args.capi_workers
    );

    let (before, etcd_before) = sample_all(&procs, etcd_pid)?;
    let shared = Arc::new(Shared::new(agent_count));
    let epoch_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut walls = Walls::default();

    // Connect the fleet, one slice per child.
    let started = Instant::now();
    let per_child = agent_count.div_ceil(children);
    for child in 0..children {
        let first = child * per_child;
        let count = per_child.min(agent_count.saturating_sub(first));
        if count == 0 {
            break;
        }
        procs.children.push(SwarmChild::start(
            &SwarmSpec {
                ca: &certs.ca_cert,
                tokens: &raw_tokens,
                replicas: &addrs,
                first,
                count,
                agents_per_cluster: per_cluster,
                wait_seconds: args.wait_seconds,
                connect_concurrency: args.connect_concurrency,
                no_alpn: args.no_alpn,
                child,
            },
            dir.path(),
        )?);
    }
    let first_polls = |procs: &Processes| -> usize {
        procs.children.iter().map(|c| c.latest().first_polls).sum()
    };
    let errors =
        |procs: &Processes| -> u64 { procs.children.iter().map(|c| c.latest().errors).sum() };
    while first_polls(&procs) < agent_count {
        for child in &mut procs.children {
            child.check_alive()?;
        }
        anyhow::ensure!(
            started.elapsed() < CONNECT_DEADLINE,
            "only {} of {agent_count} agents connected within {CONNECT_DEADLINE:?} (errors: {})",
            first_polls(&procs),
            errors(&procs)
        );
        std::thread::sleep(TICK);
    }
    walls.connect = started.elapsed();
    let (connected, etcd_connected) = sample_all(&procs, etcd_pid)?;

    // Hold the fleet: every agent waits in its long-poll on its replica, then renews it. The store's writes are
    // counted by etcd itself over the hold after `--settle-seconds`.
    let held = Instant::now();
    let settle = Duration::from_secs_f64(args.settle_seconds.clamp(0.0, 600.0)).min(idle);
    let mut window = SteadyWrites::default();
    while held.elapsed() < idle {
        for child in &mut procs.children {
            child.check_alive()?;
        }
        window.open_once_settled(&procs.etcd, held.elapsed(), settle)?;
        std::thread::sleep(TICK);
    }
    let steady_writes = window.close(&procs.etcd)?;
    walls.hold = held.elapsed();
    // Each replica's own count of the agents it heard from (within one long-poll plus grace).
    let gauges = procs
        .replicas
        .iter()
        .map(|r| {
            r.metric(AGENTS_CONNECTED_METRIC, "")?
                .with_context(|| format!("no {AGENTS_CONNECTED_METRIC} in /metrics"))
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    let (after_hold, etcd_held) = sample_all(&procs, etcd_pid)?;

    // Work: CanUpdateMachineSet once per cluster with targets (spread over the replicas), then UpdateMachine
    // for each target, every call to a replica other than the one its agent polls.
    let target_indices: Vec<usize> = (0..target_count)
        .map(|k| target_index(k, target_count, agent_count, replica_count))
        .collect();
    let work = Instant::now();
    let tls = connector(&certs.ca_cert, !args.no_alpn)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut judged = crate::capi::Judged::default();
    let capi = if target_count == 0 {
        CapiResult::default()
    } else {
        let with_targets: std::collections::BTreeSet<usize> =
            target_indices.iter().map(|&i| i / per_cluster).collect();
        runtime.block_on(async {
            for (replica, &addr) in addrs.iter().enumerate() {
                let mine = with_targets
                    .iter()
                    .filter(|&&cluster| cluster % replica_count == replica)
                    .map(|cluster| format!("edge-{cluster:03}"));
                let one = capi::judge_machine_sets_retrying(addr, &tls, mine, JUDGE_ATTEMPTS)
                    .await
                    .context("CanUpdateMachineSet")?;
                judged.failures += one.failures;
                judged.calls.extend(one.calls);
            }
            anyhow::Ok(())
        })?;
        let template = crate::payloads::UpdateTemplate::worker()?;
        let targets: Vec<Target> = target_indices
            .iter()
            .map(|&index| {
                let cluster = index / per_cluster;
                let home = index % replica_count;
                Target {
                    index,
                    body: template
                        .body(&machine_name(cluster, index), &format!("edge-{cluster:03}"))
                        .into(),
                    // Round-robin over the other replicas (only one replica: itself).
                    replicas: (1..replica_count.max(2))
                        .map(|d| (home + d) % replica_count)
                        .collect(),
                }
            })
            .collect();
        let driver = runtime.spawn(capi::drive(
            addrs.clone(),
            tls.clone(),
            targets,
            args.capi_workers.clamp(1, 256),
            shared.clone(),
            PLAN_DEADLINE + DONE_DEADLINE,
            Duration::ZERO,
        ));
        let planned = |procs: &Processes| -> usize {
            procs
                .children
                .iter()
                .filter_map(|c| c.view.lock().ok().map(|v| v.plans.len()))
                .sum()
        };
        while planned(&procs) < target_count && work.elapsed() < PLAN_DEADLINE {
            for child in &mut procs.children {
                child.check_alive()?;
            }
            std::thread::sleep(TICK);
        }
        runtime.block_on(driver).context("CAPI driver")?
    };
    walls.update = work.elapsed();
    let (updated, etcd_updated) = sample_all(&procs, etcd_pid)?;

    // Stop the children, then read what they saw into the fleet-wide slots.
    let mut child_reports = Vec::new();
    for child in &mut procs.children {
        let last = child.stop()?;
        child_reports.push((child.pid(), child.count, last));
        let Ok(view) = child.view.lock() else {
            anyhow::bail!("a child's view was poisoned");
        };
        let stamp = |at: u64| at.saturating_sub(epoch_wall) + 1;
        for (slots, events) in [
            (&shared.plan_received, &view.plans),
            (&shared.step_started, &view.steps),
        ] {
            for &(agent, at) in events {
                let slot = slots
                    .get(agent)
                    .with_context(|| format!("a child reported agent {agent} of {agent_count}"))?;
                slot.store(stamp(at), Ordering::Release);
            }
        }
    }
    let mut replicas = Vec::new();
    for (i, replica) in procs.replicas.iter_mut().enumerate() {
        let peak = proc_sample(replica.pid())?;
        replicas.push(ReplicaOutcome {
            pid: replica.pid(),
            samples: Samples {
                started: before[i],
                connected: connected[i],
                held: after_hold[i],
                updated: ProcSample {
                    hwm_kib: peak.hwm_kib,
                    ..updated[i]
                },
            },
            agents_gauge: gauges[i],
            // No series yet means no call answered.
            update_calls: replica
                .metric(HOOK_CALLS_METRIC, "hook=\"UpdateMachine\"")?
                .unwrap_or(0.0),
            puts: (
                replica
                    .metric(STORE_OPS_COUNT, "op=\"put\"")?
                    .unwrap_or(0.0),
                replica.metric(STORE_OPS_SUM, "op=\"put\"")?.unwrap_or(0.0),
            ),
            assigned: (0..agent_count).filter(|a| a % replica_count == i).count(),
            plans_logged: replica.log_lines_with("plan handed to agent"),
        });
        replica.stop();
    }
    let etcd_peak = proc_sample(etcd_pid)?;
    drop(procs);
    if args.keep_dir {
        let _ = dir.keep();
    }
    Ok(ReplicasOutcome {
        agents: agent_count,
        targets: target_count,
        children: child_reports,
        replicas,
        etcd: Samples {
            started: etcd_before,
            connected: etcd_connected,
            held: etcd_held,
            updated: ProcSample {
                hwm_kib: etcd_peak.hwm_kib,
                ..etcd_updated
            },
        },
        walls,
        shared,
        target_indices,
        capi,
        judged,
        wait_seconds: args.wait_seconds,
        steady_writes,
    })
}

#[path = "replicas_report.rs"]
mod report;
