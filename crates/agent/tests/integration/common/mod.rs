//! A small real HTTPS server speaking the agent protocol (rcgen certificates, rustls, hyper),
//! recording what agents send, plus sandbox helpers. Not a mock of TLS: the agent's real client
//! verifies this server's certificate against the test CA.
#![allow(dead_code, clippy::unwrap_used)]

pub mod fixtures;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use inplace_agent::api::*;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the server has seen and what it offers.
#[derive(Default)]
pub struct ServerState {
    pub token: String,
    pub plan: Option<Plan>,
    /// Keep offering the plan even when the agent says it finished it (a server that lost reports).
    pub offer_finished: bool,
    pub reports: Vec<StepReport>,
    pub inventories: Vec<InventoryReport>,
    pub polls: Vec<PollRequest>,
    pub unauthorized: u32,
    /// The hold on the offered plan, said in poll answers and report acks.
    pub hold: Option<Hold>,
    /// Set `hold` when the report with this step index and status arrives, before acking it.
    pub hold_on_report: Option<(u32, StepStatus, Hold)>,
    /// The Machine's onFailure, said with every plan and hold (absent: roll back).
    pub on_failure: Option<inplace_agent::api::OnFailure>,
}

/// A test CA and the server certificate (and key) it signed for `localhost` and 127.0.0.1.
pub struct TestPki {
    pub ca: rcgen::Certificate,
    pub cert: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

/// A fresh [`TestPki`] whose CA is called `ca_name`.
pub fn test_pki(ca_name: &str) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.signed_by(&key, &issuer).unwrap();
    TestPki { ca, cert, key }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<ServerState>>,
    pub wake: Arc<Notify>,
    pub ca_pem: String,
}

