//! Machines on the management cluster: read one's annotations and resourceVersion, and set or remove one
//! annotation with that resourceVersion as the precondition (a JSON merge patch carrying
//! `metadata.resourceVersion`: the API answers 409 when the Machine changed since it was read, and nothing of
//! anyone else's is overwritten).

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

use super::{Management, ManagementError};

pub use crate::dispatch::floor::guard::SKIP_REMEDIATION_ANNOTATION;

/// What the server reads of a Machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineMeta {
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

fn machines(management: &Management, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "machines");
    Api::namespaced_with(management.client.clone(), namespace, &resource)
}

fn meta(object: DynamicObject) -> MachineMeta {
    MachineMeta {
        resource_version: object.metadata.resource_version.unwrap_or_default(),
        annotations: object.metadata.annotations.unwrap_or_default(),
    }
}

impl Management {
    /// Machine `namespace/name`'s annotations and resourceVersion.
    pub async fn machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<MachineMeta, ManagementError> {
        let op = "machine-get";
        machines(self, namespace)
            .get(name)
            .await
            .map(meta)
            .map_err(|e| ManagementError::of(op, format!("{namespace}/{name}"), e))
    }

    /// Sets (`Some`) or removes (`None`) annotation `key` of Machine `namespace/name`, provided its
    /// resourceVersion is still `resource_version` (else a 409 [`ManagementError::Status`]); returns the
    /// Machine as patched.
    pub async fn annotate_machine(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<MachineMeta, ManagementError> {
        let op = "machine-patch";
        let patch = json!({
            "metadata": {"resourceVersion": resource_version, "annotations": {key: value}},
        });
        machines(self, namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(meta)
            .map_err(|e| ManagementError::of(op, format!("{namespace}/{name}"), e))
    }
}
