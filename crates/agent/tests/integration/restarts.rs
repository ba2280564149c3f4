//! Restarts: crash mid-step, clean shutdown mid-step, a step that keeps being interrupted, and a
//! corrupt state file. The agent's state dir is what carries progress across them.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fixtures::*;
use common::*;
use inplace_agent::api::*;

/// `kubeadm upgrade node` blocks until `<root>/release` exists.
fn blocking_kubeadm(node: &Node) {
    node.fake(
        "kubeadm",
        "[ \"$1\" = version ] && echo v1.34.1 && exit 0\nwhile [ ! -f \"$INPLACE_ROOT/release\" ]; do sleep 0.05; done",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_step_resumes_at_that_step_without_repeating_finished_ones() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    blocking_kubeadm(&node);
    server.offer(upgrade_plan("plan-crash"));
    let config = node.agent_config(&server, TOKEN, DRIVERS);
    let first = spawn_agent(config.clone());
    wait_until("step 1 running", LIMIT, || {
        node.calls("kubeadm upgrade node") == 1
    })
    .await;
    first.crash().await;

    // Nothing was delivered or finished after the crash; a new agent on the same state dir
    // resumes at step 1 (attempt 2) and never re-runs step 0.
    let second = spawn_agent(config);
    wait_until("step 1 re-run", LIMIT, || {
        node.calls("kubeadm upgrade node") == 2
    })
    .await;
    node.write("/release", "");
    wait_until("plan succeeded", LIMIT, || {
        server
            .reports_for(2)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    let step0 = server.reports_for(0);
    assert!(
        step0.iter().all(|r| r.attempt == 1),
        "step 0 ran once: {:?}",
        statuses(&step0)
    );
    assert_eq!(
        step0
            .iter()
            .filter(|r| r.status == StepStatus::Succeeded)
            .count(),
        1
    );
    let step1 = statuses(&server.reports_for(1));
    assert!(step1.contains(&(StepStatus::Running, 2)), "{step1:?}");
    assert_eq!(step1.last(), Some(&(StepStatus::Succeeded, 2)));
    assert_eq!(node.calls("apt-get"), 1);
    assert_eq!(node.calls("kubeadm upgrade node"), 2);
    second.shutdown().await;

    // A third start after the plan finished does nothing again.
    let third = spawn_agent(node.agent_config(&server, TOKEN, DRIVERS));
    let polls_before = server.with(|s| s.polls.len());
    wait_until("third agent polling", LIMIT, || {
        server.with(|s| s.polls.len() > polls_before)
    })
    .await;
    assert_eq!(node.calls("kubeadm upgrade node"), 2);
    third.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_mid_step_does_not_count_an_attempt() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    blocking_kubeadm(&node);
    server.offer(upgrade_plan("plan-stop"));
    let config = node.agent_config(&server, TOKEN, DRIVERS);
    let first = spawn_agent(config.clone());
    wait_until("step 1 running", LIMIT, || {
        node.calls("kubeadm upgrade node") == 1
    })
    .await;
    // The shutdown kills the blocked command's process group and returns.
    first.shutdown().await;
    let second = spawn_agent(config);
    wait_until("step 1 started again", LIMIT, || {
        node.calls("kubeadm upgrade node") == 2
    })
    .await;
    node.write("/release", "");
    wait_until("plan succeeded", LIMIT, || {
        server
            .reports_for(2)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    let step1 = server.reports_for(1);
    assert!(
        step1.iter().all(|r| r.attempt == 1),
        "{:?}",
        step1
            .iter()
            .map(|r| (r.status, r.attempt))
            .collect::<Vec<_>>()
    );
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_interrupted_too_often_fails_instead_of_looping() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    fakes(&node);
    blocking_kubeadm(&node);
    server.offer(upgrade_plan("plan-flaky"));
    let config = node.agent_config(&server, TOKEN, DRIVERS);
    for attempt in 1..=inplace_agent::MAX_STEP_ATTEMPTS as usize {
        let agent = spawn_agent(config.clone());
        wait_until("step 1 running", LIMIT, || {
            node.calls("kubeadm upgrade node") == attempt
        })
        .await;
        agent.crash().await;
    }
    let last = spawn_agent(config);
    wait_until("step 1 failed", LIMIT, || {
        server
            .reports_for(1)
            .iter()
            .any(|r| r.status == StepStatus::Failed)
    })
    .await;
    let failed = server
        .reports_for(1)
        .into_iter()
        .find(|r| r.status == StepStatus::Failed)
        .unwrap();
    assert!(
        failed
            .message
            .as_deref()
            .unwrap()
            .contains("interrupted 3 times"),
        "{failed:?}"
    );
    assert_eq!(
        node.calls("kubeadm upgrade node"),
        3,
        "not started a 4th time"
    );
    assert!(server.reports_for(2).is_empty());
    last.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_is_refused_and_left_untouched() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    std::fs::create_dir_all(&node.state).unwrap();
    let state_file = node.state.join("state.json");
    std::fs::write(&state_file, "{\"format\": 1, \"current\": tru").unwrap();
    let err = inplace_agent::run(node.agent_config(&server, TOKEN, DRIVERS), async {})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("state.json is unreadable"),
        "{err}"
    );
    assert!(err.to_string().contains("move it away"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&state_file).unwrap(),
        "{\"format\": 1, \"current\": tru"
    );
}

/// `installKubelet` whose `skipIf` passes as soon as the package is in; `apt-get` installs, then
/// blocks until `<root>/release` exists.
const SKIP_IF_DRIVERS: &str = r#"
kubernetes:
  installKubelet:
    skipIf: {run: [kubelet, --version], stdoutEquals: "Kubernetes {{version}}"}
    commands:
      - run: [apt-mark, unhold, kubelet]
      - run: [apt-get, install, -y, "kubelet={{bareVersion}}-*"]
      - run: [systemctl, daemon-reload]
      - run: [systemctl, restart, kubelet]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_inside_a_sequence_resumes_it_and_skip_if_is_not_consulted() {
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    node.write("/kubelet-version", "v1.33.4\n");
    node.fake(
        "kubelet",
        "echo \"Kubernetes $(cat \"$INPLACE_ROOT/kubelet-version\")\"",
    );
    node.fake(
        "apt-get",
        "echo v1.34.1 > \"$INPLACE_ROOT/kubelet-version\"\nwhile [ ! -f \"$INPLACE_ROOT/release\" ]; do sleep 0.05; done",
    );
    node.fake("apt-mark", "exit 0");
    node.fake("systemctl", "exit 0");
    node.fake("kubeadm", "echo v1.34.1");
    let kubelet_step = step(
        0,
        "install kubelet v1.34.1",
        StepAction::InstallKubelet {
            version: "v1.34.1".into(),
        },
    );
    server.offer(plan("plan-term", vec![kubelet_step]));
    let config = node.agent_config(&server, TOKEN, SKIP_IF_DRIVERS);
    let first = spawn_agent(config.clone());
    wait_until("inside apt-get install", LIMIT, || {
        node.calls("apt-get") == 1
    })
    .await;
    // The package is in, so `kubelet --version` already says v1.34.1; the shutdown comes before
    // daemon-reload and the restart.
    first.shutdown().await;
    let state = std::fs::read_to_string(node.state.join("state.json")).unwrap();
    assert!(state.contains("\"done\":1"), "progress recorded: {state}");
    node.write("/release", "");
    let second = spawn_agent(config);
    wait_until("plan succeeded", LIMIT, || {
        server
            .reports_for(0)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    second.shutdown().await;
    let log = std::fs::read_to_string(node.path("/calls.log")).unwrap();
    let calls: Vec<&str> = log
        .lines()
        .filter(|l| !l.starts_with("kubelet") && !l.starts_with("kubeadm"))
        .collect();
    assert_eq!(
        calls,
        [
            "apt-mark unhold kubelet",
            "apt-get install -y kubelet=1.34.1-*",
            // Resumed at the interrupted command; the first one is not repeated.
            "apt-get install -y kubelet=1.34.1-*",
            "systemctl daemon-reload",
            "systemctl restart kubelet",
        ]
    );
    let succeeded = server
        .reports_for(0)
        .into_iter()
        .find(|r| r.status == StepStatus::Succeeded)
        .unwrap();
    assert!(
        succeeded
            .message
            .as_deref()
            .unwrap()
            .contains("resumed at command 2 of 4"),
        "{succeeded:?}"
    );
    assert_eq!(
        succeeded.attempt, 1,
        "a clean stop does not count an attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_left_by_an_older_agent_stopped_mid_step_is_resumed_not_skipped() {
    // An agent from before per-command progress was stopped cleanly inside installKubelet: it put
    // the step back to pending and uncounted the attempt, but kept startedAtUnixMs. It is then
    // upgraded; the package is in, so skipIf would pass.
    let server = TestServer::start(TOKEN).await;
    let node = Node::new();
    node.write("/kubelet-version", "v1.34.1\n");
    node.fake(
        "kubelet",
        "echo \"Kubernetes $(cat \"$INPLACE_ROOT/kubelet-version\")\"",
    );
    for fake in ["apt-get", "apt-mark", "systemctl"] {
        node.fake(fake, "exit 0");
    }
    node.fake("kubeadm", "echo v1.34.1");
    let kubelet_step = step(
        0,
        "install kubelet v1.34.1",
        StepAction::InstallKubelet {
            version: "v1.34.1".into(),
        },
    );
    let old_plan = plan("plan-old", vec![kubelet_step]);
    std::fs::create_dir_all(&node.state).unwrap();
    std::fs::write(
        node.state.join("plan-plan-old.json"),
        serde_json::to_vec(&old_plan).unwrap(),
    )
    .unwrap();
    std::fs::write(
        node.state.join("state.json"),
        r#"{"format":1,"current":{"planId":"plan-old","steps":[{"status":"pending","attempt":0,"startedAtUnixMs":1700000000000,"finishedAtUnixMs":null,"exitCode":null,"stderrTail":null,"message":null}]},"outbox":[]}"#,
    )
    .unwrap();
    server.offer(old_plan);
    let agent = spawn_agent(node.agent_config(&server, TOKEN, SKIP_IF_DRIVERS));
    wait_until("plan succeeded", LIMIT, || {
        server
            .reports_for(0)
            .iter()
            .any(|r| r.status == StepStatus::Succeeded)
    })
    .await;
    agent.shutdown().await;
    let log = std::fs::read_to_string(node.path("/calls.log")).unwrap();
    let calls: Vec<&str> = log
        .lines()
        .filter(|l| !l.starts_with("kubelet") && !l.starts_with("kubeadm"))
        .collect();
    assert_eq!(
        calls,
        [
            "apt-mark unhold kubelet",
            "apt-get install -y kubelet=1.34.1-*",
            "systemctl daemon-reload",
            "systemctl restart kubelet",
        ],
        "no progress was recorded, so every command runs"
    );
}
