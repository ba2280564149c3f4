//! What operators do to runs: retry a failed step (also repeated, and on runs that have not failed), pause
//! (annotation and setting) before and during a run and resume, cancel, maintenance windows (annotation and
//! setting; a new run waiting for one, a run held by one between steps), and what UpdateMachine refuses.

use inplace_agent_api::{AgentIdentity, MachineRef, StepStatus};
use inplace_updater::api::Hook;
use inplace_updater::dispatch::{AgentRefusalReason, AgentScope};
use serde_json::{Value, json};

use super::corpus::WINDOW;
use super::harness::{Agent, Failure, Golden};
use super::rollout::{annotated, finish_run, run_step, update_to_done};
use crate::common::fleet::{can_update_before, can_update_request, update_request};
use crate::e2e_rollout::CONTROL_PLANE;
use crate::hooks_malformed::fixture;

const RETRY: &str = "inplace-updater.dev/retry";
const PAUSE: &str = "inplace-updater.dev/paused";
const CANCEL: &str = "inplace-updater.dev/cancel";
const WINDOW_ANNOTATION: &str = "inplace-updater.dev/maintenance-window";
const ACCEPT_UNJUDGED: &str = "inplace-updater.dev/accept-unjudged";

/// CanUpdateMachine for `update` (KCP's question before it), then UpdateMachine and the agent's first poll.
async fn judged_and_started(golden: &mut Golden, who: &str, agent: &mut Agent, update: &Value) {
    golden
        .judge(
            who,
            &with_settings_of(can_update_before(update, "v1.33.4"), update),
        )
        .await;
    golden
        .hook(&format!("{who} UpdateMachine"), Hook::UpdateMachine, update)
        .await;
    golden.poll(&format!("{who} poll: the plan"), agent).await;
}

/// `question` with the settings `update` carries (CAPI sends the same settings to every hook).
fn with_settings_of(mut question: Value, update: &Value) -> Value {
    if update["settings"].is_object() {
        question["settings"] = update["settings"].clone();
    }
    question
}

/// A failed step; the failed run; the retry that restarts it (asked twice); the new run to Done; the same
/// value again and a new value on a run that has not failed (ignored, said in the answer); a value first
/// ignored while running, then on the failed run.
pub async fn retry_scenario() {
    let mut golden = Golden::new("retry");
    let name = CONTROL_PLANE[0];
    let update = update_request("update-machine-kcp.json", name);
    let mut agent = Agent::machine(name);
    golden.inventory("inventory", &agent, "v1.33.4").await;
    judged_and_started(&mut golden, name, &mut agent, &update).await;
    run_step(&mut golden, name, &mut agent, &update).await;
    golden.running("step 2 running", &mut agent).await;
    golden.advance(7);
    golden
        .step(
            "step 2 failed",
            &mut agent,
            StepStatus::Failed,
            Some(Failure {
                exit_code: Some(1),
                stderr_tail: Some(
                    "E1207 10:00:07 apt-get: unable to locate package kubeadm=1.34.1-1.1\n",
                ),
                message: "install failed after 3 attempts",
            }),
            None,
        )
        .await;
    golden
        .hook("failed: UpdateMachine", Hook::UpdateMachine, &update)
        .await;
    golden.poll("poll after the failure", &mut agent).await;
    golden.operator_views("failed").await;
    golden.advance(60);
    let retried = annotated(&update, RETRY, Some("1"));
    golden.hook("retry=1", Hook::UpdateMachine, &retried).await;
    golden.advance(2);
    golden
        .hook("retry=1 asked again", Hook::UpdateMachine, &retried)
        .await;
    golden.poll("poll: the restarted plan", &mut agent).await;
    finish_run(&mut golden, "restarted", &mut agent, &retried).await;
    golden
        .hook("retry=1 once done", Hook::UpdateMachine, &retried)
        .await;
    let again = annotated(&update, RETRY, Some("2"));
    golden
        .hook(
            "retry=2 on a run that did not fail",
            Hook::UpdateMachine,
            &again,
        )
        .await;
    golden.operator_views("done after the retry").await;

    // A value set while the run is still going is ignored, and stays spent once the run fails.
    let name = CONTROL_PLANE[1];
    let update = update_request("update-machine-kcp.json", name);
    let mut agent = Agent::machine(name);
    judged_and_started(&mut golden, name, &mut agent, &update).await;
    golden.running("second step 1 running", &mut agent).await;
    let early = annotated(&update, RETRY, Some("7"));
    golden
        .hook("second retry=7 while running", Hook::UpdateMachine, &early)
        .await;
    golden.advance(5);
    golden
        .step(
            "second step 1 failed",
            &mut agent,
            StepStatus::Failed,
            Some(Failure {
                exit_code: Some(2),
                stderr_tail: None,
                message: "kubeadm not found",
            }),
            None,
        )
        .await;
    golden
        .hook("second retry=7 once failed", Hook::UpdateMachine, &early)
        .await;
    let late = annotated(&update, RETRY, Some("8"));
    golden
        .hook("second retry=8 once failed", Hook::UpdateMachine, &late)
        .await;
    golden
        .poll("second poll: the restarted plan", &mut agent)
        .await;
    golden.operator_views("second restarted").await;
    golden.finish();
}

