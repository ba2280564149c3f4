//! Hostile clients against the real binary: slow headers, TCP without TLS, more idle connections than the
//! cap, a burst of 1 000 hook calls, expired and revoked agent tokens; plus the inputs kept from fuzzing,
//! fed to the in-process router. Every case must end with a live, healthy server.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Client, ServerProcess, WAIT, certs, fixture, plain_get};
use inplace_agent_api::{AgentIdentity, MachineRef, POLL_PATH, PollRequest};
use inplace_updater::cmd::diff::{PackedInputs, render_text};
use inplace_updater::dispatch::AgentScope;
use inplace_updater::dispatch::upkeep::tokens::create_token;
use rustls::pki_types::pem::PemObject as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const CAN_UPDATE_MACHINE: &str =
    "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine";

/// Pace of the slow client: one byte per this long.
const SLOW_BYTE_INTERVAL: Duration = Duration::from_millis(200);

fn tls_config(ca: &std::path::Path, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    // An empty `alpn` offers no protocol at all (the server then detects one from the first bytes).
    config.alpn_protocols = if alpn.is_empty() {
        Vec::new()
    } else {
        vec![alpn.to_vec()]
    };
    Arc::new(config)
}

async fn tls_connect(
    config: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config.clone())
        .connect("localhost".try_into().unwrap(), tcp)
        .await
}

fn assert_healthy(server: &ServerProcess) {
    assert_eq!(
        plain_get(server.health, "/healthz").map(|(status, _)| status),
        Some(200),
        "healthz after the abuse"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_client_is_cut_off_after_the_header_read_timeout() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &["--header-read-timeout", "1s"]);
    let config = tls_config(&certs.paths.ca_cert, b"http/1.1");
    let tls = tls_connect(&config, server.hooks).await.unwrap();
    let (mut read, mut write) = tokio::io::split(tls);
    let request = format!(
        "POST {CAN_UPDATE_MACHINE} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let full_send = SLOW_BYTE_INTERVAL * request.len() as u32;
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = read.read_to_end(&mut sink).await;
        (started.elapsed(), sink)
    });
    for byte in request.bytes() {
        if reader.is_finished() || write.write_all(&[byte]).await.is_err() {
            break;
        }
        let _ = write.flush().await;
        tokio::time::sleep(SLOW_BYTE_INTERVAL).await;
    }
    let (closed_after, answer) = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        closed_after >= Duration::from_millis(800) && closed_after < Duration::from_secs(5),
        "closed after {closed_after:?} (sending everything takes {full_send:?}); answer {answer:?}"
    );
    assert!(
        !answer.contains("200 OK"),
        "the slow request must not be served: {answer}"
    );
    assert_healthy(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_without_tls_is_dropped_after_the_handshake_timeout() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &["--handshake-timeout", "1s"]);
    let started = Instant::now();
    let mut tcp = TcpStream::connect(server.hooks).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, tcp.read(&mut buf))
        .await
        .unwrap();
    let closed_after = started.elapsed();
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "server sent bytes to a client that never said hello: {read:?}"
    );
    assert!(
        closed_after >= Duration::from_millis(800) && closed_after < Duration::from_secs(5),
        "dropped after {closed_after:?}"
    );
    assert_healthy(&server);
}

/// Opens `count` TLS connections that complete the handshake and then say nothing.
async fn idle_tls(
    config: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    count: usize,
) -> Vec<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut idle = Vec::new();
    for _ in 0..count {
        idle.push(tls_connect(config, addr).await.unwrap());
    }
    idle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_and_are_served_once_others_close() {
    const CAP: usize = 50;
    /// How long the test shows the over-cap client is still waiting (a bound, not a wait for a condition).
    const HELD: Duration = Duration::from_secs(2);
    let certs = certs();
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--max-connections",
            &CAP.to_string(),
            "--handshake-timeout",
            "1s",
        ],
    );
    let config = tls_config(&certs.paths.ca_cert, b"http/1.1");
    let idle = idle_tls(&config, server.hooks, CAP).await;
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let addr = server.hooks;
    let started = Instant::now();
    let mut waiting = tokio::spawn(async move {
        client
            .request(
                addr,
                "POST",
                CAN_UPDATE_MACHINE,
                fixture("can-update-machine-kcp-version.json"),
            )
            .await
    });
    assert!(
        tokio::time::timeout(HELD, &mut waiting).await.is_err(),
        "a connection over the cap of {CAP} was served"
    );
    // The health port is its own listener: the hook port's cap never makes the pod look dead.
    assert_healthy(&server);
    drop(idle);
    let reply = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the waiting client is served once others close")
        .unwrap()
        .unwrap();
    println!(
        "over-cap client served {:?} after connecting",
        started.elapsed()
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["status"], "Success", "{}", reply.json());
    assert_healthy(&server);
}

