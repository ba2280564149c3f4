//! The fetcher: an `oci://` reference through the mirror rewrites to the registry (manifest or index by
//! digest, verified; the platform's manifest; its layer blob), an `https://` URL, or a `file://` path — all
//! into the same content-addressed store, verified before the rename. [`Fetcher::fetch_retrying`] tries a
//! transient failure again (`retry.rs`); a blob cut short resumes from its `.partial` with `Range`.

use hyper::StatusCode;
use hyper::header::CONTENT_RANGE;
use tokio::time::Instant;

use super::error::{FetchError, FetchErrorKind};
use super::manifest::{MANIFEST_ACCEPT, Manifest, select_layer, select_platform, sha256_of};
use super::options::{FetchOptions, https_client, rewrite};
use super::retry;
use super::session::Session;
use super::source::{ArtifactSource, OciReference};
use super::store::Store;
use super::{ARTIFACT_FETCH_TIMEOUT, MAX_MANIFEST_BYTES};
use crate::net::client::{HttpsClient, sha256_hex};

/// Fetches artifacts with one set of [`FetchOptions`].
pub struct Fetcher {
    options: FetchOptions,
    http: HttpsClient,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What to download and how to check it.
struct Blob<'a> {
    url: String,
    sha256: &'a str,
    size: Option<u64>,
}

impl Fetcher {
    /// A fetcher; fails when the CA file is unusable.
    pub fn new(options: FetchOptions) -> Result<Self, super::OptionsError> {
        let http = https_client(options.ca_file.as_deref())?;
        Ok(Self { options, http })
    }

    /// Fetches `source` into the download directory and answers the verified file's path
    /// (`<dir>/sha256-<hex>`), reusing a verified file already there and resuming a `.partial`.
    pub async fn fetch(&self, source: &ArtifactSource) -> Result<std::path::PathBuf, FetchError> {
        let fetch = async {
            match source {
                ArtifactSource::Oci(reference) => self.fetch_oci(reference).await,
                ArtifactSource::Https { url, sha256 } => {
                    // Credentials apply by host to https:// sources too.
                    let host = url["https://".len()..]
                        .split('/')
                        .next()
                        .unwrap_or_default();
                    let credential = self.options.credentials.for_registry(host);
                    let session = Session::new(&self.http, credential, host.to_owned());
                    let blob = Blob {
                        url: url.clone(),
                        sha256,
                        size: None,
                    };
                    self.fetch_blob(&session, &blob).await
                }
                ArtifactSource::File { path, sha256 } => {
                    let store = Store::new(&self.options.download_dir, sha256)?;
                    if let Some(done) = store.reuse().await? {
                        return Ok(done);
                    }
                    store.copy_file(path, self.options.max_bytes).await?;
                    store.finish(None).await
                }
            }
        };
        tokio::time::timeout(ARTIFACT_FETCH_TIMEOUT, fetch)
            .await
            .unwrap_or_else(|_| {
                Err(FetchErrorKind::Timeout {
                    what: "the whole fetch".into(),
                    seconds: ARTIFACT_FETCH_TIMEOUT.as_secs(),
                })
            })
            .map_err(|kind| FetchError {
                artifact: source.to_string(),
                kind,
                attempts: None,
            })
    }

    /// [`Fetcher::fetch`], a transient failure tried again after the back-off of the options' retry policy
    /// (or the registry's `Retry-After`), as long as attempts are left and the next one starts before
    /// `deadline`; a download cut short continues from its `.partial`. Each retry is logged with its cause
    /// (never a credential). Dropping the future — a shutdown — stops it at once, in a back-off as well.
    pub async fn fetch_retrying(
        &self,
        source: &ArtifactSource,
        deadline: Instant,
    ) -> Result<std::path::PathBuf, FetchError> {
        let policy = self.options.retry;
        let mut failures = 0;
        loop {
            let mut failed = match self.fetch(source).await {
                Ok(path) => return Ok(path),
                Err(e) if !e.kind.is_transient() => return Err(e),
                Err(e) => e,
            };
            failures += 1;
            let attempts = policy.attempts;
            if failures >= attempts {
                failed.attempts = Some(format!("attempt {failures}/{attempts}; no attempts left"));
                return Err(failed);
            }
            let delay = retry::delay(&policy, failures, &failed.kind);
            if Instant::now() + delay >= deadline {
                failed.attempts = Some(format!(
                    "attempt {failures}/{attempts}; attempt {} would start after the deadline",
                    failures + 1
                ));
                return Err(failed);
            }
            tracing::warn!(
                artifact = %failed.artifact,
                cause = %failed.kind,
                attempt = failures + 1,
                attempts,
                delay_ms = delay.as_millis() as u64,
                "artifact fetch failed (transient); trying again"
            );
            tokio::time::sleep(delay).await;
        }
    }