/// The `paused` setting before a run (handed out held, confirmed, lifted); the pause annotation during a
/// run (the running step finishes first, the agent confirms, removed: it goes on); a cancel (not confirmed,
/// confirmed: Failure; a late report; the retry starts afresh; a new value cancels that).
pub async fn hold_scenario() {
    let mut golden = Golden::new("hold");
    let name = CONTROL_PLANE[0];
    let update = update_request("update-machine-kcp.json", name);
    let mut paused = update.clone();
    paused["settings"] = json!({ "paused": "change freeze until Monday" });
    let mut agent = Agent::machine(name);
    judged_and_started(&mut golden, "setting", &mut agent, &paused).await;
    golden
        .poll("setting: poll confirming the hold", &mut agent)
        .await;
    golden
        .hook("setting: confirmed", Hook::UpdateMachine, &paused)
        .await;
    golden.operator_views("paused by the setting").await;
    golden.advance(3600);
    golden
        .hook("setting removed", Hook::UpdateMachine, &update)
        .await;
    golden.poll("setting removed: poll", &mut agent).await;

    golden
        .running("annotation: step 1 running", &mut agent)
        .await;
    golden.advance(2);
    let pause = annotated(&update, PAUSE, Some("alice: disk check"));
    golden
        .hook(
            "annotation: paused while a step runs",
            Hook::UpdateMachine,
            &pause,
        )
        .await;
    golden.advance(3);
    golden
        .succeeded("annotation: step 1 succeeded", &mut agent)
        .await;
    golden
        .hook("annotation: not yet confirmed", Hook::UpdateMachine, &pause)
        .await;
    golden.poll("annotation: poll confirming", &mut agent).await;
    golden.advance(30);
    golden
        .hook("annotation: confirmed", Hook::UpdateMachine, &pause)
        .await;
    golden.poll("annotation: poll while held", &mut agent).await;
    golden.operator_views("paused by the annotation").await;
    golden.advance(600);
    golden
        .hook("annotation removed", Hook::UpdateMachine, &update)
        .await;
    golden.poll("annotation removed: poll", &mut agent).await;
    finish_run(&mut golden, "resumed", &mut agent, &update).await;

    let name = CONTROL_PLANE[1];
    let update = update_request("update-machine-kcp.json", name);
    let mut agent = Agent::machine(name);
    judged_and_started(&mut golden, "cancel", &mut agent, &update).await;
    golden.running("cancel: step 1 running", &mut agent).await;
    let cancel = annotated(&update, CANCEL, Some("ticket-7"));
    golden
        .hook("cancel=ticket-7", Hook::UpdateMachine, &cancel)
        .await;
    golden.advance(4);
    golden
        .succeeded("cancel: step 1 succeeded", &mut agent)
        .await;
    golden
        .hook("cancel: not yet confirmed", Hook::UpdateMachine, &cancel)
        .await;
    golden.poll("cancel: poll confirming", &mut agent).await;
    golden
        .hook("cancel: confirmed", Hook::UpdateMachine, &cancel)
        .await;
    golden.operator_views("cancelled").await;
    golden.succeeded("cancel: a late report", &mut agent).await;
    golden.advance(60);
    let retry = annotated(&cancel, RETRY, Some("1"));
    golden
        .hook("cancel: retry=1", Hook::UpdateMachine, &retry)
        .await;
    golden
        .poll("cancel: poll for the fresh run", &mut agent)
        .await;
    let again = annotated(&retry, CANCEL, Some("ticket-8"));
    golden
        .hook(
            "cancel=ticket-8 on the fresh run",
            Hook::UpdateMachine,
            &again,
        )
        .await;
    golden.poll("cancel: poll told to stop", &mut agent).await;
    golden
        .hook(
            "cancel=ticket-8 not yet confirmed",
            Hook::UpdateMachine,
            &again,
        )
        .await;
    golden
        .poll("cancel: poll confirming ticket-8", &mut agent)
        .await;
    golden
        .hook("cancel=ticket-8 confirmed", Hook::UpdateMachine, &again)
        .await;
    golden.operator_views("cancelled again").await;
    golden.finish();
}