/// A client that completes TLS and then sends nothing cannot hold a connection slot, whatever protocol it
/// negotiated: HTTP/1.1, HTTP/2 (the server's SETTINGS go out, no request ever comes) or none at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_connections_are_closed_after_the_header_read_timeout() {
    let certs = certs();
    let server = ServerProcess::start(
        &certs.paths,
        &["--header-read-timeout", "1s", "--handshake-timeout", "1s"],
    );
    for alpn in [&b"http/1.1"[..], b"h2", b""] {
        let config = tls_config(&certs.paths.ca_cert, alpn);
        let mut tls = tls_connect(&config, server.hooks).await.unwrap();
        let started = Instant::now();
        // An HTTP/2 server speaks first (SETTINGS); what matters is that the connection ends.
        let mut sink = Vec::new();
        let ended = tokio::time::timeout(WAIT, tls.read_to_end(&mut sink)).await;
        assert!(
            ended.is_ok(),
            "{}: an idle connection was still open after {:?}",
            String::from_utf8_lossy(alpn),
            started.elapsed()
        );
        println!(
            "{}: idle connection closed after {:?}",
            String::from_utf8_lossy(alpn),
            started.elapsed()
        );
    }
}

/// The idle timeout counts only time with no request in progress: a call that takes longer than it (here a
/// body that pauses for 2.5 s, as a long-poll holds its request for up to 30 s) is answered, not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_progress_outlives_the_idle_timeout() {
    const PAUSE: Duration = Duration::from_millis(2500);
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &["--header-read-timeout", "1s"]);
    let config = tls_config(&certs.paths.ca_cert, b"http/1.1");
    let mut tls = tls_connect(&config, server.hooks).await.unwrap();
    tls.write_all(
        format!(
            "POST {CAN_UPDATE_MACHINE} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(PAUSE).await;
    tls.write_all(b"}").await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tls.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""status":"Failure""#), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_1000_hook_calls_is_answered_or_shed_never_a_crash() {
    const CONNECTIONS: usize = 100;
    const PER_CONNECTION: usize = 10;
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &[]);
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let body = fixture("can-update-machine-kcp-version.json");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let client = client.clone();
        let body = body.clone();
        let addr = server.hooks;
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            let mut connection = client.keep_alive(addr).await;
            for _ in 0..PER_CONNECTION {
                outcomes.push(connection.post(CAN_UPDATE_MACHINE, body.clone()).await);
            }
            outcomes
        }));
    }
    let (mut success, mut shed, mut other) = (0, 0, Vec::new());
    for task in tasks {
        for outcome in tokio::time::timeout(WAIT * 3, task).await.unwrap().unwrap() {
            match outcome {
                Ok((200, body)) => {
                    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(json["status"], "Success", "{json}");
                    success += 1;
                }
                Ok((429 | 503, body)) if !body.is_empty() => shed += 1,
                unexpected => other.push(format!("{unexpected:?}")),
            }
        }
    }
    println!(
        "burst of {} calls in {:?}: {success} answered, {shed} shed, {} other",
        CONNECTIONS * PER_CONNECTION,
        started.elapsed(),
        other.len()
    );
    assert!(other.is_empty(), "unexpected outcomes: {other:?}");
    assert_eq!(success + shed, CONNECTIONS * PER_CONNECTION);
    assert!(success > 0);
    assert_healthy(&server);
    // And the hook port still answers.
    let reply = client
        .post(
            server.hooks,
            CAN_UPDATE_MACHINE,
            fixture("can-update-machine-kcp-version.json"),
        )
        .await;
    assert_eq!(reply.status, 200);
}

async fn agent_poll(ca: &std::path::Path, addr: SocketAddr, token: &str) -> (u16, String) {
    use http_body_util::{BodyExt as _, Full};
    let tls = tls_connect(&tls_config(ca, b"http/1.1"), addr)
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let poll = PollRequest {
        agent: AgentIdentity::Machine(MachineRef::new("default", "m-1")),
        current: None,
        wait_seconds: 0,
        facts: None,
    };
    let request = hyper::Request::post(POLL_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(hyper::body::Bytes::from(
            serde_json::to_vec(&poll).unwrap(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_revoked_agent_tokens_get_401() {
    let certs = certs();
    let dir = tempfile::tempdir().unwrap();
    let scope = AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    };
    let past = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let expired = create_token(&scope, Some(past)).unwrap();
    let live = create_token(&scope, None).unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, format!("{}\n{}\n", expired.line, live.line)).unwrap();
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--agent-tokens",
            tokens.to_str().unwrap(),
            "--tls-reload-interval",
            "200ms",
        ],
    );
    let ca = &certs.paths.ca_cert;

    let (status, body) = agent_poll(ca, server.hooks, &expired.token).await;
    assert_eq!(status, 401, "expired token: {body}");
    assert!(body.contains("expired"), "{body}");
    let (status, body) = agent_poll(ca, server.hooks, &live.token).await;
    assert_eq!(status, 200, "live token: {body}");

    // Revoke: remove the line; the server re-reads the file on its reload tick.
    std::fs::write(&tokens, format!("{}\n", expired.line)).unwrap();
    let deadline = Instant::now() + WAIT;
    let (status, body) = loop {
        let (status, body) = agent_poll(ca, server.hooks, &live.token).await;
        if status != 200 || Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 401, "revoked token: {body}");
    let logs = server.logs().join("\n");
    assert!(
        !logs.contains(&live.token) && !logs.contains(&expired.token),
        "tokens never reach the logs"
    );
}

/// A client that sends headers promptly and then one body byte at a time is cut off at the call's deadline
/// (80% of CAPI's default 10 s timeout), not held open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_body_client_is_cut_off() {
    const BODY_BYTES: usize = 1000;
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &["--header-read-timeout", "1s"]);
    let config = tls_config(&certs.paths.ca_cert, b"http/1.1");
    let tls = tls_connect(&config, server.hooks).await.unwrap();
    let (mut read, mut write) = tokio::io::split(tls);
    write
        .write_all(
            format!(
                "POST {CAN_UPDATE_MACHINE} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {BODY_BYTES}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = read.read_to_end(&mut sink).await;
        started.elapsed()
    });
    for _ in 0..BODY_BYTES {
        if reader.is_finished() || started.elapsed() > WAIT || write.write_all(b" ").await.is_err()
        {
            break;
        }
        let _ = write.flush().await;
        tokio::time::sleep(SLOW_BYTE_INTERVAL).await;
    }
    assert!(
        reader.is_finished(),
        "a slow body still held its connection after {:?}",
        started.elapsed()
    );
}

