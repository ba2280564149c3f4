//! Typed Machine and MachineSet (cluster.x-k8s.io/v1beta2) as CAPI's Go structs hold them, and the
//! comparison CAPI makes after `inplace.CleanupMachineSpecForDiff`.
//!
//! CAPI keeps these objects typed, so a patched Machine is re-read through the Go struct: unknown
//! fields vanish, absent and zero-valued `omitempty` fields are the same thing, a wrong type is an
//! error. After the cleanup only `version` and `failureDomain` are left to compare.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::godecode::{DecodeCtx, DecodeError, GoDecode, GoEncode, decode_partial, go_struct};
use crate::gojson::{GoJson, from_value};

go_struct! {
    /// `ContractVersionedObjectReference`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct ObjectReference {
        /// `kind`
        kind: String = "kind" [omitempty],
        /// `name`
        name: String = "name" [omitempty],
        /// `apiGroup`
        api_group: String = "apiGroup" [omitempty],
    }
}

go_struct! {
    /// `Bootstrap`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Bootstrap {
        /// `configRef`
        config_ref: ObjectReference = "configRef" [omitempty, omitzero],
        /// `dataSecretName`
        data_secret_name: Option<String> = "dataSecretName" [omitempty],
    }
}

go_struct! {
    /// `MachineReadinessGate`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct ReadinessGate {
        /// `conditionType`
        condition_type: String = "conditionType" [omitempty],
        /// `polarity`
        polarity: String = "polarity" [omitempty],
    }
}

go_struct! {
    /// `MachineDeletionSpec`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineDeletion {
        /// `nodeDrainTimeoutSeconds`
        node_drain_timeout_seconds: Option<i32> = "nodeDrainTimeoutSeconds" [omitempty],
        /// `nodeVolumeDetachTimeoutSeconds`
        node_volume_detach_timeout_seconds: Option<i32> = "nodeVolumeDetachTimeoutSeconds" [omitempty],
        /// `nodeDeletionTimeoutSeconds`
        node_deletion_timeout_seconds: Option<i32> = "nodeDeletionTimeoutSeconds" [omitempty],
    }
}

go_struct! {
    /// `MachineTaint`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineTaint {
        /// `key`
        key: String = "key" [omitempty],
        /// `value`
        value: String = "value" [omitempty],
        /// `effect`
        effect: String = "effect" [omitempty],
        /// `propagation`
        propagation: String = "propagation" [omitempty],
    }
}

go_struct! {
    /// `MachineSpec` (v1beta2), every field.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineSpec {
        /// `clusterName`
        cluster_name: String = "clusterName" [omitempty],
        /// `bootstrap`
        bootstrap: Bootstrap = "bootstrap" [omitempty, omitzero],
        /// `infrastructureRef`
        infrastructure_ref: ObjectReference = "infrastructureRef" [omitempty, omitzero],
        /// `version`
        version: String = "version" [omitempty],
        /// `providerID`
        provider_id: String = "providerID" [omitempty],
        /// `failureDomain`
        failure_domain: String = "failureDomain" [omitempty],
        /// `minReadySeconds`
        min_ready_seconds: Option<i32> = "minReadySeconds" [omitempty],
        /// `readinessGates`
        readiness_gates: Vec<ReadinessGate> = "readinessGates" [omitempty],
        /// `deletion`
        deletion: MachineDeletion = "deletion" [omitempty, omitzero],
        /// `taints`
        taints: Vec<MachineTaint> = "taints" [omitempty],
    }
}

impl MachineSpec {
    /// `inplace.CleanupMachineSpecForDiff`: zero every field in-place updates never have to cover.
    pub fn cleaned_for_diff(&self) -> MachineSpec {
        MachineSpec {
            version: self.version.clone(),
            failure_domain: self.failure_domain.clone(),
            ..Default::default()
        }
    }

    /// The JSON `json.Marshal` writes for this spec.
    pub fn to_go_json(&self) -> Value {
        self.go_encode()
    }
}

go_struct! {
    /// The `metav1.ObjectMeta` fields CAPI puts into hook requests (`cleanupMachine` & co).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct RequestObjectMeta {
        /// `name`
        name: String = "name" [omitempty],
        /// `namespace`
        namespace: String = "namespace" [omitempty],
        /// `labels`
        labels: BTreeMap<String, String> = "labels" [omitempty],
        /// `annotations`
        annotations: BTreeMap<String, String> = "annotations" [omitempty],
    }
}