/// Windows (Monday 22:00 to 04:00 in Berlin): shut when asked (annotation; setting; a bad annotation; `none`
/// overriding the setting), open (the waiting run starts), shut again between two steps (the run is held
/// after its running step), open a week later (it goes on).
pub async fn window_scenario() {
    let mut golden = Golden::new("window");
    golden.pin("2026-12-07T17:48:00Z");
    let [by_annotation, by_setting, overridden] = CONTROL_PLANE;
    let update = annotated(
        &update_request("update-machine-kcp.json", by_annotation),
        WINDOW_ANNOTATION,
        Some(WINDOW),
    );
    let mut agent = Agent::machine(by_annotation);
    golden
        .inventory("annotation: inventory", &agent, "v1.33.4")
        .await;
    judged_and_started(&mut golden, "annotation", &mut agent, &update).await;
    let bad = annotated(&update, WINDOW_ANNOTATION, Some("days=mon start=22:00"));
    golden
        .hook("annotation: a bad window", Hook::UpdateMachine, &bad)
        .await;

    let mut setting = update_request("update-machine-kcp.json", by_setting);
    setting["settings"] = json!({ "maintenanceWindow": WINDOW });
    let mut setting_agent = Agent::machine(by_setting);
    judged_and_started(&mut golden, "setting", &mut setting_agent, &setting).await;
    let none = annotated(
        &{
            let mut request = update_request("update-machine-kcp.json", overridden);
            request["settings"] = setting["settings"].clone();
            request
        },
        WINDOW_ANNOTATION,
        Some("none"),
    );
    let mut none_agent = Agent::machine(overridden);
    judged_and_started(&mut golden, "none", &mut none_agent, &none).await;
    golden.operator_views("shut").await;

    // 22:00 in Berlin: the window opens.
    golden.pin("2026-12-07T21:00:00Z");
    golden
        .hook("annotation: open", Hook::UpdateMachine, &update)
        .await;
    golden.poll("annotation: poll once open", &mut agent).await;
    run_step(&mut golden, "annotation", &mut agent, &update).await;
    golden
        .hook("setting: open", Hook::UpdateMachine, &setting)
        .await;
    golden.operator_views("open").await;

    // 03:59:30 on Tuesday in Berlin: a step starts, and ends after 04:00.
    golden.pin("2026-12-08T02:59:30Z");
    golden
        .running("annotation: a step before 04:00", &mut agent)
        .await;
    golden.pin("2026-12-08T03:00:40Z");
    golden
        .hook(
            "annotation: window shut while the step runs",
            Hook::UpdateMachine,
            &update,
        )
        .await;
    golden
        .succeeded("annotation: the step ends after 04:00", &mut agent)
        .await;
    golden
        .poll("annotation: poll confirming the hold", &mut agent)
        .await;
    golden.advance(5);
    golden
        .hook(
            "annotation: held by the window",
            Hook::UpdateMachine,
            &update,
        )
        .await;
    golden.operator_views("held by the window").await;

    // The next Monday 22:00 in Berlin: it goes on.
    golden.pin("2026-12-14T21:00:10Z");
    golden
        .hook("annotation: open again", Hook::UpdateMachine, &update)
        .await;
    golden
        .poll("annotation: poll when open again", &mut agent)
        .await;
    finish_run(&mut golden, "annotation", &mut agent, &update).await;
    golden.operator_views("a week later").await;
    golden.finish();
}

