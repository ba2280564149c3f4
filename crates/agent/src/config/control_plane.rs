//! The `controlPlane:` section of the agent's `--config`: how the control-plane preflight reaches this node's
//! etcd member — kubeadm's own health-check client certificate, so no new credentials are needed. Every key
//! has kubeadm's default; the etcd static pod manifest that says "this node runs an etcd member" is
//! `etcd.manifest`.

use serde::Deserialize;

/// Default `controlPlane.etcdEndpoint`: the local member's client URL on a kubeadm node.
pub const DEFAULT_ETCD_ENDPOINT: &str = "https://127.0.0.1:2379";
/// Default `controlPlane.etcdCaFile`: kubeadm's etcd CA.
pub const DEFAULT_ETCD_CA_FILE: &str = "/etc/kubernetes/pki/etcd/ca.crt";
/// Default `controlPlane.etcdCertFile`: kubeadm's etcd health-check client certificate.
pub const DEFAULT_ETCD_CERT_FILE: &str = "/etc/kubernetes/pki/etcd/healthcheck-client.crt";
/// Default `controlPlane.etcdKeyFile`: its key.
pub const DEFAULT_ETCD_KEY_FILE: &str = "/etc/kubernetes/pki/etcd/healthcheck-client.key";

/// `controlPlane:` (all keys optional).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// Ask etcd when `etcd.manifest` exists (default). `false` only where that manifest runs no member (a
    /// sandbox, the demo): the other control-plane Nodes are still checked.
    #[serde(default = "default_check_etcd")]
    pub check_etcd: bool,
    /// The local etcd member's client URL (`https://` with the certificate below, or `http://`).
    #[serde(default = "default_endpoint")]
    pub etcd_endpoint: String,
    /// Node path (under `--root`) of the CA the etcd members' serving certificates chain to.
    #[serde(default = "default_ca")]
    pub etcd_ca_file: String,
    /// Node path of the client certificate (PEM) presented to every member.
    #[serde(default = "default_cert")]
    pub etcd_cert_file: String,
    /// Node path of its private key (PEM; never logged).
    #[serde(default = "default_key")]
    pub etcd_key_file: String,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self {
            check_etcd: default_check_etcd(),
            etcd_endpoint: default_endpoint(),
            etcd_ca_file: default_ca(),
            etcd_cert_file: default_cert(),
            etcd_key_file: default_key(),
        }
    }
}

fn default_check_etcd() -> bool {
    true
}

fn default_endpoint() -> String {
    DEFAULT_ETCD_ENDPOINT.to_owned()
}

fn default_ca() -> String {
    DEFAULT_ETCD_CA_FILE.to_owned()
}

fn default_cert() -> String {
    DEFAULT_ETCD_CERT_FILE.to_owned()
}

fn default_key() -> String {
    DEFAULT_ETCD_KEY_FILE.to_owned()
}

impl ControlPlaneConfig {
    /// Checks the values (names the key).
    pub fn validate(&self) -> Result<(), String> {
        let endpoint = &self.etcd_endpoint;
        let uri: Result<hyper::Uri, _> = endpoint.parse();
        let ok = uri.as_ref().is_ok_and(|uri| {
            matches!(uri.scheme_str(), Some("https" | "http"))
                && uri.authority().is_some()
                && uri.path() == "/"
                && uri.query().is_none()
        }) && !endpoint.ends_with('/');
        if !ok {
            return Err(format!(
                "controlPlane.etcdEndpoint: {endpoint:?} is not a URL like {DEFAULT_ETCD_ENDPOINT} (scheme, host, port; no path)"
            ));
        }
        for (key, path) in [
            ("etcdCaFile", &self.etcd_ca_file),
            ("etcdCertFile", &self.etcd_cert_file),
            ("etcdKeyFile", &self.etcd_key_file),
        ] {
            if !path.starts_with('/') {
                return Err(format!(
                    "controlPlane.{key}: {path:?} is not an absolute node path"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::DriverConfig;

    #[test]
    fn defaults_and_bad_values() {
        let config = DriverConfig::from_yaml("").unwrap().control_plane;
        assert_eq!(config.etcd_endpoint, super::DEFAULT_ETCD_ENDPOINT);
        assert_eq!(config.etcd_key_file, super::DEFAULT_ETCD_KEY_FILE);
        assert!(config.check_etcd);
        let config =
            DriverConfig::from_yaml("controlPlane: {etcdEndpoint: 'http://10.0.0.1:2379'}")
                .unwrap()
                .control_plane;
        assert_eq!(config.etcd_ca_file, super::DEFAULT_ETCD_CA_FILE);
        let cases = [
            (
                "controlPlane: {etcdEndpoint: '127.0.0.1:2379'}",
                "controlPlane.etcdEndpoint",
            ),
            (
                "controlPlane: {etcdEndpoint: 'https://h:2379/v3'}",
                "controlPlane.etcdEndpoint",
            ),
            (
                "controlPlane: {etcdEndpoint: 'https://h:2379/'}",
                "controlPlane.etcdEndpoint",
            ),
            (
                "controlPlane: {etcdKeyFile: key.pem}",
                "controlPlane.etcdKeyFile",
            ),
            ("controlPlane: {etcdEndpionts: x}", "unknown field"),
        ];
        for (yaml, want) in cases {
            let err = DriverConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
