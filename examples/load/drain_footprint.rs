//! Scenario `agent-drain`: what the agent costs a node while it drains it. The real server binary and one real
//! `inplace-agent` on a sandboxed worker node (the demo's sandbox: fake package tools under its root, the node's
//! Kubernetes API the TLS fake of `inplace_drain::fake`) holding `--pods` evictable pods; a CAPI-faithful
//! caller upgrades the Machine from v1.33.4 to v1.34.1 (a minor change: the drain cannot be turned off) and
//! calls UpdateMachine until Done, while the agent's RSS is read from /proc. Prints one Markdown table next to
//! issue 32's target. The fake API answers as the API documents; it is not Kubernetes (a real API server's
//! pod objects are larger, so the figure is a floor for the list the agent holds).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_drain::fake::FakePod;
use inplace_updater::api::Hook;
use inplace_updater::cmd::demo::Sandbox;
use serde_json::{Value, json};

use crate::footprint::{AgentProcess, SAMPLE_INTERVAL, binaries, serve_one_agent, wait_connected};
use crate::stats::{Table, proc_sample};

/// Pods on the node by default: the kubelet's default `maxPods`.
pub const DEFAULT_DRAIN_PODS: usize = 110;
/// Issue 32's target for the agent's RSS during the drain of a node with 110 pods.
pub const TARGET_DRAIN_RSS_MIB: f64 = 32.0;
/// Longest the whole update (drain, fake package steps, wait for Ready, uncordon) may take.
pub const UPDATE_DEADLINE: Duration = Duration::from_secs(300);
/// Pause between UpdateMachine calls (CAPI itself honours `retryAfterSeconds`; this only paces the loop).
pub const CALL_INTERVAL: Duration = Duration::from_millis(200);
/// The worker Machine (its name is also its Node's).
const NODE: &str = "edge-01-md-0-drain-0";

const WORKER_REQUEST: &str = include_str!("../../tests/fixtures/update-machine-worker.json");
const WORKER_QUESTION: &str = include_str!("../../tests/fixtures/can-update-machineset-md.json");

#[derive(clap::Args)]
pub struct DrainArgs {
    /// The `inplace-updater` binary serving the agent API [default: target/release/inplace-updater].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// The agent binary [default: inplace-agent beside the server binary]; an `inplace-updater` measures its
    /// `agent` subcommand.
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// Evictable pods on the node (each owned by a ReplicaSet, no budget).
    #[arg(long, default_value_t = DEFAULT_DRAIN_PODS)]
    pods: usize,
}

/// The worker fixture's UpdateMachine, for Machine `default/<NODE>`.
fn update_request() -> anyhow::Result<Value> {
    let mut request: Value = serde_json::from_str(WORKER_REQUEST)?;
    for side in ["current", "desired"] {
        for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
            if request[side][object].is_object() {
                request[side][object]["metadata"]["name"] = json!(NODE);
            }
        }
    }
    request["desired"]["machine"]["spec"]["providerID"] = json!(format!("docker:////{NODE}"));
    Ok(request)
}

