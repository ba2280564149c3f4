//! The real binary over real TLS on loopback: ALPN, certificate rotation, mTLS, graceful shutdown,
//! no plaintext, and start-up failures that name the problem.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::io::{Read as _, Write as _};
use std::time::Duration;

use common::{Client, ServerProcess, certs, plain_get};
use inplace_updater::api::Hook;
use inplace_updater::cmd::certs::{DevCertsSpec, write_dev_certs};

fn discovery_body() -> Vec<u8> {
    common::fixture("discovery-request.json")
}

#[tokio::test(flavor = "multi_thread")]
async fn serves_discovery_over_http1_and_http2_and_logs_the_first_call_at_info() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &[]);
    for http1_only in [true, false] {
        let client = Client::new(&certs.paths.ca_cert, None, http1_only);
        let reply = client
            .post(server.hooks, Hook::Discovery.path(), discovery_body())
            .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.http2, !http1_only, "ALPN must pick h2 when offered");
        let handlers =
            capi_sim::discover(&reply.body, "inplace-updater").expect("CAPI accepts discovery");
        let hooks: Vec<_> = handlers
            .iter()
            .map(|h| (h.name.as_str(), h.hook.as_str()))
            .collect();
        assert_eq!(
            hooks,
            [
                ("can-update-machine.inplace-updater", "CanUpdateMachine"),
                (
                    "can-update-machineset.inplace-updater",
                    "CanUpdateMachineSet"
                ),
                ("update-machine.inplace-updater", "UpdateMachine"),
            ]
        );
    }
    let log = server.wait_for_log("\"hook\":\"Discovery\"");
    assert!(
        log.contains("duration_ms"),
        "one line per call with its duration: {log}"
    );
    // CAPI discovers again on every ExtensionConfig sync and the answer never changes: only the first call is
    // logged at info. A later call's line (a bad CanUpdateMachine, a warning) shows the repeat's would be there.
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let reply = client
        .post(server.hooks, Hook::CanUpdateMachine.path(), b"{}".to_vec())
        .await;
    assert_eq!(reply.status, 200);
    server.wait_for_log("\"hook\":\"CanUpdateMachine\"");
    let discoveries = server
        .logs()
        .into_iter()
        .filter(|l| l.contains("\"hook\":\"Discovery\""))
        .count();
    assert_eq!(discoveries, 1, "{:#?}", server.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn rotated_certificate_is_served_to_new_connections_and_open_ones_survive() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &["--tls-reload-interval", "100ms"]);
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let before = client.served_cert(server.hooks).await;
    let mut open = client.keep_alive(server.hooks).await;
    assert_eq!(
        open.post(Hook::Discovery.path(), discovery_body())
            .await
            .unwrap()
            .0,
        200
    );

    // cert-manager style: new material appears under the same names (here: atomic renames).
    let next = tempfile::tempdir().unwrap();
    let rotated = write_dev_certs(&DevCertsSpec::with_defaults(
        next.path().to_owned(),
        vec![],
        vec![],
    ))
    .unwrap();
    std::fs::rename(&rotated.server_key, &certs.paths.server_key).unwrap();
    std::fs::rename(&rotated.server_cert, &certs.paths.server_cert).unwrap();
    let new_der = rustls_pki_types_der(&certs.paths.server_cert);
    assert_ne!(before, new_der);

    let new_client = Client::new(&rotated.ca_cert, None, true);
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        if let Ok(der) = tokio::time::timeout(
            Duration::from_secs(2),
            new_client_cert(&new_client, server.hooks),
        )
        .await
            && der.as_deref() == Some(new_der.as_slice())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "new certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = open
        .post(Hook::Discovery.path(), discovery_body())
        .await
        .expect("open connection survives rotation");
    assert_eq!(status, 200);
    server.wait_for_log("serving certificate reloaded");
}

async fn new_client_cert(client: &Client, addr: std::net::SocketAddr) -> Option<Vec<u8>> {
    // A handshake with the new CA only succeeds once the new certificate is served.
    let reply = client
        .request(addr, "POST", Hook::Discovery.path(), discovery_body())
        .await
        .ok()?;
    (reply.status == 200).then_some(())?;
    Some(client.served_cert(addr).await)
}

