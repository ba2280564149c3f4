//! Agents held in a child process of the harness (`load agent-swarm`, hidden), for fleets one process cannot
//! hold (each connection is an open file, and the hard limit is per process). The child runs a slice of the
//! fleet's agents against the replicas (agent `i` long-polls replica `i % replicas`) and tells the parent what
//! happens as JSON lines on stdout ([`Event`]); a line `stop` on stdin (or stdin closing, e.g. the parent
//! died) stops it, and it answers with a last [`Event::Final`]. The parent side is [`SwarmChild`].

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use inplace_agent_api::MachineRef;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::agents::{self, Agent, Shared};
use crate::fleet::machine_name;
use crate::net::connector;
use crate::stats::proc_sample;

/// Most agents one child holds: each is an open file, and the hard limit here is 20 000 per process.
pub const MAX_AGENTS_PER_CHILD: usize = 15_000;
/// Agents sharing one loopback source address (each address has ~28 000 ephemeral ports).
pub const AGENTS_PER_SOURCE_IP: usize = 10_000;
/// Source addresses set aside for each child (so no two children share one: their ports would add up).
pub const SOURCE_IPS_PER_CHILD: usize = MAX_AGENTS_PER_CHILD.div_ceil(AGENTS_PER_SOURCE_IP);
/// Descriptors a child needs besides its agents' connections (epoll, stdio, its runtime).
pub const CHILD_FD_HEADROOM: usize = 64;
/// How often a child reports its counters and newly received plans.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(50);
/// Longest a child may take to send its last report once told to stop.
pub const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a child writes, one JSON document per line.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// Counters so far (sent every [`REPORT_INTERVAL`]).
    Progress(Counters),
    /// Agent `agent` (fleet-wide index) got a plan from its poll at this wall-clock instant.
    Plan { agent: usize, at_unix_ns: u64 },
    /// Agent `agent` had the start of its plan's first step acknowledged at this wall-clock instant.
    Step { agent: usize, at_unix_ns: u64 },
    /// Agent `agent`, on a new connection after a failure, was answered by replica `replica` (its inventory
    /// report acknowledged) at this wall-clock instant.
    Served {
        agent: usize,
        replica: usize,
        at_unix_ns: u64,
    },
    /// The last line: counters after every agent stopped.
    Final(Counters),
}

/// A child's counters.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct Counters {
    pub connected: usize,
    pub first_polls: usize,
    pub idle_polls: u64,
    pub longest_idle_poll_ns: u64,
    pub oldest_poll_seen_ns: u64,
    pub errors: u64,
    pub reconnects: u64,
    /// Polls answered with another status than 200: `(status, count)` (part of `errors`).
    pub refusals: Vec<(u16, u64)>,
    /// Failed requests and connects by replica (index in `--replicas`): `(replica, count)` (`errors` split).
    #[serde(default)]
    pub errors_by_replica: Vec<(usize, u64)>,
    pub peak_rss_kib: u64,
}

/// `load agent-swarm`: which slice of the fleet this child holds and where its replicas are.
#[derive(clap::Args)]
pub struct SwarmArgs {
    /// The CA the replicas' certificate chains to.
    #[arg(long)]
    ca: PathBuf,
    /// One raw agent token per line, cluster by cluster (a file, so no token is on a command line).
    #[arg(long)]
    tokens: PathBuf,
    /// Hook addresses of the replicas, in order.
    #[arg(long, value_delimiter = ',', required = true)]
    replicas: Vec<SocketAddr>,
    /// Fleet-wide index of this child's first agent.
    #[arg(long)]
    first: usize,
    /// Agents this child holds.
    #[arg(long)]
    count: usize,
    #[arg(long)]
    agents_per_cluster: usize,
    #[arg(long)]
    wait_seconds: u32,
    #[arg(long)]
    connect_concurrency: usize,
    #[arg(long)]
    no_alpn: bool,
    /// Last octet of this child's first loopback source address (127.0.0.N).
    #[arg(long)]
    source_base: u8,
}

