//! Scenario `replicas`: a fleet larger than one process can hold, scaled out as users would — one real etcd,
//! N replicas of the real server binary sharing it (same key prefix), agents spread over the replicas (agent
//! `i` on replica `i % N`) and held by child processes of this harness ([`crate::swarm`]), and UpdateMachine
//! sent by the CAPI workers to the *other* replicas in turn, so every plan reaches its agent through etcd's
//! watch. Prints per-replica agents, memory and CPU, etcd's memory, dispatch latency and errors.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inplace_agent_api::DEFAULT_WAIT_SECONDS;

use crate::agents::Shared;
use crate::capi::CapiResult;
use crate::stats::ProcSample;
use crate::swarm::{Counters, MAX_AGENTS_PER_CHILD};

/// Most replicas one run starts.
pub const MAX_REPLICAS: usize = 8;
/// Most agents one run holds.
pub const MAX_AGENTS: usize = 100_000;
/// How often progress is checked while waiting.
const TICK: Duration = Duration::from_millis(100);
/// Target: dispatch latency p99 (UpdateMachine sent to one replica → the agent's poll on another returns).
pub const TARGET_P99: Duration = Duration::from_secs(1);

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
    /// After the hold, SIGKILL this replica (0-based) and measure its agents' takeover by the others before the
    /// updates ([`takeover`]).
    #[arg(long)]
    kill_replica: Option<usize>,
    /// With `--kill-replica`: also wait until the killed replica's heartbeat is older than
    /// `PRESENCE_STALE_AFTER` (30 s), when every replica counts it dead.
    #[arg(long, requires = "kill_replica")]
    notice_dead: bool,
}

/// The fleet's shape, from the arguments, checked before anything starts.
pub struct Sizes {
    pub agents: usize,
    pub replicas: usize,
    /// Child processes holding the agents.
    pub children: usize,
    /// Agents given work.
    pub targets: usize,
    /// Machines per cluster (one agent token each).
    pub per_cluster: usize,
    /// The replica the takeover phase kills (its agents then move to the others).
    pub kill: Option<usize>,
}

impl Sizes {
    /// The sizes `args` ask for, or what is wrong with them — including open-file limits too low for them
    /// ([`descriptors::check`]), so a run that cannot hold its fleet fails before it starts anything.
    fn of(args: &ReplicasArgs) -> anyhow::Result<Sizes> {
        let agents = args.agents;
        anyhow::ensure!(
            (1..=MAX_AGENTS).contains(&agents),
            "--agents must be 1..={MAX_AGENTS}"
        );
        anyhow::ensure!(
            (1..=MAX_REPLICAS).contains(&args.replicas),
            "--replicas must be 1..={MAX_REPLICAS}"
        );
        if let Some(killed) = args.kill_replica {
            anyhow::ensure!(
                args.replicas >= 2 && killed < args.replicas,
                "--kill-replica must name one of 2 or more replicas (0..{})",
                args.replicas
            );
        }
        let children = args
            .children
            .unwrap_or_else(|| agents.div_ceil(MAX_AGENTS_PER_CHILD))
            .clamp(1, agents);
        anyhow::ensure!(
            agents.div_ceil(children) <= MAX_AGENTS_PER_CHILD,
            "{children} children would hold more than {MAX_AGENTS_PER_CHILD} agents each"
        );
        let sizes = Sizes {
            agents,
            replicas: args.replicas,
            children,
            targets: args.targets.min(agents),
            per_cluster: args.agents_per_cluster.max(1),
            kill: args.kill_replica,
        };
        descriptors::check(&sizes, args.capi_workers, descriptors::open_file_limit())?;
        Ok(sizes)
    }

    pub fn clusters(&self) -> usize {
        self.agents.div_ceil(self.per_cluster)
    }
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
    pub takeover: Duration,
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
    /// etcd's own count of writes (puts and deletes) and reads over the steady-state window of the hold, and
    /// the window.
    pub steady: (crate::store_writes::Counts, Duration),
    /// The takeover phase, when a replica was killed.
    pub takeover: Option<takeover::Takeover>,
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

/// The run, phase by phase: the fleet's sizes checked, etcd and the replicas started, the agents connected,
/// held idle, given work, and what every process saw collected after the run.
fn run_outcome(args: &ReplicasArgs) -> anyhow::Result<ReplicasOutcome> {
    let sizes = Sizes::of(args)?;
    let mut fleet = setup::Fleet::start(args, &sizes)?;
    let before = fleet.sample()?;
    let shared = Arc::new(Shared::new(sizes.agents));
    let epoch_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut walls = Walls::default();

    let started = Instant::now();
    connect::connect(&mut fleet, args, &sizes)?;
    walls.connect = started.elapsed();
    let connected = fleet.sample()?;

    let held = Instant::now();
    let hold = hold::hold(&mut fleet, args)?;
    walls.hold = held.elapsed();
    let after_hold = fleet.sample()?;

    let takeover = match args.kill_replica {
        Some(replica) => {
            let taken = takeover::takeover(&mut fleet, &sizes, replica, args.notice_dead)?;
            walls.takeover = taken.wall;
            Some(taken)
        }
        None => None,
    };

    let target_indices: Vec<usize> = (0..sizes.targets)
        .map(|k| target_index(k, sizes.targets, sizes.agents, sizes.replicas))
        .collect();
    let work = Instant::now();
    let (capi, judged) = update::update(&mut fleet, args, &sizes, &target_indices, &shared)?;
    walls.update = work.elapsed();
    let updated = fleet.sample()?;

    let after = after::collect(fleet, &sizes, &shared, epoch_wall, args.keep_dir)?;
    Ok(ReplicasOutcome {
        agents: sizes.agents,
        targets: sizes.targets,
        children: after.children,
        replicas: after::replica_outcomes(
            after.replicas,
            [&before, &connected, &after_hold, &updated],
            &hold.gauges,
            &sizes,
        ),
        etcd: Samples {
            started: before.etcd,
            connected: connected.etcd,
            held: after_hold.etcd,
            updated: ProcSample {
                hwm_kib: after.etcd_peak.hwm_kib,
                ..updated.etcd
            },
        },
        walls,
        shared,
        target_indices,
        capi,
        judged,
        wait_seconds: args.wait_seconds,
        steady: hold.steady,
        takeover,
    })
}

mod after;
mod connect;
mod descriptors;
mod hold;
mod report;
mod setup;
mod takeover;
mod update;
