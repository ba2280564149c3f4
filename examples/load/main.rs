//! Load harness for the updater: hook throughput against a bare axum + rustls ceiling (`hooks`), a fleet of
//! long-polling agents with CAPI-style UpdateMachine calls (`fleet`), issue 4's 1 000-agent dispatch
//! benchmark (`dispatch`), a fleet spread over several replicas on one real etcd (`replicas`), and one real
//! `inplace-agent` idle (`agent-footprint`, issue 32). Everything runs on loopback, every loop is bounded in
//! count and time, and each scenario prints a Markdown table with figures and the ratios measured in the same
//! run.
//!
//! `cargo build --release && cargo run --release --example load -- <hooks|fleet|dispatch|replicas|agent-footprint> [options]`

mod agents;
mod capi;
mod ceiling;
mod drain_footprint;
mod fleet;
mod footprint;
mod hooks;
mod net;
mod payloads;
mod process;
mod replicas;
mod stats;
mod store_writes;
mod swarm;

use clap::{Parser, Subcommand};

/// The binary's allocator, so the in-process server of `hooks` runs as `inplace-updater serve` does.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Open files the harness asks for: 30 000 agent connections on the client side (the server process inherits
/// the limit and holds as many), plus the server's own files, with room to spare.
const WANTED_OPEN_FILES: u64 = 80_000;

#[derive(Parser)]
#[command(about = "Load scenarios for inplace-updater (loopback only, bounded, self-stopping)")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Hook throughput over TLS with keep-alive, next to a bare axum + rustls ceiling.
    Hooks(hooks::HooksArgs),
    /// Long-polling agents held by the real server binary while UpdateMachine creates work for some of them.
    Fleet(fleet::FleetArgs),
    /// Issue 4's benchmark: 1 000 agents connected, work for each of them, time until each has its plan.
    Dispatch(fleet::DispatchArgs),
    /// Issue 18's scale-out: one real etcd, several server replicas on it, agents spread over them and held by
    /// child processes, UpdateMachine sent to another replica than the agent's.
    Replicas(replicas::ReplicasArgs),
    /// Issue 32: one real `inplace-agent` long-polling the real server with no work; its idle RSS, threads
    /// and CPU per idle hour.
    AgentFootprint(footprint::FootprintArgs),
    /// Issue 32: one real `inplace-agent` draining a sandboxed node of 110 pods (the fake Kubernetes API) during
    /// an in-place minor upgrade; its RSS.
    AgentDrain(drain_footprint::DrainArgs),
    /// (Used by `replicas`.) A slice of the fleet's agents held in a child process, reporting on stdout.
    #[command(hide = true)]
    AgentSwarm(swarm::SwarmArgs),
    /// (Used by `fleet --compare-ceiling`.) The bare axum + rustls ceiling as a process of its own.
    #[command(hide = true)]
    CeilingServe {
        #[arg(long)]
        tls_cert: std::path::PathBuf,
        #[arg(long)]
        tls_key: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let limit = raise_open_files(WANTED_OPEN_FILES);
    // A swarm child's stdout is its report to the parent: nothing else goes there.
    if !matches!(cli.scenario, Scenario::AgentSwarm(_)) {
        println!(
            "open-file limit: {limit} (asked for {WANTED_OPEN_FILES}; the server process inherits it)"
        );
    }
    match cli.scenario {
        Scenario::Hooks(args) => hooks::run(&args),
        Scenario::Fleet(args) => fleet::run_fleet(&args),
        Scenario::Dispatch(args) => fleet::run_dispatch(&args),
        Scenario::Replicas(args) => replicas::run(&args),
        Scenario::AgentFootprint(args) => footprint::run(&args),
        Scenario::AgentDrain(args) => drain_footprint::run(&args),
        Scenario::AgentSwarm(args) => swarm::serve(&args),
        Scenario::CeilingServe { tls_cert, tls_key } => ceiling::serve_process(&tls_cert, &tls_key),
    }
}

/// Raises RLIMIT_NOFILE towards `wanted` (soft and hard when we may, else soft up to hard); returns the soft
/// limit in force afterwards.
fn raise_open_files(wanted: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let current = getrlimit(Resource::Nofile);
    let soft = current.current.unwrap_or(u64::MAX);
    if soft >= wanted {
        return soft;
    }
    let raised = Rlimit {
        current: Some(wanted),
        maximum: Some(current.maximum.map_or(wanted, |hard| hard.max(wanted))),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return wanted;
    }
    // Not privileged: the soft limit can still go up to the hard one.
    let hard = current.maximum.unwrap_or(wanted).min(wanted);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: current.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(hard)
}
