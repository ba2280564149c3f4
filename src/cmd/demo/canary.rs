//! The demo's paced rollout (`demo --canary`): every Machine asks for the same change at once, as
//! MachineDeployments across clusters with a generous `maxUnavailable` would, and the updater paces it — the
//! registration sets `canary: 1` and `soak: DEMO_SOAK`, the server runs with `--max-concurrent-updates
//! DEMO_BUDGET`. The canary goes alone, the others wait for it to finish and soak, then at most the budget
//! update at once. With `--fail-machine N`, Machine N is the canary: its update fails and rolls back, and the
//! failure brake holds the change for every other Machine. Ends with the `status --changes` listing.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::agents::reboot_if_asked;
use super::run::{CALL_INTERVAL, ROLLED_BACK, WORKER_QUESTION, WORKER_REQUEST};
use super::scenario::Scenario;
use super::setup::{
    Demo, DemoError, MachineResult, Start, ask, node_report, request_for, setup, start,
};
use crate::api::Hook;
use crate::cmd::tables::render_changes;
use crate::dispatch::changes::control::ChangeRow;

/// The `soak` setting of the demo's paced registration: how long the change must stay healthy after each
/// Machine finishes before the next starts.
pub const DEMO_SOAK: &str = "4s";
/// The server's `--max-concurrent-updates` in the paced demo.
pub const DEMO_BUDGET: u32 = 2;
/// Longest the paced demo waits for the whole fleet.
pub const FLEET_DEADLINE: Duration = Duration::from_secs(300);
/// The result of a Machine the failure brake held (it never started the change).
pub const HELD: &str = "held by brake";

/// What a paced demo ended with: each Machine's result, the most Machines seen updating at once, and the
/// `inplace-updater status --changes` listing.
#[derive(Debug)]
pub struct PacedRollout {
    /// One line per Machine.
    pub results: Vec<MachineResult>,
    /// The most Machines whose answers said they were updating at one time.
    pub most_at_once: usize,
    /// The changes as `status --changes` lists them after the rollout.
    pub changes: String,
}

/// `request` (a built-in worker request) with the demo registration's rollout settings added to the
/// scenario's.
fn paced(scenario: &Scenario, request: Value) -> Value {
    let mut request = scenario.request(request);
    if !request["settings"].is_object() {
        request["settings"] = json!({});
    }
    request["settings"]["canary"] = json!("1");
    request["settings"]["soak"] = json!(DEMO_SOAK);
    request
}

/// Where one Machine stands in the paced rollout.
struct Asking {
    request: Value,
    begun: Option<Instant>,
    took: Duration,
    last: String,
    updating: bool,
    result: Option<String>,
}

