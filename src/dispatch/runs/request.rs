//! What UpdateMachine asks dispatch (the desired Machine read once, the objects' texts, what the policy allows)
//! and what dispatch answers.

use std::sync::OnceLock;

use inplace_agent_api::KubeadmUpgradeMode;
use inplace_core::plan::PlanInputs;
use inplace_core::verdict::{Desired, Normalized, NormalizedObject};
use inplace_core::{DesiredMachine, ObjectRole, Scope};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};

use crate::dispatch::floor::DispatchError;
use crate::dispatch::licence::RefusalReason;
use crate::hex;

/// Names the plan builder in input fingerprints: a new server version builds the plan once more (and keeps
/// the run when the plan is the same).
const PLAN_INPUT_VERSION: &str = concat!("inplace-updater/", env!("CARGO_PKG_VERSION"));

/// What UpdateMachine was asked, decoded as far as answering needs.
#[derive(Debug, Clone)]
pub struct UpdateRequest {
    /// The desired Machine, read once: facts, knobs, labels.
    pub desired: DesiredMachine,
    /// The desired Machine's JSON, parsed (its fingerprint is checked against a CanUpdate verdict).
    pub machine: Value,
    /// The desired Machine's JSON text, as CAPI sent it (part of the input fingerprint).
    pub machine_text: Box<RawValue>,
    /// The desired bootstrap config's JSON text; parsed only when the plan has to be built.
    pub bootstrap: Option<Box<RawValue>>,
    /// The desired infrastructure machine's JSON text; parsed to check it against a CanUpdate verdict, and
    /// for its OS image when `os_image` names the field.
    pub infra: Option<Box<RawValue>>,
    /// The settings and policy results the plan is built from (the actions allowed, the switches, the OS
    /// image field), as the policy built them.
    pub inputs: PlanInputs,
    /// The maintenance window in force for this Machine (its annotation, else the ExtensionConfig setting).
    pub window: Option<inplace_core::Window>,
    /// The ExtensionConfig `paused` setting, when set: every Machine of the registration is paused.
    pub paused_setting: Option<String>,
    /// The ExtensionConfig `onFailure` setting, when set (the Machine's annotation overrides it).
    pub on_failure_setting: Option<inplace_agent_api::OnFailure>,
    /// The registration's rollout settings (`canary`, `soak`, `maxFailures`, `healthGates`): a new run of a
    /// paced registration waits for its change's pace ([`crate::dispatch::changes`]).
    pub pacing: inplace_core::pacing::Pacing,
    /// The ExtensionConfig `remediationGuardPastDeadline` setting is `keep`: a new run records that its
    /// remediation guard stays past a step's deadline.
    pub keep_guard_past_deadline: bool,
    /// [`UpdateRequest::input_hash`] per upgrade mode (`apply`, `node`), computed at most once each.
    pub hashed: [OnceLock<String>; 2],
}

impl UpdateRequest {
    /// The Machine's `metadata.uid`, when the request carries one.
    pub fn uid(&self) -> Option<&str> {
        self.machine
            .pointer("/metadata/uid")
            .and_then(|v| v.as_str())
            .filter(|uid| !uid.is_empty())
    }

    /// A fingerprint of everything the plan is built from but what the change moves: this server's version,
    /// the upgrade mode, the plan inputs' serialized form and the desired objects' texts (the infrastructure
    /// machine's too, which only the verdict check reads). What the change moves belongs to the desired state's
    /// licence, which the Machine record keeps with the run: a call repeating the recorded fingerprint is of
    /// that state, so it always has the same plan, and a Machine record carrying the fingerprint lets a
    /// repeated call skip building and hashing the plan. Different texts that mean the same only cost one
    /// build.
    pub fn input_hash(&self, mode: KubeadmUpgradeMode) -> &str {
        let slot = match mode {
            KubeadmUpgradeMode::Apply => &self.hashed[0],
            KubeadmUpgradeMode::Node => &self.hashed[1],
        };
        slot.get_or_init(|| self.hash_inputs(mode))
    }

