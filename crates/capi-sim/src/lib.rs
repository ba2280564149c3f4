//! Test-only: what Cluster API would decide from a hook answer, reproduced from CAPI's Go code.
//!
//! Pure functions, no I/O. Hand it the request CAPI sent and the answer an extension gave, and it
//! tells what CAPI's controllers would do:
//! - [`can_update_machine`] / [`can_update_machine_set`]: decode the answer with Go's
//!   `encoding/json` rules, apply each patch to the whole current object with evanphx/json-patch
//!   semantics, copy back only `spec` (`spec.template.spec`), compare with desired after CAPI's
//!   cleanup → [`CapiDecision`] (in place, rollout with the fields that still differ, or error);
//! - [`update_machine`] → [`UpdateOutcome`] (in progress, done, failed);
//! - [`discover`] → the handlers CAPI would register, or why it refuses them;
//! - the `_with` variants take any [`HookAnswer`] (non-200, transport error) and a
//!   [`FailurePolicy`] (`Ignore` turns call errors into an empty `Success`).
//!
//! Sources (kubernetes-sigs/cluster-api main): api/runtime/hooks/v1alpha1, internal/runtime/client,
//! internal/util/patch, internal/util/inplace, controlplane/kubeadm/reconcilers/kubeadmcontrolplane,
//! core/reconcilers/machinedeployment, core/reconcilers/machine; evanphx/json-patch v5.9.11;
//! k8s.io/apimachinery (unstructured decoding).

// Tests may unwrap (house rules); the workspace lint is for code handling real input.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod capi_patch;
mod client;
mod decision;
mod diff;
mod discovery;
mod evanphx;
mod evanphx_merge;
mod goconv;
mod godecode;
mod gojson;
mod machine;
mod request;
mod wire;

pub use wire::affects_availability;

pub use capi_patch::{
    PatchError, SPEC_PATH, TEMPLATE_SPEC_PATH, apply_patch_the_capi_way, apply_patch_to_machine,
    apply_patch_to_machine_set,
};
pub use client::{
    CapiError, FailurePolicy, HookAnswer, LOGGED_ERROR_BODY_BYTES, MAX_ERROR_BODY_BYTES,
    check_response_status,
};
pub use decision::{
    CapiDecision, UpdateOutcome, can_update_machine, can_update_machine_set,
    can_update_machine_set_with, can_update_machine_with, machine_objects_differences,
    machine_set_objects_differences, patch_current_machine_objects,
    patch_current_machine_set_objects, update_machine, update_machine_with,
};
pub use diff::{MAX_LISTED_DIFFERENCES, json_differences};
pub use discovery::{
    DEFAULT_TIMEOUT_SECONDS, DNS1123_LABEL_MAX_LEN, HOOKS_API_VERSION, KNOWN_HOOKS,
    MAX_TIMEOUT_SECONDS, RegisteredHandler, discover, discover_with, dns1123_label_errors,
    validate_discovery_response,
};
pub use evanphx::{JsonPatch, apply_json_patch, apply_merge_patch, decode_json_patch};
pub use goconv::MAX_VALUE_CONVERSION_DEPTH;
pub use godecode::DecodeError;
pub use gojson::{GO_MAX_NESTING_DEPTH, SyntaxError};
pub use machine::{
    Bootstrap, MachineDeletion, MachineSpec, MachineTaint, ObjectReference, ReadinessGate,
    machine_spec_differences, machine_specs_equal,
};
pub use request::{
    CORE_API_VERSION, CanUpdateMachineRequest, CanUpdateMachineSetRequest, MachineObjects,
    MachineSetObjects, RequestError, UPDATE_IN_PROGRESS_ANNOTATION, UpdateMachineRequest,
};
pub use wire::{
    CanUpdateMachineResponse, CanUpdateMachineSetResponse, DiscoveryResponse, ExtensionHandler,
    GroupVersionHook, Patch, UpdateMachineResponse, decode_can_update_machine_response,
    decode_can_update_machine_set_response, decode_discovery_response,
    decode_update_machine_response,
};