/// Runs the paced demo with `machines` workers in `dir`; Machine `fail` (1-based) is the canary and fails.
pub async fn run(
    machines: usize,
    dir: &Path,
    fail: Option<usize>,
    scenario: &Scenario,
) -> Result<PacedRollout, DemoError> {
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
        workers_only: true,
        serve_flags: vec!["--max-concurrent-updates".into(), DEMO_BUDGET.to_string()],
    })?;
    println!(
        "\nCAPI: {} in place, every Machine asking at once; the updater paces it (the registration's canary: 1, \
         soak: {DEMO_SOAK}; the server's --max-concurrent-updates {DEMO_BUDGET})\n",
        scenario.what()
    );
    let started = Instant::now();
    let question = paced(
        scenario,
        serde_json::from_str(WORKER_QUESTION).map_err(setup("built-in request"))?,
    );
    let set = question["desired"]["machineSet"]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let what = format!("MachineSet default/{set}");
    ask(
        addr.hooks,
        &ca,
        Hook::CanUpdateMachineSet,
        &question,
        started,
        &what,
    )
    .await?;

    // The canary asks first, so it is the one the change starts on.
    let canary = fail.map_or(0, |n| n - 1);
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.retain(|&i| i != canary);
    order.insert(0, canary);
    let mut asking = Vec::new();
    for node in &nodes {
        asking.push(Asking {
            request: paced(scenario, request_for(WORKER_REQUEST, &node.name)?),
            begun: None,
            took: Duration::ZERO,
            last: String::new(),
            updating: false,
            result: None,
        });
    }
    let mut most_at_once = 0;
    while asking.iter().any(|a| a.result.is_none()) {
        if started.elapsed() > FLEET_DEADLINE {
            for a in asking.iter_mut().filter(|a| a.result.is_none()) {
                a.result = Some(format!("not done after {}s", FLEET_DEADLINE.as_secs()));
            }
            break;
        }
        for &i in &order {
            let (node, state) = (&nodes[i], &mut asking[i]);
            if state.result.is_some() {
                continue;
            }
            let name = &node.name;
            let (status, body) = crate::cmd::http::post_tls(
                addr.hooks,
                "localhost",
                &ca,
                &format!("{}?timeout=10s", Hook::UpdateMachine.path()),
                state.request.to_string().into_bytes(),
            )
            .await
            .map_err(|e| DemoError::Rollout(format!("UpdateMachine for {name}: {e}")))?;
            let answer: Value = serde_json::from_slice(&body).unwrap_or_default();
            let message = answer["message"].as_str().unwrap_or_default().to_owned();
            let retry = answer["retryAfterSeconds"].as_i64().unwrap_or_default();
            if message != state.last {
                println!(
                    "[{:6.1}s] default/{name}: {message}",
                    started.elapsed().as_secs_f64()
                );
                state.last = message.clone();
            }
            state.updating = !message.starts_with("waiting for");
            if state.updating && state.begun.is_none() {
                state.begun = Some(Instant::now());
            }
            state.result = match (status, answer["status"].as_str(), retry) {
                (200, Some("Success"), 0) => Some("done".to_owned()),
                _ if message.contains("halted by the failure brake") => Some(HELD.to_owned()),
                (200, Some("Success"), _) => None,
                _ if message.contains("; rolled back step") => Some(ROLLED_BACK.to_owned()),
                _ => Some(format!("failed: {message}")),
            };
            if state.result.is_some() {
                state.updating = false;
                state.took = state.begun.map(|b| b.elapsed()).unwrap_or_default();
            }
            if let Some(line) =
                reboot_if_asked(&launch, name, &node.sandbox, &mut children.0[i + 1])?
            {
                println!(
                    "[{:6.1}s] default/{name}: {line}",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        most_at_once = most_at_once.max(asking.iter().filter(|a| a.updating).count());
        tokio::time::sleep(CALL_INTERVAL).await;
    }
    let changes = changes_listing(addr.health).await?;
    drop(children);
    let results = nodes
        .iter()
        .zip(asking)
        .map(|(node, state)| MachineResult {
            name: node.name.clone(),
            result: state.result.unwrap_or_default(),
            took: state.took,
            kubeadm: node
                .sandbox
                .calls()
                .into_iter()
                .filter(|c| c.starts_with("kubeadm upgrade"))
                .collect(),
            node: node_report(&node.sandbox),
            os: (node.sandbox.os_image(), node.sandbox.reboots()),
        })
        .collect();
    Ok(PacedRollout {
        results,
        most_at_once,
        changes,
    })
}

/// The server's changes, as `inplace-updater status --changes` prints them.
async fn changes_listing(health: std::net::SocketAddr) -> Result<String, DemoError> {
    let (body, _) =
        crate::cmd::http::get_plain_response(&format!("http://{health}/status/changes"))
            .await
            .map_err(|e| DemoError::Rollout(format!("GET /status/changes: {e}")))?;
    let rows: Vec<ChangeRow> =
        serde_json::from_slice(&body).map_err(setup("the changes listing"))?;
    Ok(render_changes(&rows))
}