    fn hash_inputs(&self, mode: KubeadmUpgradeMode) -> String {
        let mut hash = Sha256::new();
        hash.update(PLAN_INPUT_VERSION.as_bytes());
        hash.update(match mode {
            KubeadmUpgradeMode::Apply => b"\napply\n",
            KubeadmUpgradeMode::Node => b"\nnode\n\0",
        });
        // Ends with a newline, as each line of it does.
        hash.update(self.inputs.fingerprint());
        hash.update(self.machine_text.get().as_bytes());
        hash.update(b"\n");
        if let Some(bootstrap) = &self.bootstrap {
            hash.update(bootstrap.get().as_bytes());
        }
        // Read by the plan for its OS image, and checked against the CanUpdate verdict: a repeat must be the
        // same text too.
        hash.update(b"\n");
        if let Some(infra) = &self.infra {
            hash.update(infra.get().as_bytes());
        }
        hex(&hash.finalize())
    }

    /// The desired objects, normalised and fingerprinted as a CanUpdate verdict of them was. The bootstrap
    /// config and infrastructure machine are parsed here for it alone, so their compared parts are taken
    /// out of the parsed values rather than copied.
    pub fn desired_print(&self) -> Result<Desired, DispatchError> {
        let parsed = |text: Option<&RawValue>, role, what: &str| {
            text.map(|raw| {
                serde_json::from_str::<Value>(raw.get())
                    .map(|value| NormalizedObject::from_owned(role, Scope::Object, value))
                    .map_err(|err| DispatchError::BadRequest(format!("{what}: {err}")))
            })
            .transpose()
        };
        Ok(Desired::new(Normalized {
            machine: Some(NormalizedObject::of(
                ObjectRole::Machine,
                Scope::Object,
                &self.machine,
            )),
            bootstrap: parsed(
                self.bootstrap.as_deref(),
                ObjectRole::Bootstrap,
                "bootstrap config",
            )?,
            infra: parsed(
                self.infra.as_deref(),
                ObjectRole::Infra,
                "infrastructure machine",
            )?,
        }))
    }
}

/// How UpdateMachine answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateAnswer {
    /// Call again after `retry_after_seconds`; `message` is what operators see.
    InProgress {
        /// Shown as `In-place update in progress: <message>`.
        message: String,
        /// Seconds.
        retry_after_seconds: i32,
    },
    /// Every step done.
    Done {
        /// Summary.
        message: String,
    },
    /// A step failed: the same answer on every later call for this run.
    Failed {
        /// The failing step and its error.
        message: String,
    },
    /// No CanUpdate answer accepted this desired state in place: nothing was recorded or run.
    Refused {
        /// Why.
        reason: RefusalReason,
        /// The paths and what the operator can do.
        message: String,
    },
}

/// The run id: the desired state's hash chained to the previous run, so returning to an earlier desired
/// state (A → B → A) is a new run the agent executes again, while repeated calls keep the same id.
pub fn run_id(state_hash: &str, previous_run: Option<&str>) -> String {
    hex(&Sha256::digest(
        format!("{state_hash}:{}", previous_run.unwrap_or_default()).as_bytes(),
    ))
}

#[cfg(test)]
mod tests {
    use inplace_core::drain::DrainRules;
    use inplace_core::plan::Switches;
    use inplace_core::policy::ImageField;
    use inplace_core::{Action, Objects};

    use super::*;
    use crate::dispatch::testing::request;

    /// The input fingerprint as it was written field by field before the plan inputs were one value.
    fn field_by_field(r: &UpdateRequest, mode: KubeadmUpgradeMode) -> String {
        let mut hash = Sha256::new();
        hash.update(PLAN_INPUT_VERSION.as_bytes());
        hash.update(match mode {
            KubeadmUpgradeMode::Apply => b"\napply\n",
            KubeadmUpgradeMode::Node => b"\nnode\n\0",
        });
        for action in &r.inputs.actions {
            hash.update(action.as_str().as_bytes());
            hash.update(b",");
        }
        hash.update(b"\n");
        let rules = &r.inputs.switches.drain;
        for on in [
            rules.patch_version,
            rules.kubelet_args,
            rules.delete_empty_dir_data,
            rules.force_unmanaged,
        ]
        .into_iter()
        .chain(r.inputs.switches.version_steps.flags())
        {
            hash.update(if on { b"1" } else { b"0" });
        }
        hash.update(b"\n");
        if let Some(field) = &r.inputs.os_image {
            hash.update(field.as_str().as_bytes());
        }
        hash.update(b"\n");
        hash.update(r.machine_text.get().as_bytes());
        hash.update(b"\n");
        if let Some(bootstrap) = &r.bootstrap {
            hash.update(bootstrap.get().as_bytes());
        }
        hash.update(b"\n");
        if let Some(infra) = &r.infra {
            hash.update(infra.get().as_bytes());
        }
        hex(&hash.finalize())
    }