fn unix_ns(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn emit(event: &Event) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, event)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// The child: holds its agents until told to stop, reporting as it goes.
pub fn serve(args: &SwarmArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_AGENTS_PER_CHILD).contains(&args.count),
        "a child holds 1..={MAX_AGENTS_PER_CHILD} agents"
    );
    let needed = (args.count + CHILD_FD_HEADROOM) as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    anyhow::ensure!(
        limit >= needed,
        "{} agents need about {needed} open files in one child, but its limit is {limit}: use more --children",
        args.count
    );
    let text = std::fs::read_to_string(&args.tokens).context("token file")?;
    let tokens: Vec<Arc<str>> = text.lines().map(Arc::from).collect();
    let per_cluster = args.agents_per_cluster.max(1);
    let tls = connector(&args.ca, !args.no_alpn)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared::new(args.count));
    // Stamps of `shared` (since its epoch, taken just now) to wall-clock time: the parent compares them with
    // its own wall clock, on the same machine.
    let epoch_wall = unix_ns(SystemTime::now());
    let at_unix_ns = |stamp: u64| epoch_wall + stamp.saturating_sub(1);
    let stop = shared.stop.clone();
    std::thread::spawn(move || {
        // Any line, or the end of stdin (the parent went away), stops the child.
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        stop.cancel();
    });
    let oldest_seen = AtomicU64::new(0);
    let counters = |shared: &Shared| Counters {
        connected: shared.connected.load(Ordering::Relaxed),
        first_polls: shared.first_polls.load(Ordering::Relaxed),
        idle_polls: shared.idle_polls.load(Ordering::Relaxed),
        longest_idle_poll_ns: shared.longest_idle_poll_ns.load(Ordering::Relaxed),
        oldest_poll_seen_ns: oldest_seen.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        reconnects: shared.reconnects.load(Ordering::Relaxed),
        refusals: shared
            .refusals
            .lock()
            .map(|r| r.iter().map(|(&status, &n)| (status, n)).collect())
            .unwrap_or_default(),
        errors_by_replica: shared
            .errors_by_replica
            .lock()
            .map(|r| r.iter().map(|(&replica, &n)| (replica, n)).collect())
            .unwrap_or_default(),
        peak_rss_kib: proc_sample(std::process::id()).map_or(0, |s| s.hwm_kib),
    };
    let replicas: Arc<[SocketAddr]> = Arc::from(args.replicas.as_slice());
    runtime.block_on(async {
        let gate = Arc::new(Semaphore::new(args.connect_concurrency.clamp(1, 4096)));
        let mut fleet = tokio::task::JoinSet::new();
        for local in 0..args.count {
            let index = args.first + local;
            let cluster = index / per_cluster;
            let token = tokens
                .get(cluster)
                .with_context(|| format!("no token for cluster {cluster}"))?
                .clone();
            let octet = usize::from(args.source_base) + local / AGENTS_PER_SOURCE_IP;
            let agent = Agent {
                index: local,
                machine: MachineRef::new("default", machine_name(cluster, index)),
                token,
                source: IpAddr::V4(Ipv4Addr::new(127, 0, 0, u8::try_from(octet)?)),
            };
            let route = agents::Route {
                replicas: replicas.clone(),
                home: index % replicas.len(),
            };
            fleet.spawn(agents::run(
                agent,
                route,
                tls.clone(),
                gate.clone(),
                args.wait_seconds,
                shared.clone(),
                agents::Pace::instant(),
            ));
        }
        let mut told_plan = vec![false; args.count];
        let mut told_step = vec![false; args.count];
        let mut told_served = vec![0u64; args.count];
        let mut ticker = tokio::time::interval(REPORT_INTERVAL);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = shared.stop.cancelled() => break,
            }
            oldest_seen.fetch_max(shared.oldest_poll().as_nanos() as u64, Ordering::Relaxed);
            for local in 0..args.count {
                let index = args.first + local;
                let plan = shared.plan_received[local].load(Ordering::Acquire);
                if plan != 0 && !told_plan[local] {
                    told_plan[local] = true;
                    emit(&Event::Plan {
                        agent: index,
                        at_unix_ns: at_unix_ns(plan),
                    })?;
                }
                let served = shared.served_again[local].load(Ordering::Acquire);
                if served != told_served[local] {
                    told_served[local] = served;
                    emit(&Event::Served {
                        agent: index,
                        replica: shared.served_by[local].load(Ordering::Relaxed),
                        at_unix_ns: at_unix_ns(served),
                    })?;
                }
                let step = shared.step_started[local].load(Ordering::Acquire);
                if step != 0 && !told_step[local] {
                    told_step[local] = true;
                    emit(&Event::Step {
                        agent: index,
                        at_unix_ns: at_unix_ns(step),
                    })?;
                }
            }
            emit(&Event::Progress(counters(&shared)))?;
        }
        fleet.abort_all();
        while fleet.join_next().await.is_some() {}
        anyhow::Ok(())
    })?;
    emit(&Event::Final(counters(&shared)))?;
    Ok(())
}

