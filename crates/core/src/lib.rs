//! inplace-core: the pure domain logic of inplace-updater — no I/O, no async, only functions over
//! `serde_json::Value`.
//!
//! [`diff`] turns current and desired specs into field-path changes, [`policy`] judges each path
//! (an [`Action`] the node agent performs, accept, or reject), [`patch`] builds the CAPI patches that
//! cover exactly the accepted changes, and [`decide()`] puts it together for CanUpdateMachine and
//! CanUpdateMachineSet, self-checking every patch the way CAPI applies it. [`settings`] reads the
//! ExtensionConfig settings that narrow the policy per registration. [`verdict`] fingerprints what a
//! CanUpdate answer judged, so UpdateMachine can tell a desired state nobody judged.

// Tests may unwrap (house rules); the workspace lint is for code handling real input.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod action;
pub mod decide;
pub mod diff;
pub mod objects;
pub mod patch;
pub mod path;
pub mod policy;
pub mod redact;
pub mod settings;
pub mod verdict;

pub use action::Action;
pub use decide::{ChangeVerdict, Decision, JudgedChange, Outcome, Patches, decide};
pub use diff::{Change, ChangeKind};
pub use objects::{ObjectRole, Objects, Scope};
pub use patch::{Patch, PatchType};
pub use path::{Path, Seg};
pub use policy::{DEFAULT_POLICY_YAML, Policy, PolicyError};
pub use settings::{Mode, Settings, SettingsError};
