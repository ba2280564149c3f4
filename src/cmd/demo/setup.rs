//! What every demo rollout starts from: this binary started as one server (with its certificates and an agent
//! token) and N agents on sandboxed roots, each node with its Kubernetes API (the drain's fake) and workloads;
//! and what every rollout uses: the built-in requests renamed per Machine, a CanUpdate question asked as CAPI
//! asks it, and each node's summary line.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inplace_drain::fake::{FakeApiServer, FakePdb, FakePod, PdbBlock};
use serde_json::{Value, json};

use super::Sandbox;
use super::agents::AgentLaunch;
use super::scenario::Scenario;
use crate::api::Hook;
use crate::cmd::certs::{DevCertsSpec, write_dev_certs};
use crate::dispatch::AgentScope;
use crate::dispatch::upkeep::tokens::create_token;

/// Longest the demo waits for the server to start.
pub const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long each fake package install or kubeadm upgrade takes in the demo, so progress can be watched.
pub const DEMO_PACE_SECONDS: &str = "0.4";
/// Eviction attempts the demo's PodDisruptionBudget `default/web` refuses (429) on each node before it allows
/// one, so the drain's wait on a budget shows in the UpdateMachine message.
pub const DEMO_PDB_REFUSALS: u32 = 4;
/// Control-plane Machines in the demo cluster (the rest are workers).
pub const CONTROL_PLANE_MACHINES: usize = 3;

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Setting up files or processes failed.
    #[error("{0}")]
    Setup(String),
    /// A Machine did not finish.
    #[error("{0}")]
    Rollout(String),
}

pub(super) fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> DemoError + '_ {
    move |err| DemoError::Setup(format!("{what}: {err}"))
}

/// The child processes, killed when dropped.
pub(super) struct Children(pub(super) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where the server listens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Addresses {
    /// The hooks and agents (TLS).
    pub(super) hooks: SocketAddr,
    /// Health and `/status` (plain HTTP).
    pub(super) health: SocketAddr,
}

/// One demo node: its Machine's name, whether it is a control-plane Machine, its sandbox.
pub(super) struct Node {
    pub(super) name: String,
    pub(super) control_plane: bool,
    pub(super) sandbox: Sandbox,
}

/// A started demo: the server, the agents (`children.0[i + 1]` is node `i`'s), and how to reach them.
pub(super) struct Demo {
    pub(super) addr: Addresses,
    pub(super) ca: Vec<u8>,
    pub(super) launch: AgentLaunch,
    pub(super) children: Children,
    pub(super) nodes: Vec<Node>,
}

/// What the demo starts.
pub(super) struct Start<'a> {
    /// How many Machines.
    pub(super) machines: usize,
    /// The directory of the store, logs and sandboxes.
    pub(super) dir: &'a Path,
    /// The Machine (1-based) whose update fails.
    pub(super) fail: Option<usize>,
    /// What is rolled out.
    pub(super) scenario: &'a Scenario,
    /// Every Machine a worker (the first [`CONTROL_PLANE_MACHINES`] are control plane otherwise).
    pub(super) workers_only: bool,
    /// Flags added to `serve`.
    pub(super) serve_flags: Vec<String>,
}

