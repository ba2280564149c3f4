//! TLS for the hook port: loads the serving certificate chain and key, serves whatever is current to each new
//! handshake, and re-reads the files when their bytes change (cert-manager rotates a mounted Secret by swapping a
//! `..data` symlink, so the content is compared, not file events on one path). Optional client-certificate checks
//! against `--client-ca` (mTLS).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocols offered on the hook port, in preference order.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read, or is over [`MAX_PEM_FILE_BYTES`].
    #[error(transparent)]
    Read(#[from] inplace_bounded_read::ReadError),
    /// The certificate file holds no PEM certificate or a malformed one.
    #[error("{path}: no valid PEM certificate ({detail})")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The key file holds no usable private key.
    #[error("{path}: no valid PEM private key ({detail})")]
    Key {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The key does not belong to the certificate, or its algorithm is unsupported.
    #[error("certificate {cert} and key {key} do not form a usable pair: {detail}")]
    Pair {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// The client CA bundle could not be used.
    #[error("client CA {path}: {detail}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

/// The crypto provider used everywhere (ring: no C toolchain beyond cc needed).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Largest certificate, key or client CA file read (`--tls-cert`, `--tls-key`, `--client-ca`, at start and on
/// every reload check): a PEM bundle of a few hundred CA certificates fits many times over.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    Ok(inplace_bounded_read::read(path, MAX_PEM_FILE_BYTES)?)
}

/// Parses every certificate of a PEM file (leaf first, then intermediates).
pub fn parse_cert_chain(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    crate::pem::certificates(pem).map_err(|detail| TlsError::Certificate {
        path: path.to_owned(),
        detail,
    })
}

/// Builds a certified key from PEM bytes, checking that key and leaf certificate match.
fn certified_key(
    files: &TlsFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = parse_cert_chain(&files.cert, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|err| TlsError::Key {
        path: files.key.clone(),
        detail: err.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|err| TlsError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        detail: err.to_string(),
    })
}

/// Where the serving certificate and key live.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain (`tls.crt`).
    pub cert: PathBuf,
    /// PEM private key (`tls.key`).
    pub key: PathBuf,
}

struct Loaded {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    key: Arc<CertifiedKey>,
}

/// The serving certificate, swappable at run time: each new handshake gets the current one,
/// open connections keep theirs.
pub struct ReloadingCert {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the files once; fails when they are missing or unusable.
    pub fn load(files: TlsFiles, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let cert_pem = read(&files.cert)?;
        let key_pem = read(&files.key)?;
        let key = Arc::new(certified_key(&files, &cert_pem, &key_pem, &provider)?);
        Ok(Self {
            files,
            provider,
            current: RwLock::new(Loaded {
                cert_pem,
                key_pem,
                key,
            }),
        })
    }

    /// Re-reads both files; swaps in the new pair when the bytes changed and the pair is valid.
    /// Returns whether a new certificate is now served. A half-written rotation (new cert, old key) is an
    /// error and keeps the old pair in service until the next check.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let cert_pem = read(&self.files.cert)?;
        let key_pem = read(&self.files.key)?;
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.cert_pem == cert_pem && current.key_pem == key_pem {
                return Ok(false);
            }
        }
        let key = Arc::new(certified_key(
            &self.files,
            &cert_pem,
            &key_pem,
            &self.provider,
        )?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Loaded {
            cert_pem,
            key_pem,
            key,
        };
        Ok(true)
    }

    /// The certificate chain served now (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .key
            .cert
            .clone()
    }

    /// The files being watched.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .key
                .clone(),
        )
    }
}

/// Builds the hook port's rustls config: TLS 1.2/1.3, ALPN h2 + http/1.1, and — when a client CA is
/// given — client certificates verified against it. Client certificates are requested but not demanded
/// at the handshake, so agents (bearer tokens) can share the port; hook routes then refuse calls whose
/// connection presented none.
pub fn server_config(
    cert: Arc<ReloadingCert>,
    client_ca: Option<&Path>,
    provider: Arc<CryptoProvider>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Pair {
            cert: cert.files.cert.clone(),
            key: cert.files.key.clone(),
            detail: err.to_string(),
        })?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let pem = read(path)?;
            let mut roots = RootCertStore::empty();
            for ca in parse_cert_chain(path, &pem)? {
                roots.add(ca).map_err(|err| TlsError::ClientCa {
                    path: path.to_owned(),
                    detail: err.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|err| TlsError::ClientCa {
                    path: path.to_owned(),
                    detail: err.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}
