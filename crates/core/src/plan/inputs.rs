//! What a plan is built from. [`PlanInputs`]: what it depends on besides the desired objects and the change
//! (the actions the policy and settings allow, the registration's switches and the policy's OS image field)
//! as one value, built once per UpdateMachine call from the policy, the settings and the objects
//! ([`PlanInputs::of`]); dispatch carries it whole and fingerprints it from its serialized form
//! ([`PlanInputs::fingerprint`]), so a field added here is in every input fingerprint. [`PlanInput`]: all of
//! one plan's input, these with the desired objects' texts and the change.

use std::collections::BTreeSet;

use inplace_agent_api::KubeadmUpgradeMode;
use serde::Serialize;

use super::facts::MachineFacts;

use super::lines;
use crate::Action;
use crate::drain::{Drain, DrainRules, NodeChange};
use crate::policy::ImageField;
use crate::settings::StepSettings;
use crate::version_steps::VersionSteps;
use crate::{Objects, Policy, Scope, Settings};

/// The settings and policy results a plan is built from. Its field order is its fingerprint's line order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanInputs {
    /// Actions the policy and settings allow for this Machine.
    pub actions: BTreeSet<Action>,
    /// The registration's on/off settings the plan and its drain read.
    pub switches: Switches,
    /// The field of the infrastructure machine naming its OS image, when the policy maps one and the settings
    /// allow `os-image` ([`Policy::os_image_field`]).
    pub os_image: Option<ImageField>,
    /// The settings of step kinds, as the registration set them, whole: a builder reads its kind's setting here
    /// and the fingerprint has it with no line naming it. Left out of the line form while none is set (the
    /// fingerprints of registrations without them stay as they were); otherwise one line, their compact JSON
    /// (texts escaped, so one setting's text cannot pass for another's).
    #[serde(
        skip_serializing_if = "StepSettings::is_unset",
        serialize_with = "json_line"
    )]
    pub steps: StepSettings,
}

/// The on/off settings a plan reads: one line of flags in the fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Switches {
    /// The drain rules of this registration: the policy's `drain:` section with the settings' overrides.
    pub drain: DrainRules,
    /// The settings `rebootWhenRequired` and `upgradeContainerRuntime`: what a version change brings besides
    /// its packages.
    pub version_steps: VersionSteps,
}

impl PlanInputs {
    /// What a plan for the `desired` objects is built from under a registration's `settings` and `policy`:
    /// the actions allowed, the switches and the OS image field, once per UpdateMachine call.
    pub fn of(policy: &Policy, desired: &Objects, settings: &Settings) -> PlanInputs {
        PlanInputs {
            actions: policy.actions_for(Scope::Object, desired, settings),
            switches: Switches {
                drain: policy.drain_for(settings),
                version_steps: settings.version_steps,
            },
            os_image: policy.os_image_field(desired, settings).cloned(),
            steps: settings.steps.clone(),
        }
    }

    /// The inputs' line form ([`lines`]): actions each followed by `,`, then the switches as `1`/`0`, then the
    /// OS image field, each line ended by `\n`. Input fingerprints hash it.
    pub fn fingerprint(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Every field is a shape the format has (lists, flags, texts): the tests below write each of them.
        #[allow(clippy::expect_used)]
        lines::write(self, &mut out).expect("plan inputs have a line form");
        out
    }
}

/// The step settings as one text, their compact JSON.
fn json_line<S: serde::Serializer>(steps: &StepSettings, out: S) -> Result<S::Ok, S::Error> {
    let text = serde_json::to_string(steps).map_err(serde::ser::Error::custom)?;
    out.serialize_str(&text)
}

/// Everything a plan is built from.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// Facts of the desired Machine.
    pub facts: &'a MachineFacts,
    /// The desired bootstrap config's JSON text (a KubeadmConfig), when there is one. Decoded into a
    /// [`super::KubeadmConfigView`] only when a step builder that runs reads it.
    pub bootstrap: Option<&'a str>,
    /// The settings and policy results the plan is built from: the actions allowed, the switches, the OS
    /// image field.
    pub inputs: &'a PlanInputs,
    /// What the change moves: the judgement of the CanUpdate verdict that accepted this desired state, else
    /// [`NodeChange::unknown`]. Only the steps of an action it does (and `inputs` allows) are planned.
    pub change: &'a NodeChange,
    /// For a version change on a control-plane node: `apply` on the first node of that version, else `node`.
    pub upgrade_mode: KubeadmUpgradeMode,
    /// The drain [`crate::drain::decide`] found, if any: the plan then drains, waits and uncordons.
    pub drain: Option<Drain>,
    /// The desired infrastructure machine's JSON text, when there is one: read only for its OS image.
    pub infra: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_is_actions_then_switches_then_the_image_field() {
        let inputs = PlanInputs {
            actions: [Action::Ntp, Action::Files].into(),
            switches: Switches {
                drain: DrainRules {
                    patch_version: true,
                    kubelet_args: false,
                    delete_empty_dir_data: true,
                    force_unmanaged: false,
                },
                version_steps: VersionSteps {
                    reboot_when_required: false,
                    container_runtime: true,
                },
            },
            os_image: Some(ImageField::parse("spec.image.url").unwrap()),
            steps: Default::default(),
        };
        assert_eq!(
            String::from_utf8(inputs.fingerprint()).unwrap(),
            "files,ntp,\n101001\nspec.image.url\n"
        );
        let none = PlanInputs::default().fingerprint();
        assert_eq!(String::from_utf8(none).unwrap(), "\n100000\n\n");
    }
}