/// Starts the server and one agent per Machine, printing where they are.
pub(super) fn start(start: &Start) -> Result<Demo, DemoError> {
    let dir = start.dir;
    let exe: PathBuf = std::env::current_exe().map_err(setup("locating this binary"))?;
    let certs_dir = dir.join("certs");
    write_dev_certs(&DevCertsSpec::with_defaults(
        certs_dir.clone(),
        vec![],
        vec![],
    ))
    .map_err(setup("certificates"))?;
    let ca = inplace_bounded_read::read(
        &certs_dir.join("ca.crt"),
        crate::server::tls::MAX_PEM_FILE_BYTES,
    )
    .map_err(setup("reading the CA"))?;
    let token = create_token(
        &AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        },
        None,
    )
    .map_err(setup("token"))?;
    let tokens = dir.join("agent-tokens");
    std::fs::write(&tokens, format!("{}\n", token.line)).map_err(setup("token file"))?;
    let token_file = dir.join("agent-token");
    std::fs::write(&token_file, &token.token).map_err(setup("token file"))?;

    let (server, addr) = start_server(&exe, dir, &tokens, &start.serve_flags)?;
    let mut children = Children(vec![server]);
    let launch = AgentLaunch {
        exe: exe.clone(),
        server: format!("https://{}", addr.hooks),
        ca_file: certs_dir.join("ca.crt"),
        token_file: token_file.clone(),
    };
    println!(
        "server   https://{}  (store, logs and sandboxes in {})",
        addr.hooks,
        dir.display()
    );
    let mut nodes = Vec::new();
    for i in 0..start.machines {
        let control_plane = !start.workers_only && i < CONTROL_PLANE_MACHINES;
        let name = if control_plane {
            format!("edge-01-control-plane-{i}")
        } else {
            format!("edge-01-md-0-worker-{i}")
        };
        let node_dir = dir.join("nodes").join(&name);
        let sandbox =
            Sandbox::create(&node_dir, "v1.33.4", control_plane).map_err(setup("sandbox"))?;
        sandbox
            .set_pace(DEMO_PACE_SECONDS)
            .map_err(setup("sandbox"))?;
        if start.fail == Some(i + 1) {
            match start.scenario {
                Scenario::Upgrade => sandbox.fail_kubelet_restart(true),
                // The node comes back on its previous image, as an A/B boot falls back.
                Scenario::OsImage(_) => sandbox.fall_back_next_boot(true),
            }
            .map_err(setup("sandbox"))?;
        }
        add_workloads(&sandbox.kube, i, PdbBlock::Attempts(DEMO_PDB_REFUSALS));
        let child = launch.spawn(&name, &sandbox, &node_dir)?;
        children.0.push(child);
        println!("agent    default/{name}  (root {})", sandbox.root.display());
        nodes.push(Node {
            name,
            control_plane,
            sandbox,
        });
    }
    Ok(Demo {
        addr,
        ca,
        launch,
        children,
        nodes,
    })
}

/// One line of the summary.
#[derive(Debug, Clone)]
pub struct MachineResult {
    /// The Machine.
    pub name: String,
    /// `done`, [`ROLLED_BACK`], [`NOT_STARTED`] or the failure.
    pub result: String,
    /// Time from the first UpdateMachine call to done.
    pub took: Duration,
    /// The kubeadm commands the node ran.
    pub kubeadm: Vec<String>,
    /// What the node's API saw: `spec.unschedulable` patches and evictions answered.
    pub node: String,
    /// The OS image the node booted last, and how many times it was asked to reboot.
    pub os: (String, usize),
}

/// The built-in `template` request with every object named `name` (and its provider id to match).
pub(super) fn request_for(template: &str, name: &str) -> Result<Value, DemoError> {
    let mut request: Value = serde_json::from_str(template).map_err(setup("built-in request"))?;
    for side in ["current", "desired"] {
        for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
            if request[side][object].is_object() {
                request[side][object]["metadata"]["name"] = json!(name);
            }
        }
    }
    if request["desired"]["machine"]["spec"].is_object() {
        request["desired"]["machine"]["spec"]["providerID"] = json!(format!("docker:////{name}"));
    }
    Ok(request)
}

/// Asks a CanUpdate hook as CAPI does before an in-place update, and prints the answer.
pub(super) async fn ask(
    addr: SocketAddr,
    ca: &[u8],
    hook: Hook,
    request: &Value,
    started: Instant,
    what: &str,
) -> Result<(), DemoError> {
    let path = format!("{}?timeout=10s", hook.path());
    let (status, body) = crate::cmd::http::post_tls(
        addr,
        "localhost",
        ca,
        &path,
        request.to_string().into_bytes(),
    )
    .await
    .map_err(|e| DemoError::Rollout(format!("{} for {what}: {e}", hook.name())))?;
    let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
    let message = answer["message"].as_str().unwrap_or_default();
    println!(
        "[{:6.1}s] {what}: {} {message}",
        started.elapsed().as_secs_f64(),
        hook.name()
    );
    if status != 200 || answer["status"] != "Success" {
        return Err(DemoError::Rollout(format!(
            "{} for {what} answered {status}: {message}",
            hook.name()
        )));
    }
    Ok(())
}