/// The inputs kept from fuzz target `target` (`tests/fuzz-regressions/<target>/`), sorted by name.
pub(crate) fn kept_inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-regressions")
        .join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no inputs", dir.display());
    inputs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_fuzz_inputs_are_answered_without_a_crash() {
    use axum::body::Body;
    use http_body_util::BodyExt as _;
    use inplace_updater::api::Hook;
    use inplace_updater::dispatch::upkeep::tokens::{AgentTokens, parse_token_file};
    use inplace_updater::hooks::Engine;
    use inplace_updater::server::{AppState, app};
    use tower::ServiceExt as _;

    let state = AppState::new(Arc::new(Engine::in_memory()), Arc::new(AgentTokens::none()));
    for (name, body) in kept_inputs("hook_request") {
        for hook in [
            Hook::CanUpdateMachine,
            Hook::CanUpdateMachineSet,
            Hook::UpdateMachine,
        ] {
            let request = axum::http::Request::post(hook.path())
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .unwrap();
            let response = app(state.clone()).oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|err| panic!("{name} → {hook}: not JSON ({err})"));
            assert_eq!(status, 200, "{name} → {hook}: {json}");
            assert_eq!(json["status"], "Failure", "{name} → {hook}: {json}");
            assert!(
                !json["message"].as_str().unwrap().is_empty(),
                "{name} → {hook}: a Failure says why"
            );
        }
    }
    for (name, body) in kept_inputs("agent_api") {
        let poll = serde_json::from_slice::<PollRequest>(&body);
        let report = serde_json::from_slice::<inplace_agent_api::StepReport>(&body);
        assert!(poll.is_err() && report.is_err(), "{name} decoded");
    }
    for (name, text) in kept_inputs("policy_yaml") {
        let text = String::from_utf8(text).unwrap();
        let err = inplace_core::Policy::from_yaml(&text)
            .err()
            .unwrap_or_else(|| panic!("{name} was accepted as a policy"));
        assert!(!err.to_string().is_empty(), "{name}");
    }
    for (name, text) in kept_inputs("token_file") {
        let text = String::from_utf8(text).unwrap();
        let err = parse_token_file("kept", &text).unwrap_err();
        assert!(err.to_string().contains("kept:1"), "{name}: {err}");
    }
    for (name, text) in kept_inputs("diff_inputs") {
        let Ok(text) = String::from_utf8(text) else {
            continue; // the CLI refuses a non-UTF-8 file before parsing it
        };
        match PackedInputs::unpack(&text).decide(&inplace_core::Policy::builtin()) {
            Ok(report) => assert!(!render_text(&report).is_empty(), "{name}"),
            Err(err) => assert!(!err.to_string().is_empty(), "{name}: an error says why"),
        }
    }
}

/// Every kept input of every fuzz target (`inplace_updater::fuzzing::TARGETS`, one directory each under
/// `tests/fuzz-regressions/`) replayed through the target's own body, so whatever crashed the fuzzer once
/// runs again in plain `cargo test`. A target without kept inputs fails here too.
#[test]
fn every_kept_fuzz_input_replays_through_its_fuzz_target() {
    let mut panicked = Vec::new();
    for (target, body) in inplace_updater::fuzzing::TARGETS {
        for (name, input) in kept_inputs(target) {
            if std::panic::catch_unwind(|| body(&input)).is_err() {
                panicked.push(format!("{target}/{name}"));
            }
        }
    }
    assert!(
        panicked.is_empty(),
        "kept fuzz inputs panicked: {panicked:?}"
    );
}
