//! The request corpus: every fixture under every settings set the tests use (each against a fresh engine),
//! the malformed tables of `hooks_malformed`, and the undecodable bodies of `hooks_bad_input` and the kept
//! fuzz inputs of `hostile`.

use inplace_updater::api::Hook;
use serde_json::Value;

use super::harness::{Agent, Golden};
use crate::common::fleet::can_update_before;
use crate::common::with_settings;
use crate::hooks_bad_input::{bad_bodies, huge_annotation_body};
use crate::hooks_malformed::{Case, apply, can_update, fixture, update};
use crate::hostile::kept_inputs;

/// A maintenance window shut at the scenarios' start (Monday 10:00 in Berlin).
pub const WINDOW: &str = "days=mon start=22:00 end=04:00 tz=Europe/Berlin";

/// The ExtensionConfig settings sets the tests use, and a name for each.
const SETTINGS: &[(&str, &[(&str, &str)])] = &[
    ("no settings", &[]),
    (
        "patchType=JSONMergePatch",
        &[("patchType", "JSONMergePatch")],
    ),
    ("inPlace=false", &[("inPlace", "false")]),
    ("disableActions=ssh-keys", &[("disableActions", "ssh-keys")]),
    (
        "disableActions=kubernetes-version,files",
        &[("disableActions", "kubernetes-version,files")],
    ),
    ("mode=in-place-only", &[("mode", "in-place-only")]),
    (
        "drain overrides",
        &[
            ("drainPatchVersion", "true"),
            ("drainKubeletArgs", "true"),
            ("drainDeleteEmptyDirData", "true"),
            ("drainForceUnmanaged", "true"),
        ],
    ),
    ("drainMinorVersion=false", &[("drainMinorVersion", "false")]),
    ("maintenanceWindow shut", &[("maintenanceWindow", WINDOW)]),
    ("maintenanceWindow=none", &[("maintenanceWindow", "none")]),
    (
        "maintenanceWindow bad",
        &[("maintenanceWindow", "days=mon")],
    ),
    ("paused", &[("paused", "change freeze (ticket 42)")]),
    ("mode=sometimes", &[("mode", "sometimes")]),
    ("unknown key", &[("colour", "blue")]),
    (
        "inPlace=false with mode=in-place-only",
        &[("inPlace", "false"), ("mode", "in-place-only")],
    ),
];

/// Every fixture, sorted by name, with the hook it is for.
fn fixtures() -> Vec<(String, Hook)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let hook = if name.starts_with("discovery") {
                Hook::Discovery
            } else if name.starts_with("can-update-machineset") {
                Hook::CanUpdateMachineSet
            } else if name.starts_with("can-update-machine") {
                Hook::CanUpdateMachine
            } else if name.starts_with("update-machine") {
                Hook::UpdateMachine
            } else {
                panic!("fixture {name}: which hook is it for? (golden_answers/corpus.rs)")
            };
            (name, hook)
        })
        .collect()
}

/// The CanUpdate question whose `Success` licenses the UpdateMachine fixture `update` (what CAPI asks first).
fn question_for(name: &str, update: &Value) -> (Hook, Value) {
    if name.contains("worker") {
        (
            Hook::CanUpdateMachineSet,
            fixture("can-update-machineset-md.json"),
        )
    } else {
        (Hook::CanUpdateMachine, can_update_before(update, "v1.33.4"))
    }
}

/// Every fixture against a fresh engine under every settings set; UpdateMachine fixtures unjudged, then
/// judged by their CanUpdate question under the same settings, with the agent's poll for the plan.
pub async fn fixtures_scenario() {
    let mut golden = Golden::new("fixtures");
    for (name, hook) in fixtures() {
        let request = fixture(&name);
        if hook == Hook::Discovery {
            golden.fresh();
            golden.hook(&name, hook, &request).await;
            continue;
        }
        for (settings_name, settings) in SETTINGS {
            let request = with_settings(request.clone(), settings);
            let label = format!("{name} [{settings_name}]");
            golden.fresh();
            if hook != Hook::UpdateMachine {
                golden.hook(&label, hook, &request).await;
                continue;
            }
            golden
                .hook(&format!("{label} unjudged"), hook, &request)
                .await;
            golden.fresh();
            let (asks, question) = question_for(&name, &request);
            let question = with_settings(question, settings);
            golden
                .hook(&format!("{label} judged first"), asks, &question)
                .await;
            golden
                .hook(&format!("{label} judged"), hook, &request)
                .await;
            let machine = request["desired"]["machine"]["metadata"]["name"]
                .as_str()
                .unwrap();
            let mut agent = Agent::machine(machine);
            golden
                .poll(&format!("{label} agent's plan"), &mut agent)
                .await;
        }
    }
    golden.finish();
}

