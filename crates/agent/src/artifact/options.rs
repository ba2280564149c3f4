//! What a fetch may use: mirror rewrites (registry prefix → replacement, first match wins), registry
//! credentials from a Docker `config.json` (`auths`), the CA the registry's TLS is checked with, the size
//! limit, and the HTTPS client built from them (the agent's hyper + hyper-rustls, ring).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{MAX_ARTIFACT_BYTES, MAX_CREDENTIALS_FILE_BYTES};
use crate::limits::MAX_CA_FILE_BYTES;
use crate::net::client::{CONNECT_TIMEOUT, HttpsClient, POOL_IDLE_TIMEOUT, tls_trusting};
use crate::retry::RetryPolicy;

/// One mirror rewrite: a reference whose `registry/repository` starts with `prefix` (at a `/` boundary) is
/// fetched from `replacement` + the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorRewrite {
    /// `registry.example.com/k8s` (a registry, optionally with a repository prefix).
    pub prefix: String,
    /// `mirror.local:5443/k8s`.
    pub replacement: String,
}

/// Applies the first rewrite whose prefix matches `name` (`registry/repository`); `None` when none does.
pub fn rewrite(mirrors: &[MirrorRewrite], name: &str) -> Option<String> {
    mirrors.iter().find_map(|m| {
        let prefix = m.prefix.trim_end_matches('/');
        let rest = name.strip_prefix(prefix)?;
        (rest.is_empty() || rest.starts_with('/'))
            .then(|| format!("{}{rest}", m.replacement.trim_end_matches('/')))
    })
}

/// A user name and password for one registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name.
    pub username: String,
    password: String,
}

impl Credential {
    /// A credential.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The `Authorization: Basic …` value.
    pub(crate) fn basic(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Registry credentials by registry host (`host[:port]`), read from a Docker `config.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    by_registry: BTreeMap<String, Credential>,
}

/// Why the credentials file or the CA file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The file could not be read (or is over its bound).
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: inplace_bounded_read::ReadError,
    },
    /// The credentials file is not a Docker `config.json` with usable `auths` (the values are never shown).
    #[error("credentials file {path}: {reason}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The CA file holds no usable certificate, or TLS setup failed.
    #[error("registry CA file {path}: {reason}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(serde::Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl Credentials {
    /// Reads a Docker `config.json`: `{"auths": {"host[:port]": {"auth": base64(user:password)}}}` (or
    /// `username` + `password`). Keys may carry `https://` and a path; only `host[:port]` is kept.
    pub fn from_file(path: &Path) -> Result<Self, OptionsError> {
        let bytes =
            inplace_bounded_read::read(path, MAX_CREDENTIALS_FILE_BYTES).map_err(|source| {
                OptionsError::Read {
                    path: path.to_owned(),
                    source,
                }
            })?;
        Self::parse(&bytes).map_err(|reason| OptionsError::Credentials {
            path: path.to_owned(),
            reason,
        })
    }

    /// [`Credentials::from_file`] on the file's bytes; the error never quotes the file.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let config: DockerConfig = serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "not a Docker config.json (line {}, column {})",
                e.line(),
                e.column()
            )
        })?;
        let mut by_registry = BTreeMap::new();
        for (key, auth) in config.auths {
            let host = key
                .trim_start_matches("https://")
                .trim_start_matches("http://");
            let host = host.split('/').next().unwrap_or_default().to_owned();
            let credential = match (auth.auth, auth.username, auth.password) {
                (Some(encoded), _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded.trim())
                        .ok()
                        .and_then(|d| String::from_utf8(d).ok())
                        .ok_or_else(|| {
                            format!("auths.{key:?}.auth is not base64 of user:password")
                        })?;
                    let (user, password) = decoded.split_once(':').ok_or_else(|| {
                        format!("auths.{key:?}.auth is not base64 of user:password")
                    })?;
                    Credential::new(user, password)
                }
                (None, Some(user), Some(password)) => Credential::new(user, password),
                _ => {
                    return Err(format!(
                        "auths.{key:?} has neither auth nor username and password"
                    ));
                }
            };
            by_registry.insert(host, credential);
        }
        Ok(Self { by_registry })
    }

    /// The credential for `registry` (`host[:port]`), if any.
    pub fn for_registry(&self, registry: &str) -> Option<&Credential> {
        self.by_registry.get(registry)
    }

    /// Adds (or replaces) the credential for `registry`.
    pub fn insert(&mut self, registry: impl Into<String>, credential: Credential) {
        self.by_registry.insert(registry.into(), credential);
    }
}

