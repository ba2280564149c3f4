//! Durability, all real processes: the server is killed with SIGKILL at the worst moments of a rollout and
//! restarted on the same embedded store; the rollout completes, no step runs twice, and no answer after a
//! restart contradicts one before it. A CanUpdate verdict recorded before a restart is honoured after it.

use crate::common;

use std::time::Duration;

use capi_sim::UpdateOutcome;
use common::fleet::{AgentProcess, Capi, Setup, update_request, wait_until};
use common::{Client, ServerProcess, plain_get};

const MACHINES: [&str; 3] = [
    "edge-01-control-plane-aaaaa",
    "edge-01-control-plane-bbbbb",
    "edge-01-control-plane-ccccc",
];
const SETTLE: Duration = Duration::from_secs(90);

/// Where an UpdateMachine answer says the run is: waiting (0), step i (i), done (usize::MAX); failures panic.
fn progress(outcome: &UpdateOutcome) -> usize {
    match outcome {
        UpdateOutcome::Done => usize::MAX,
        UpdateOutcome::InProgress { message, .. } => message
            .strip_prefix("step ")
            .and_then(|rest| rest.split('/').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        other => panic!("no answer may be a failure here: {other:?}"),
    }
}

fn status_state(server: &ServerProcess, machine: &str) -> Option<String> {
    let (code, body) = plain_get(server.health, "/status")?;
    if code != 200 {
        return None;
    }
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
    rows.iter()
        .find(|r| r["machine"] == format!("default/{machine}") && r["state"] != "superseded")
        .and_then(|r| r["state"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_server_resumes_the_rollout_without_repeating_a_step() {
    let setup = Setup::new();
    let certs = &setup.certs;
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let args = setup.server_args(&store);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = ServerProcess::start(&certs.paths, &args);
    let listen = server.hooks.to_string();
    let restart = |server: &mut ServerProcess| {
        server.kill9();
        *server = ServerProcess::start_at(&certs.paths, &listen, &args, None);
    };

    let agents: Vec<AgentProcess> = MACHINES
        .iter()
        .map(|name| setup.agent(&server, name, true))
        .collect();
    let capi = Capi {
        client: Client::new(&certs.paths.ca_cert, None, false),
        addr: server.hooks,
    };

    // 0. Killed between CanUpdateMachine and UpdateMachine: the verdict is on disk.
    capi.kcp_judges(MACHINES[0]).await;
    restart(&mut server);

    // 1. Killed right after UpdateMachine recorded the work.
    let first = update_request("update-machine-kcp.json", MACHINES[0]);
    let before = progress(&capi.update_machine(&first).await);
    restart(&mut server);
    let after = progress(&capi.update_machine(&first).await);
    assert!(
        after >= before,
        "after a restart the answer does not go back: {before} then {after}"
    );
    assert_eq!(
        capi.update_until_settled(&first, SETTLE).await.0,
        UpdateOutcome::Done
    );

    // 2. Killed while the agent is inside a step.
    agents[1].sandbox.slow_kubeadm(true).unwrap();
    let second = update_request("update-machine-kcp.json", MACHINES[1]);
    capi.kcp_judges(MACHINES[1]).await;
    let mut last = progress(&capi.update_machine(&second).await);
    let sandbox = agents[1].sandbox.clone();
    wait_until("the agent to be inside kubeadm upgrade", || {
        sandbox
            .calls()
            .iter()
            .any(|c| c.starts_with("kubeadm upgrade"))
    });
    last = last.max(progress(&capi.update_machine(&second).await));
    restart(&mut server);
    agents[1].sandbox.slow_kubeadm(false).unwrap();
    let now = progress(&capi.update_machine(&second).await);
    assert!(
        now >= last,
        "answers stay consistent across the restart: {last} then {now}"
    );
    assert_eq!(
        capi.update_until_settled(&second, SETTLE).await.0,
        UpdateOutcome::Done
    );

    // 3. Killed after the agent reported done, before CAPI asked again.
    let third = update_request("update-machine-kcp.json", MACHINES[2]);
    capi.kcp_judges(MACHINES[2]).await;
    capi.update_machine(&third).await;
    let probe = &server;
    wait_until("the run to be recorded done", || {
        status_state(probe, MACHINES[2]).as_deref() == Some("done")
    });
    restart(&mut server);
    assert_eq!(
        capi.update_machine(&third).await,
        UpdateOutcome::Done,
        "done stays done"
    );

    for agent in &agents {
        let calls = agent.sandbox.calls();
        let installs = calls
            .iter()
            .filter(|c| c.contains("install -y kubeadm=1.34.1"))
            .count();
        let upgrades = calls
            .iter()
            .filter(|c| c.starts_with("kubeadm upgrade"))
            .count();
        assert_eq!(
            (installs, upgrades),
            (1, 1),
            "{}: every step ran exactly once: {calls:?}",
            agent.name
        );
        assert_eq!(agent.sandbox.kubelet_version(), "v1.34.1");
    }
    let applies: usize = agents
        .iter()
        .map(|a| {
            a.sandbox
                .calls()
                .iter()
                .filter(|c| c.starts_with("kubeadm upgrade apply"))
                .count()
        })
        .sum();
    assert_eq!(
        applies, 1,
        "kubeadm upgrade apply ran once in the cluster, restarts notwithstanding"
    );

    // The operator's view after all that: every Machine done, from the running server's health port.
    let output = std::process::Command::new(common::binary())
        .args(["status", "--server", &format!("http://{}", server.health)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.starts_with("cluster edge-01"), "{text}");
    for machine in MACHINES {
        let line = text
            .lines()
            .find(|l| l.contains(machine))
            .unwrap_or_else(|| panic!("{machine} missing: {text}"));
        assert!(line.contains(" done "), "{line}");
    }
}
