//! What a CanUpdate answer judged, in a form UpdateMachine can be checked against: the desired objects
//! normalised the way CAPI normalises them ([`normalize()`]), fingerprinted per leaf ([`fingerprints()`]), and
//! compared ([`check()`]) — exactly for a Machine judged by CanUpdateMachine, and as "every judged template
//! path holds in the Machine's objects" for a Machine of a MachineSet judged by CanUpdateMachineSet.
//!
//! Pure: the dispatcher stores and finds the records, this module only builds and compares them.

mod check;
mod fingerprint;
mod normalize;

pub use check::{CheckMode, Mismatch, check};

pub use fingerprint::{
    FINGERPRINT_HEX, FingerprintMap, Granularity, MAX_FINGERPRINT_BYTES, fingerprints,
    fingerprints_at,
};
pub use normalize::{
    DEFAULT_IMAGE_PULL_POLICY, DEFAULT_KUBEADM_FORMAT, KUBEADM_BOOTSTRAP_GROUP, is_kubeadm_config,
    machine_level_kind, normalize,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::objects::{self, ObjectRole, Objects, Scope};

/// Hex digits of a desired state's fingerprint an operator copies into the
/// `inplace-updater.dev/accept-unjudged` annotation.
pub const OPERATOR_FINGERPRINT_HEX: usize = 16;

/// One object, normalised: its Machine-level kind and API group, and the compared part at `spec`.
#[derive(Clone, Debug, PartialEq)]
pub struct NormalizedObject {
    /// `Machine`, `KubeadmConfig`, `DevMachine`, ... (templates: the templated kind).
    pub kind: String,
    /// The API group of its `apiVersion`.
    pub api_group: String,
    /// The normalised spec (see [`normalize()`]).
    pub spec: Value,
}

impl NormalizedObject {
    /// Normalises one object of a request of `scope`.
    pub fn of(role: ObjectRole, scope: Scope, object: &Value) -> NormalizedObject {
        NormalizedObject {
            kind: machine_level_kind(scope, object).to_owned(),
            api_group: objects::api_group_of(object).to_owned(),
            spec: normalize(role, scope, object),
        }
    }

    /// Normalises one object of a request of `scope`, taking its compared part out instead of copying it.
    pub fn from_owned(role: ObjectRole, scope: Scope, mut object: Value) -> NormalizedObject {
        let kind = machine_level_kind(scope, &object).to_owned();
        let api_group = objects::api_group_of(&object).to_owned();
        let region = object.pointer_mut(scope.pointer()).map(Value::take);
        NormalizedObject {
            spec: normalize::normalize_region(role, &kind, &api_group, region),
            kind,
            api_group,
        }
    }

    /// Its fingerprints, bounded by [`MAX_FINGERPRINT_BYTES`].
    pub fn prints(&self) -> ObjectPrints {
        let (granularity, entries) = fingerprints(&self.spec);
        ObjectPrints {
            kind: self.kind.clone(),
            api_group: self.api_group.clone(),
            granularity,
            entries,
        }
    }
}

/// The three objects of one side of a request, normalised.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalized {
    /// Machine (MachineSet template).
    pub machine: Option<NormalizedObject>,
    /// Bootstrap config (template).
    pub bootstrap: Option<NormalizedObject>,
    /// Infrastructure machine (template).
    pub infra: Option<NormalizedObject>,
}

impl Normalized {
    /// Normalises every object present.
    pub fn of(scope: Scope, objects: &Objects) -> Normalized {
        let one = |role| {
            objects
                .get(role)
                .map(|object| NormalizedObject::of(role, scope, object))
        };
        Normalized {
            machine: one(ObjectRole::Machine),
            bootstrap: one(ObjectRole::Bootstrap),
            infra: one(ObjectRole::Infra),
        }
    }

