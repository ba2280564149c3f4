//! Hostile clients against the real binary: slow headers, TCP without TLS, more idle connections than the
//! cap, a burst of 1 000 hook calls, expired and revoked agent tokens; plus the inputs kept from fuzzing,
//! fed to the in-process router. Every case must end with a live, healthy server.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Client, ServerProcess, WAIT, certs, fixture, plain_get};
use inplace_agent_api::{AgentIdentity, MachineRef, POLL_PATH, PollRequest};
use inplace_updater::auth::create_token;
use inplace_updater::dispatch::AgentScope;
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
    config.alpn_protocols = vec![alpn.to_vec()];
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
    let read = tokio::time::timeout(WAIT, tcp.read(&mut buf)).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_beyond_the_cap_wait_and_a_fresh_client_is_served() {
    const CAP: usize = 50;
    const IDLE: usize = 200;
    let certs = certs();
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--max-connections",
            &CAP.to_string(),
            "--header-read-timeout",
            "1s",
            "--handshake-timeout",
            "1s",
        ],
    );
    let config = tls_config(&certs.paths.ca_cert, b"http/1.1");
    // 200 clients connect and then say nothing; each keeps its socket until the server closes it.
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        let config = config.clone();
        let addr = server.hooks;
        idle.push(tokio::spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let mut hello = tokio_rustls::TlsConnector::from(config)
                .connect("localhost".try_into().unwrap(), &mut tcp);
            // Those over the cap sit in the backlog; either way the client only ever waits.
            let mut buf = [0u8; 16];
            match tokio::time::timeout(WAIT * 2, &mut hello).await {
                Ok(Ok(mut tls)) => {
                    let _ = tokio::time::timeout(WAIT * 2, tls.read(&mut buf)).await;
                }
                Ok(Err(_)) | Err(_) => {}
            }
        }));
    }
    // The health port is a different listener: never held up by the hook port's cap.
    assert_healthy(&server);
    let started = Instant::now();
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let reply = tokio::time::timeout(
        WAIT,
        client.request(
            server.hooks,
            "POST",
            CAN_UPDATE_MACHINE,
            fixture("can-update-machine-kcp-version.json"),
        ),
    )
    .await
    .expect("a fresh client is served once idle connections time out")
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["status"], "Success", "{}", reply.json());
    println!("fresh client served after {waited:?} behind {IDLE} idle connections (cap {CAP})");
    for task in idle {
        tokio::time::timeout(WAIT * 3, task).await.unwrap().unwrap();
    }
    assert_healthy(&server);
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
    let tls = tls_connect(&tls_config(ca, b"http/1.1"), addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let poll = PollRequest {
        agent: AgentIdentity::Machine(MachineRef::new("default", "m-1")),
        current: None,
        wait_seconds: 0,
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
