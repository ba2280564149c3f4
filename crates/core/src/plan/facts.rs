//! The facts of the desired Machine that decide its plan (and its records): name, cluster, role, version,
//! drain knobs.

use inplace_agent_api::MachineRef;
use serde_json::Value;

use super::PlanError;
use crate::drain::MachineDrain;
use crate::objects::Scope;
use crate::objects::{CLUSTER_NAME_LABEL, CONTROL_PLANE_LABEL};

/// Facts about the Machine that decide the plan, read from the desired Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    /// `namespace/name`.
    pub machine: MachineRef,
    /// The cluster it belongs to.
    pub cluster: String,
    /// Whether it is a control-plane Machine.
    pub control_plane: bool,
    /// `spec.version`, when set.
    pub version: Option<String>,
    /// `spec.providerID`, when set.
    pub provider_id: Option<String>,
    /// CAPI's drain knobs on the Machine (exclude annotation, node drain timeout).
    pub drain: MachineDrain,
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

impl MachineFacts {
    /// Reads the facts from a desired Machine object.
    pub fn of(machine: &Value) -> Result<Self, PlanError> {
        let name = str_at(machine, "/metadata/name").ok_or(PlanError::Field {
            path: "machine.metadata.name".into(),
            problem: "is missing".into(),
        })?;
        let namespace = str_at(machine, "/metadata/namespace").unwrap_or("default");
        let cluster = str_at(machine, "/spec/clusterName")
            .or_else(|| {
                str_at(
                    machine,
                    &format!("/metadata/labels/{}", CLUSTER_NAME_LABEL.replace('/', "~1")),
                )
            })
            .filter(|c| !c.is_empty())
            .ok_or(PlanError::NoCluster)?;
        let control_plane = machine
            .pointer(&format!(
                "/metadata/labels/{}",
                CONTROL_PLANE_LABEL.replace('/', "~1")
            ))
            .is_some();
        Ok(Self {
            machine: MachineRef::new(namespace, name),
            cluster: cluster.to_string(),
            control_plane,
            version: str_at(machine, "/spec/version").map(str::to_string),
            provider_id: str_at(machine, "/spec/providerID").map(str::to_string),
            drain: MachineDrain::of(Scope::Object, machine),
        })
    }
}