pub fn run(args: &DrainArgs) -> anyhow::Result<()> {
    let (server_bin, agent_bin) = binaries(args.server_bin.as_ref(), args.agent_bin.as_ref())?;
    let dir = tempfile::tempdir()?;
    let (certs, mut server) = serve_one_agent(&server_bin, dir.path(), &format!("default/{NODE}"))?;

    let sandbox = Sandbox::create(&dir.path().join("nodes").join(NODE), "v1.33.4", false)?;
    for i in 0..args.pods {
        sandbox
            .kube
            .add_pod(FakePod::new("default", format!("app-{i:03}")).owner(Some("ReplicaSet")));
    }
    let log = dir.path().join("agent.log");
    let child = Command::new(&agent_bin)
        .args(["agent", "--log-format", "json", "--server"])
        .arg(format!("https://{}", server.hooks))
        .args(["--tls-server-name", "localhost", "--ca-file"])
        .arg(&certs.ca_cert)
        .arg("--token-file")
        .arg(dir.path().join("token"))
        .args(["--machine", &format!("default/{NODE}"), "--config"])
        .arg(&sandbox.config)
        .arg("--state-dir")
        .arg(&sandbox.state_dir)
        .arg("--root")
        .arg(&sandbox.root)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("spawning {}", agent_bin.display()))?;
    let agent = AgentProcess { child, log };
    wait_connected(&server, &agent)?;
    let pid = agent.child.id();
    let before = proc_sample(pid)?;

    // The agent's RSS, read on a thread of its own through the whole update.
    let stop = Arc::new(AtomicBool::new(false));
    let peak_kib = Arc::new(AtomicU64::new(before.rss_kib));
    let sampler = {
        let (stop, peak_kib) = (stop.clone(), peak_kib.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(sample) = proc_sample(pid) {
                    peak_kib.fetch_max(sample.rss_kib, Ordering::Relaxed);
                }
                std::thread::sleep(SAMPLE_INTERVAL / 5);
            }
        })
    };
    let ca = std::fs::read(&certs.ca_cert)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let outcome = runtime.block_on(update(server.hooks, &ca));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let after = proc_sample(pid)?;
    if let Err(err) = outcome {
        let text = std::fs::read_to_string(&agent.log).unwrap_or_default();
        bail!("{err}; the agent's log:\n{text}");
    }
    let evicted = sandbox
        .kube
        .evictions()
        .iter()
        .filter(|e| (200..300).contains(&e.status))
        .count();
    let peak = peak_kib.load(Ordering::Relaxed) as f64 / 1024.0;
    println!(
        "agent {} draining a node of {} pods (fake API), update v1.33.4 → v1.34.1 done in {:.1} s",
        agent_bin.display(),
        args.pods,
        took.as_secs_f64()
    );
    let mut table = Table::new(&["agent during the drain", "value", "target"]);
    table.row(vec![
        "pods evicted".into(),
        evicted.to_string(),
        String::new(),
    ]);
    table.row(vec![
        "RSS before the update, idle (MiB)".into(),
        format!("{:.1}", before.rss_mib()),
        String::new(),
    ]);
    table.row(vec![
        format!(
            "RSS peak during the update, sampled every {} ms (MiB)",
            (SAMPLE_INTERVAL / 5).as_millis()
        ),
        format!("{peak:.1}"),
        format!("≤ {TARGET_DRAIN_RSS_MIB}"),
    ]);
    table.row(vec![
        "RSS high-water mark since start, VmHWM (MiB)".into(),
        format!("{:.1}", after.hwm_mib()),
        format!("≤ {TARGET_DRAIN_RSS_MIB}"),
    ]);
    table.row(vec![
        "RSS after the update (MiB)".into(),
        format!("{:.1}", after.rss_mib()),
        String::new(),
    ]);
    table.print();
    if evicted != args.pods {
        bail!("{evicted} of {} pods evicted", args.pods);
    }
    let kubelet = sandbox.kubelet_version();
    if kubelet != "v1.34.1" {
        bail!("the update answered Done but the node's kubelet is {kubelet}");
    }
    drop(agent);
    server.stop();
    Ok(())
}

/// CanUpdateMachineSet for the workers' new MachineSet, then UpdateMachine until Done, as CAPI calls them.
async fn update(addr: std::net::SocketAddr, ca: &[u8]) -> anyhow::Result<()> {
    let post = move |hook: Hook, body: Vec<u8>| async move {
        let path = format!("{}?timeout=10s", hook.path());
        let (status, body) =
            inplace_updater::cmd::http::post_tls(addr, "localhost", ca, &path, body)
                .await
                .map_err(|err| anyhow::anyhow!("{}: {err}", hook.name()))?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
        if status != 200 || answer["status"] != "Success" {
            bail!("{} answered {status}: {}", hook.name(), answer["message"]);
        }
        anyhow::Ok(answer)
    };
    post(
        Hook::CanUpdateMachineSet,
        WORKER_QUESTION.as_bytes().to_vec(),
    )
    .await?;
    let request = serde_json::to_vec(&update_request()?)?;
    let started = Instant::now();
    loop {
        let answer = post(Hook::UpdateMachine, request.clone()).await?;
        if answer["retryAfterSeconds"].as_u64().unwrap_or(0) == 0 {
            return Ok(());
        }
        if started.elapsed() > UPDATE_DEADLINE {
            bail!("not done within {UPDATE_DEADLINE:?}: {}", answer["message"]);
        }
        tokio::time::sleep(CALL_INTERVAL).await;
    }
}