/// UpdateMachine refusals: no verdict (a wrong and the right accept-unjudged fingerprint); a desired state
/// changed after the verdict (then the judged one runs); a verdict that sent the change to a rollout; a
/// refused agent; an agent known by its provider id only; agents outside their token or with a bad name.
pub async fn refusals_scenario() {
    let mut golden = Golden::new("refusals");
    let [unjudged, changed, rolled] = CONTROL_PLANE;

    let update = update_request("update-machine-kcp.json", unjudged);
    let answer = golden
        .hook("no verdict", Hook::UpdateMachine, &update)
        .await;
    let message = answer["message"].as_str().unwrap_or_default();
    let needle = format!("{ACCEPT_UNJUDGED}=");
    let offered: String = message
        .find(&needle)
        .map(|at| {
            message[at + needle.len()..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect()
        })
        .unwrap_or_else(|| panic!("no fingerprint offered: {message}"));
    golden.advance(20);
    golden
        .hook(
            "no verdict, a wrong fingerprint",
            Hook::UpdateMachine,
            &annotated(&update, ACCEPT_UNJUDGED, Some("feedfacecafebeef")),
        )
        .await;
    golden
        .hook(
            "no verdict, the offered fingerprint",
            Hook::UpdateMachine,
            &annotated(&update, ACCEPT_UNJUDGED, Some(&offered)),
        )
        .await;

    let update = update_request("update-machine-kcp.json", changed);
    golden
        .hook(
            "changed: CanUpdateMachine",
            Hook::CanUpdateMachine,
            &can_update_request("can-update-machine-kcp-version.json", changed),
        )
        .await;
    golden.advance(30);
    let mut disks = update.clone();
    disks["desired"]["bootstrapConfig"]["spec"]["diskSetup"] =
        json!({"partitions": [{"device": "/dev/sdb", "layout": true, "tableType": "gpt"}]});
    golden
        .hook("changed after the verdict", Hook::UpdateMachine, &disks)
        .await;
    golden
        .hook("changed: the judged state", Hook::UpdateMachine, &update)
        .await;

    let mut question = can_update_request("can-update-machine-kcp-mixed.json", rolled);
    golden
        .hook(
            "rollout: CanUpdateMachine",
            Hook::CanUpdateMachine,
            &question,
        )
        .await;
    let mut rollout = fixture("update-machine-kcp.json");
    rollout["desired"] = question["desired"].take();
    golden
        .hook("rollout: UpdateMachine", Hook::UpdateMachine, &rollout)
        .await;
    golden.operator_views("after the refusals").await;

    // Agents: one refused for its token, one known only by its node's provider id, two out of bounds.
    golden.fresh();
    let refused = "edge-01-md-0-x7k2p-refus";
    golden
        .dispatcher()
        .agents
        .refusals
        .refused(
            Some(&AgentIdentity::Machine(MachineRef::new("default", refused))),
            AgentRefusalReason::ExpiredToken,
            "token expired at 2026-12-01T00:00:00Z",
            None,
        )
        .await;
    golden
        .hook(
            "refused agent: CanUpdateMachineSet",
            Hook::CanUpdateMachineSet,
            &fixture("can-update-machineset-md.json"),
        )
        .await;
    let update = update_request("update-machine-worker.json", refused);
    golden.advance(10);
    golden
        .hook("refused agent: UpdateMachine", Hook::UpdateMachine, &update)
        .await;
    let mut agent = Agent::machine(refused);
    golden.advance(50);
    golden.poll("refused agent gets through", &mut agent).await;
    golden
        .hook(
            "refused agent: UpdateMachine once through",
            Hook::UpdateMachine,
            &update,
        )
        .await;

    let by_id = "edge-01-md-0-x7k2p-byid1";
    let mut nobody = Agent::provider("docker:////edge-01-md-0-nobody");
    golden.poll("unknown provider id: poll", &mut nobody).await;
    nobody.plan = agent.plan.clone();
    golden
        .running("unknown provider id: report", &mut nobody)
        .await;
    let update = update_request("update-machine-worker.json", by_id);
    let mut agent = Agent::provider(&format!("docker:////{by_id}"));
    golden
        .inventory("provider id: inventory", &agent, "v1.33.4")
        .await;
    update_to_done(&mut golden, "provider id", &mut agent, &update).await;

    let mut outside = Agent::machine(by_id);
    outside.scope = AgentScope::Machine(MachineRef::new("default", "edge-01-md-0-other"));
    golden.poll("outside its token: poll", &mut outside).await;
    outside.plan = agent.plan.clone();
    golden
        .running("outside its token: report", &mut outside)
        .await;
    let mut bad = Agent::machine("Not_A_Name");
    golden.poll("bad machine name: poll", &mut bad).await;
    golden.operator_views("agents").await;
    golden.finish();
}
