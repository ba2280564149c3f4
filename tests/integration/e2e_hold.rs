//! Pause and cancel end to end, all real processes over TLS: a Machine annotation (or the ExtensionConfig
//! `paused` setting) pauses a multi-step rollout after the step that is running, UpdateMachine says so, and
//! removing it finishes the update; a cancel annotation stops a run after its running step with Failure
//! "cancelled by operator", and the operator retry then finishes it.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::{Duration, Instant};

use capi_sim::UpdateOutcome;
use common::fleet::{AgentProcess, Capi, Setup, update_request};
use common::{ServerProcess, plain_get};
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);
const FIRST: &str = "edge-01-control-plane-aaaaa";

fn annotated(request: &Value, name: &str, value: &str) -> Value {
    let mut request = request.clone();
    request["desired"]["machine"]["metadata"]["annotations"][name] = json!(value);
    request
}

fn calls(agent: &AgentProcess, prefix: &str) -> usize {
    agent
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.starts_with(prefix))
        .count()
}

/// Calls UpdateMachine with `request` until its in-progress message satisfies `until`; returns it.
async fn message_until(
    capi: &Capi,
    request: &Value,
    mut until: impl FnMut(&str) -> bool,
) -> String {
    let deadline = Instant::now() + SETTLE;
    loop {
        let outcome = capi.update_machine(request).await;
        let UpdateOutcome::InProgress { message, .. } = &outcome else {
            panic!("not in progress: {outcome:?}")
        };
        if until(message) {
            return message.clone();
        }
        assert!(Instant::now() < deadline, "last message: {message}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts FIRST's update and waits until its agent is inside `kubeadm upgrade apply` (held there by the gate).
async fn inside_kubeadm(capi: &Capi, agent: &AgentProcess, request: &Value) -> String {
    agent.sandbox.gate_kubeadm(true).unwrap();
    capi.kcp_judges(FIRST).await;
    message_until(capi, request, |m| {
        m.contains("kubeadm upgrade apply") && calls(agent, "kubeadm upgrade apply") == 1
    })
    .await
}

fn series(server: &ServerProcess, state: &str) -> String {
    let text = plain_get(server.metrics, "/metrics").unwrap().1;
    let name = format!("inplace_updater_updates{{state=\"{state}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_mid_rollout_holds_after_the_running_step_and_removing_it_finishes() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    let request = update_request("update-machine-kcp.json", FIRST);
    let running = inside_kubeadm(&capi, &agent, &request).await;
    let step = running.split(':').next().unwrap().to_owned(); // "step k/n"
    let (k, n) = step
        .trim_start_matches("step ")
        .split_once('/')
        .map(|(k, n)| (k.parse::<usize>().unwrap(), n.parse::<usize>().unwrap()))
        .unwrap();
    assert!(k < n, "a step follows the kubeadm step: {running}");

    // The operator pauses while `kubeadm upgrade apply` runs: it is said to finish first.
    let paused = annotated(&request, "inplace-updater.dev/paused", "alice: etcd check");
    let message = capi.update_machine(&paused).await;
    assert!(
        matches!(&message, UpdateOutcome::InProgress { message, .. } if message.starts_with(
            &format!("paused by annotation inplace-updater.dev/paused=alice: etcd check: step {k}/{n}: ")
        ) && message.contains("is running and finishes first")),
        "{message:?}"
    );
    let installs = calls(&agent, "apt-get install -y kubelet");
    agent.sandbox.gate_kubeadm(false).unwrap();

    // The step finishes, the agent confirms it stopped, and nothing after it starts.
    let held = message_until(&capi, &paused, |m| {
        !m.contains("finishes first") && !m.contains("not confirmed")
    })
    .await;
    assert_eq!(
        held,
        format!(
            "paused by annotation inplace-updater.dev/paused=alice: etcd check after step {k} of {n}; to resume: \
             kubectl annotate machine -n default {FIRST} inplace-updater.dev/paused-"
        )
    );
    assert_eq!(series(&server, "paused"), "1");
    // Several answers later (each a full exchange with the store), still no new step.
    for _ in 0..5 {
        let again = message_until(&capi, &paused, |_| true).await;
        assert_eq!(again, held);
    }
    assert_eq!(calls(&agent, "apt-get install -y kubelet"), installs);
    assert_eq!(calls(&agent, "kubeadm upgrade apply"), 1);

    // Resumed by removing the annotation: the agent continues with the next step and the update is done.
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert_eq!(calls(&agent, "kubeadm upgrade apply"), 1, "not run again");
    assert!(calls(&agent, "apt-get install -y kubelet") > installs);
    assert_eq!(series(&server, "paused"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_after_the_running_step_with_failure_and_a_retry_finishes_it() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    let request = update_request("update-machine-kcp.json", FIRST);
    let running = inside_kubeadm(&capi, &agent, &request).await;
    let k = running
        .trim_start_matches("step ")
        .split('/')
        .next()
        .unwrap()
        .to_owned();

    let cancel = annotated(&request, "inplace-updater.dev/cancel", "INC-42");
    let message = capi.update_machine(&cancel).await;
    assert!(
        matches!(&message, UpdateOutcome::InProgress { message, .. }
            if message.starts_with(&format!("cancelling (inplace-updater.dev/cancel=INC-42): step {k}/"))),
        "{message:?}"
    );
    let installs = calls(&agent, "apt-get install -y kubelet");
    agent.sandbox.gate_kubeadm(false).unwrap();
    let (outcome, messages) = capi.update_until_settled(&cancel, SETTLE).await;
    let UpdateOutcome::Failed { message } = outcome else {
        panic!("{outcome:?} {messages:?}")
    };
    assert!(
        message.starts_with(&format!(
            "cancelled by operator (inplace-updater.dev/cancel=INC-42) after step {k} of "
        )) && message.contains("inplace-updater.dev/retry="),
        "{message}"
    );
    assert_eq!(calls(&agent, "apt-get install -y kubelet"), installs);
    assert_eq!(series(&server, "cancelled"), "1");
    // The same answer again: the cancel is not undone by asking again.
    assert!(matches!(
        capi.update_machine(&cancel).await,
        UpdateOutcome::Failed { .. }
    ));

    // The operator retries (the spent cancel value may stay on the Machine): the fresh run finishes.
    let retry = annotated(&cancel, "inplace-updater.dev/retry", "1764780000");
    let (outcome, messages) = capi.update_until_settled(&retry, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert!(calls(&agent, "apt-get install -y kubelet") > installs);
    assert_eq!(series(&server, "cancelled"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extension_config_setting_pauses_every_machine_until_it_is_removed() {
    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let agent = setup.agent(&server, FIRST, true);
    let request = update_request("update-machine-kcp.json", FIRST);
    let mut paused = request.clone();
    paused["settings"] = json!({ "paused": "change freeze" });
    capi.kcp_judges(FIRST).await;

    // A brand-new run under the setting is handed to the agent held: it confirms before step 1.
    let held = message_until(&capi, &paused, |m| !m.contains("not confirmed")).await;
    assert!(
        held.starts_with("paused by ExtensionConfig setting paused=change freeze after step 0 of ")
            && held.ends_with("to resume, remove the ExtensionConfig setting paused"),
        "{held}"
    );
    assert_eq!(calls(&agent, "apt-get install"), 0);
    assert_eq!(calls(&agent, "kubeadm upgrade"), 0);

    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert_eq!(calls(&agent, "kubeadm upgrade apply"), 1);
}
