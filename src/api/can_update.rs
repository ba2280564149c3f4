//! What the two CanUpdate requests have in common, read one way by the hooks and by `inplace-updater diff`:
//! the settings, both sides' objects in role order and the desired object's key ([`CanUpdateRequest`]);
//! which of the two a whole body is ([`AnyCanUpdateRequest`]); and the request's own rules applied to objects
//! given outside a request, `diff`'s object-set files ([`check_object_sets`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::error::DecodeError;
use super::key::ObjectKey;
use super::objects::Object;
use super::requests::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, HookRequest, MachineObjects,
    MachineSetObjects, SideObjects, decode_request,
};
use super::validate::{self, Head, Invalid};

/// One side's objects in role order: the Machine or MachineSet, the bootstrap config (template), the
/// infrastructure machine (template).
pub type SideTexts<'a> = [Option<&'a Object>; 3];

/// A CanUpdateMachine or CanUpdateMachineSet request, as the shared decide path reads it.
pub trait CanUpdateRequest: HookRequest {
    /// `true` for CanUpdateMachineSet, whose objects are a MachineSet and templates.
    const TEMPLATES: bool;
    /// ExtensionConfig `spec.settings`.
    fn settings(&self) -> &BTreeMap<String, String>;
    /// The current side's objects, then the desired side's.
    fn sides(&self) -> [SideTexts<'_>; 2];
    /// `namespace/name` of the desired Machine or MachineSet (read when the request was validated).
    fn key(&self) -> Option<&ObjectKey>;
}

/// The two requests have the same fields around sides of different types.
macro_rules! can_update_request {
    ($request:ty, $templates:expr) => {
        impl CanUpdateRequest for $request {
            const TEMPLATES: bool = $templates;
            fn settings(&self) -> &BTreeMap<String, String> {
                &self.settings
            }
            fn sides(&self) -> [SideTexts<'_>; 2] {
                [self.current.objects(), self.desired.objects()]
            }
            fn key(&self) -> Option<&ObjectKey> {
                self.desired.key.as_ref()
            }
        }
    };
}

can_update_request!(CanUpdateMachineRequest, false);
can_update_request!(CanUpdateMachineSetRequest, true);

/// A whole CanUpdate request body, decoded as the request of the hook it is for.
#[derive(Debug, Clone)]
pub enum AnyCanUpdateRequest {
    /// A CanUpdateMachine request.
    Machine(CanUpdateMachineRequest),
    /// A CanUpdateMachineSet request.
    MachineSet(CanUpdateMachineSetRequest),
}

impl AnyCanUpdateRequest {
    /// Decodes `body` ([`decode_request`]) as a CanUpdateMachineSet request when its `kind` says so or,
    /// without a `kind`, when its `current` side holds a `machineSet`; as a CanUpdateMachine request otherwise.
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        Ok(if is_machine_set(body) {
            Self::MachineSet(decode_request(body)?)
        } else {
            Self::Machine(decode_request(body)?)
        })
    }
}

/// Whether a body asks CanUpdateMachineSet. A body this cannot read is left to the CanUpdateMachine decoder,
/// which names what is wrong with it.
fn is_machine_set(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        kind: Option<String>,
        #[serde(default)]
        current: Option<ProbeSide>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ProbeSide {
        #[serde(default)]
        machine_set: Option<IgnoredAny>,
    }
    match serde_json::from_slice::<Probe>(body) {
        Ok(Probe {
            kind: Some(kind), ..
        }) => kind == CanUpdateMachineSetRequest::KIND,
        Ok(Probe {
            current: Some(side),
            ..
        }) => side.machine_set.is_some(),
        _ => false,
    }
}

/// Objects of `diff`'s object sets that a request would refuse: the side they are on and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{invalid}")]
pub struct InvalidObjectSet {
    /// The desired side (else the current side).
    pub desired: bool,
    /// The field and what is wrong with it.
    pub invalid: Invalid,
}

/// Checks objects given outside a request, each side in role order (as [`CanUpdateRequest::sides`]), with
/// the requests' own rules: each object against its role, named by its field in a request side (`machine`,
/// `bootstrapConfigTemplate`, ...), and the same kind on both sides. `templates` as
/// [`CanUpdateRequest::TEMPLATES`].
pub fn check_object_sets(
    templates: bool,
    sides: [[Option<&Value>; 3]; 2],
) -> Result<(), InvalidObjectSet> {
    if templates {
        check_sets::<MachineSetObjects>(sides)
    } else {
        check_sets::<MachineObjects>(sides)
    }
}

fn check_sets<T: SideObjects>(sides: [[Option<&Value>; 3]; 2]) -> Result<(), InvalidObjectSet> {
    let mut heads: [[Option<Head>; 3]; 2] = Default::default();
    for (desired, (heads, objects)) in heads.iter_mut().zip(sides).enumerate() {
        for (index, object) in objects.into_iter().enumerate() {
            if let Some(object) = object {
                heads[index] = Some(
                    validate::check_value(T::ROLES[index], T::FIELDS[index], object).map_err(
                        |invalid| InvalidObjectSet {
                            desired: desired == 1,
                            invalid,
                        },
                    )?,
                );
            }
        }
    }
    let [current, desired] = &heads;
    for (index, pair) in current.iter().zip(desired).enumerate() {
        if let (Some(c), Some(d)) = pair {
            let at = T::FIELDS[index];
            validate::same_kind(at, c, at, d).map_err(|invalid| InvalidObjectSet {
                desired: true,
                invalid,
            })?;
        }
    }
    Ok(())
}