    #[test]
    fn input_fingerprints_are_the_bytes_they_were_field_by_field() {
        let base = request("cp-1", true, "v1.34.1", "hello");
        let mut cases = vec![base.clone()];
        for bits in 0..64u8 {
            let on = |bit: u8| bits & (1 << bit) != 0;
            let mut r = base.clone();
            let switches = Switches {
                drain: DrainRules {
                    patch_version: on(0),
                    kubelet_args: on(1),
                    delete_empty_dir_data: on(2),
                    force_unmanaged: on(3),
                },
                version_steps: inplace_core::VersionSteps {
                    reboot_when_required: on(4),
                    container_runtime: on(5),
                },
            };
            r.inputs = PlanInputs {
                actions: Action::ALL
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| (usize::from(bits) * 7 + i) % 3 != 0)
                    .map(|(_, a)| a)
                    .collect(),
                switches,
                os_image: on(3).then(|| ImageField::parse("spec.image.url").unwrap()),
                steps: Default::default(),
            };
            if on(2) {
                r.bootstrap = None;
            }
            r.hashed = Default::default();
            cases.push(r);
        }
        for r in &cases {
            for mode in [KubeadmUpgradeMode::Apply, KubeadmUpgradeMode::Node] {
                assert_eq!(
                    r.input_hash(mode),
                    field_by_field(r, mode),
                    "{:?}",
                    r.inputs
                );
            }
        }
        // And the fingerprint still tells the inputs apart.
        let distinct: std::collections::BTreeSet<_> = cases
            .iter()
            .map(|r| r.input_hash(KubeadmUpgradeMode::Node).to_owned())
            .collect();
        assert!(distinct.len() > 60, "{}", distinct.len());
    }

    #[test]
    fn the_desired_print_is_the_one_of_the_whole_objects() {
        let parse = |text: &Option<Box<RawValue>>| {
            text.as_ref()
                .map(|raw| serde_json::from_str::<Value>(raw.get()).expect("JSON"))
        };
        let text = |value: serde_json::Value| RawValue::from_string(value.to_string()).ok();
        let mut kubeadm = request("cp-1", true, "v1.34.1", "hello");
        kubeadm.bootstrap = text(serde_json::json!({
            "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
            "metadata": {"name": "b"},
            "spec": {"files": [{"path": "/etc/motd", "content": "hello"}], "users": [],
                "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "v", "value": "2"}]}},
                "joinConfiguration": {"discovery": {"bootstrapToken": {"token": "t"}}}}
        }));
        kubeadm.infra = text(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachine",
            "metadata": {"name": "i"}, "spec": {"image": {"url": "u"}, "empty": {}}
        }));
        let plain = request("cp-1", true, "v1.34.1", "hello");
        let mut bare = plain.clone();
        (bare.bootstrap, bare.infra) = (None, None);
        for r in [kubeadm, plain, bare] {
            let (bootstrap, infra) = (parse(&r.bootstrap), parse(&r.infra));
            let whole = Desired::new(Normalized::of(
                Scope::Object,
                &Objects {
                    machine: Some(&r.machine),
                    bootstrap: bootstrap.as_ref(),
                    infra: infra.as_ref(),
                },
            ));
            assert_eq!(r.desired_print().expect("prints"), whole);
        }
    }

    #[test]
    fn run_ids_chain_so_returning_to_an_old_state_is_a_new_run() {
        let a1 = run_id("A", None);
        let b = run_id("B", Some(&a1));
        let a2 = run_id("A", Some(&b));
        assert_ne!(a1, a2);
        assert_eq!(a1, run_id("A", None));
    }
}