    /// The object in `role`.
    pub fn get(&self, role: ObjectRole) -> Option<&NormalizedObject> {
        match role {
            ObjectRole::Machine => self.machine.as_ref(),
            ObjectRole::Bootstrap => self.bootstrap.as_ref(),
            ObjectRole::Infra => self.infra.as_ref(),
        }
    }

    /// Every object's fingerprints.
    pub fn prints(&self) -> Prints {
        Prints {
            machine: self.machine.as_ref().map(NormalizedObject::prints),
            bootstrap: self.bootstrap.as_ref().map(NormalizedObject::prints),
            infra: self.infra.as_ref().map(NormalizedObject::prints),
        }
    }
}

/// Desired objects normalised and fingerprinted once: what UpdateMachine checks against a verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// The objects, normalised.
    pub normalized: Normalized,
    /// Their fingerprints (bounded).
    pub prints: Prints,
    /// The fingerprint of all of `prints` (see [`Prints::fingerprint`]).
    pub fingerprint: String,
}

impl Desired {
    /// Fingerprints `normalized`.
    pub fn new(normalized: Normalized) -> Desired {
        let prints = normalized.prints();
        Desired {
            fingerprint: prints.fingerprint(),
            prints,
            normalized,
        }
    }
}

/// The fingerprints of one normalised object, as a verdict record keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectPrints {
    /// Machine-level kind.
    pub kind: String,
    /// API group.
    pub api_group: String,
    /// How fine `entries` is.
    pub granularity: Granularity,
    /// Path → fingerprint.
    pub entries: FingerprintMap,
}

/// The fingerprints of the three objects of one side.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prints {
    /// Machine (MachineSet template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<ObjectPrints>,
    /// Bootstrap config (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<ObjectPrints>,
    /// Infrastructure machine (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra: Option<ObjectPrints>,
}

impl Prints {
    /// The object in `role`.
    pub fn get(&self, role: ObjectRole) -> Option<&ObjectPrints> {
        match role {
            ObjectRole::Machine => self.machine.as_ref(),
            ObjectRole::Bootstrap => self.bootstrap.as_ref(),
            ObjectRole::Infra => self.infra.as_ref(),
        }
    }

    /// One SHA-256 (hex) over every object's kind, granularity and entries: equal exactly when the maps are.
    pub fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"inplace-updater/state/v1\n");
        for role in ObjectRole::ALL {
            let Some(object) = self.get(role) else {
                hash.update(b"-\n");
                continue;
            };
            hash.update(
                format!(
                    "{role:?}\0{}\0{}\0{:?}\n",
                    object.kind, object.api_group, object.granularity
                )
                .as_bytes(),
            );
            for (path, print) in &object.entries {
                hash.update(path.as_bytes());
                hash.update(b"\0");
                hash.update(print.as_bytes());
                hash.update(b"\n");
            }
        }
        fingerprint::hex(&hash.finalize())
    }
}

/// What an operator writes into the override annotation: the first [`OPERATOR_FINGERPRINT_HEX`] digits.
pub fn operator_fingerprint(fingerprint: &str) -> &str {
    fingerprint
        .get(..OPERATOR_FINGERPRINT_HEX)
        .unwrap_or(fingerprint)
}

/// Whether `value` is a valid Kubernetes label value (at most 63 characters, alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric; or empty).
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    value.is_empty()
        || (bytes.len() <= 63
            && bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')))
}

/// CAPI's `format.MustFormatValue`: the name itself when it is a valid label value, otherwise
/// `hash_<base64url(fnv32a(name))>_z`. The value of a Machine's `cluster.x-k8s.io/set-name` label for its
/// MachineSet `name`.
pub fn label_value(name: &str) -> String {
    use base64::Engine as _;
    if is_label_value(name) {
        return name.to_owned();
    }
    // FNV-1a, 32 bits (Go's hash/fnv New32a).
    let hash = name.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!(
        "hash_{}_z",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hash.to_be_bytes())
    )
}

#[cfg(test)]
mod tests;
