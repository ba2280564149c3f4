//! The verdict check on the shared fixtures, which are shaped as CAPI sends them: the desired objects a
//! CanUpdate request judged against the live objects UpdateMachine later receives for the same desired
//! state. An honest KCP or MachineDeployment update must never be refused.
#![allow(clippy::unwrap_used)]

use inplace_core::verdict::{CheckMode, Desired, Normalized, check, label_value};
use inplace_core::{Objects, Scope};
use serde_json::{Value, json};

fn fixture(name: &str) -> Value {
    let path = format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn normalized(side: &Value, names: [&str; 3], scope: Scope) -> Normalized {
    Normalized::of(
        scope,
        &Objects {
            machine: side.get(names[0]),
            bootstrap: side.get(names[1]),
            infra: side.get(names[2]),
        },
    )
}

const MACHINE: [&str; 3] = ["machine", "bootstrapConfig", "infrastructureMachine"];
const SET: [&str; 3] = [
    "machineSet",
    "bootstrapConfigTemplate",
    "infrastructureMachineTemplate",
];

fn shown(judged: &Normalized, desired: &Value, mode: CheckMode) -> Vec<String> {
    check(
        &judged.prints(),
        &Desired::new(normalized(desired, MACHINE, Scope::Object)),
        mode,
    )
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// KCP: CanUpdateMachine's desired KubeadmConfig went through `PrepareKubeadmConfigsForDiff` (no discovery,
/// defaults spelled out, init converted); UpdateMachine's is the live object with CABPK's bootstrap token
/// and `controlPlaneEndpoint`. Same desired state: no mismatch. A diskSetup added later: named.
#[test]
fn kcp_can_update_and_update_machine_agree_on_an_honest_update() {
    let judged = normalized(
        &fixture("can-update-machine-kcp-version.json")["desired"],
        MACHINE,
        Scope::Object,
    );
    let mut live = fixture("update-machine-kcp.json")["desired"].clone();
    assert!(
        live.pointer("/bootstrapConfig/spec/joinConfiguration/discovery/bootstrapToken/token")
            .is_some()
    );
    assert!(shown(&judged, &live, CheckMode::Exact).is_empty());

    live["bootstrapConfig"]["spec"]["diskSetup"] =
        json!({"partitions": [{"device": "/dev/sdb", "layout": true}]});
    live["machine"]["spec"]["version"] = json!("v1.34.2");
    assert_eq!(
        shown(&judged, &live, CheckMode::Exact),
        [
            "Machine spec.version (changed)",
            "KubeadmConfig spec.diskSetup (added)"
        ]
    );
}

/// MachineDeployment: CanUpdateMachineSet judged templates; the Machine moved to the new MachineSet has its
/// own objects (providerID, discovery token, refs). Same templates: no mismatch.
#[test]
fn md_templates_and_the_moved_machine_agree_on_an_honest_update() {
    let request = fixture("can-update-machineset-md.json");
    let judged = normalized(&request["desired"], SET, Scope::Template);
    let mut live = fixture("update-machine-worker.json")["desired"].clone();
    assert_eq!(
        live["machine"]["metadata"]["labels"]["cluster.x-k8s.io/set-name"],
        json!(label_value(
            request["desired"]["machineSet"]["metadata"]["name"]
                .as_str()
                .unwrap()
        ))
    );
    assert!(shown(&judged, &live, CheckMode::TemplateSubset).is_empty());

    // The template's file content changed after the verdict (the 24 h cache), and a mount was added.
    live["bootstrapConfig"]["spec"]["files"][0]["content"] = json!("version = 3\n");
    live["bootstrapConfig"]["spec"]["mounts"] = json!([["/dev/sdb1", "/data"]]);
    assert_eq!(
        shown(&judged, &live, CheckMode::TemplateSubset),
        [
            "KubeadmConfig spec.files[path=/etc/containerd/config.toml].content (changed)",
            "KubeadmConfig spec.mounts (added)"
        ]
    );
}
