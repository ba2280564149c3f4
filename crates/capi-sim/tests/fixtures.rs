//! The request fixtures in tests/fixtures/ and the simulator agree: every CanUpdate fixture differs
//! exactly where its name says (an empty answer gives a rollout naming those fields), and a patch
//! that writes desired over current goes in place.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use base64::Engine as _;
use capi_sim::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, CapiDecision, FailurePolicy,
    HOOKS_API_VERSION, HookAnswer, UPDATE_IN_PROGRESS_ANNOTATION, UpdateMachineRequest,
    can_update_machine, can_update_machine_set, can_update_machine_set_with,
    can_update_machine_with,
};
use serde_json::{Map, Value, json};

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

/// RFC 7386 patch turning `from` into `to` (fixtures hold no nulls, so this is exact).
fn merge_diff(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = Map::new();
            for (k, v) in b {
                match a.get(k) {
                    Some(old) if old == v => {}
                    Some(old) if old.is_object() && v.is_object() => {
                        out.insert(k.clone(), merge_diff(old, v));
                    }
                    _ => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in a.keys().filter(|k| !b.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => to.clone(),
    }
}

fn merge_patch(current: &Value, desired: &Value) -> Value {
    json!({"patchType": "JSONMergePatch", "patch": b64(&merge_diff(current, desired))})
}

fn success(patches: &[(&str, Value)]) -> Vec<u8> {
    let mut body = json!({"apiVersion": HOOKS_API_VERSION, "status": "Success"});
    for (k, v) in patches {
        body[*k] = v.clone();
    }
    body.to_string().into_bytes()
}

fn reasons(d: CapiDecision) -> Vec<String> {
    match d {
        CapiDecision::Rollout { reasons } => reasons,
        other => panic!("expected a rollout, got {other:?}"),
    }
}

const CAN_UPDATE_MACHINE: &[(&str, &[&str])] = &[
    (
        "can-update-machine-kcp-version.json",
        &["Machine spec.version"],
    ),
    (
        "can-update-machine-kcp-files-keys.json",
        &[
            "KubeadmConfig spec.files[0].content",
            "KubeadmConfig spec.files[4]",
            "KubeadmConfig spec.ntp.servers[0]",
            "KubeadmConfig spec.users[0].sshAuthorizedKeys[1]",
        ],
    ),
    (
        "can-update-machine-kcp-mixed.json",
        &[
            "Machine spec.failureDomain",
            "KubeadmConfig spec.diskSetup",
            "KubeadmConfig spec.mounts",
            "KubeadmConfig spec.ntp.servers[0]",
            "DevMachine spec.backend.docker.customImage",
        ],
    ),
    (
        "can-update-machine-unknown-infra.json",
        &[
            "KubeadmConfig spec.files[2].content",
            "AcmeMetalMachine spec.firmware.bmcVersion",
        ],
    ),
    (
        "can-update-machine-rke2.json",
        &[
            "Machine spec.version",
            "RKE2Config spec.agentConfig.ntp.servers[0]",
        ],
    ),
    (
        "can-update-machine-k3s.json",
        &["Machine spec.version", "KThreesConfig spec.version"],
    ),
    (
        "can-update-machine-talos.json",
        &[
            "Machine spec.version",
            "TalosConfig spec.strategicPatches[0]",
        ],
    ),
];

#[test]
fn can_update_machine_fixtures_differ_exactly_as_named() {
    for (name, expected) in CAN_UPDATE_MACHINE {
        let request = fixture(name);
        CanUpdateMachineRequest::from_json(&request).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            reasons(can_update_machine(&request, &success(&[]))),
            *expected,
            "{name}"
        );
        // failurePolicy Ignore with an unreachable extension: no patches, same rollout.
        let ignored = can_update_machine_with(
            &request,
            HookAnswer::TransportError("connection refused"),
            FailurePolicy::Ignore,
        );
        assert_eq!(reasons(ignored), *expected, "{name}");
    }
}

#[test]
fn can_update_machine_fixtures_go_in_place_when_every_object_is_patched_to_desired() {
    for (name, _) in CAN_UPDATE_MACHINE {
        let r = fixture(name);
        let (cur, des) = (&r["current"], &r["desired"]);
        let merge = success(&[
            (
                "machinePatch",
                merge_patch(&cur["machine"], &des["machine"]),
            ),
            (
                "infrastructureMachinePatch",
                merge_patch(&cur["infrastructureMachine"], &des["infrastructureMachine"]),
            ),
            (
                "bootstrapConfigPatch",
                merge_patch(&cur["bootstrapConfig"], &des["bootstrapConfig"]),
            ),
        ]);
        assert_eq!(
            can_update_machine(&r, &merge),
            CapiDecision::InPlace,
            "{name} (merge patch)"
        );
        let replace = |obj: &str| json!({"patchType": "JSONPatch", "patch": b64(&json!([{"op": "replace", "path": "/spec", "value": des[obj]["spec"]}]))});
        let json_patch = success(&[
            ("machinePatch", replace("machine")),
            (
                "infrastructureMachinePatch",
                replace("infrastructureMachine"),
            ),
            ("bootstrapConfigPatch", replace("bootstrapConfig")),
        ]);
        assert_eq!(
            can_update_machine(&r, &json_patch),
            CapiDecision::InPlace,
            "{name} (JSON patch)"
        );
    }
}

#[test]
fn a_partial_answer_leaves_exactly_the_uncovered_fields() {
    let r = fixture("can-update-machine-unknown-infra.json");
    let answer = success(&[(
        "bootstrapConfigPatch",
        merge_patch(
            &r["current"]["bootstrapConfig"],
            &r["desired"]["bootstrapConfig"],
        ),
    )]);
    assert_eq!(
        reasons(can_update_machine(&r, &answer)),
        ["AcmeMetalMachine spec.firmware.bmcVersion"]
    );
    // A Failure answer stops the reconcile instead ("in-place only" mode).
    let failure = br#"{"status":"Failure","message":"AcmeMetalMachine spec.firmware.bmcVersion cannot be changed in place"}"#;
    assert!(matches!(
        can_update_machine(&r, failure),
        CapiDecision::Error { .. }
    ));
}

const MD_REASONS: &[&str] = &[
    "MachineSet spec.template.spec.version",
    "KubeadmConfigTemplate spec.template.spec.files[0].content",
    "KubeadmConfigTemplate spec.template.spec.files[2]",
    "KubeadmConfigTemplate spec.template.spec.users[0].sshAuthorizedKeys[0]",
];

#[test]
fn machine_set_fixture_differs_exactly_as_named_and_goes_in_place_when_patched() {
    let r = fixture("can-update-machineset-md.json");
    CanUpdateMachineSetRequest::from_json(&r).unwrap();
    assert_eq!(
        reasons(can_update_machine_set(&r, &success(&[]))),
        MD_REASONS
    );
    let ignored = can_update_machine_set_with(
        &r,
        HookAnswer::Http {
            status: 503,
            body: b"",
        },
        FailurePolicy::Ignore,
    );
    assert_eq!(reasons(ignored), MD_REASONS);

    let (cur, des) = (&r["current"], &r["desired"]);
    // Only spec.template.spec has to be covered: old and new MachineSet differ in name, labels,
    // replicas and template refs, which CAPI never compares.
    let template_patch = |obj: &str| {
        let diff = merge_diff(
            &cur[obj]["spec"]["template"]["spec"],
            &des[obj]["spec"]["template"]["spec"],
        );
        json!({"patchType": "JSONMergePatch", "patch": b64(&json!({"spec": {"template": {"spec": diff}}}))})
    };
    let answer = success(&[
        ("machineSetPatch", template_patch("machineSet")),
        (
            "bootstrapConfigTemplatePatch",
            template_patch("bootstrapConfigTemplate"),
        ),
    ]);
    assert_eq!(can_update_machine_set(&r, &answer), CapiDecision::InPlace);
    // Without the bootstrap template patch the files and keys still differ.
    let answer = success(&[("machineSetPatch", template_patch("machineSet"))]);
    assert_eq!(
        reasons(can_update_machine_set(&r, &answer)),
        &MD_REASONS[1..]
    );
}

#[test]
fn update_machine_fixtures_are_what_capi_sends() {
    for name in ["update-machine-kcp.json", "update-machine-worker.json"] {
        let r = fixture(name);
        let parsed = UpdateMachineRequest::from_json(&r).unwrap_or_else(|e| panic!("{name}: {e}"));
        let spec = &parsed.desired.machine["spec"];
        assert_eq!(spec["version"], "v1.34.1", "{name}");
        assert!(
            spec["providerID"]
                .as_str()
                .is_some_and(|p| p.starts_with("docker:////")),
            "{name}"
        );
        assert!(parsed.desired.bootstrap_config.is_some(), "{name}");
        assert!(
            r["desired"]["machine"]["metadata"]["annotations"]
                .get(UPDATE_IN_PROGRESS_ANNOTATION)
                .is_some()
        );
    }
}

#[test]
fn fixtures_tell_one_consistent_story() {
    // The KCP UpdateMachine desires what the CanUpdateMachine version fixture desired.
    let can = fixture("can-update-machine-kcp-version.json");
    let upd = fixture("update-machine-kcp.json");
    assert_eq!(
        can["desired"]["machine"]["spec"],
        upd["desired"]["machine"]["spec"]
    );
    assert_eq!(
        can["desired"]["infrastructureMachine"]["spec"],
        upd["desired"]["infrastructureMachine"]["spec"]
    );
    let (a, b) = (
        &can["desired"]["bootstrapConfig"]["spec"],
        &upd["desired"]["bootstrapConfig"]["spec"],
    );
    for field in ["files", "users", "ntp"] {
        assert_eq!(a[field], b[field], "{field}");
    }
    // The worker's desired KubeadmConfig is the MachineDeployment's new template.
    let md = fixture("can-update-machineset-md.json");
    let worker = fixture("update-machine-worker.json");
    let template = &md["desired"]["bootstrapConfigTemplate"]["spec"]["template"]["spec"];
    for field in ["files", "users", "ntp"] {
        assert_eq!(
            template[field], worker["desired"]["bootstrapConfig"]["spec"][field],
            "{field}"
        );
    }
    let ms_spec = &md["desired"]["machineSet"]["spec"]["template"]["spec"];
    assert_eq!(
        ms_spec["version"],
        worker["desired"]["machine"]["spec"]["version"]
    );
    // Discovery requests carry TypeMeta only.
    assert_eq!(
        fixture("discovery-request.json"),
        json!({"apiVersion": HOOKS_API_VERSION, "kind": "DiscoveryRequest"})
    );
}
