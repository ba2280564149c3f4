//! Every JSON shape Cluster API sends to or reads from this extension, spelled exactly as CAPI's Go types
//! (`api/runtime/hooks/v1alpha1`) spell them. No logic lives here beyond encoding rules.
//!
//! Requests are decoded strictly enough to name the field that is wrong; responses are written the way
//! CAPI's Go decoder reads them (`patch` bytes as standard base64, `status` exactly `Success`/`Failure`).

mod can_update;
mod duration;
mod error;
mod key;
pub mod objects;
mod requests;
mod responses;
pub mod validate;

pub use can_update::{
    AnyCanUpdateRequest, CanUpdateRequest, InvalidObjectSet, SideTexts, check_object_sets,
};
pub use duration::{DurationError, parse_go_duration};
pub use error::DecodeError;
/// The one JSON decoder (Go's field naming, the failing field named), shared with the plan in `inplace-core`.
pub use inplace_core::decode_json;
pub use key::ObjectKey;
pub use objects::{Object, Pair};
pub use requests::{
    CanUpdateMachineRequest, CanUpdateMachineSetRequest, HookRequest, MachineObjects,
    MachineSetObjects, UpdateMachineObjects, UpdateMachineRequest, decode_request,
};
pub use responses::{
    CanUpdateMachineResponse, CanUpdateMachineSetResponse, DiscoveryResponse, ExtensionHandler,
    FailurePolicy, GroupVersionHook, Patch, PatchType, Status, UpdateMachineResponse,
};

/// The API group and version of every hook request and response.
pub const HOOKS_API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// The hooks this extension serves, with their wire names and URL paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// Discovery: lists the handlers (no handler name in its path).
    Discovery,
    /// CanUpdateMachine: called by KubeadmControlPlane for one control-plane Machine.
    CanUpdateMachine,
    /// CanUpdateMachineSet: called by the MachineDeployment controller.
    CanUpdateMachineSet,
    /// UpdateMachine: called by the Machine controller until the update is done.
    UpdateMachine,
}

impl Hook {
    /// Every hook served, in discovery order.
    pub const ALL: [Hook; 4] = [
        Hook::Discovery,
        Hook::CanUpdateMachine,
        Hook::CanUpdateMachineSet,
        Hook::UpdateMachine,
    ];

    /// The hook's Go type name, as used in `requestHook.hook` and in `kind: <Hook>Request`.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Discovery => "Discovery",
            Hook::CanUpdateMachine => "CanUpdateMachine",
            Hook::CanUpdateMachineSet => "CanUpdateMachineSet",
            Hook::UpdateMachine => "UpdateMachine",
        }
    }

    /// The handler name registered in discovery (a DNS-1123 label), `None` for discovery itself.
    pub fn handler_name(self) -> Option<&'static str> {
        match self {
            Hook::Discovery => None,
            Hook::CanUpdateMachine => Some("can-update-machine"),
            Hook::CanUpdateMachineSet => Some("can-update-machineset"),
            Hook::UpdateMachine => Some("update-machine"),
        }
    }

    /// The URL path CAPI posts to: `/<group>/<version>/<hook lowercased>[/<handler name>]`.
    pub fn path(self) -> &'static str {
        match self {
            Hook::Discovery => "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery",
            Hook::CanUpdateMachine => {
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine"
            }
            Hook::CanUpdateMachineSet => {
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachineset/can-update-machineset"
            }
            Hook::UpdateMachine => {
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/updatemachine/update-machine"
            }
        }
    }

    /// The `kind` of this hook's response.
    pub fn response_kind(self) -> &'static str {
        match self {
            Hook::Discovery => "DiscoveryResponse",
            Hook::CanUpdateMachine => "CanUpdateMachineResponse",
            Hook::CanUpdateMachineSet => "CanUpdateMachineSetResponse",
            Hook::UpdateMachine => "UpdateMachineResponse",
        }
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_capi_url_rule() {
        for hook in Hook::ALL {
            let mut expected = format!("/{HOOKS_API_VERSION}/{}", hook.name().to_lowercase());
            if let Some(handler) = hook.handler_name() {
                expected = format!("{expected}/{handler}");
            }
            assert_eq!(hook.path(), expected);
        }
    }
}
