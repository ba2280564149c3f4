//! Realistic CAPI objects (as CAPI sends them in CanUpdate requests) and an independent reading of
//! our answers the way CAPI reads them.
#![allow(dead_code, clippy::unwrap_used)]

use inplace_core::{
    Decision, DecisionOutcome, ObjectRole, Objects, Patch, PatchType, Policy, Scope, Settings,
    decide,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub const CP_LABEL: &str = "cluster.x-k8s.io/control-plane";

pub fn machine_spec(version: &str) -> Value {
    json!({
        "clusterName": "prod",
        "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "prod-cp-abc"},
                      "dataSecretName": "prod-cp-abc"},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "VSphereMachine", "name": "prod-cp-abc"},
        "version": version,
        "providerID": "vsphere://4213-aa",
        "failureDomain": "fd-1",
        "deletion": {"nodeDrainTimeoutSeconds": 300},
        "readinessGates": [{"conditionType": "example.com/Ready"}]
    })
}

pub fn kubeadm_spec() -> Value {
    json!({
        "clusterConfiguration": {
            "etcd": {"local": {"imageRepository": "registry.k8s.io", "imageTag": "3.5.21-0", "dataDir": "/var/lib/etcddisk/etcd"}},
            "apiServer": {"extraArgs": [{"name": "audit-log-path", "value": "/var/log/audit.log"}, {"name": "oidc-client-secret", "value": "s3cr3t"}]},
            "controllerManager": {"extraArgs": [{"name": "bind-address", "value": "0.0.0.0"}]}
        },
        "initConfiguration": {"nodeRegistration": {"name": "{{ ds.meta_data.hostname }}", "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}, {"name": "max-pods", "value": "110"}]}},
        "joinConfiguration": {"nodeRegistration": {"name": "{{ ds.meta_data.hostname }}", "kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}},
        "files": [
            {"path": "/etc/kubernetes/audit-policy.yaml", "owner": "root:root", "permissions": "0600", "content": "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"},
            {"path": "/etc/sysctl.d/99-k8s.conf", "content": "net.ipv4.ip_forward = 1\n"},
            {"path": "/etc/pki/ca.pem", "contentFrom": {"secret": {"name": "prod-ca", "key": "tls.crt"}}, "permissions": "0644"}
        ],
        "users": [
            {"name": "capv", "sudo": "ALL=(ALL) NOPASSWD:ALL", "sshAuthorizedKeys": ["ssh-ed25519 AAAAC3Nza-one ops@example.com"], "passwd": "$6$rounds=4096$hash"},
            {"name": "backup", "shell": "/bin/bash", "sshAuthorizedKeys": ["ssh-rsa AAAAB3Nza-backup backup@example.com"]}
        ],
        "ntp": {"enabled": true, "servers": ["0.pool.ntp.org", "1.pool.ntp.org"]},
        "diskSetup": {"filesystems": [{"device": "/dev/sdb1", "filesystem": "ext4", "label": "etcd_disk"}]},
        "mounts": [["LABEL=etcd_disk", "/var/lib/etcddisk"]],
        "preKubeadmCommands": ["hostnamectl set-hostname '{{ ds.meta_data.hostname }}'"],
        "postKubeadmCommands": ["echo done"],
        "format": "cloud-config"
    })
}

pub fn infra_spec() -> Value {
    json!({
        "template": "ubuntu-2404-kube-v1.33.4",
        "server": "vcenter.example.com",
        "numCPUs": 4,
        "memoryMiB": 8192,
        "diskGiB": 40,
        "network": {"devices": [{"networkName": "VM Network", "dhcp4": true}]},
        "providerID": "vsphere://4213-aa"
    })
}

fn meta(name: &str, labels: Value) -> Value {
    json!({"name": name, "namespace": "default", "labels": labels, "annotations": {"note": "synced"}})
}

pub fn machine(spec: Value, control_plane: bool) -> Value {
    let labels = if control_plane {
        json!({"cluster.x-k8s.io/cluster-name": "prod", CP_LABEL: ""})
    } else {
        json!({"cluster.x-k8s.io/cluster-name": "prod"})
    };
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta("prod-cp-abc", labels), "spec": spec})
}

pub fn kubeadm_config(spec: Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "metadata": meta("prod-cp-abc", json!({})), "spec": spec})
}