/// What the parent knows of one child, updated by the thread reading its stdout.
#[derive(Default)]
pub struct SwarmView {
    pub latest: Counters,
    /// `(fleet-wide agent index, wall-clock ns)` of each plan received.
    pub plans: Vec<(usize, u64)>,
    /// The same for each first step started.
    pub steps: Vec<(usize, u64)>,
    /// `(fleet-wide agent index, replica, wall-clock ns)` of each new connection answered after a failure.
    pub served: Vec<(usize, usize, u64)>,
    pub last: Option<Counters>,
    /// Lines that were not an [`Event`] (kept for the error message).
    pub other: Vec<String>,
}

/// A running child, killed when dropped (also on error paths).
pub struct SwarmChild {
    child: Child,
    stdin: Option<ChildStdin>,
    pub view: Arc<Mutex<SwarmView>>,
    pub log: PathBuf,
    pub count: usize,
}

/// Where one child's slice of the fleet is and what it connects to.
pub struct SwarmSpec<'a> {
    pub ca: &'a Path,
    pub tokens: &'a Path,
    pub replicas: &'a [SocketAddr],
    pub first: usize,
    pub count: usize,
    pub agents_per_cluster: usize,
    pub wait_seconds: u32,
    pub connect_concurrency: usize,
    pub no_alpn: bool,
    /// Which child this is (sets its source addresses).
    pub child: usize,
}

impl SwarmChild {
    /// Starts `load agent-swarm` for `spec`, its stderr in `dir/swarm-<child>.log`.
    pub fn start(spec: &SwarmSpec<'_>, dir: &Path) -> anyhow::Result<SwarmChild> {
        let source_base = 2 + spec.child * SOURCE_IPS_PER_CHILD;
        anyhow::ensure!(
            source_base + SOURCE_IPS_PER_CHILD <= 255,
            "too many children for 127.0.0.0/24"
        );
        let log = dir.join(format!("swarm-{}.log", spec.child));
        let replicas: Vec<String> = spec.replicas.iter().map(ToString::to_string).collect();
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("agent-swarm")
            .arg("--ca")
            .arg(spec.ca)
            .arg("--tokens")
            .arg(spec.tokens)
            .arg("--replicas")
            .arg(replicas.join(","))
            .args(["--first", &spec.first.to_string()])
            .args(["--count", &spec.count.to_string()])
            .args(["--agents-per-cluster", &spec.agents_per_cluster.to_string()])
            .args(["--wait-seconds", &spec.wait_seconds.to_string()])
            .args([
                "--connect-concurrency",
                &spec.connect_concurrency.to_string(),
            ])
            .args(["--source-base", &source_base.to_string()]);
        if spec.no_alpn {
            command.arg("--no-alpn");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("spawning an agent-swarm child")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("child stdout")?;
        let view = Arc::new(Mutex::new(SwarmView::default()));
        let writer = view.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(mut view) = writer.lock() else { break };
                match serde_json::from_str::<Event>(&line) {
                    Ok(Event::Progress(counters)) => view.latest = counters,
                    Ok(Event::Plan { agent, at_unix_ns }) => view.plans.push((agent, at_unix_ns)),
                    Ok(Event::Step { agent, at_unix_ns }) => view.steps.push((agent, at_unix_ns)),
                    Ok(Event::Served {
                        agent,
                        replica,
                        at_unix_ns,
                    }) => view.served.push((agent, replica, at_unix_ns)),
                    Ok(Event::Final(counters)) => {
                        view.latest = counters.clone();
                        view.last = Some(counters);
                    }
                    Err(_) => view.other.push(line),
                }
            }
        });
        Ok(SwarmChild {
            child,
            stdin,
            view,
            log,
            count: spec.count,
        })
    }

    /// Counters as last reported.
    pub fn latest(&self) -> Counters {
        self.view
            .lock()
            .map(|v| v.latest.clone())
            .unwrap_or_default()
    }

    /// Fails when the child has exited before being told to stop.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            anyhow::bail!("an agent-swarm child exited early ({status}); its stderr:\n{log}");
        }
        Ok(())
    }

    /// Tells the child to stop and waits (within [`CHILD_STOP_TIMEOUT`]) for its final counters.
    pub fn stop(&mut self) -> anyhow::Result<Counters> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let started = Instant::now();
        loop {
            let last = self.view.lock().ok().and_then(|v| v.last.clone());
            if let Some(last) = last {
                let _ = self.child.wait();
                return Ok(last);
            }
            if started.elapsed() > CHILD_STOP_TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                anyhow::bail!(
                    "an agent-swarm child sent no final report within {CHILD_STOP_TIMEOUT:?}"
                );
            }
            std::thread::sleep(REPORT_INTERVAL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SwarmChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
