//! The plan's typed view of a KubeadmConfig: exactly the fields [`super::build`] reads, named as CAPI's
//! v1beta2 Go types name them, decoded from the object's JSON text by [`crate::decode::decode_json_at`] (the
//! hooks' decoder: exact member names, unknown members skipped, the failing field named). Every other field
//! of the object is skipped unparsed.
//!
//! As in Go, `null` is the same as absent for every field. `api::validate` (server crate) has already
//! checked these fields' types for requests, so a decode error here means a caller skipped validation.

use inplace_agent_api::{FileEncoding, SecretString};
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::PlanError;
use crate::decode::decode_json_at;

/// A KubeadmConfig, as far as the plan reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct KubeadmConfigView {
    /// `spec`.
    pub spec: Option<KubeadmConfigSpec>,
}

impl KubeadmConfigView {
    /// Decodes the view from a KubeadmConfig's JSON text; an error names the field under `bootstrapConfig`.
    pub fn decode(text: &str) -> Result<Self, PlanError> {
        decode_json_at(text.as_bytes()).map_err(|err| PlanError::Field {
            path: match err.path {
                Some(path) => format!("bootstrapConfig.{path}"),
                None => "bootstrapConfig".into(),
            },
            problem: without_strings(&err.message),
        })
    }
}

/// Serde's message with any quoted string value left out (`invalid type: string "…", expected a
/// sequence` becomes `invalid type: a string, expected a sequence`): the value may be a key or file content,
/// and plan errors reach UpdateMachine's Failure message and the logs.
fn without_strings(message: &str) -> String {
    const QUOTED: &str = "string \"";
    match (message.find(QUOTED), message.rfind("\", expected")) {
        (Some(start), Some(end)) if end >= start + QUOTED.len() => {
            format!("{}a string{}", &message[..start], &message[end + 1..])
        }
        _ => message.to_string(),
    }
}

/// `spec` of a KubeadmConfig.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeadmConfigSpec {
    /// `files`.
    pub files: Option<Vec<File>>,
    /// `users`.
    pub users: Option<Vec<User>>,
    /// `ntp`.
    pub ntp: Option<Ntp>,
    /// `clusterConfiguration` (only `etcd.local` is read).
    pub cluster_configuration: Option<ClusterConfiguration>,
    /// `initConfiguration` (only `nodeRegistration.kubeletExtraArgs` is read).
    pub init_configuration: Option<NodeConfiguration>,
    /// `joinConfiguration` (only `nodeRegistration.kubeletExtraArgs` is read).
    pub join_configuration: Option<NodeConfiguration>,
}

/// One of `files`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct File {
    /// `path`: required unless the content comes from a secret (such files are not managed, so unread).
    pub path: Option<String>,
    /// `content`.
    pub content: Option<SecretString>,
    /// `owner`.
    pub owner: Option<String>,
    /// `permissions`.
    pub permissions: Option<String>,
    /// `encoding`: empty is none.
    pub encoding: Option<Encoding>,
    /// `append`.
    pub append: Option<bool>,
    /// `contentFrom`: only whether it is set.
    pub content_from: Option<IgnoredAny>,
}

/// `files[].encoding`, with Go's empty string meaning none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Encoding(pub FileEncoding);

impl TryFrom<String> for Encoding {
    type Error = &'static str;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Ok(Encoding(match text.as_str() {
            "" => FileEncoding::None,
            "base64" => FileEncoding::Base64,
            "gzip" => FileEncoding::Gzip,
            "gzip+base64" => FileEncoding::GzipBase64,
            _ => return Err("is not one of base64, gzip, gzip+base64"),
        }))
    }
}

/// One of `users`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// `name`.
    pub name: String,
    /// `sshAuthorizedKeys`: unset leaves the user's keys alone, a list (even empty) is the whole set.
    pub ssh_authorized_keys: Option<Vec<SecretString>>,
}

/// `ntp`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Ntp {
    /// `servers`.
    pub servers: Option<Vec<String>>,
    /// `enabled`.
    pub enabled: Option<bool>,
}

/// `clusterConfiguration`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClusterConfiguration {
    /// `etcd`.
    pub etcd: Option<Etcd>,
}

/// `clusterConfiguration.etcd`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Etcd {
    /// `local`.
    pub local: Option<LocalEtcd>,
}

/// `clusterConfiguration.etcd.local`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalEtcd {
    /// `imageTag`.
    pub image_tag: Option<String>,
    /// `imageRepository`.
    pub image_repository: Option<String>,
}

/// `initConfiguration` or `joinConfiguration`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfiguration {
    /// `nodeRegistration`.
    pub node_registration: Option<NodeRegistration>,
}

/// `nodeRegistration`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistration {
    /// `kubeletExtraArgs` (v1beta2: a list of `{name, value}`).
    pub kubelet_extra_args: Option<Vec<Arg>>,
}

/// One `{name, value}` of `kubeletExtraArgs`.
#[derive(Debug, Clone, Deserialize)]
pub struct Arg {
    /// `name`.
    pub name: String,
    /// `value`.
    pub value: String,
}
