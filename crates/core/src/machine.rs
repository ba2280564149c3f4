//! The desired Machine of an UpdateMachine call, read once into a typed view: the facts its plan reads
//! ([`MachineFacts`]), the operator's knobs ([`Knobs`]) and the labels that find the CanUpdateMachineSet verdict
//! covering it. Dispatch works from this view and never reads the Machine's JSON itself.

use serde_json::Value;

use crate::knobs::{KnobError, Knobs};
use crate::objects::{SET_NAME_LABEL, TEMPLATE_HASH_LABEL};
use crate::plan::{MachineFacts, PlanError};
use crate::verdict::is_label_value;

/// The desired Machine, as dispatch needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredMachine {
    /// What the plan and the records read.
    pub facts: MachineFacts,
    /// The `inplace-updater.dev/*` annotations.
    pub knobs: Knobs,
    /// The value of its `cluster.x-k8s.io/set-name` label, when it is a non-empty label value: the key of its
    /// MachineSet's CanUpdateMachineSet verdict.
    pub set_name: Option<String>,
    /// Its `machine-template-hash` label, which tells two MachineSet names CAPI hashed alike apart.
    pub template_hash: Option<String>,
}

/// Why a desired Machine cannot be updated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineError {
    /// A fact the plan needs is missing or wrong.
    #[error(transparent)]
    Facts(#[from] PlanError),
    /// An operator knob is malformed.
    #[error(transparent)]
    Knob(#[from] KnobError),
}

fn label<'v>(machine: &'v Value, name: &str) -> Option<&'v str> {
    machine.pointer("/metadata/labels")?.get(name)?.as_str()
}

impl DesiredMachine {
    /// Reads the view from the desired Machine object.
    pub fn of(machine: &Value) -> Result<DesiredMachine, MachineError> {
        Ok(DesiredMachine {
            facts: MachineFacts::of(machine)?,
            knobs: Knobs::of(machine)?,
            set_name: label(machine, SET_NAME_LABEL)
                .filter(|v| !v.is_empty() && is_label_value(v))
                .map(str::to_owned),
            template_hash: label(machine, TEMPLATE_HASH_LABEL).map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_that_cannot_name_a_verdict_are_dropped() {
        let machine = |set: &str| {
            json!({"metadata": {"name": "m", "namespace": "ns", "labels": {
                SET_NAME_LABEL: set, TEMPLATE_HASH_LABEL: "abc",
                "cluster.x-k8s.io/cluster-name": "c"}}})
        };
        let view = DesiredMachine::of(&machine("md-0-x")).unwrap();
        assert_eq!(view.set_name.as_deref(), Some("md-0-x"));
        assert_eq!(view.template_hash.as_deref(), Some("abc"));
        assert_eq!(view.facts.cluster, "c");
        assert_eq!(DesiredMachine::of(&machine("")).unwrap().set_name, None);
        assert_eq!(
            DesiredMachine::of(&machine("-bad-")).unwrap().set_name,
            None
        );
    }
}
