//! inplace-core: the pure domain logic of inplace-updater — no I/O, no async, only functions over
//! `serde_json::Value`.
//!
//! [`diff`] turns current and desired specs into field-path changes, [`policy`] judges each path
//! (an [`Action`] the node agent performs, accept, or reject), [`patch`] builds the CAPI patches that
//! cover exactly the accepted changes, and [`decide()`] puts it together for CanUpdateMachine and
//! CanUpdateMachineSet, self-checking every patch the way CAPI applies it. [`settings`] reads the
//! ExtensionConfig settings that narrow the policy per registration, [`window`] the maintenance
//! windows (setting and Machine annotation) outside which no run starts or takes its next step. [`verdict`] fingerprints what a
//! CanUpdate answer judged, so UpdateMachine can tell a desired state nobody judged. [`plan`] turns
//! an UpdateMachine's desired Machine and KubeadmConfig into the agent's steps with a stable id, [`drain`]
//! decides whether those steps drain the node, and [`decode`] is the one JSON decoder (Go's field names, the failing field named) behind every typed read.

// Tests may unwrap (house rules); the workspace lint is for code handling real input.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod action;
pub mod decide;
pub mod decode;
pub mod diff;
pub mod drain;
pub mod duration;
pub mod knobs;
pub mod machine;
pub mod objects;
pub mod pacing;
pub mod patch;
pub mod path;
pub mod plan;
pub mod policy;
pub mod redact;
pub mod settings;
pub mod verdict;
pub mod version_steps;
pub mod window;

pub use action::Action;
pub use decide::{ChangeVerdict, Decision, DecisionOutcome, JudgedChange, Patches, decide};
pub use decode::decode_json;
pub use diff::{Change, ChangeKind};
pub use knobs::Knobs;
pub use machine::DesiredMachine;
pub use objects::{ObjectRole, Objects, Scope};
pub use patch::{Patch, PatchType};
pub use path::{Path, Seg};
pub use policy::{DEFAULT_POLICY_YAML, Policy, PolicyError};
pub use settings::{MAX_PAUSED_BYTES, Mode, Settings, SettingsError};
pub use version_steps::VersionSteps;
pub use window::{Gate, Window, WindowError};

/// Lower-case hex of `bytes` (digests in ids, fingerprints, store keys and token lines).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lower_case_two_digits_per_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(super::hex(&[]), "");
    }
}