go_struct! {
    /// `clusterv1.ObjectMeta` (labels and annotations only) of a machine template.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct TemplateMeta {
        /// `labels`
        labels: BTreeMap<String, String> = "labels" [omitempty],
        /// `annotations`
        annotations: BTreeMap<String, String> = "annotations" [omitempty],
    }
}

go_struct! {
    /// `MachineTemplateSpec`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineTemplate {
        /// `metadata`
        metadata: TemplateMeta = "metadata" [omitempty, omitzero],
        /// `spec`
        spec: MachineSpec = "spec" [omitempty, omitzero],
    }
}

go_struct! {
    /// `metav1.LabelSelectorRequirement`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct LabelSelectorRequirement {
        /// `key`
        key: String = "key",
        /// `operator`
        operator: String = "operator",
        /// `values`
        values: Vec<String> = "values" [omitempty],
    }
}

go_struct! {
    /// `metav1.LabelSelector`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct LabelSelector {
        /// `matchLabels`
        match_labels: BTreeMap<String, String> = "matchLabels" [omitempty],
        /// `matchExpressions`
        match_expressions: Vec<LabelSelectorRequirement> = "matchExpressions" [omitempty],
    }
}

go_struct! {
    /// `MachineNamingSpec`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineNaming {
        /// `template`
        template: String = "template" [omitempty],
    }
}

go_struct! {
    /// `MachineSetDeletionSpec`.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineSetDeletion {
        /// `order`
        order: String = "order" [omitempty],
    }
}

go_struct! {
    /// `MachineSetSpec` (v1beta2), every field.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineSetSpec {
        /// `clusterName`
        cluster_name: String = "clusterName" [omitempty],
        /// `replicas`
        replicas: Option<i32> = "replicas" [omitempty],
        /// `selector`
        selector: LabelSelector = "selector" [omitempty, omitzero],
        /// `template`
        template: MachineTemplate = "template" [omitempty, omitzero],
        /// `machineNaming`
        machine_naming: MachineNaming = "machineNaming" [omitempty, omitzero],
        /// `deletion`
        deletion: MachineSetDeletion = "deletion" [omitempty, omitzero],
    }
}

go_struct! {
    /// A Machine as `cleanupMachine` builds it for a hook request (never any status).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Machine {
        /// `apiVersion`
        api_version: String = "apiVersion" [omitempty],
        /// `kind`
        kind: String = "kind" [omitempty],
        /// `metadata`
        metadata: RequestObjectMeta = "metadata" [omitempty],
        /// `spec`
        spec: MachineSpec = "spec" [omitempty, omitzero],
    }
}

go_struct! {
    /// A MachineSet as `cleanupMachineSet` builds it for a hook request.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MachineSet {
        /// `apiVersion`
        api_version: String = "apiVersion" [omitempty],
        /// `kind`
        kind: String = "kind" [omitempty],
        /// `metadata`
        metadata: RequestObjectMeta = "metadata" [omitempty],
        /// `spec`
        spec: MachineSetSpec = "spec" [omitempty, omitzero],
    }
}

/// Decodes `value` into Go type `T` the way `json.Unmarshal` reads an unstructured object's JSON.
pub(crate) fn decode_typed<T: GoDecode>(value: &Value) -> Result<T, DecodeError> {
    let json: GoJson = from_value(value);
    let mut cx = DecodeCtx::default();
    let typed = decode_partial(&json, &mut cx);
    match cx.first_error() {
        Some(e) => Err(e.clone()),
        None => Ok(typed),
    }
}

/// Decodes a request object strictly: anything a Go encoder of `T` would not have written
/// (unknown or misspelt keys, wrong types) is reported.
pub(crate) fn decode_request_object<T: GoDecode>(value: &Value, what: &str) -> Result<T, String> {
    let json: GoJson = from_value(value);
    let mut cx = DecodeCtx::strict();
    let typed = decode_partial(&json, &mut cx);
    if let Some(e) = cx.first_error() {
        return Err(format!("{what}: {e}"));
    }
    if !cx.unexpected_keys().is_empty() {
        return Err(format!("{what}: {}", cx.unexpected_keys().join("; ")));
    }
    Ok(typed)
}

