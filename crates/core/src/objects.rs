//! The three objects of a CanUpdate request, and what CAPI covers of each: `spec` for
//! CanUpdateMachine, `spec.template.spec` for CanUpdateMachineSet.

use serde::Serialize;
use serde_json::Value;

/// Which part of the objects CAPI compares after applying our patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Scope {
    /// CanUpdateMachine: Machine, KubeadmConfig and infrastructure machine; `spec` is compared.
    Object,
    /// CanUpdateMachineSet: MachineSet, bootstrap config template and infrastructure machine template;
    /// `spec.template.spec` is compared.
    Template,
}

impl Scope {
    /// The JSON Pointer of the compared part of every object (`/spec` or `/spec/template/spec`).
    pub fn pointer(self) -> &'static str {
        match self {
            Scope::Object => "/spec",
            Scope::Template => "/spec/template/spec",
        }
    }

    /// The member names leading to the compared part.
    pub fn segments(self) -> &'static [&'static str] {
        match self {
            Scope::Object => &["spec"],
            Scope::Template => &["spec", "template", "spec"],
        }
    }
}

/// The Machine (or MachineSet), bootstrap config (or template) and infrastructure machine (or
/// template) of one side of a request, as whole objects the way CAPI sends them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Objects<'a> {
    /// `machine` / `machineSet`.
    pub machine: Option<&'a Value>,
    /// `bootstrapConfig` / `bootstrapConfigTemplate`.
    pub bootstrap: Option<&'a Value>,
    /// `infrastructureMachine` / `infrastructureMachineTemplate`.
    pub infra: Option<&'a Value>,
}

impl<'a> Objects<'a> {
    /// The object in `role`.
    pub fn get(&self, role: ObjectRole) -> Option<&'a Value> {
        match role {
            ObjectRole::Machine => self.machine,
            ObjectRole::Bootstrap => self.bootstrap,
            ObjectRole::Infra => self.infra,
        }
    }
}

/// The place of an object in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectRole {
    /// Machine or MachineSet.
    Machine,
    /// KubeadmConfig or KubeadmConfigTemplate (or another bootstrap provider's kind).
    Bootstrap,
    /// The infrastructure provider's machine or machine template.
    Infra,
}

impl ObjectRole {
    /// All roles, in the order decisions report them.
    pub const ALL: [ObjectRole; 3] = [
        ObjectRole::Machine,
        ObjectRole::Bootstrap,
        ObjectRole::Infra,
    ];

    /// The name used when the object's own `kind` is unknown.
    pub fn fallback_kind(self, scope: Scope) -> &'static str {
        match (self, scope) {
            (ObjectRole::Machine, Scope::Object) => "Machine",
            (ObjectRole::Machine, Scope::Template) => "MachineSet",
            (ObjectRole::Bootstrap, Scope::Object) => "BootstrapConfig",
            (ObjectRole::Bootstrap, Scope::Template) => "BootstrapConfigTemplate",
            (ObjectRole::Infra, Scope::Object) => "InfrastructureMachine",
            (ObjectRole::Infra, Scope::Template) => "InfrastructureMachineTemplate",
        }
    }
}

/// The label CAPI puts on control-plane Machines.
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// The label CAPI puts on every Machine with its cluster's name.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The label CAPI puts on a Machine with its MachineSet's (formatted) name.
pub const SET_NAME_LABEL: &str = "cluster.x-k8s.io/set-name";
/// The label CAPI puts on a MachineSet and its Machines with the template hash.
pub const TEMPLATE_HASH_LABEL: &str = "machine-template-hash";

/// API group of CAPI's kubeadm bootstrap provider.
pub const KUBEADM_BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

/// The kind whose rules apply to an object's compared part: the object's own kind for Machine-level
/// objects, the templated kind for templates (`KubeadmConfigTemplate` → `KubeadmConfig`).
pub fn machine_level_kind(scope: Scope, object: &Value) -> &str {
    let kind = kind_of(object);
    match scope {
        Scope::Object => kind,
        Scope::Template => templated_kind(kind).unwrap_or(kind),
    }
}

/// Whether an object of this Machine-level kind and API group is a CABPK KubeadmConfig.
pub fn is_kubeadm_config(kind: &str, api_group: &str) -> bool {
    kind == "KubeadmConfig" && api_group == KUBEADM_BOOTSTRAP_GROUP
}

/// The object's `kind`, or `""`.
pub fn kind_of(object: &Value) -> &str {
    object.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// The API group of the object's `apiVersion` (`cluster.x-k8s.io` for `cluster.x-k8s.io/v1beta2`; `""` for
/// the core group or a missing apiVersion).
pub fn api_group_of(object: &Value) -> &str {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The compared part of `object` (`spec` or `spec.template.spec`), if present.
pub fn region(scope: Scope, object: &Value) -> Option<&Value> {
    scope
        .segments()
        .iter()
        .try_fold(object, |v, name| v.get(name))
}

/// The kind whose rules apply to a template's `spec.template.spec`: MachineSet → Machine,
/// KubeadmConfigTemplate → KubeadmConfig, DockerMachineTemplate → DockerMachine. `None` when the
/// kind is not a template kind.
pub fn templated_kind(kind: &str) -> Option<&str> {
    if kind == "MachineSet" {
        return Some("Machine");
    }
    kind.strip_suffix("Template").filter(|k| !k.is_empty())
}

/// Whether the Machine of a request is a control-plane Machine: only CanUpdateMachine (called by
/// KubeadmControlPlane) has one, and its Machine carries [`CONTROL_PLANE_LABEL`].
pub fn is_control_plane(scope: Scope, current: &Objects, desired: &Objects) -> bool {
    let labelled = |m: Option<&Value>| {
        m.and_then(|m| m.pointer("/metadata/labels"))
            .and_then(Value::as_object)
            .is_some_and(|labels| labels.contains_key(CONTROL_PLANE_LABEL))
    };
    scope == Scope::Object && (labelled(desired.machine) || labelled(current.machine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_kind_group_and_region() {
        let ms = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "spec": {"replicas": 3, "template": {"spec": {"version": "v1.33.1"}}}});
        assert_eq!(kind_of(&ms), "MachineSet");
        assert_eq!(api_group_of(&ms), "cluster.x-k8s.io");
        assert_eq!(
            region(Scope::Template, &ms),
            Some(&json!({"version": "v1.33.1"}))
        );
        assert_eq!(api_group_of(&json!({"apiVersion": "v1"})), "");
        assert_eq!(
            templated_kind("KubeadmConfigTemplate"),
            Some("KubeadmConfig")
        );
        assert_eq!(templated_kind("MachineSet"), Some("Machine"));
        assert_eq!(templated_kind("Template"), None);
    }

    #[test]
    fn control_plane_only_for_labelled_machines_in_object_scope() {
        let cp = json!({"metadata": {"labels": {CONTROL_PLANE_LABEL: ""}}});
        let objs = Objects {
            machine: Some(&cp),
            ..Default::default()
        };
        assert!(is_control_plane(Scope::Object, &objs, &objs));
        assert!(!is_control_plane(Scope::Template, &objs, &objs));
        assert!(!is_control_plane(
            Scope::Object,
            &Objects::default(),
            &Objects::default()
        ));
    }
}
