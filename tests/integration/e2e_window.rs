//! Maintenance windows end to end, real server and agent processes over TLS: a Machine annotated with a
//! window gets no run while the window is shut (UpdateMachine says when it opens, the agent runs nothing),
//! and once the window opens during the test the update runs to Done. The server judges windows by a clock
//! file the test writes (the hidden test-only `serve --test-window-clock-file`).
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::time::Duration;

use capi_sim::UpdateOutcome;
use common::fleet::{Setup, update_request};
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);
const NODE: &str = "edge-01-control-plane-aaaaa";
const WINDOW: &str = "days=mon start=22:00 end=04:00 tz=Europe/Berlin";

fn unix_ms(rfc3339: &str) -> String {
    rfc3339
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_millisecond()
        .to_string()
}

fn with_window(request: &Value, spec: &str) -> Value {
    let mut request = request.clone();
    request["desired"]["machine"]["metadata"]["annotations"]["inplace-updater.dev/maintenance-window"] =
        json!(spec);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_waits_for_its_window_and_runs_once_it_opens() {
    let setup = Setup::new();
    let clock = setup.dir.path().join("clock");
    // Monday 2026-12-07 18:48 in Berlin: the window opens at 22:00 local.
    std::fs::write(&clock, unix_ms("2026-12-07T17:48:00Z")).unwrap();
    let clock_arg = clock.display().to_string();
    let (server, capi) = setup.serve("memory:", &["--test-window-clock-file", &clock_arg]);
    let agent = setup.agent(&server, NODE, true);
    let request = with_window(&update_request("update-machine-kcp.json", NODE), WINDOW);
    capi.judges(&request).await;

    let shut = capi.update_machine(&request).await;
    assert_eq!(
        shut,
        UpdateOutcome::InProgress {
            // The setup's `--retry-after-seconds 1`: the opening is hours away, so the normal one.
            retry_after_seconds: 1,
            message: format!(
                "outside maintenance window {WINDOW}: opens 2026-12-07T22:00:00+01:00 (in 3h12m); \
                 the update starts then"
            ),
        }
    );
    // Nothing was recorded, so there is nothing the agent could have been handed.
    assert_eq!(upgrades(&agent), 0, "{:?}", agent.sandbox.calls());

    // A bad override is the client's mistake: Failure naming the annotation and the problem.
    let bad = capi
        .update_machine(&with_window(&request, "days=mon start=22:00"))
        .await;
    assert_eq!(
        bad,
        UpdateOutcome::Failed {
            message: "annotation inplace-updater.dev/maintenance-window: invalid value \
                      \"days=mon start=22:00\": end missing (e.g. \"days=mon-fri start=22:00 end=04:00\")"
                .to_owned()
        }
    );

    // The window opens (21:00 UTC is 22:00 in Berlin): the next call starts the run and it finishes.
    std::fs::write(&clock, unix_ms("2026-12-07T21:00:00Z")).unwrap();
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(outcome, UpdateOutcome::Done, "{messages:?}");
    assert!(
        messages
            .iter()
            .all(|m| !m.contains("outside maintenance window")),
        "{messages:?}"
    );
    assert_eq!(upgrades(&agent), 1);
}

fn upgrades(agent: &common::fleet::AgentProcess) -> usize {
    agent
        .sandbox
        .calls()
        .iter()
        .filter(|c| c.starts_with("kubeadm upgrade apply v1.34.1"))
        .count()
}