/// `/desired/machine/metadata (removed)` or `/desired/machine/kind = "MachineSet"` (the first 60 characters).
fn describe(case: &Case) -> String {
    case.changes
        .iter()
        .map(|(pointer, value)| match value {
            None => format!("{pointer} (removed)"),
            Some(value) => {
                let value: String = value.to_string().chars().take(60).collect();
                format!("{pointer} = {value}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The malformed tables of `hooks_malformed`: each table's valid request, then each case, on one engine (the
/// UpdateMachine table over the Machine's real run, as there).
pub async fn malformed_scenario() {
    let mut golden = Golden::new("malformed");
    let tables = [
        (
            Hook::CanUpdateMachine,
            can_update::MACHINE_FIXTURE,
            can_update::machine_cases(),
        ),
        (
            Hook::CanUpdateMachineSet,
            can_update::MACHINE_SET_FIXTURE,
            can_update::machine_set_cases(),
        ),
    ];
    for (hook, name, cases) in tables {
        golden.fresh();
        let valid = fixture(name);
        golden.hook(&format!("{hook} valid"), hook, &valid).await;
        for (i, case) in cases.iter().enumerate() {
            let label = format!("{hook} case {}: {}", i + 1, describe(case));
            golden
                .hook(&label, hook, &apply(valid.clone(), &case.changes))
                .await;
        }
    }
    golden.fresh();
    let valid = fixture(update::FIXTURE);
    golden
        .hook(
            "UpdateMachine judged first",
            Hook::CanUpdateMachine,
            &fixture("can-update-machine-kcp-version.json"),
        )
        .await;
    golden
        .hook("UpdateMachine valid", Hook::UpdateMachine, &valid)
        .await;
    for (i, case) in update::cases(&valid).iter().enumerate() {
        let label = format!("UpdateMachine case {}: {}", i + 1, describe(case));
        golden
            .hook(
                &label,
                Hook::UpdateMachine,
                &apply(valid.clone(), &case.changes),
            )
            .await;
    }
    golden.operator_views("after the UpdateMachine table").await;
    golden.finish();
}

/// Undecodable bodies (`hooks_bad_input`), a 15 MiB annotation, the kept fuzz inputs against every hook
/// (`hostile`), and a POST to a path that is no hook.
pub async fn bad_input_scenario() {
    let mut golden = Golden::new("bad_input");
    for case in bad_bodies() {
        let label = format!("{} {}", case.hook, case.label);
        golden
            .post(
                &label,
                case.hook.name(),
                &case.path(),
                case.body.into_bytes(),
            )
            .await;
    }
    golden
        .post(
            "UpdateMachine 15 MiB annotation",
            Hook::UpdateMachine.name(),
            Hook::UpdateMachine.path(),
            huge_annotation_body().into_bytes(),
        )
        .await;
    for (name, body) in kept_inputs("hook_request") {
        for hook in [
            Hook::CanUpdateMachine,
            Hook::CanUpdateMachineSet,
            Hook::UpdateMachine,
        ] {
            golden
                .post(
                    &format!("{hook} fuzz input {name}"),
                    hook.name(),
                    hook.path(),
                    body.clone(),
                )
                .await;
        }
    }
    golden
        .post(
            "no such hook",
            "POST",
            "/hooks.runtime.cluster.x-k8s.io/v1alpha1/beforeclustercreate/x",
            b"{}".to_vec(),
        )
        .await;
    golden.finish();
}