pub fn vsphere_machine(spec: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "VSphereMachine", "metadata": meta("prod-cp-abc", json!({})), "spec": spec})
}

pub fn machine_set(spec: Value) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "metadata": meta("prod-md-0-x", json!({})),
        "spec": {"clusterName": "prod", "replicas": 3, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}}})
}

pub fn kubeadm_config_template(spec: Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfigTemplate", "metadata": meta("prod-md-0", json!({})),
        "spec": {"template": {"spec": spec}}})
}

pub fn vsphere_machine_template(spec: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "VSphereMachineTemplate", "metadata": meta("prod-md-0", json!({})),
        "spec": {"template": {"spec": spec}}})
}

/// Current and desired objects of one request.
#[derive(Clone, Debug)]
pub struct Req {
    pub scope: Scope,
    pub current: [Value; 3],
    pub desired: [Value; 3],
}

impl Req {
    /// A CanUpdateMachine request for a control-plane Machine with identical sides.
    pub fn machine(version: &str) -> Req {
        let cur = [
            machine(machine_spec(version), true),
            kubeadm_config(kubeadm_spec()),
            vsphere_machine(infra_spec()),
        ];
        Req {
            scope: Scope::Object,
            current: cur.clone(),
            desired: cur,
        }
    }

    /// A CanUpdateMachineSet request with identical sides.
    pub fn machine_set(version: &str) -> Req {
        let mut ms = machine_spec(version);
        ms.as_object_mut().unwrap().remove("providerID");
        let cur = [
            machine_set(ms),
            kubeadm_config_template(kubeadm_spec()),
            vsphere_machine_template(infra_spec()),
        ];
        Req {
            scope: Scope::Template,
            current: cur.clone(),
            desired: cur,
        }
    }

    fn idx(role: ObjectRole) -> usize {
        match role {
            ObjectRole::Machine => 0,
            ObjectRole::Bootstrap => 1,
            ObjectRole::Infra => 2,
        }
    }

    /// The compared part of the desired object in `role`, to mutate.
    pub fn desired_spec(&mut self, role: ObjectRole) -> &mut Value {
        let ptr = self.scope.pointer();
        self.desired[Self::idx(role)].pointer_mut(ptr).unwrap()
    }

    /// The compared part of the current object in `role`, to mutate.
    pub fn current_spec(&mut self, role: ObjectRole) -> &mut Value {
        let ptr = self.scope.pointer();
        self.current[Self::idx(role)].pointer_mut(ptr).unwrap()
    }

    pub fn objects(side: &[Value; 3]) -> Objects<'_> {
        Objects {
            machine: Some(&side[0]),
            bootstrap: Some(&side[1]),
            infra: Some(&side[2]),
        }
    }

    pub fn decide_with(&self, policy: &Policy, settings: &Settings) -> Decision {
        decide(
            self.scope,
            &Self::objects(&self.current),
            &Self::objects(&self.desired),
            policy,
            settings,
        )
    }

    pub fn decide(&self) -> Decision {
        self.decide_with(&Policy::builtin(), &Settings::default())
    }
}

pub fn settings(pairs: &[(&str, &str)]) -> Settings {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_map(&map).unwrap()
}

/// evanphx/json-patch v5 `MergePatch` for objects, written independently of the crate's own copy.
fn go_merge(doc: &mut Value, patch: &Value) {
    fn prune(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, v| !v.is_null());
                m.values_mut().for_each(prune);
            }
            Value::Array(a) => a.iter_mut().filter(|v| !v.is_null()).for_each(prune),
            _ => {}
        }
    }
    let (Value::Object(d), Value::Object(p)) = (doc, patch) else {
        panic!("merge patch of a non-object")
    };
    for (k, v) in p {
        if v.is_null() {
            d.remove(k);
        } else if let Some(cur) = d.get_mut(k).filter(|c| !c.is_null()) {
            if cur.is_object() && v.is_object() {
                go_merge(cur, v);
            } else if cur.is_object() {
                *cur = v.clone();
            } else {
                let mut v = v.clone();
                prune(&mut v);
                *cur = v;
            }
        } else {
            let mut v = v.clone();
            prune(&mut v);
            d.insert(k.clone(), v);
        }
    }
}

