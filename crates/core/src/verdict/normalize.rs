//! The compared part of an object, re-rooted at the Machine-level `spec` and cleaned the way CAPI cleans it
//! before it asks CanUpdate, so the objects a CanUpdate answer judged and the live objects UpdateMachine
//! receives for the same desired state come out identical.
//!
//! What CAPI changes between the two (see `capi-facts.md` §1–4):
//! - Machine: only what `CleanupMachineSpecForDiff` keeps is compared ([`MACHINE_FIELDS_IGNORED_BY_CAPI`] are
//!   dropped: `providerID`, `bootstrap.dataSecretName`, refs, in-place fields `syncMachines` may change at any
//!   time), so today `version` and `failureDomain`.
//! - KubeadmConfig (and KubeadmConfigTemplate's `spec.template.spec`): KCP's `PrepareKubeadmConfigsForDiff`
//!   empties `joinConfiguration.discovery` (UpdateMachine's live object carries CABPK's bootstrap token
//!   there), nils both `timeouts.controlPlaneComponentHealthCheckSeconds`, overwrites
//!   `clusterConfiguration.controlPlaneEndpoint` and `.dns`, defaults `format` and `imagePullPolicy`, drops
//!   empty lists and maps, and sends the join variant (`initConfiguration` emptied). The same is done here to
//!   both sides. `initConfiguration.nodeRegistration.kubeletExtraArgs` is first moved to `joinConfiguration`
//!   when that has none, because that is where the plan would read kubelet flags from.
//! - Everything: a member that is `null`, `""`, `[]` or `{}` counts as absent (Go's `omitempty`), except an
//!   empty `taints` list, which kubeadm reads as "no taints" rather than "the default taints".

use serde_json::{Map, Value};

use crate::decide::MACHINE_FIELDS_IGNORED_BY_CAPI;
use crate::objects::{self, ObjectRole, Scope};
pub use crate::objects::{KUBEADM_BOOTSTRAP_GROUP, is_kubeadm_config, machine_level_kind};

/// `format` when a KubeadmConfig leaves it out (CAPI's `ApplyPreviousKubeadmConfigDefaults`).
pub const DEFAULT_KUBEADM_FORMAT: &str = "cloud-config";

/// `nodeRegistration.imagePullPolicy` when a KubeadmConfig leaves it out (same function).
pub const DEFAULT_IMAGE_PULL_POLICY: &str = "IfNotPresent";

/// The normalised compared part of `object` (its `spec`, or `spec.template.spec` for a template), as the
/// value at the Machine-level `spec`. An object without one normalises to an empty object.
pub fn normalize(role: ObjectRole, scope: Scope, object: &Value) -> Value {
    normalize_region(
        role,
        machine_level_kind(scope, object),
        objects::api_group_of(object),
        objects::region(scope, object).cloned(),
    )
}

/// [`normalize`] for the compared part taken out of an object of this (Machine-level) kind and group.
pub(crate) fn normalize_region(
    role: ObjectRole,
    kind: &str,
    api_group: &str,
    region: Option<Value>,
) -> Value {
    let mut spec = region.unwrap_or_else(|| Value::Object(Map::new()));
    match role {
        ObjectRole::Machine => {
            for fields in MACHINE_FIELDS_IGNORED_BY_CAPI {
                remove_at(&mut spec, fields);
            }
        }
        ObjectRole::Bootstrap if is_kubeadm_config(kind, api_group) => kubeadm_config(&mut spec),
        ObjectRole::Bootstrap | ObjectRole::Infra => {}
    }
    prune(&mut spec);
    spec
}

/// What CAPI's `PrepareKubeadmConfigsForDiff` does to both sides, on a KubeadmConfig spec.
fn kubeadm_config(spec: &mut Value) {
    let Value::Object(_) = spec else { return };
    // Where the plan reads kubelet flags when the join configuration has none.
    let init_args = spec
        .pointer("/initConfiguration/nodeRegistration/kubeletExtraArgs")
        .filter(|args| !crate::diff::typed_empty(args))
        .cloned();
    let join_args = spec
        .pointer("/joinConfiguration/nodeRegistration/kubeletExtraArgs")
        .is_some_and(|args| !crate::diff::typed_empty(args));
    if let (Some(args), false) = (init_args, join_args) {
        set_at(
            spec,
            &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
            args,
        );
    }
    remove_at(spec, &["initConfiguration"]);
    remove_at(spec, &["joinConfiguration", "discovery"]);
    remove_at(
        spec,
        &[
            "joinConfiguration",
            "timeouts",
            "controlPlaneComponentHealthCheckSeconds",
        ],
    );
    remove_at(spec, &["clusterConfiguration", "controlPlaneEndpoint"]);
    remove_at(spec, &["clusterConfiguration", "dns"]);
    default_at(spec, &["format"], DEFAULT_KUBEADM_FORMAT);
    default_at(
        spec,
        &["joinConfiguration", "nodeRegistration", "imagePullPolicy"],
        DEFAULT_IMAGE_PULL_POLICY,
    );
}

/// Removes the member at `fields` (a path of object members), if there.
fn remove_at(value: &mut Value, fields: &[&str]) {
    let Some((last, parents)) = fields.split_last() else {
        return;
    };
    let mut cur = value;
    for name in parents {
        match cur.get_mut(*name) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Value::Object(map) = cur {
        map.remove(*last);
    }
}

/// Sets the member at `fields`, creating objects on the way (a non-object on the way is left alone).
fn set_at(value: &mut Value, fields: &[&str], new: Value) {
    let Some((last, parents)) = fields.split_last() else {
        return;
    };
    let mut cur = value;
    for name in parents {
        let Value::Object(map) = cur else { return };
        cur = map
            .entry((*name).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Value::Object(map) = cur {
        map.insert((*last).to_owned(), new);
    }
}

/// Sets the member at `fields` to `default` when it is absent, `null` or `""`.
fn default_at(value: &mut Value, fields: &[&str], default: &str) {
    let unset = match crate::path::resolve_segs(
        Some(value),
        &fields
            .iter()
            .map(|f| crate::path::Seg::Field((*f).to_owned()))
            .collect::<Vec<_>>(),
    ) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    };
    if unset {
        set_at(value, fields, Value::String(default.to_owned()));
    }
}

/// Drops every member that is typed-empty after its own members were pruned; list items stay (their
/// position is their identity) but are pruned inside.
fn prune(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|name, member| {
                prune(member);
                !is_empty(member) || kept_empty(name, member)
            });
        }
        Value::Array(items) => items.iter_mut().for_each(prune),
        _ => {}
    }
}

/// Whether a pruned value is Go's zero value (its members are pruned already, so an object is empty only
/// when nothing is left in it).
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// An empty `taints` list means "no taints" to kubeadm, not "the default taints": CAPI keeps it too.
fn kept_empty(name: &str, member: &Value) -> bool {
    name == "taints" && matches!(member, Value::Array(items) if items.is_empty())
}