impl TestServer {
    pub async fn start(token: &str) -> Self {
        let TestPki {
            ca: ca_cert,
            cert,
            key,
        } = test_pki("agent test CA");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ServerState {
            token: token.to_owned(),
            ..Default::default()
        }));
        let wake = Arc::new(Notify::new());
        let (s, w) = (state.clone(), wake.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, s, w) = (acceptor.clone(), s.clone(), w.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req| handle(req, s.clone(), w.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            wake,
            ca_pem: ca_cert.pem(),
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Offers a plan and wakes waiting polls.
    pub fn offer(&self, plan: Plan) {
        self.state.lock().unwrap().plan = Some(plan);
        self.wake.notify_waiters();
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut ServerState) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    /// Reports for one step, in arrival order.
    pub fn reports_for(&self, step: u32) -> Vec<StepReport> {
        self.with(|s| {
            s.reports
                .iter()
                .filter(|r| r.step_index == step)
                .cloned()
                .collect()
        })
    }
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

fn should_offer(state: &ServerState, current: Option<&PlanProgress>) -> Option<Plan> {
    let plan = state.plan.as_ref()?;
    let unfinished = match current {
        None => true,
        Some(c) => c.plan_id != plan.id || c.status == PlanStatus::Running,
    };
    (unfinished || state.offer_finished).then(|| plan.clone())
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<ServerState>>,
    wake: Arc<Notify>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let expected = format!("Bearer {}", state.lock().unwrap().token);
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(expected.as_str());
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if !authorized {
        state.lock().unwrap().unauthorized += 1;
        return Ok(json(
            StatusCode::UNAUTHORIZED,
            &ErrorResponse {
                message: "unknown token".into(),
            },
        ));
    }
    match path.as_str() {
        POLL_PATH => {
            let poll: PollRequest = serde_json::from_slice(&body).unwrap();
            let wait = Duration::from_secs(u64::from(poll.wait_seconds.min(MAX_WAIT_SECONDS)));
            let deadline = Instant::now() + wait;
            state.lock().unwrap().polls.push(poll.clone());
            loop {
                let notified = wake.notified();
                let (offer, hold) = {
                    let state = state.lock().unwrap();
                    (
                        should_offer(&state, poll.current.as_ref()),
                        state.hold.clone(),
                    )
                };
                if let Some(plan) = offer {
                    // An agent already honouring this hold waits, as the real server makes it.
                    let honoured = poll
                        .current
                        .as_ref()
                        .filter(|c| c.plan_id == plan.id)
                        .and_then(|c| c.hold.clone());
                    if hold.is_none() || honoured != hold {
                        let answer = PollResponse {
                            plan: Some(plan),
                            on_failure: state.lock().unwrap().on_failure,
                            hold,
                            ..PollResponse::default()
                        };
                        return Ok(json(StatusCode::OK, &answer));
                    }
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    let answer = PollResponse {
                        plan: None,
                        on_failure: state.lock().unwrap().on_failure.filter(|_| hold.is_some()),
                        hold,
                        ..PollResponse::default()
                    };
                    return Ok(json(StatusCode::OK, &answer));
                }
            }
        }
        REPORT_PATH => {
            let report: StepReport = serde_json::from_slice(&body).unwrap();
            validate_report(&report).unwrap();
            let mut state = state.lock().unwrap();
            if let Some((step, status, hold)) = state.hold_on_report.clone()
                && report.step_index == step
                && report.status == status
            {
                state.hold = Some(hold);
            }
            let hold = state.hold.clone().filter(|h| h.plan_id == report.plan_id);
            state.reports.push(report);
            Ok(json(StatusCode::OK, &AckResponse { hold }))
        }
        INVENTORY_PATH => {
            let inventory: InventoryReport = serde_json::from_slice(&body).unwrap();
            state.lock().unwrap().inventories.push(inventory);
            Ok(json(StatusCode::OK, &AckResponse::default()))
        }
        _ => Ok(json(
            StatusCode::NOT_FOUND,
            &ErrorResponse {
                message: "no such path".into(),
            },
        )),
    }
}

/// A node sandbox: root, state dir, fake programs, token and CA files.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub bin: PathBuf,
}

impl Node {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (root, state, bin) = (
            dir.path().join("root"),
            dir.path().join("state"),
            dir.path().join("bin"),
        );
        for d in [&root, &bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        let node = Self {
            dir,
            root,
            state,
            bin,
        };
        node.write(
            "/proc/sys/kernel/random/boot_id",
            "0b5c6c5e-1111-2222-3333-444455556666\n",
        );
        node.write("/proc/sys/kernel/hostname", "cp-0\n");
        node
    }

    pub fn path(&self, node_path: &str) -> PathBuf {
        self.root.join(node_path.trim_start_matches('/'))
    }

    pub fn write(&self, node_path: &str, content: &str) {
        let path = self.path(node_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// A fake program logging `name args…` to `<root>/calls.log`, then running `body`.
    pub fn fake(&self, name: &str, body: &str) {
        let path = self.bin.join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho \"{name} $*\" >> \"$INPLACE_ROOT/calls.log\"\n{body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    pub fn calls(&self, prefix: &str) -> usize {
        std::fs::read_to_string(self.path("/calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// Writes CA, token and driver config; returns an agent config for `machine` on `server`.
    pub fn agent_config(
        &self,
        server: &TestServer,
        token: &str,
        driver_yaml: &str,
    ) -> inplace_agent::AgentConfig {
        let ca = self.dir.path().join("ca.pem");
        std::fs::write(&ca, &server.ca_pem).unwrap();
        let token_file = self.dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let config_file = self.dir.path().join("agent.yaml");
        let yaml = format!(
            "path: [\"{}\", /usr/bin, /bin]\n{driver_yaml}",
            self.bin.display()
        );
        std::fs::write(&config_file, yaml).unwrap();
        let mut config = inplace_agent::AgentConfig::new(
            server.url(),
            ca,
            token_file,
            AgentIdentity::Machine(MachineRef::new("default", "cp-0")),
        );
        config.driver_config = Some(config_file);
        config.state_dir = self.state.clone();
        config.root = self.root.clone();
        config
    }

    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("token")
    }
}

/// A running agent task and the way to stop it cleanly.
pub struct RunningAgent {
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<Result<inplace_agent::Stopped, inplace_agent::AgentError>>,
}

pub fn spawn_agent(config: inplace_agent::AgentConfig) -> RunningAgent {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(inplace_agent::run(config, async move {
        let _ = stopped.await;
    }));
    RunningAgent {
        stop: Some(stop),
        task,
    }
}

impl RunningAgent {
    /// Clean shutdown; the agent must return within the deadline.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// Simulated crash: the agent's future is dropped mid-work.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Waits (polling, with a deadline) until `condition` holds.
pub async fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn step(index: u32, description: &str, action: StepAction) -> Step {
    Step {
        index,
        description: description.into(),
        timeout_seconds: 60,
        action,
    }
}

pub fn plan(id: &str, steps: Vec<Step>) -> Plan {
    Plan {
        id: id.into(),
        machine: MachineRef::new("default", "cp-0"),
        cluster: "prod".into(),
        steps,
        control_plane: false,
    }
}
