//! Why no plan could be built: the one error of [`super::build`].

use crate::objects::CLUSTER_NAME_LABEL;

/// Why no plan could be built from the desired objects.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A field the plan needs has the wrong shape.
    #[error("field `{path}`: {problem}")]
    Field {
        /// Where, e.g. `bootstrapConfig.spec.files[2].path`.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The Machine has no cluster name (neither `spec.clusterName` nor the cluster-name label).
    #[error("Machine has no spec.clusterName and no {CLUSTER_NAME_LABEL} label")]
    NoCluster,
}