fn start_server(
    exe: &Path,
    dir: &Path,
    tokens: &Path,
    extra: &[String],
) -> Result<(Child, Addresses), DemoError> {
    let certs = dir.join("certs");
    let mut child = Command::new(exe)
        .args([
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--health-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--retry-after-seconds",
            "1",
        ])
        .arg("--tls-cert")
        .arg(certs.join("tls.crt"))
        .arg("--tls-key")
        .arg(certs.join("tls.key"))
        .arg("--agent-tokens")
        .arg(tokens)
        .arg("--store")
        .arg(format!("file:{}", dir.join("data").display()))
        .args(extra)
        .env("RUST_LOG", "warn,inplace_updater=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(setup("starting the server"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| DemoError::Setup("no server stderr".into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let log = dir.join("server.log");
    std::thread::spawn(move || {
        let mut file = std::fs::File::create(log).ok();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(json) = serde_json::from_str::<Value>(&line) {
                if json["fields"]["message"] == "ready" {
                    let _ = tx.send(None);
                }
                let field = |name: &str| json["fields"][name].as_str()?.parse().ok();
                if let (Some(hooks), Some(health)) = (field("hooks"), field("health")) {
                    let _ = tx.send(Some(Addresses { hooks, health }));
                }
            }
            if let Some(file) = file.as_mut() {
                let _ = std::io::Write::write_all(file, format!("{line}\n").as_bytes());
            }
        }
    });
    let deadline = Instant::now() + START_DEADLINE;
    let mut addr = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(found)) => addr = Some(found),
            Ok(None) => break,
            Err(_) => {
                return Err(DemoError::Setup(format!(
                    "the server did not start; see {}",
                    dir.join("server.log").display()
                )));
            }
        }
    }
    let addr = addr.ok_or_else(|| DemoError::Setup("the server reported no address".into()))?;
    Ok((child, addr))
}

/// What runs on a demo (or end-to-end test) node: a kube-proxy DaemonSet pod (a drain leaves it), a web pod of a
/// ReplicaSet under the budget `default/web` (refusing evictions as `block` says), and a pod already finished
/// (needs no eviction). `i` tells the nodes' pods apart.
pub fn add_workloads(kube: &FakeApiServer, i: usize, block: PdbBlock) {
    kube.add_pod(FakePod::new("kube-system", format!("kube-proxy-{i}")).owner(Some("DaemonSet")));
    kube.add_pod(
        FakePod::new("default", format!("web-{i}"))
            .owner(Some("ReplicaSet"))
            .label("app", "web"),
    );
    kube.add_pod(
        FakePod::new("default", format!("backup-job-{i}"))
            .owner(Some("Job"))
            .phase("Succeeded"),
    );
    kube.add_pdb(FakePdb {
        namespace: "default".into(),
        name: "web".into(),
        match_labels: [("app".to_owned(), "web".to_owned())].into(),
        block,
    });
}

/// `cordon, uncordon; evicted default/web-0 (4 refused by a budget)`: the node's API calls as the fake saw them.
pub(super) fn node_report(sandbox: &Sandbox) -> String {
    let patches: Vec<&str> = sandbox
        .kube
        .unschedulable_patches()
        .iter()
        .map(|p| {
            if *p == Some(true) {
                "cordon"
            } else {
                "uncordon"
            }
        })
        .collect();
    let evictions = sandbox.kube.evictions();
    let refused = evictions.iter().filter(|e| e.status == 429).count();
    let evicted: Vec<String> = evictions
        .iter()
        .filter(|e| (200..300).contains(&e.status))
        .map(|e| e.pod.clone())
        .collect();
    format!(
        "kubelet {}; OS {} ({} reboot{}); {}; evicted {} ({refused} refused by a budget)",
        sandbox.kubelet_version(),
        sandbox.os_image(),
        sandbox.reboots(),
        if sandbox.reboots() == 1 { "" } else { "s" },
        if patches.is_empty() {
            "never cordoned".to_owned()
        } else {
            patches.join(", ")
        },
        if evicted.is_empty() {
            "nothing".to_owned()
        } else {
            evicted.join(", ")
        }
    )
}