/// The compared part of `object` after CAPI applied `patch` and copied back.
pub fn capi_apply(scope: Scope, object: &Value, patch: Option<&Patch>) -> Value {
    let ptr = scope.pointer();
    let Some(patch) = patch else {
        return object.pointer(ptr).cloned().unwrap_or(Value::Null);
    };
    let mut doc = object.clone();
    match patch.patch_type {
        PatchType::JsonPatch => {
            let ops: json_patch::Patch =
                serde_json::from_slice(&patch.bytes).expect("CAPI decodes the JSON patch");
            json_patch::patch(&mut doc, &ops).expect("CAPI applies the JSON patch");
        }
        PatchType::JsonMergePatch => {
            let p: Value =
                serde_json::from_slice(&patch.bytes).expect("CAPI decodes the merge patch");
            go_merge(&mut doc, &p);
        }
    }
    doc.pointer(ptr)
        .or_else(|| object.pointer(ptr))
        .cloned()
        .unwrap_or(Value::Null)
}

/// CAPI's comparison of a Machine spec: only `version` and `failureDomain` survive its cleanup, and a
/// typed string is "" when absent.
fn machine_compared(spec: &Value) -> (String, String) {
    let s = |k: &str| spec.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    (s("version"), s("failureDomain"))
}

/// Whether CAPI, applying the decision's patches, finds every object equal to desired.
pub fn capi_in_place(req: &Req, d: &Decision) -> bool {
    ObjectRole::ALL.iter().all(|&role| {
        let i = Req::idx(role);
        let after = capi_apply(req.scope, &req.current[i], d.patches.get(role));
        let desired = req.desired[i]
            .pointer(req.scope.pointer())
            .cloned()
            .unwrap_or(Value::Null);
        match role {
            ObjectRole::Machine => machine_compared(&after) == machine_compared(&desired),
            _ => after == desired,
        }
    })
}

/// Asserts what a user relies on for every change of a Success answer: accepted paths read as
/// desired after CAPI applies the patches, rejected ones as current, and CAPI's overall verdict
/// matches ours.
pub fn assert_capi_agrees(req: &Req, d: &Decision) {
    if !d.outcome.is_success() {
        assert!(
            ObjectRole::ALL.iter().all(|r| d.patches.get(*r).is_none()),
            "no patches with a Failure"
        );
        assert_capi_sim_agrees(req, d);
        return;
    }
    for c in &d.changes {
        let i = Req::idx(c.object);
        let after = capi_apply(req.scope, &req.current[i], d.patches.get(c.object));
        let cur = req.current[i].pointer(req.scope.pointer());
        let des = req.desired[i].pointer(req.scope.pointer());
        let got = c.location.resolve(Some(&after));
        fn norm(v: Option<&Value>) -> Option<&Value> {
            v.filter(|v| !v.is_null() && v.as_str() != Some(""))
        }
        let typed_eq = |a: Option<&Value>, b: Option<&Value>| {
            if c.object == ObjectRole::Machine {
                norm(a) == norm(b)
            } else {
                a == b
            }
        };
        if c.change == inplace_core::ChangeKind::Reordered {
            continue;
        }
        match c.verdict {
            inplace_core::ChangeVerdict::Action | inplace_core::ChangeVerdict::Accept => {
                assert!(
                    typed_eq(got, c.location.resolve(des)),
                    "accepted {} {} is not desired after CAPI applies: {}",
                    c.kind,
                    c.path,
                    d.message
                )
            }
            inplace_core::ChangeVerdict::Reject => {
                assert!(
                    typed_eq(got, c.location.resolve(cur)),
                    "rejected {} {} is not current after CAPI applies: {}",
                    c.kind,
                    c.path,
                    d.message
                )
            }
            inplace_core::ChangeVerdict::Ignored => {}
        }
    }
    assert_eq!(
        capi_in_place(req, d),
        d.outcome == DecisionOutcome::InPlace,
        "CAPI's reading differs from our outcome: {}",
        d.message
    );
    assert_capi_sim_agrees(req, d);
}

