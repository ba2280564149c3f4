//! What a verified agent token allows: one cluster's Machines or one Machine (a token-file line's `cluster=` or
//! `machine=`, which its successors inherit).

use inplace_agent_api::MachineRef;

/// What a verified agent token allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AgentScope {
    /// Every Machine of one cluster.
    Cluster {
        /// The cluster's namespace.
        namespace: String,
        /// The cluster's name.
        cluster: String,
    },
    /// One Machine.
    Machine(MachineRef),
}

impl std::fmt::Display for AgentScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentScope::Cluster { namespace, cluster } => {
                write!(f, "cluster {namespace}/{cluster}")
            }
            AgentScope::Machine(machine) => write!(f, "machine {machine}"),
        }
    }
}

impl AgentScope {
    /// Whether a Machine (with the cluster its record names, when known) is inside this scope.
    pub fn covers(&self, machine: &MachineRef, cluster: Option<&str>) -> bool {
        match self {
            AgentScope::Machine(allowed) => allowed == machine,
            AgentScope::Cluster {
                namespace,
                cluster: allowed,
            } => namespace == &machine.namespace && cluster.is_none_or(|c| c == allowed),
        }
    }
}
