//! A server process plus agent processes on sandboxed roots, and a CAPI-faithful caller: everything the
//! end-to-end tests need to run a rollout for real.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use inplace_updater::api::Hook;
use inplace_updater::cmd::demo::Sandbox;
use serde_json::{Value, json};

use super::{AGENT_BIN_VAR, Client, ServerProcess, WAIT, binary, chosen_binary};

/// One agent process.
pub struct AgentProcess {
    pub name: String,
    pub sandbox: Sandbox,
    child: Option<Child>,
    args: Vec<String>,
    log: PathBuf,
}

impl AgentProcess {
    pub fn start(
        server: &ServerProcess,
        ca: &Path,
        token: &Path,
        name: &str,
        sandbox: Sandbox,
    ) -> Self {
        Self::start_with(server, ca, token, name, sandbox, &[])
    }

    /// [`AgentProcess::start`] with `extra` agent arguments.
    pub fn start_with(
        server: &ServerProcess,
        ca: &Path,
        token: &Path,
        name: &str,
        sandbox: Sandbox,
        extra: &[&str],
    ) -> Self {
        let url = format!("https://127.0.0.1:{}", server.hooks.port());
        Self::start_at(&url, ca, token, name, sandbox, extra)
    }

    /// [`AgentProcess::start_with`] against the agent API at `url` (another server than a [`ServerProcess`]).
    pub fn start_at(
        url: &str,
        ca: &Path,
        token: &Path,
        name: &str,
        sandbox: Sandbox,
        extra: &[&str],
    ) -> Self {
        let mut args = vec![
            "agent".to_string(),
            "--server".into(),
            url.to_string(),
            "--ca-file".into(),
            ca.display().to_string(),
            "--token-file".into(),
            token.display().to_string(),
            "--machine".into(),
            format!("default/{name}"),
            "--config".into(),
            sandbox.config.display().to_string(),
            "--state-dir".into(),
            sandbox.state_dir.display().to_string(),
            "--root".into(),
            sandbox.root.display().to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let log = sandbox
            .root
            .parent()
            .expect("sandbox dir")
            .join("agent.log");
        let mut agent = Self {
            name: name.to_string(),
            sandbox,
            child: None,
            args,
            log,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        // `inplace-agent` takes the flags of `inplace-updater agent` without the subcommand.
        let (program, args) = match chosen_binary(AGENT_BIN_VAR) {
            Some(agent) => (agent, &self.args[1..]),
            None => (binary(), &self.args[..]),
        };
        let child = Command::new(program)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("AGENT_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn agent");
        self.child = Some(child);
    }

    /// SIGKILL, as a crash or a power cut would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, as systemd stops the unit, and waits for the agent to exit.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let status = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CAPI's side: posts hook requests and reads answers the way CAPI's Go code does.
pub struct Capi {
    pub client: Client,
    pub addr: std::net::SocketAddr,
}

impl Capi {
    pub async fn can_update_machine(&self, request: &Value) -> capi_sim::CapiDecision {
        let reply = self
            .client
            .post(
                self.addr,
                Hook::CanUpdateMachine.path(),
                request.to_string(),
            )
            .await;
        capi_sim::can_update_machine_with(
            request,
            capi_sim::HookAnswer::Http {
                status: reply.status,
                body: &reply.body,
            },
            capi_sim::FailurePolicy::Fail,
        )
    }

    pub async fn can_update_machine_set(&self, request: &Value) -> capi_sim::CapiDecision {
        let reply = self
            .client
            .post(
                self.addr,
                Hook::CanUpdateMachineSet.path(),
                request.to_string(),
            )
            .await;
        capi_sim::can_update_machine_set_with(
            request,
            capi_sim::HookAnswer::Http {
                status: reply.status,
                body: &reply.body,
            },
            capi_sim::FailurePolicy::Fail,
        )
    }

    /// What KubeadmControlPlane does before it triggers an in-place update of Machine `name`: asks
    /// CanUpdateMachine (the version fixture, renamed) and expects CAPI to decide "in place".
    pub async fn kcp_judges(&self, name: &str) {
        let request = can_update_request("can-update-machine-kcp-version.json", name);
        assert_eq!(
            self.can_update_machine(&request).await,
            capi_sim::CapiDecision::InPlace,
            "{name}"
        );
    }

    /// What KubeadmControlPlane asks before it sends `update` (an UpdateMachine request): CanUpdateMachine
    /// for the same desired objects ([`can_update_before`]); CAPI must decide "in place".
    pub async fn judges(&self, update: &Value) {
        let request = can_update_before(update, "v1.33.4");
        assert_eq!(
            self.can_update_machine(&request).await,
            capi_sim::CapiDecision::InPlace,
            "{}",
            update["desired"]["machine"]["metadata"]["name"]
        );
    }

    pub async fn update_machine(&self, request: &Value) -> UpdateOutcome {
        let path = format!("{}?timeout=10s", Hook::UpdateMachine.path());
        let reply = self
            .client
            .post(self.addr, &path, request.to_string())
            .await;
        capi_sim::update_machine_with(
            capi_sim::HookAnswer::Http {
                status: reply.status,
                body: &reply.body,
            },
            capi_sim::FailurePolicy::Fail,
        )
    }

    /// Calls UpdateMachine until it is done or failed (as the Machine controller does, but without honouring
    /// the full retryAfterSeconds, so the test is quick). Returns the final outcome and every progress message.
    pub async fn update_until_settled(
        &self,
        request: &Value,
        limit: Duration,
    ) -> (UpdateOutcome, Vec<String>) {
        let started = Instant::now();
        let mut messages: Vec<String> = Vec::new();
        loop {
            let outcome = self.update_machine(request).await;
            match &outcome {
                UpdateOutcome::InProgress {
                    message,
                    retry_after_seconds,
                } => {
                    assert!(
                        *retry_after_seconds > 0 && *retry_after_seconds <= 15,
                        "retry {retry_after_seconds}"
                    );
                    if messages.last() != Some(message) {
                        messages.push(message.clone());
                    }
                }
                _ => return (outcome, messages),
            }
            assert!(
                started.elapsed() < limit,
                "update not settled after {limit:?}; messages: {messages:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// KubeadmControlPlane's question for another Machine: a CanUpdateMachine request from a fixture, every
/// object of both sides renamed (CAPI sends each control-plane Machine's own objects).
pub fn can_update_request(fixture: &str, name: &str) -> Value {
    let mut request: Value = serde_json::from_slice(&super::fixture(fixture)).expect("fixture");
    for side in ["current", "desired"] {
        for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
            if request[side][object].is_object() {
                request[side][object]["metadata"]["name"] = json!(name);
            }
        }
    }
    request
}

/// The CanUpdateMachine request whose desired side is exactly `update`'s (an UpdateMachine request) and whose
/// current side holds the same objects with the Machine on Kubernetes `from`: the question whose `Success`
/// licenses that UpdateMachine.
pub fn can_update_before(update: &Value, from: &str) -> Value {
    let mut request: Value =
        serde_json::from_slice(&super::fixture("can-update-machine-kcp-version.json"))
            .expect("fixture");
    request["desired"] = update["desired"].clone();
    request["current"] = update["desired"].clone();
    request["current"]["machine"]["spec"]["version"] = json!(from);
    request
}

/// An UpdateMachine request for another Machine, from a fixture.
pub fn update_request(fixture: &str, name: &str) -> Value {
    let mut request: Value = serde_json::from_slice(&super::fixture(fixture)).expect("fixture");
    for object in ["machine", "bootstrapConfig", "infrastructureMachine"] {
        if request["desired"][object].is_object() {
            request["desired"][object]["metadata"]["name"] = json!(name);
        }
    }
    request["desired"]["machine"]["spec"]["providerID"] = json!(format!("docker:////{name}"));
    request
}

/// Waits until `condition` holds.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// What every fleet test starts from: certificates, a cluster-scoped agent token for `default/edge-01`, the
/// server's token file and the agents' token file, in one scratch directory.
pub struct Setup {
    pub certs: super::Certs,
    pub dir: tempfile::TempDir,
    pub token: inplace_updater::dispatch::upkeep::tokens::NewToken,
    /// The server's `--agent-tokens` file.
    pub tokens: PathBuf,
    /// The agents' `--token-file`.
    pub token_file: PathBuf,
}

impl Setup {
    pub fn new() -> Self {
        let certs = super::certs();
        let dir = tempfile::tempdir().expect("tempdir");
        let scope = inplace_updater::dispatch::AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        };
        let token =
            inplace_updater::dispatch::upkeep::tokens::create_token(&scope, None).expect("token");
        let tokens = dir.path().join("agent-tokens");
        std::fs::write(&tokens, format!("{}\n", token.line)).expect("token file");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, &token.token).expect("token file");
        Self {
            certs,
            dir,
            token,
            tokens,
            token_file,
        }
    }

    /// `serve` arguments for this setup on `store`.
    pub fn server_args(&self, store: &str) -> Vec<String> {
        [
            "--agent-tokens",
            &self.tokens.display().to_string(),
            "--store",
            store,
            "--retry-after-seconds",
            "1",
        ]
        .map(String::from)
        .to_vec()
    }

    /// The server on `store` with this setup's arguments and `extra`, and a CAPI client of its hooks port.
    pub fn serve(&self, store: &str, extra: &[&str]) -> (ServerProcess, Capi) {
        let mut args = self.server_args(store);
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let server = ServerProcess::start(
            &self.certs.paths,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let capi = Capi {
            client: Client::new(&self.certs.paths.ca_cert, None, false),
            addr: server.hooks,
        };
        (server, capi)
    }

    /// [`Setup::serve`] on this setup's file store (`<dir>/data`), with no extra arguments.
    pub fn serve_on_file_store(&self) -> (ServerProcess, Capi) {
        let store = format!("file:{}", self.dir.path().join("data").display());
        self.serve(&store, &[])
    }

    /// A sandboxed control-plane (or worker) node at v1.33.4 with its agent polling `server`.
    pub fn agent(&self, server: &ServerProcess, name: &str, control_plane: bool) -> AgentProcess {
        let sandbox = Sandbox::create(&self.dir.path().join(name), "v1.33.4", control_plane)
            .expect("sandbox");
        AgentProcess::start(
            server,
            &self.certs.paths.ca_cert,
            &self.token_file,
            name,
            sandbox,
        )
    }
}