/// Fields that differ between two Machine specs after CAPI's cleanup (`spec.version`, ...).
pub fn machine_spec_differences(a: &MachineSpec, b: &MachineSpec, prefix: &str) -> Vec<String> {
    let (a, b) = (a.cleaned_for_diff(), b.cleaned_for_diff());
    let mut out = Vec::new();
    if a.version != b.version {
        out.push(format!("{prefix}.version"));
    }
    if a.failure_domain != b.failure_domain {
        out.push(format!("{prefix}.failureDomain"));
    }
    // Guard: if CleanupMachineSpecForDiff ever keeps more fields, compare those too.
    if out.is_empty() && a != b {
        out.push(prefix.to_string());
    }
    out
}

/// Whether CAPI considers two Machine specs (JSON) equal: Go-typed decode, cleanup, compare.
pub fn machine_specs_equal(a: &Value, b: &Value) -> Result<bool, DecodeError> {
    let a: MachineSpec = decode_typed(a)?;
    let b: MachineSpec = decode_typed(b)?;
    Ok(machine_spec_differences(&a, &b, "spec").is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "clusterName": "edge-01",
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "a"}, "dataSecretName": "a"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "a"},
            "version": "v1.33.4",
            "providerID": "docker:////a",
            "failureDomain": "fd1",
            "minReadySeconds": 0,
            "readinessGates": [{"conditionType": "APIServerPodHealthy"}],
            "deletion": {"nodeDrainTimeoutSeconds": 10, "nodeDeletionTimeoutSeconds": 10, "nodeVolumeDetachTimeoutSeconds": 5},
            "taints": [{"key": "k", "effect": "NoSchedule", "propagation": "Always"}]
        })
    }

    #[test]
    fn ignored_fields_do_not_count() {
        let mut other = base();
        other["providerID"] = json!("docker:////b");
        other["clusterName"] = json!("other");
        other["bootstrap"] = json!({"dataSecretName": "b"});
        other["infrastructureRef"]["name"] = json!("b");
        other["readinessGates"] = json!([]);
        other["taints"] = json!(null);
        other["minReadySeconds"] = json!(30);
        other["deletion"] = json!({"nodeDrainTimeoutSeconds": 600});
        assert!(machine_specs_equal(&base(), &other).unwrap());
    }

    #[test]
    fn version_and_failure_domain_count() {
        for (field, value) in [
            ("version", json!("v1.34.1")),
            ("failureDomain", json!("fd2")),
        ] {
            let mut other = base();
            other[field] = value;
            assert!(!machine_specs_equal(&base(), &other).unwrap(), "{field}");
        }
    }

    #[test]
    fn absent_and_empty_are_the_same_for_typed_specs() {
        let mut a = base();
        a.as_object_mut().unwrap().remove("failureDomain");
        let mut b = base();
        b["failureDomain"] = json!("");
        assert!(machine_specs_equal(&a, &b).unwrap());
        // Case-insensitive keys, as Go reads them: the last matching key wins in sorted order.
        let mut c = base();
        c.as_object_mut().unwrap().remove("version");
        c["VERSION"] = json!("v1.33.4");
        assert!(machine_specs_equal(&base(), &c).unwrap());
    }

    #[test]
    fn wrong_types_are_errors() {
        let mut bad = base();
        bad["minReadySeconds"] = json!("30");
        assert!(machine_specs_equal(&base(), &bad).is_err());
        let mut bad = base();
        bad["version"] = json!(1.34);
        assert!(machine_specs_equal(&base(), &bad).is_err());
    }

    #[test]
    fn round_trip_drops_empty_fields() {
        let spec: MachineSpec = decode_typed(
            &json!({"version": "v1", "providerID": "", "readinessGates": [], "deletion": {}}),
        )
        .unwrap();
        assert_eq!(spec.to_go_json(), json!({"version": "v1"}));
        assert!(
            decode_request_object::<MachineSpec>(
                &json!({"version": "v1", "failuredomain": "x"}),
                "spec"
            )
            .is_err()
        );
        assert!(
            decode_request_object::<MachineSpec>(&json!({"version": "v1", "status": {}}), "spec")
                .is_err()
        );
    }
}