    async fn fetch_oci(
        &self,
        reference: &OciReference,
    ) -> Result<std::path::PathBuf, FetchErrorKind> {
        let name = format!("{}/{}", reference.registry, reference.repository);
        let name = rewrite(&self.options.mirrors, &name).unwrap_or(name);
        let (registry, repository) = name.split_once('/').unwrap_or((&name, ""));
        let session = Session::new(
            &self.http,
            self.options.credentials.for_registry(registry),
            registry.to_owned(),
        );
        let base = format!("https://{registry}/v2/{repository}");
        let mut digest = reference.digest.clone();
        let manifest = self.manifest(&session, &base, &digest).await?;
        let manifest = match manifest.manifests {
            Some(index) => {
                let entry = select_platform(&index, &self.options.arch).map_err(|offered| {
                    FetchErrorKind::NoPlatform {
                        wanted: format!("linux/{}", self.options.arch),
                        digest: format!("sha256:{digest}"),
                        offered,
                    }
                })?;
                digest = sha256_of(&entry.digest)
                    .ok_or_else(|| {
                        bad_manifest(
                            &digest,
                            format!("entry digest {:?} is not sha256", entry.digest),
                        )
                    })?
                    .to_owned();
                self.manifest(&session, &base, &digest).await?
            }
            None => manifest,
        };
        let layers = manifest.layers.ok_or_else(|| {
            bad_manifest(
                &digest,
                "neither an index nor a manifest with layers".into(),
            )
        })?;
        let layer = select_layer(&layers, self.options.layer_media_type.as_deref())
            .map_err(|reason| bad_manifest(&digest, reason))?;
        let sha256 = sha256_of(&layer.digest).ok_or_else(|| {
            bad_manifest(
                &digest,
                format!("layer digest {:?} is not sha256", layer.digest),
            )
        })?;
        let blob = Blob {
            url: format!("{base}/blobs/{}", layer.digest),
            sha256,
            size: Some(layer.size),
        };
        self.fetch_blob(&session, &blob).await
    }

    /// The manifest or index `digest`, checked against its digest.
    async fn manifest(
        &self,
        session: &Session<'_>,
        base: &str,
        digest: &str,
    ) -> Result<Manifest, FetchErrorKind> {
        let url = format!("{base}/manifests/sha256:{digest}");
        let body = session
            .get_bytes(&url, Some(MANIFEST_ACCEPT), MAX_MANIFEST_BYTES)
            .await?;
        let actual = sha256_hex(&body);
        if actual != digest {
            return Err(FetchErrorKind::DigestMismatch {
                expected: digest.to_owned(),
                actual,
            });
        }
        serde_json::from_slice(&body)
            .map_err(|e| bad_manifest(digest, format!("not a manifest: {e}")))
    }

    /// Downloads `blob` into the store: reuse, resume (206) or start over, then verify and rename. A
    /// resumed download that fails verification is fetched once more from the start.
    async fn fetch_blob(
        &self,
        session: &Session<'_>,
        blob: &Blob<'_>,
    ) -> Result<std::path::PathBuf, FetchErrorKind> {
        let store = Store::new(&self.options.download_dir, blob.sha256)?;
        if let Some(done) = store.reuse().await? {
            return Ok(done);
        }
        let limit = self.options.max_bytes;
        if let Some(size) = blob.size.filter(|s| *s > limit) {
            return Err(FetchErrorKind::TooLarge { size, limit });
        }
        let mut resume = store.partial_len();
        if blob.size.is_some_and(|s| resume >= s) {
            // All bytes are there (a crash before the rename): verify them as they are.
            match store.finish(blob.size).await {
                Ok(path) => return Ok(path),
                Err(_) => resume = 0,
            }
        }
        loop {
            let response = session
                .get(&blob.url, None, (resume > 0).then_some(resume))
                .await;
            let response = match response {
                // A range the server cannot serve (the `.partial` is longer than the blob): start over.
                Err(FetchErrorKind::Status { status: 416, .. }) if resume > 0 => {
                    store.discard()?;
                    resume = 0;
                    continue;
                }
                other => other?,
            };
            let start = match response.status() {
                StatusCode::PARTIAL_CONTENT if resume > 0 && range_starts_at(&response, resume) => {
                    resume
                }
                _ => 0,
            };
            store
                .write_body(response.into_body(), start, blob.size, limit, &blob.url)
                .await?;
            match store.finish(blob.size).await {
                Err(FetchErrorKind::DigestMismatch { .. }) if start > 0 => {
                    resume = 0;
                    continue;
                }
                result => return result,
            }
        }
    }
}

fn range_starts_at(response: &hyper::Response<hyper::body::Incoming>, offset: u64) -> bool {
    response
        .headers()
        .get(CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split_once('-'))
        .is_some_and(|(first, _)| first.trim().parse::<u64>().ok() == Some(offset))
}

fn bad_manifest(digest: &str, reason: String) -> FetchErrorKind {
    FetchErrorKind::Manifest {
        digest: format!("sha256:{digest}"),
        reason,
    }
}
