//! Artifacts by digest (issue 31; the `fetch` sequence command uses them): an `oci://` artifact or image from a registry
//! (the platform picked from an index), an `https://` or `file://` file with its SHA-256. Every download is
//! bounded ([`MAX_ARTIFACT_BYTES`], [`MAX_MANIFEST_BYTES`], the timeouts below), streamed into
//! `<dir>/sha256-<hex>.partial`, verified (size and SHA-256), fsynced and only then renamed to
//! `<dir>/sha256-<hex>`: a crash leaves a `.partial` that the next fetch resumes (HTTP Range) or starts over,
//! never a half-written artifact under its final name. A registry outage (no connection, 5xx, 429 with its
//! `Retry-After`, a body cut short) is ridden out with bounded retries (`retry.rs`); an answer a retry would
//! only repeat (401, 404, a digest mismatch) fails at once.

mod error;
mod fetch;
mod manifest;
mod options;
mod retry;
mod session;
mod source;
mod store;
mod url_text;

use std::time::Duration;

pub use error::{FetchError, FetchErrorKind};
pub use fetch::Fetcher;
pub use manifest::{Descriptor, Platform};
pub use options::{
    Credential, Credentials, FetchOptions, MirrorRewrite, OptionsError, check_ca_file, rewrite,
};
pub use retry::{DEFAULT_FETCH_RETRY, MAX_FETCH_RETRY_AFTER};
pub use source::{ArtifactSource, OciReference, SourceError};

/// Default largest artifact (blob or file) a fetch accepts ([`FetchOptions::max_bytes`]).
pub const MAX_ARTIFACT_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Largest manifest or index read from a registry.
pub const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;
/// Largest registry credentials file (`config.json`).
pub const MAX_CREDENTIALS_FILE_BYTES: u64 = 64 * 1024;
/// Largest token answer, and the part of an error answer read from a registry.
pub const MAX_REGISTRY_ANSWER_BYTES: usize = 64 * 1024;
/// Longest one request for a manifest or a token, or the headers of a blob answer, may take.
pub const ARTIFACT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a blob download may go without receiving a byte.
pub const ARTIFACT_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest one whole fetch (manifests and the blob) may take.
pub const ARTIFACT_FETCH_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Most redirects followed for one request (credentials are dropped when a redirect leaves the host).
pub const MAX_ARTIFACT_REDIRECTS: usize = 5;
