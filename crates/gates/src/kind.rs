//! The kinds of gate, one file each; a new kind is one more variant and one more arm in each match here.

use std::time::Duration;

use crate::alertmanager::{self, AlertmanagerGate};
use crate::prometheus::{self, PrometheusGate};
use crate::result::Verdict;
use crate::vars::Vars;

/// What a gate asks, and of which system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateKind {
    /// A PromQL instant query that must return no series.
    Prometheus(PrometheusGate),
    /// An Alertmanager filter that must match no active, unsilenced, uninhibited alert.
    Alertmanager(AlertmanagerGate),
}

impl GateKind {
    /// The keys a gate in the file may use for its kind.
    pub(crate) const KEYS: [&'static str; 2] = ["prometheus", "alertmanager"];

    /// The kind named `key` from its fields (the endpoint's removed); `None` for an unknown key.
    pub(crate) fn parse(
        key: &str,
        fields: serde_yaml_ng::Value,
    ) -> Option<Result<Self, serde_yaml_ng::Error>> {
        Some(match key {
            "prometheus" => serde_yaml_ng::from_value(fields).map(Self::Prometheus),
            "alertmanager" => serde_yaml_ng::from_value(fields).map(Self::Alertmanager),
            _ => return None,
        })
    }

    /// The key this kind has in the file (and in messages).
    pub fn key(&self) -> &'static str {
        match self {
            Self::Prometheus(_) => "prometheus",
            Self::Alertmanager(_) => "alertmanager",
        }
    }

    /// The field at fault and what is wrong with it.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        match self {
            Self::Prometheus(gate) => gate.check(),
            Self::Alertmanager(gate) => gate.check(),
        }
    }

    /// Path and query string asked after the gate's URL, for the Machine `vars` names.
    pub fn target(&self, vars: &Vars, timeout: Duration) -> String {
        match self {
            Self::Prometheus(gate) => gate.target(vars, timeout),
            Self::Alertmanager(gate) => gate.target(vars),
        }
    }

    /// The verdict on an answer (HTTP status and body).
    pub fn judge(&self, status: u16, body: &[u8]) -> Verdict {
        match self {
            Self::Prometheus(_) => prometheus::judge(status, body),
            Self::Alertmanager(_) => alertmanager::judge(status, body),
        }
    }
}