/// Everything a fetch may use.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Where finished artifacts (`sha256-<hex>`) and interrupted downloads (`.partial`) live.
    pub download_dir: PathBuf,
    /// Registry prefix rewrites, first match wins.
    pub mirrors: Vec<MirrorRewrite>,
    /// Registry credentials.
    pub credentials: Credentials,
    /// PEM CA bundle that alone is trusted for registries and `https://` sources; `None`: the system's.
    pub ca_file: Option<PathBuf>,
    /// Largest artifact accepted (manifests are bounded by [`super::MAX_MANIFEST_BYTES`]).
    pub max_bytes: u64,
    /// When an image has several layers, the media type of the one to fetch.
    pub layer_media_type: Option<String>,
    /// The architecture (GOARCH name) to pick from an index: this node's by default.
    pub arch: String,
    /// How [`super::Fetcher::fetch_retrying`] retries a transient failure.
    pub retry: RetryPolicy,
}

impl FetchOptions {
    /// Defaults: no mirror, no credentials, the system CA store, [`MAX_ARTIFACT_BYTES`], this node's
    /// architecture, [`super::DEFAULT_FETCH_RETRY`].
    pub fn new(download_dir: impl Into<PathBuf>) -> Self {
        Self {
            download_dir: download_dir.into(),
            mirrors: Vec::new(),
            credentials: Credentials::default(),
            ca_file: None,
            max_bytes: MAX_ARTIFACT_BYTES,
            layer_media_type: None,
            arch: inplace_agent_api::go_arch(std::env::consts::ARCH).to_owned(),
            retry: super::DEFAULT_FETCH_RETRY,
        }
    }
}

/// Checks that `path` is a PEM CA bundle the fetcher can trust (read bounded, at least one certificate).
pub fn check_ca_file(path: &Path) -> Result<(), OptionsError> {
    https_client(Some(path)).map(|_| ())
}

/// The HTTPS client for fetches: only `ca_file` is trusted when given, else the system's CA store.
pub(crate) fn https_client(ca_file: Option<&Path>) -> Result<HttpsClient, OptionsError> {
    let ca_err = |path: &Path, reason: String| OptionsError::Ca {
        path: path.to_owned(),
        reason,
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    let builder = match ca_file {
        Some(path) => {
            let pem = inplace_bounded_read::read(path, MAX_CA_FILE_BYTES).map_err(|source| {
                OptionsError::Read {
                    path: path.to_owned(),
                    source,
                }
            })?;
            let tls = tls_trusting(&pem).map_err(|e| ca_err(path, e))?;
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
        }
        None => hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| ca_err(Path::new("(system CA store)"), e.to_string()))?,
    };
    let connector = builder.https_only().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(prefix: &str, replacement: &str) -> MirrorRewrite {
        MirrorRewrite {
            prefix: prefix.into(),
            replacement: replacement.into(),
        }
    }

    #[test]
    fn the_first_matching_prefix_wins_at_a_path_boundary() {
        let mirrors = [
            m("registry.example.com/k8s", "mirror.local:5443/k8s-mirror"),
            m("registry.example.com", "mirror.local:5443/other"),
        ];
        assert_eq!(
            rewrite(&mirrors, "registry.example.com/k8s/kubelet").as_deref(),
            Some("mirror.local:5443/k8s-mirror/kubelet")
        );
        // `k8sx` is not under `k8s`: the second rule applies.
        assert_eq!(
            rewrite(&mirrors, "registry.example.com/k8sx/kubelet").as_deref(),
            Some("mirror.local:5443/other/k8sx/kubelet")
        );
        assert_eq!(rewrite(&mirrors, "registry.example.community/x"), None);
        assert_eq!(rewrite(&mirrors, "docker.io/library/x"), None);
    }

    #[test]
    fn docker_config_credentials_by_registry_host() {
        let auth = base64::engine::general_purpose::STANDARD.encode("agent:s3cr:et");
        let json = format!(
            r#"{{"auths": {{"https://r.example:5443/v2/": {{"auth": "{auth}"}},
                "m.local": {{"username": "u", "password": "p"}}}}}}"#
        );
        let creds = Credentials::parse(json.as_bytes()).unwrap();
        let c = creds.for_registry("r.example:5443").unwrap();
        assert_eq!(c.username, "agent");
        assert_eq!(
            c.basic(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("agent:s3cr:et")
            )
        );
        assert_eq!(
            creds.for_registry("m.local"),
            Some(&Credential::new("u", "p"))
        );
        assert_eq!(creds.for_registry("r.example"), None);
        let debug = format!("{creds:?}");
        assert!(
            !debug.contains("s3cr") && debug.contains("<redacted>"),
            "{debug}"
        );
    }

    #[test]
    fn a_bad_credentials_file_is_named_without_its_content() {
        let err = Credentials::parse(br#"{"auths": {"r": {"auth": "!!secret!!"}}}"#).unwrap_err();
        assert!(
            err.contains("not base64 of user:password") && !err.contains("secret!!"),
            "{err}"
        );
        let err = Credentials::parse(b"agent:s3cret").unwrap_err();
        assert!(
            err.starts_with("not a Docker config.json") && !err.contains("s3cret"),
            "{err}"
        );
        let err = Credentials::parse(br#"{"auths": {"r": {}}}"#).unwrap_err();
        assert!(err.contains("neither auth nor username"), "{err}");
    }
}
