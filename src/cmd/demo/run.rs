//! The demo rollout as CAPI drives it: a simulated CAPI upgrading every Machine from v1.33.4 to v1.34.1 —
//! control plane one by one, as KubeadmControlPlane does, then the workers — printing each Machine's progress
//! as CAPI would show it. As CAPI does, it asks CanUpdateMachine for each control-plane Machine and
//! CanUpdateMachineSet once for the workers' new MachineSet before it calls UpdateMachine.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::agents::reboot_if_asked;
use super::scenario::Scenario;
use super::setup::{
    Demo, DemoError, MachineResult, Start, ask, node_report, request_for, setup, start,
};
use crate::api::Hook;

/// Longest the demo waits for one Machine's update.
pub const MACHINE_DEADLINE: Duration = Duration::from_secs(120);
/// How often the simulated CAPI calls UpdateMachine (CAPI itself honours retryAfterSeconds).
pub const CALL_INTERVAL: Duration = Duration::from_millis(200);
/// The result of a Machine whose update failed and whose agent rolled the node back.
pub const ROLLED_BACK: &str = "rolled back";
/// The result of a Machine the rollout never reached because an earlier one failed.
pub const NOT_STARTED: &str = "not started";

pub(super) const CONTROL_PLANE_REQUEST: &str =
    include_str!("../../../tests/fixtures/update-machine-kcp.json");
pub(super) const WORKER_REQUEST: &str =
    include_str!("../../../tests/fixtures/update-machine-worker.json");
const CONTROL_PLANE_QUESTION: &str =
    include_str!("../../../tests/fixtures/can-update-machine-kcp-version.json");
pub(super) const WORKER_QUESTION: &str =
    include_str!("../../../tests/fixtures/can-update-machineset-md.json");

/// Runs the demo with `machines` Machines in `dir`, printing progress to stdout; the kubelet restart of Machine
/// `fail` (1-based) fails.
pub async fn run(
    machines: usize,
    dir: &Path,
    fail: Option<usize>,
    scenario: &Scenario,
) -> Result<Vec<MachineResult>, DemoError> {
    let Demo {
        addr,
        ca,
        launch,
        mut children,
        nodes,
    } = start(&Start {
        machines,
        dir,
        fail,
        scenario,
        workers_only: false,
        serve_flags: Vec::new(),
    })?;
    let addr = addr.hooks;
    println!("\n{}\n", scenario.headline());

    let started = Instant::now();
    let mut results = Vec::new();
    let mut workers_judged = false;
    for (i, node) in nodes.iter().enumerate() {
        let (name, sandbox) = (&node.name, &node.sandbox);
        // CAPI does not go on to the next Machine while one failed: KCP and a MachineDeployment with
        // maxUnavailable 1 wait for it.
        if results.iter().any(|r: &MachineResult| r.result != "done") {
            results.push(MachineResult {
                name: name.clone(),
                result: NOT_STARTED.to_owned(),
                took: Duration::ZERO,
                kubeadm: Vec::new(),
                node: node_report(sandbox),
                os: (sandbox.os_image(), sandbox.reboots()),
            });
            continue;
        }
        let template = if node.control_plane {
            let question = scenario.request(request_for(CONTROL_PLANE_QUESTION, name)?);
            let what = format!("default/{name}");
            ask(addr, &ca, Hook::CanUpdateMachine, &question, started, &what).await?;
            CONTROL_PLANE_REQUEST
        } else {
            if !workers_judged {
                let question: Value = scenario.request(
                    serde_json::from_str(WORKER_QUESTION).map_err(setup("built-in request"))?,
                );
                let set = &question["desired"]["machineSet"]["metadata"]["name"];
                let what = format!("MachineSet default/{}", set.as_str().unwrap_or_default());
                ask(
                    addr,
                    &ca,
                    Hook::CanUpdateMachineSet,
                    &question,
                    started,
                    &what,
                )
                .await?;
                workers_judged = true;
            }
            WORKER_REQUEST
        };
        let request = scenario.request(request_for(template, name)?);
        let begun = Instant::now();
        let mut last = String::new();
        let result = loop {
            let path = format!("{}?timeout=10s", Hook::UpdateMachine.path());
            let (status, body) = crate::cmd::http::post_tls(
                addr,
                "localhost",
                &ca,
                &path,
                request.to_string().into_bytes(),
            )
            .await
            .map_err(|e| DemoError::Rollout(format!("UpdateMachine for {name}: {e}")))?;
            let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
            let message = answer["message"].as_str().unwrap_or_default().to_string();
            let retry = answer["retryAfterSeconds"].as_i64().unwrap_or_default();
            if message != last {
                println!(
                    "[{:6.1}s] default/{name}: {message}",
                    started.elapsed().as_secs_f64()
                );
                last = message.clone();
            }
            match (status, answer["status"].as_str(), retry) {
                (200, Some("Success"), 0) => break "done".to_string(),
                (200, Some("Success"), _) => {}
                _ if message.contains("; rolled back step") => break ROLLED_BACK.to_owned(),
                _ => break format!("failed: {message}"),
            }
            if let Some(line) = reboot_if_asked(&launch, name, sandbox, &mut children.0[i + 1])? {
                println!(
                    "[{:6.1}s] default/{name}: {line}",
                    started.elapsed().as_secs_f64()
                );
            }
            if begun.elapsed() > MACHINE_DEADLINE {
                break format!("not done after {}s", MACHINE_DEADLINE.as_secs());
            }
            tokio::time::sleep(CALL_INTERVAL).await;
        };
        let kubeadm = sandbox
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("kubeadm upgrade"))
            .collect();
        results.push(MachineResult {
            name: name.clone(),
            result,
            took: begun.elapsed(),
            kubeadm,
            node: node_report(sandbox),
            os: (sandbox.os_image(), sandbox.reboots()),
        });
    }
    drop(children);
    Ok(results)
}

/// The summary table.
pub fn summary(results: &[MachineResult]) -> String {
    let mut out = String::from("\nsummary\n");
    for r in results {
        out.push_str(&format!(
            "  default/{:<32} {:<13} {:>6.1}s  {}\n  {:<47} node: {}\n",
            r.name,
            r.result,
            r.took.as_secs_f64(),
            r.kubeadm.join("; "),
            "",
            r.node
        ));
    }
    let done = results.iter().filter(|r| r.result == "done").count();
    out.push_str(&format!(
        "{done}/{} Machines updated in place\n",
        results.len()
    ));
    out
}
