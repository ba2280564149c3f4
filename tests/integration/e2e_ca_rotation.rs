//! A CA rotation end to end with real processes and real certificates: the server's certificate comes from
//! CA-old and the agent trusts CA-old; the served bundle becomes old+new (the agent's `--ca-file` follows);
//! the serving certificate switches to one from CA-new (the agent keeps connecting, also after a restart
//! that reads its file afresh); the bundle becomes new only (the agent's file follows). A bundle that would
//! not verify the server is refused by the server and never reaches the agent.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::Path;
use std::time::Instant;

use inplace_updater::cmd::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use inplace_updater::dispatch::upkeep::served_ca::sha256_hex;
use serde_json::Value;

use crate::common::fleet::{AgentProcess, Setup, wait_until};
use crate::common::{Client, ServerProcess, plain_get};
use inplace_updater::cmd::demo::Sandbox;

/// Writes `bytes` to `path` the way a Secret update lands: a complete new file under the same name.
fn replace(path: &Path, bytes: &[u8]) {
    let temp = path.with_extension("new");
    std::fs::write(&temp, bytes).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The agent's row of `status --agents`, as the server's health port serves it.
fn agent_row(server: &ServerProcess) -> Option<Value> {
    let (status, body) = plain_get(server.health, "/status/agents")?;
    assert_eq!(status, 200, "{body}");
    let rows: Vec<Value> = serde_json::from_str(&body).unwrap();
    rows.into_iter()
        .find(|row| row["machine"] == "default/edge-01-cp-0")
}

/// Waits until the agent's row says it trusts `digest`, and that it is the served bundle.
fn wait_reported(server: &ServerProcess, digest: &str) {
    wait_until(&format!("the agent to report CA {digest}"), || {
        agent_row(server).is_some_and(|row| {
            row["caSha256"] == digest && row["caServed"] == true && row["connected"] == true
        })
    });
}

/// Waits until the server has heard from the agent again, later than now (plus a full poll).
fn wait_heard_again(server: &ServerProcess) {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 1500;
    wait_until("the agent to be heard from again", || {
        agent_row(server).is_some_and(|row| row["lastSeenMs"].as_u64() > Some(since))
    });
}

fn connections(agent: &AgentProcess) -> usize {
    agent.log().matches("connected to the server").count()
}

fn new_ca(dir: &Path) -> DevCertPaths {
    write_dev_certs(&DevCertsSpec::with_defaults(dir.to_owned(), vec![], vec![])).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_follow_a_ca_rotation_and_keep_connecting_throughout() {
    let started = Instant::now();
    let setup = Setup::new();
    let old = setup.certs.paths.clone();
    let new_dir = tempfile::tempdir().unwrap();
    let new = new_ca(new_dir.path());
    let (old_ca, new_ca_pem) = (read(&old.ca_cert), read(&new.ca_cert));

    let bundle = setup.dir.path().join("agent-ca-bundle.pem");
    replace(&bundle, &old_ca);
    let agent_ca = setup.dir.path().join("agent-ca.crt");
    replace(&agent_ca, &old_ca);
    let bundle_arg = bundle.display().to_string();
    let (server, _capi) = setup.serve(
        "memory:",
        &[
            "--agent-ca-bundle",
            &bundle_arg,
            "--tls-reload-interval",
            "100ms",
        ],
    );
    let sandbox = Sandbox::create(&setup.dir.path().join("cp-0"), "v1.33.4", true).unwrap();
    let mut agent = AgentProcess::start_with(
        &server,
        &agent_ca,
        &setup.token_file,
        "edge-01-cp-0",
        sandbox,
        &["--poll-wait", "1"],
    );

    // Phase 0: the agent trusts the served bundle.
    wait_reported(&server, &sha256_hex(&old_ca));

    // Only authenticated agents get the bundle.
    let client = Client::new(&old.ca_cert, None, true);
    let anonymous = client
        .get_with(server.hooks, "/agent/v1/ca", &[])
        .await
        .unwrap();
    assert_eq!(anonymous.status, 401);
    let bearer = format!("Bearer {}", setup.token.token);
    let served = client
        .get_with(server.hooks, "/agent/v1/ca", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(
        (served.status, served.body.as_slice()),
        (200, old_ca.as_slice())
    );

    // Phase 1: old + new. The agent's file follows.
    let both = [old_ca.as_slice(), new_ca_pem.as_slice()].concat();
    replace(&bundle, &both);
    wait_until("the agent's CA file to hold old and new", || {
        read(&agent_ca) == both
    });
    wait_reported(&server, &sha256_hex(&both));

    // Phase 2: the serving certificate switches to one from CA-new.
    replace(&old.server_key, &read(&new.server_key));
    replace(&old.server_cert, &read(&new.server_cert));
    // The test's own client trusts both, so it sees which one is served without failing its handshake.
    let both_file = setup.dir.path().join("both.pem");
    replace(&both_file, &both);
    let either = Client::new(&both_file, None, true);
    let new_client = Client::new(&new.ca_cert, None, true);
    let new_leaf = rustls_pki_types::pem::PemObject::from_pem_file(&new.server_cert)
        .map(|der: rustls_pki_types::CertificateDer<'static>| der.to_vec())
        .unwrap();
    let deadline = Instant::now() + crate::common::WAIT;
    while either.served_cert(server.hooks).await != new_leaf {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // A restarted agent reads its file afresh and makes a new handshake against the new certificate.
    let before = connections(&agent);
    agent.restart();
    wait_until("the restarted agent to connect", || {
        connections(&agent) > before
    });
    wait_heard_again(&server);

    // Phase 3: new only. The agent's file follows, and the agent still connects after a restart.
    replace(&bundle, &new_ca_pem);
    wait_until("the agent's CA file to hold only the new CA", || {
        read(&agent_ca) == new_ca_pem
    });
    wait_reported(&server, &sha256_hex(&new_ca_pem));
    let before = connections(&agent);
    agent.restart();
    wait_until("the agent to connect trusting only the new CA", || {
        connections(&agent) > before
    });

    // A bundle that would not verify the server (a stranger's CA only) is refused and never handed out.
    let stranger_dir = tempfile::tempdir().unwrap();
    let stranger = read(&new_ca(stranger_dir.path()).ca_cert);
    replace(&bundle, &stranger);
    let refusal = server.wait_for_log("agent CA bundle refused");
    assert!(refusal.contains(&bundle_arg), "names the file: {refusal}");
    wait_heard_again(&server);
    wait_heard_again(&server);
    assert_eq!(
        read(&agent_ca),
        new_ca_pem,
        "the refused bundle reached the agent"
    );
    wait_reported(&server, &sha256_hex(&new_ca_pem));
    let still = new_client
        .get_with(server.hooks, "/agent/v1/ca", &[("authorization", &bearer)])
        .await
        .unwrap();
    assert_eq!(still.body, new_ca_pem, "the last good bundle stays served");
    assert!(
        !agent.log().contains("CA file kept"),
        "no failed update on the way: {}",
        agent.log()
    );
    eprintln!("CA rotation end to end took {:?}", started.elapsed());
}
