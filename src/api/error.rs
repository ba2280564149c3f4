//! Why a hook request body could not be decoded: one error for the request as a whole (`requests.rs`) and
//! for the objects inside it (`objects.rs`), each naming the field that is wrong.

use super::validate::Invalid;

/// Why a request body could not be decoded; the message names the offending field.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The body was empty.
    #[error("request body is empty: expected a {kind} JSON object")]
    Empty {
        /// The request kind that was expected.
        kind: &'static str,
    },
    /// JSON syntax or shape error at a field path.
    #[error("cannot decode {kind}: {detail}")]
    Json {
        /// The request kind that was expected.
        kind: &'static str,
        /// `path: serde message`, e.g. ``desired: missing field `machine` at line 1 column 40``.
        detail: String,
    },
    /// An object inside the request is not valid JSON; the message is the one `Json` gave for it.
    #[error("cannot decode object: {path}: {source}")]
    Object {
        /// Where the object sits in the request, e.g. `desired.machine`.
        path: &'static str,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// `apiVersion` or `kind` is present but names something else.
    #[error("field `{field}` is {found:?}, expected {expected:?}")]
    TypeMeta {
        /// `apiVersion` or `kind`.
        field: &'static str,
        /// What the body said (truncated).
        found: String,
        /// What this endpoint serves.
        expected: &'static str,
    },
    /// An object does not fit its role, or a field this extension reads has the wrong type or form.
    #[error("{0}")]
    Invalid(#[from] Invalid),
}
