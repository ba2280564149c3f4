//! End to end, all real processes over TLS: one server, five agents on sandboxed roots whose `bin/` holds fake
//! kubeadm / kubelet / apt-get / systemctl, and a CAPI-faithful caller acting as KubeadmControlPlane (three
//! control-plane Machines upgraded one after another) and as a MachineDeployment (files and SSH keys on two
//! workers). What the nodes end up with is read from their disks.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use base64::Engine as _;
use capi_sim::{CapiDecision, UpdateOutcome};
use common::fleet::{AgentProcess, Capi, update_request, wait_until};
use common::{Client, ServerProcess, certs};
use inplace_agent_api::{AgentIdentity, MachineRef, POLL_PATH, PollRequest};
use inplace_updater::cmd::demo::Sandbox;
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use serde_json::Value;

pub const CONTROL_PLANE: [&str; 3] = [
    "edge-01-control-plane-aaaaa",
    "edge-01-control-plane-bbbbb",
    "edge-01-control-plane-ccccc",
];
pub const WORKERS: [&str; 2] = ["edge-01-md-0-x7k2p-11111", "edge-01-md-0-x7k2p-22222"];
pub const SETTLE: Duration = Duration::from_secs(60);

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// What KubeadmControlPlane asks for each control-plane Machine: the version fixture with the KubeadmConfig the
/// sandboxed node was made with as the current one (the etcd image 3.5.16-0 of its manifest, neither the audit
/// policy nor the health-check script the new spec adds). The upgrade moves the version, the etcd image and
/// those files, so the plan holds their steps (issue 43: a plan holds what the change moves).
async fn kcp_judges_upgrade(capi: &Capi, name: &str) {
    let mut question =
        common::fleet::can_update_request("can-update-machine-kcp-version.json", name);
    let current = &mut question["current"]["bootstrapConfig"]["spec"];
    current["clusterConfiguration"]["etcd"]["local"]["imageTag"] = "3.5.16-0".into();
    let added = [
        "/etc/kubernetes/audit-policy.yaml",
        "/usr/local/bin/edge-healthcheck.sh",
    ];
    current["files"]
        .as_array_mut()
        .unwrap()
        .retain(|file| !added.contains(&file["path"].as_str().unwrap_or_default()));
    assert_eq!(
        capi.can_update_machine(&question).await,
        CapiDecision::InPlace,
        "{name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollout_upgrades_control_plane_then_workers_for_real() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let edge = create_token(
        &AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        },
        None,
    )
    .unwrap();
    let other = create_token(
        &AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "other".into(),
        },
        None,
    )
    .unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, format!("{}\n{}\n", edge.line, other.line)).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &edge.token).unwrap();
    let store = format!("file:{}", dir.path().join("data").display());
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--agent-tokens",
            tokens.to_str().unwrap(),
            "--store",
            &store,
            "--retry-after-seconds",
            "1",
        ],
    );
    let ca = &certs.paths.ca_cert;

    let mut agents: Vec<AgentProcess> = Vec::new();
    for (i, name) in CONTROL_PLANE.iter().chain(WORKERS.iter()).enumerate() {
        let sandbox = Sandbox::create(&dir.path().join(name), "v1.33.4", i < 3).unwrap();
        agents.push(AgentProcess::start(&server, ca, &token_file, name, sandbox));
    }
    let capi = Capi {
        client: Client::new(ca, None, false),
        addr: server.hooks,
    };

    // KubeadmControlPlane: asks CanUpdateMachine for each Machine, then drives its UpdateMachine.
    for name in CONTROL_PLANE {
        kcp_judges_upgrade(&capi, name).await;
        let request = update_request("update-machine-kcp.json", name);
        let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
        assert_eq!(outcome, UpdateOutcome::Done, "{name}: {messages:?}");
        assert!(
            messages
                .iter()
                .any(|m| m.starts_with("step ") || m.starts_with("waiting for agent")),
            "progress is reported as it happens: {messages:?}"
        );
        // Idempotent after completion: the same desired spec, the same answer.
        assert_eq!(capi.update_machine(&request).await, UpdateOutcome::Done);
    }
    // Each control-plane step that disturbs a control plane waited for the preflight (the sandboxes' etcd
    // manifests run no member: the Nodes were checked); the workers' steps ran none.
    for (i, agent) in agents.iter().enumerate() {
        let log = agent.sandbox.root.parent().unwrap().join("agent.log");
        let log = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            log.contains("control-plane preflight passed")
                && log.contains("etcd not checked (controlPlane.checkEtcd: false)"),
            i < 3,
            "{}: {log}",
            agent.name
        );
    }
    let applies: Vec<(&str, usize)> = agents[..3]
        .iter()
        .map(|a| {
            (
                a.name.as_str(),
                a.sandbox
                    .calls()
                    .iter()
                    .filter(|c| c.starts_with("kubeadm upgrade apply v1.34.1"))
                    .count(),
            )
        })
        .collect();
    assert_eq!(
        applies,
        [
            (CONTROL_PLANE[0], 1),
            (CONTROL_PLANE[1], 0),
            (CONTROL_PLANE[2], 0)
        ],
        "apply exactly once, on the first node"
    );
    for agent in &agents[1..3] {
        assert!(
            agent
                .sandbox
                .calls()
                .contains(&"kubeadm upgrade node".to_string()),
            "{}: {:?}",
            agent.name,
            agent.sandbox.calls()
        );
    }
    for agent in &agents[..3] {
        assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1", "{}", agent.name);
        let calls = agent.sandbox.calls();
        let upgrade = calls
            .iter()
            .position(|c| c.starts_with("kubeadm upgrade"))
            .unwrap();
        let kubelet = calls
            .iter()
            .position(|c| c.contains("kubelet=1.34.1"))
            .unwrap();
        assert!(upgrade < kubelet, "kubeadm before kubelet: {calls:?}");
        assert!(calls.contains(&"systemctl restart kubelet".to_string()));
        let etcd =
            std::fs::read_to_string(agent.sandbox.path("/etc/kubernetes/manifests/etcd.yaml"))
                .unwrap();
        assert!(etcd.contains("registry.k8s.io/etcd:3.5.21-0"), "{etcd}");
    }

    // The desired files landed with the right content and mode.
    let desired: Value =
        serde_json::from_slice(&common::fixture("update-machine-kcp.json")).unwrap();
    let spec = &desired["desired"]["bootstrapConfig"]["spec"];
    let audit = agents[0].sandbox.path("/etc/kubernetes/audit-policy.yaml");
    assert_eq!(
        std::fs::read_to_string(&audit).unwrap(),
        spec["files"][0]["content"].as_str().unwrap()
    );
    assert_eq!(mode(&audit), 0o600);
    let script = agents[0].sandbox.path("/usr/local/bin/edge-healthcheck.sh");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(spec["files"][3]["content"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        std::fs::read(&script).unwrap(),
        decoded,
        "base64 content is decoded on the node"
    );
    assert_eq!(mode(&script), 0o755);
    assert!(
        !agents[0]
            .sandbox
            .path("/etc/kubernetes/encryption-config.yaml")
            .exists(),
        "secret-sourced files are not touched"
    );

    // MachineDeployment: files and SSH keys on the workers; one worker's agent is killed mid-plan.
    let can_set =
        serde_json::from_slice::<Value>(&common::fixture("can-update-machineset-md.json")).unwrap();
    assert_eq!(
        capi.can_update_machine_set(&can_set).await,
        CapiDecision::InPlace
    );
    agents[3].sandbox.slow_kubeadm(true).unwrap();
    let first = update_request("update-machine-worker.json", WORKERS[0]);
    assert!(matches!(
        capi.update_machine(&first).await,
        UpdateOutcome::InProgress { .. }
    ));
    let sandbox = agents[3].sandbox.clone();
    wait_until("worker 1 to be inside kubeadm upgrade node", || {
        sandbox.calls().iter().any(|c| c == "kubeadm upgrade node")
    });
    agents[3].kill();
    agents[3].sandbox.slow_kubeadm(false).unwrap();
    agents[3].restart();
    let (outcome, messages) = capi.update_until_settled(&first, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    let calls = agents[3].sandbox.calls();
    let installs = calls
        .iter()
        .filter(|c| c.contains("install -y kubeadm=1.34.1"))
        .count();
    assert_eq!(
        installs, 1,
        "a finished step never runs again after a restart: {calls:?}"
    );
    assert!(
        agents[3].log().contains("resum")
            || calls
                .iter()
                .filter(|c| *c == "kubeadm upgrade node")
                .count()
                == 2,
        "{}",
        agents[3].log()
    );

    let second = update_request("update-machine-worker.json", WORKERS[1]);
    let (outcome, messages) = capi.update_until_settled(&second, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    let worker_spec = &second["desired"]["bootstrapConfig"]["spec"];
    let keys_path = agents[4].sandbox.path("/home/capi/.ssh/authorized_keys");
    let keys = std::fs::read_to_string(&keys_path).unwrap();
    for key in worker_spec["users"][0]["sshAuthorizedKeys"]
        .as_array()
        .unwrap()
    {
        assert!(keys.contains(key.as_str().unwrap()), "{keys}");
    }
    assert_eq!(mode(&keys_path), 0o600);
    let hosts = agents[4]
        .sandbox
        .path("/etc/containerd/certs.d/registry.edge.example/hosts.toml");
    assert_eq!(
        std::fs::read_to_string(hosts).unwrap(),
        worker_spec["files"][2]["content"].as_str().unwrap()
    );

    // A failing kubeadm surfaces as Failure with its stderr, and stays so on every later call. The
    // MachineDeployment first asks about a newer MachineSet at v1.34.2 and moves the worker to it.
    agents[4].sandbox.fail_kubeadm(true).unwrap();
    let mut newer_set = can_set.clone();
    newer_set["current"] = can_set["desired"].clone();
    newer_set["desired"]["machineSet"]["metadata"]["name"] = Value::from("edge-01-md-0-v1342");
    newer_set["desired"]["machineSet"]["spec"]["template"]["spec"]["version"] =
        Value::from("v1.34.2");
    assert_eq!(
        capi.can_update_machine_set(&newer_set).await,
        CapiDecision::InPlace
    );
    let mut failing = second.clone();
    failing["desired"]["machine"]["spec"]["version"] = Value::from("v1.34.2");
    failing["desired"]["machine"]["metadata"]["labels"]["cluster.x-k8s.io/set-name"] =
        Value::from("edge-01-md-0-v1342");
    let (outcome, _) = capi.update_until_settled(&failing, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("expected Failure, got {outcome:?}")
    };
    assert!(
        message.contains("kubeadm upgrade node (v1.34.2)"),
        "{message}"
    );
    assert!(
        message.contains("CoreDNSUnsupportedPlugins"),
        "stderr tail reaches the answer: {message}"
    );
    assert!(
        matches!(
            capi.update_machine(&failing).await,
            UpdateOutcome::Failed { .. }
        ),
        "same answer for this run, for ever"
    );

    // Tokens: another cluster's token gets 403 and no byte of this cluster's plan; none gets 401.
    let poll = PollRequest {
        agent: AgentIdentity::Machine(MachineRef::new("default", CONTROL_PLANE[0])),
        current: None,
        wait_seconds: 0,
        facts: None,
    };
    for (token, expected) in [
        (Some(other.token.as_str()), 403),
        (None, 401),
        (Some("iu1_forged"), 401),
    ] {
        let reply = agent_post(
            &certs.paths.ca_cert,
            server.hooks,
            token,
            &serde_json::to_vec(&poll).unwrap(),
        )
        .await;
        assert_eq!(reply.0, expected, "{}", String::from_utf8_lossy(&reply.1));
        let body = String::from_utf8_lossy(&reply.1);
        assert!(!body.contains("steps") && !body.contains("audit"), "{body}");
    }

    // Every log of the run (the server's and each agent's) is free of tokens, key material and file content.
    let mut secrets = vec![
        ("agent token edge-01".to_string(), edge.token.clone()),
        ("agent token other".to_string(), other.token.clone()),
    ];
    for key in [
        &certs.paths.server_key,
        &certs.paths.client_key,
        &certs.paths.ca_key,
    ] {
        secrets.extend(pem_body_lines(key));
    }
    for fixture in ["update-machine-kcp.json", "update-machine-worker.json"] {
        secrets.extend(plan_secrets(fixture));
    }
    assert!(secrets.len() > 20, "{secrets:?}");
    // The check itself must catch a secret the way a JSON log line would carry it (quotes escaped).
    let quoted = secrets
        .iter()
        .find(|(_, secret)| secret.contains('"'))
        .unwrap();
    let sample = format!(
        "{{\"detail\":{}}}",
        serde_json::to_string(&quoted.1).unwrap()
    );
    assert!(!sample.contains(&quoted.1) && !leaks(&sample, &secrets).is_empty());
    let mut logs = vec![("server".to_string(), server.logs().join("\n"))];
    for agent in &agents {
        logs.push((format!("agent {}", agent.name), agent.log()));
    }
    for (whose, text) in &logs {
        assert!(!text.is_empty(), "{whose}: no log captured");
        let found = leaks(text, &secrets);
        assert!(found.is_empty(), "{whose} log contains {found:?}");
    }
}

/// Every base64 line of a PEM private key (a line is enough to identify key material).
fn pem_body_lines(path: &std::path::Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("PRIVATE KEY"), "{}", path.display());
    text.lines()
        .filter(|line| !line.starts_with("-----") && line.len() >= 16)
        .map(|line| (format!("{} (PEM body)", path.display()), line.to_string()))
        .collect()
}

/// The SSH authorized keys and the inline file contents of an UpdateMachine fixture: each key's base64
/// blob, and each content line of 12 or more characters (raw, and decoded when base64).
fn plan_secrets(fixture: &str) -> Vec<(String, String)> {
    let request: Value = serde_json::from_slice(&common::fixture(fixture)).unwrap();
    let spec = &request["desired"]["bootstrapConfig"]["spec"];
    let mut secrets = Vec::new();
    for user in spec["users"].as_array().into_iter().flatten() {
        for key in user["sshAuthorizedKeys"].as_array().into_iter().flatten() {
            let blob = key.as_str().unwrap().split_whitespace().nth(1).unwrap();
            secrets.push((format!("{fixture}: ssh key"), blob.to_string()));
        }
    }
    for file in spec["files"].as_array().into_iter().flatten() {
        let Some(content) = file["content"].as_str() else {
            continue;
        };
        let path = file["path"].as_str().unwrap();
        let mut texts = vec![content.to_string()];
        if file["encoding"] == "base64" {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(content)
                .unwrap();
            texts.push(String::from_utf8(decoded).unwrap());
        }
        for text in texts {
            for line in text.lines().map(str::trim).filter(|line| line.len() >= 12) {
                secrets.push((format!("{fixture}: content of {path}"), line.to_string()));
            }
        }
    }
    secrets
}

/// Which secrets occur in `log`, as written or JSON-escaped (JSON log lines escape quotes and backslashes).
fn leaks(log: &str, secrets: &[(String, String)]) -> Vec<String> {
    secrets
        .iter()
        .filter(|(_, secret)| {
            let escaped = serde_json::to_string(secret).unwrap();
            log.contains(secret.as_str()) || log.contains(escaped.trim_matches('"'))
        })
        .map(|(what, secret)| format!("{what}: {secret:?}"))
        .collect()
}

async fn agent_post(
    ca: &std::path::Path,
    addr: std::net::SocketAddr,
    token: Option<&str>,
    body: &[u8],
) -> (u16, Vec<u8>) {
    use http_body_util::{BodyExt as _, Full};
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut request = hyper::Request::post(POLL_PATH).header("host", "localhost");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = sender
        .send_request(
            request
                .body(Full::new(hyper::body::Bytes::copy_from_slice(body)))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    (
        status,
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}
