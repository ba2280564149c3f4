//! Agent token rotation with real processes: an agent whose token is past 2/3 of its life gets a successor,
//! keeps it in `<token-file>.next`, moves it over its token file once the server accepted it, and keeps
//! working across a server restart (file store); the old token stops working after the grace period; removing
//! the root line refuses the successor too. On two replicas of one etcd, the successor minted through one is
//! accepted by the other.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::agent_tokens::{aged_token, poll_body};
use crate::common;

use std::net::SocketAddr;
use std::path::Path;

use std::time::{Duration, Instant};

use common::fleet::{AgentProcess, Setup};
use common::{Client, ServerProcess};
use inplace_agent_api::POLL_PATH;
use inplace_store::testing::Etcd;

const MACHINE: &str = "edge-01-control-plane-abcde";

/// A setup whose agent token (and token-file line) is 2 h into a 3 h life: due for rotation.
fn aged_setup() -> Setup {
    let mut setup = Setup::new();
    let token = aged_token(2, 3);
    std::fs::write(&setup.tokens, format!("{}\n", token.line)).unwrap();
    std::fs::write(&setup.token_file, &token.token).unwrap();
    setup.token = token;
    setup
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until the agent has moved its successor over its token file; returns the successor.
fn rotated(setup: &Setup, agent: &AgentProcess, server: &ServerProcess) -> String {
    let next = setup.token_file.with_extension("next");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = read(&setup.token_file);
        if !now.is_empty() && now != setup.token.token && !next.exists() {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "no successor adopted; agent log:\n{}\nserver log:\n{}",
            agent.log(),
            server.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One poll of `MACHINE` with `token`: the status and the answer's message.
async fn poll(client: &Client, addr: SocketAddr, token: &str) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let reply = client
        .request_with(
            addr,
            POLL_PATH,
            poll_body(true),
            &[("authorization", &auth)],
        )
        .await
        .unwrap();
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_agent_keeps_working_across_a_restart_and_the_old_token_retires() {
    let setup = aged_setup();
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let mut args = setup.server_args(&store);
    args.extend(["--agent-token-grace", "1s", "--tls-reload-interval", "1s"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let certs = &setup.certs;
    let mut server = ServerProcess::start(&certs.paths, &args);
    let listen = server.hooks.to_string();
    let mut agent = setup.agent(&server, MACHINE, true);
    let successor = rotated(&setup, &agent, &server);
    assert!(successor.starts_with("iu1_"));
    assert!(
        !agent.log().contains(&successor) && !agent.log().contains(&setup.token.token),
        "tokens never reach the agent's log"
    );
    assert!(
        server.logs().iter().all(|line| !line.contains(&successor)),
        "nor the server's"
    );

    server.kill9();
    server = ServerProcess::start_at(&certs.paths, &listen, &args, None);
    let client = Client::new(&certs.paths.ca_cert, None, false);
    let (status, body) = poll(&client, server.hooks, &successor).await;
    assert_eq!(
        status, 200,
        "the restarted server knows the successor: {body}"
    );
    // The agent's successor was in use more than the 1 s grace ago: its old token is refused for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = poll(&client, server.hooks, &setup.token.token).await;
        if status == 401 {
            assert!(body.contains("superseded"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "still {status}: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agent, restarted too, connects to the restarted server with the successor from its token file.
    agent.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.log().matches("connected to the server").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "agent never reconnected:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !agent.log().contains("answered 401"),
        "the agent was never refused: {}",
        agent.log()
    );

    // Revoking the root line refuses the successor too.
    std::fs::write(&setup.tokens, "# revoked\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = poll(&client, server.hooks, &successor).await;
        if status == 401 {
            assert!(body.contains("revoked"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "still {status}: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_minted_through_one_replica_is_accepted_by_the_other() {
    let etcd = Etcd::start().expect("etcd (apt-get install etcd-server)");
    let setup = aged_setup();
    let args = setup.server_args(&etcd.store_url());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = ServerProcess::start(&setup.certs.paths, &args);
    let b = ServerProcess::start(&setup.certs.paths, &args);
    let agent = setup.agent(&a, MACHINE, true);
    let successor = rotated(&setup, &agent, &a);
    let client = Client::new(&setup.certs.paths.ca_cert, None, false);
    let (status, body) = poll(&client, b.hooks, &successor).await;
    assert_eq!(status, 200, "{body}");
    // A stranger's guess is not.
    let (status, _) = poll(&client, b.hooks, "iu1_guessed").await;
    assert_eq!(status, 401);
}
