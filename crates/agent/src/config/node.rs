//! The `node:` section of the agent's `--config`: how the node steps (drainNode, waitNodeReady,
//! uncordonNode) reach the workload cluster's API server — with the node's own kubelet
//! kubeconfig, so no new credentials are needed (see SECURITY.md) — and how often they look.

use std::time::Duration;

use serde::Deserialize;

/// Default `node.kubeconfig`: kubeadm's kubelet kubeconfig.
pub const DEFAULT_NODE_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// Default `node.pollIntervalMillis`: between two looks at the node's pods or its Ready condition.
pub const DEFAULT_NODE_POLL_MILLIS: u64 = 2_000;
/// Default `node.evictionRetryMillis`: before an eviction the API refused is asked again.
pub const DEFAULT_EVICTION_RETRY_MILLIS: u64 = 5_000;
/// Smallest accepted interval (either key).
pub const MIN_NODE_INTERVAL_MILLIS: u64 = 50;
/// Largest accepted interval (either key).
pub const MAX_NODE_INTERVAL_MILLIS: u64 = 60_000;

/// `node:`. Without this section the node steps fail, naming it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Node path (under `--root`) of the kubeconfig the node steps use: the kubelet's own.
    #[serde(default = "default_kubeconfig")]
    pub kubeconfig: String,
    /// The Node object's name. Default: the host name the inventory reports
    /// (`<root>/proc/sys/kernel/hostname`, else `<root>/etc/hostname`).
    #[serde(default)]
    pub name: Option<String>,
    /// Milliseconds between two looks at the node's pods or its Ready condition.
    #[serde(default = "default_poll")]
    pub poll_interval_millis: u64,
    /// Milliseconds before a refused eviction (PodDisruptionBudget) is asked again.
    #[serde(default = "default_retry")]
    pub eviction_retry_millis: u64,
}

fn default_kubeconfig() -> String {
    DEFAULT_NODE_KUBECONFIG.to_owned()
}

fn default_poll() -> u64 {
    DEFAULT_NODE_POLL_MILLIS
}

fn default_retry() -> u64 {
    DEFAULT_EVICTION_RETRY_MILLIS
}

impl NodeConfig {
    /// Checks the values (names the key).
    pub fn validate(&self) -> Result<(), String> {
        if !self.kubeconfig.starts_with('/') {
            return Err(format!(
                "node.kubeconfig: {:?} is not an absolute node path",
                self.kubeconfig
            ));
        }
        if let Some(name) = &self.name {
            let ok = !name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b));
            if !ok {
                return Err(format!("node.name: {name:?} is not a Kubernetes node name"));
            }
        }
        for (key, value) in [
            ("node.pollIntervalMillis", self.poll_interval_millis),
            ("node.evictionRetryMillis", self.eviction_retry_millis),
        ] {
            if !(MIN_NODE_INTERVAL_MILLIS..=MAX_NODE_INTERVAL_MILLIS).contains(&value) {
                return Err(format!(
                    "{key}: {value} is outside {MIN_NODE_INTERVAL_MILLIS}..={MAX_NODE_INTERVAL_MILLIS}"
                ));
            }
        }
        Ok(())
    }

    /// The drainer's timing.
    pub fn timing(&self) -> inplace_drain::Timing {
        inplace_drain::Timing {
            poll_interval: Duration::from_millis(self.poll_interval_millis),
            eviction_retry_interval: Duration::from_millis(self.eviction_retry_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::DriverConfig;

    #[test]
    fn defaults_and_bounds() {
        let config = DriverConfig::from_yaml("node: {}\n").unwrap();
        let node = config.node.unwrap();
        assert_eq!(node.kubeconfig, super::DEFAULT_NODE_KUBECONFIG);
        assert_eq!(node.name, None);
        assert_eq!(
            node.timing().poll_interval.as_millis(),
            u128::from(super::DEFAULT_NODE_POLL_MILLIS)
        );
        assert!(DriverConfig::from_yaml("").unwrap().node.is_none());
        let cases = [
            ("node: {pollIntervalMillis: 10}", "node.pollIntervalMillis"),
            (
                "node: {evictionRetryMillis: 600000}",
                "node.evictionRetryMillis",
            ),
            ("node: {kubeconfig: kubelet.conf}", "node.kubeconfig"),
            ("node: {name: Node_A}", "node.name"),
            ("node: {kubeconfg: /x}", "unknown field"),
        ];
        for (yaml, want) in cases {
            let err = DriverConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