fn rustls_pki_types_der(path: &std::path::Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn client_ca_makes_hooks_require_a_client_certificate() {
    let certs = certs();
    let ca = certs.paths.ca_cert.to_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let token = inplace_updater::dispatch::upkeep::tokens::create_token(
        &inplace_updater::dispatch::AgentScope::Cluster {
            namespace: "default".into(),
            cluster: "edge-01".into(),
        },
        None,
    )
    .unwrap();
    let tokens = dir.path().join("agent-tokens");
    std::fs::write(&tokens, format!("{}\n", token.line)).unwrap();
    let server = ServerProcess::start(
        &certs.paths,
        &[
            "--client-ca",
            &ca,
            "--agent-tokens",
            tokens.to_str().unwrap(),
        ],
    );
    let anonymous = Client::new(&certs.paths.ca_cert, None, false);
    for (hook, fixture) in [
        (Hook::Discovery, "discovery-request.json"),
        (
            Hook::CanUpdateMachine,
            "can-update-machine-kcp-version.json",
        ),
        (Hook::CanUpdateMachineSet, "can-update-machineset-md.json"),
        (Hook::UpdateMachine, "update-machine-kcp.json"),
    ] {
        let reply = anonymous
            .post(server.hooks, hook.path(), common::fixture(fixture))
            .await;
        let body = String::from_utf8_lossy(&reply.body);
        assert_eq!(reply.status, 401, "{hook}: {body}");
        assert!(body.contains("client certificate"), "{hook}: {body}");
    }
    // The refused UpdateMachine recorded nothing.
    assert_eq!(
        plain_get(server.health, "/status").map(|(status, body)| (status, body.trim().to_string())),
        Some((200, "[]".to_string()))
    );
    // Agents present no client certificate: their routes are guarded by their token, not by --client-ca.
    let poll = serde_json::json!({
        "agent": {"machine": {"namespace": "default", "name": "edge-01-control-plane-abcde"}},
        "waitSeconds": 0
    });
    let reply = anonymous
        .request_with(
            server.hooks,
            inplace_agent_api::POLL_PATH,
            poll.to_string().into_bytes(),
            &[("authorization", &format!("Bearer {}", token.token))],
        )
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );

    let other = tempfile::tempdir().unwrap();
    let stranger = write_dev_certs(&DevCertsSpec::with_defaults(
        other.path().to_owned(),
        vec![],
        vec![],
    ))
    .unwrap();
    let wrong = Client::new(
        &certs.paths.ca_cert,
        Some((&stranger.client_cert, &stranger.client_key)),
        false,
    );
    assert!(
        wrong
            .request(
                server.hooks,
                "POST",
                Hook::Discovery.path(),
                discovery_body()
            )
            .await
            .is_err(),
        "a client certificate from another CA must fail the handshake"
    );

    let capi = Client::new(
        &certs.paths.ca_cert,
        Some((&certs.paths.client_cert, &certs.paths.client_key)),
        false,
    );
    let reply = capi
        .post(server.hooks, Hook::Discovery.path(), discovery_body())
        .await;
    assert_eq!(reply.status, 200);
    capi_sim::discover(&reply.body, "inplace-updater").expect("CAPI accepts discovery");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_in_flight_calls_then_exits_zero() {
    let certs = certs();
    let mut server = ServerProcess::start(&certs.paths, &[]);
    let client = Client::new(&certs.paths.ca_cert, None, true);
    let body = common::fixture("can-update-machine-kcp-version.json");

    // An in-flight call: headers and half the body sent, the rest only after SIGTERM.
    let (first, rest) = body.split_at(body.len() / 2);
    let mut stream = tls_stream(&certs.paths.ca_cert, server.hooks);
    write!(
        stream,
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        Hook::CanUpdateMachine.path(),
        body.len()
    )
    .unwrap();
    stream.write_all(first).unwrap();
    stream.flush().unwrap();
    wait_for_metric(&server, "inplace_updater_hook_calls_in_flight 1");
    server.signal("TERM");
    server.wait_for_log("shutting down");
    assert!(
        client
            .request(
                server.hooks,
                "POST",
                Hook::Discovery.path(),
                discovery_body()
            )
            .await
            .is_err(),
        "no new connections after SIGTERM"
    );
    stream.write_all(rest).unwrap();
    stream.flush().unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("CanUpdateMachineResponse"), "{answer}");
    let (code, took) = server.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(10));
}

fn wait_for_metric(server: &ServerProcess, needle: &str) {
    let deadline = std::time::Instant::now() + common::WAIT;
    while std::time::Instant::now() < deadline {
        if plain_get(server.metrics, "/metrics").is_some_and(|(_, text)| text.contains(needle)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("metric {needle:?} never appeared");
}

fn tls_stream(
    ca: &std::path::Path,
    addr: std::net::SocketAddr,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
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
    let conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(common::WAIT)).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

#[tokio::test(flavor = "multi_thread")]
async fn hook_port_serves_nothing_in_plaintext() {
    let certs = certs();
    let server = ServerProcess::start(&certs.paths, &[]);
    let answer = plain_get(server.hooks, Hook::Discovery.path());
    assert!(
        answer.as_ref().is_none_or(|(status, _)| *status != 200),
        "plaintext request got {answer:?}"
    );
    // And the health/metrics ports do answer plain HTTP; the metrics show the call made over TLS.
    let client = Client::new(&certs.paths.ca_cert, None, false);
    assert_eq!(
        client
            .post(server.hooks, Hook::Discovery.path(), discovery_body())
            .await
            .status,
        200
    );
    assert_eq!(plain_get(server.health, "/healthz").map(|r| r.0), Some(200));
    let (status, metrics) = plain_get(server.metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("inplace_updater_hook_duration_seconds_count{hook=\"Discovery\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("inplace_updater_hook_calls_total{hook=\"Discovery\",status=\"Success\"} 1"),
        "{metrics}"
    );
}

#[test]
fn unusable_certificate_files_stop_start_up_with_the_file_named() {
    let certs = certs();
    std::fs::write(&certs.paths.server_key, "not a key").unwrap();
    let output = std::process::Command::new(common::binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--health-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--store",
            "memory:",
        ])
        .arg("--tls-cert")
        .arg(&certs.paths.server_cert)
        .arg("--tls-key")
        .arg(&certs.paths.server_key)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tls.key"), "{stderr}");
}
