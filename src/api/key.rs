//! The `namespace/name` of an object CAPI sent, as logs, metrics and messages name it.

/// `namespace/name` of an object, for logs and messages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `metadata.namespace` (empty when absent).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