/// The CanUpdateMachine(Set) request body CAPI would send for `req`.
pub fn request_body(req: &Req, settings: &[(&str, &str)]) -> Value {
    let settings: serde_json::Map<String, Value> = settings
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let side = |objs: &[Value; 3]| match req.scope {
        Scope::Object => {
            json!({"machine": objs[0], "bootstrapConfig": objs[1], "infrastructureMachine": objs[2]})
        }
        Scope::Template => {
            json!({"machineSet": objs[0], "bootstrapConfigTemplate": objs[1], "infrastructureMachineTemplate": objs[2]})
        }
    };
    let kind = match req.scope {
        Scope::Object => "CanUpdateMachineRequest",
        Scope::Template => "CanUpdateMachineSetRequest",
    };
    json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": kind, "settings": settings,
           "current": side(&req.current), "desired": side(&req.desired)})
}

/// The response body a hook built on `d` sends (patches base64-encoded as Go's []byte).
pub fn response_body(req: &Req, d: &Decision) -> Vec<u8> {
    response_body_for(req.scope, d)
}

/// [`response_body`] for a request of `scope`.
pub fn response_body_for(scope: Scope, d: &Decision) -> Vec<u8> {
    use base64::Engine as _;
    let wire = |p: Option<&Patch>| {
        p.map(|p| json!({"patchType": p.patch_type.as_str(), "patch": base64::engine::general_purpose::STANDARD.encode(&p.bytes)}))
    };
    let names = match scope {
        Scope::Object => [
            "machinePatch",
            "bootstrapConfigPatch",
            "infrastructureMachinePatch",
        ],
        Scope::Template => [
            "machineSetPatch",
            "bootstrapConfigTemplatePatch",
            "infrastructureMachineTemplatePatch",
        ],
    };
    let mut body = json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "status": if d.outcome.is_success() { "Success" } else { "Failure" }, "message": d.message});
    for (name, role) in names.iter().zip(ObjectRole::ALL) {
        if let Some(p) = wire(d.patches.get(role)) {
            body[*name] = p;
        }
    }
    serde_json::to_vec(&body).unwrap()
}

/// What CAPI's controllers do with our answer (through the capi-sim crate).
pub fn capi_sim_decision(req: &Req, d: &Decision) -> capi_sim::CapiDecision {
    let request = request_body(req, &[]);
    let response = response_body(req, d);
    match req.scope {
        Scope::Object => capi_sim::can_update_machine(&request, &response),
        Scope::Template => capi_sim::can_update_machine_set(&request, &response),
    }
}

/// Asserts that CAPI (as capi-sim reproduces it) reaches the outcome we announced.
pub fn assert_capi_sim_agrees(req: &Req, d: &Decision) {
    let capi = capi_sim_decision(req, d);
    let ok = match d.outcome {
        DecisionOutcome::InPlace => capi == capi_sim::CapiDecision::InPlace,
        DecisionOutcome::NeedsRollout => matches!(capi, capi_sim::CapiDecision::Rollout { .. }),
        DecisionOutcome::Refused | DecisionOutcome::SelfCheckFailed => {
            matches!(capi, capi_sim::CapiDecision::Error { .. })
        }
    };
    assert!(
        ok,
        "we said {:?} ({}), CAPI does {capi:?}",
        d.outcome, d.message
    );
}

/// The verdict of the change at `path` (as shown).
pub fn verdict_of<'d>(d: &'d Decision, path: &str) -> &'d inplace_core::JudgedChange {
    d.changes
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| {
            panic!(
                "no change at {path}; changes: {:?}",
                d.changes.iter().map(|c| &c.path).collect::<Vec<_>>()
            )
        })
}
