//! Why a fetch failed: always the artifact (as configured) and the cause, never a credential.

use crate::fsutil::FsError;

use super::options::OptionsError;

/// A failed fetch of `artifact`.
#[derive(Debug, thiserror::Error)]
#[error("artifact {artifact}: {kind}{}", attempts.as_deref().map(|a| format!(" ({a})")).unwrap_or_default())]
pub struct FetchError {
    /// The source as configured (`oci://…@sha256:…`, the URL, `file://…`).
    pub artifact: String,
    /// What went wrong (at the last attempt).
    #[source]
    pub kind: FetchErrorKind,
    /// How the retries of a transient failure ended (`attempt 6/6; no attempts left`); `None` when the failure
    /// was not retried.
    pub attempts: Option<String>,
}

/// What went wrong in a fetch.
#[derive(Debug, thiserror::Error)]
pub enum FetchErrorKind {
    /// The credentials or CA file is unusable.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// 401: no credentials for the registry, or the registry refused them.
    #[error("{url} answered 401 Unauthorized: {hint}")]
    Unauthorized {
        /// The URL.
        url: String,
        /// Which credentials were tried (never their value).
        hint: String,
    },
    /// 404: the registry or server does not have it.
    #[error("{url} answered 404 Not Found: {message}")]
    NotFound {
        /// The URL.
        url: String,
        /// The start of the answer's body.
        message: String,
    },
    /// A 5xx answer.
    #[error("{url} answered {status} (a server error): {message}")]
    Server {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the answer's body.
        message: String,
        /// Its `Retry-After`, in seconds, when it gave one.
        retry_after: Option<u64>,
    },
    /// Another unexpected status.
    #[error("{url} answered {status}: {message}")]
    Status {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the answer's body.
        message: String,
        /// Its `Retry-After`, in seconds, when it gave one (a 429).
        retry_after: Option<u64>,
    },
    /// No answer: connection, TLS, or a dropped connection.
    #[error("request to {url} failed: {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// The error chain.
        reason: String,
        /// Whether another attempt may get through (a refused or dropped connection, a broken body), as
        /// opposed to a certificate the CA file does not vouch for or a peer that does not speak TLS.
        transient: bool,
    },
    /// A request or the download took longer than its bound.
    #[error("{what} took longer than {seconds} s")]
    Timeout {
        /// What timed out (a URL, or the whole fetch).
        what: String,
        /// The bound.
        seconds: u64,
    },
    /// The Bearer token flow failed.
    #[error("token from {realm}: {reason}")]
    Token {
        /// The token endpoint.
        realm: String,
        /// What went wrong.
        reason: String,
        /// Whether the token endpoint was only unavailable (it answered 5xx or 429).
        transient: bool,
    },
    /// A manifest or index that cannot be used.
    #[error("manifest {digest}: {reason}")]
    Manifest {
        /// The manifest's digest.
        digest: String,
        /// What is wrong.
        reason: String,
    },
    /// An index without a manifest for this node's platform.
    #[error("no manifest for {wanted} in index {digest}; it offers: {offered}")]
    NoPlatform {
        /// `linux/<arch>`.
        wanted: String,
        /// The index digest.
        digest: String,
        /// The platforms the index lists.
        offered: String,
    },
    /// Fewer bytes than the descriptor's size (a short read or a truncated blob).
    #[error("truncated: got {got} of {expected} bytes")]
    Truncated {
        /// Bytes received.
        got: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// More bytes than the descriptor's size.
    #[error("longer than its descriptor's {expected} bytes")]
    Overlong {
        /// Bytes expected.
        expected: u64,
    },
    /// The bytes' SHA-256 is not the expected one (nothing was renamed into place).
    #[error("digest mismatch: expected sha256:{expected}, got sha256:{actual}")]
    DigestMismatch {
        /// The expected SHA-256.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// Over the size limit.
    #[error("{size} bytes is over the limit of {limit} bytes")]
    TooLarge {
        /// The size announced or reached.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Reading or writing the download directory.
    #[error("{action} {path}: {source}")]
    Disk {
        /// What was done.
        action: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl From<FsError> for FetchErrorKind {
    fn from(e: FsError) -> Self {
        Self::Disk {
            action: e.action,
            path: e.path,
            source: e.source,
        }
    }
}
