//! The CA bundle agents should trust (`serve --agent-ca-bundle`), served at `GET /agent/v1/ca` and named by
//! its digest in poll answers: re-read when its bytes (or the serving certificate) change, and handed out only
//! when it verifies the server's own current serving certificate — a bundle that does not would cut every
//! agent off from the server. A refused bundle keeps the last good one (or none) in service. The check is pure
//! ([`check_bundle`]); [`ServedCa`] holds what passed, and the server's watcher refreshes it.

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

use inplace_agent_api::MAX_CA_BUNDLE_BYTES;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::ParsedCertificate;
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};

/// Why a CA bundle is not handed out.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    /// The file could not be read, or is over [`MAX_CA_BUNDLE_BYTES`].
    #[error(transparent)]
    Read(#[from] inplace_bounded_read::ReadError),
    /// The file holds no PEM certificate, or a malformed one.
    #[error("--agent-ca-bundle {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The bundle does not verify the certificate the server serves now: agents trusting only it would lose
    /// the server.
    #[error(
        "--agent-ca-bundle {path}: does not verify the server's current serving certificate ({detail}); \
         not handed out to agents"
    )]
    DoesNotVerifyServer {
        /// The file.
        path: PathBuf,
        /// What the verification said.
        detail: String,
    },
}

/// A bundle that passed the checks: its bytes and their SHA-256 (64 lower-case hex digits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoodBundle {
    /// The PEM bytes, as read.
    pub pem: Vec<u8>,
    /// Their SHA-256.
    pub sha256: String,
}

/// SHA-256 of `bytes` as the wire carries it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    inplace_core::hex(&Sha256::digest(bytes))
}

/// Checks a bundle against the serving chain (leaf first, then intermediates): every block parses, and the
/// leaf chains to one of the bundle's certificates at `now`. The name is not checked: agents reach the
/// server by names the server does not know.
pub fn check_bundle(
    path: &Path,
    pem: &[u8],
    serving_chain: &[CertificateDer<'static>],
    provider: &CryptoProvider,
    now: UnixTime,
) -> Result<GoodBundle, CaBundleError> {
    let parse_err = |detail: String| CaBundleError::Parse {
        path: path.to_owned(),
        detail,
    };
    let cas = crate::pem::certificates(pem).map_err(|detail| {
        parse_err(format!(
            "{}: no valid PEM certificate ({detail})",
            path.display()
        ))
    })?;
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots
            .add(ca)
            .map_err(|err| parse_err(format!("unusable CA certificate: {err}")))?;
    }
    let refused = |detail: String| CaBundleError::DoesNotVerifyServer {
        path: path.to_owned(),
        detail,
    };
    let (leaf, intermediates) = serving_chain
        .split_first()
        .ok_or_else(|| refused("the server serves no certificate".into()))?;
    let leaf = ParsedCertificate::try_from(leaf).map_err(|err| refused(err.to_string()))?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &leaf,
        &roots,
        intermediates,
        now,
        provider.signature_verification_algorithms.all,
    )
    .map_err(|err| refused(err.to_string()))?;
    Ok(GoodBundle {
        pem: pem.to_vec(),
        sha256: sha256_hex(pem),
    })
}

/// What was last checked (so an unchanged refused bundle is not logged again on every tick).
#[derive(Default)]
struct Checked {
    pem: Vec<u8>,
    leaf: Vec<u8>,
}

/// What was last checked and what is handed out.
#[derive(Default)]
struct Served {
    checked: Option<Checked>,
    good: Option<GoodBundle>,
}

/// The served bundle, swappable at run time: none until a bundle passes [`ServedCa::refresh`].
#[derive(Default)]
pub struct ServedCa {
    served: RwLock<Served>,
}

/// What a refresh did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refreshed {
    /// Neither the file nor the serving certificate changed.
    Unchanged,
    /// A new bundle is served (its digest changed).
    Served,
    /// The bundle was checked again (the serving certificate changed) and still holds.
    StillGood,
}

impl ServedCa {
    fn served(&self) -> RwLockReadGuard<'_, Served> {
        self.served.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bundle handed out now, if any.
    pub fn current(&self) -> Option<GoodBundle> {
        self.served().good.clone()
    }

    /// The digest of the bundle handed out now, if any (said in poll answers and `status --agents`).
    pub fn sha256(&self) -> Option<String> {
        self.served().good.as_ref().map(|good| good.sha256.clone())
    }

    /// Re-reads the bundle at `path`; when it or the serving chain changed since the last check, checks it
    /// again and serves it when it passes. A refused bundle leaves the last good one in service (and is
    /// reported once per change).
    pub fn refresh(
        &self,
        path: &Path,
        serving_chain: &[CertificateDer<'static>],
        provider: &CryptoProvider,
    ) -> Result<Refreshed, CaBundleError> {
        let pem = inplace_bounded_read::read(path, MAX_CA_BUNDLE_BYTES)?;
        let leaf = serving_chain
            .first()
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default();
        if self
            .served()
            .checked
            .as_ref()
            .is_some_and(|c| c.pem == pem && c.leaf == leaf)
        {
            return Ok(Refreshed::Unchanged);
        }
        let checked = check_bundle(path, &pem, serving_chain, provider, UnixTime::now());
        let mut served = self.served.write().unwrap_or_else(PoisonError::into_inner);
        served.checked = Some(Checked { pem, leaf });
        let good = checked?;
        if served
            .good
            .as_ref()
            .is_some_and(|c| c.sha256 == good.sha256)
        {
            return Ok(Refreshed::StillGood);
        }
        served.good = Some(good);
        Ok(Refreshed::Served)
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    use super::*;

    type Ca = CertifiedIssuer<'static, KeyPair>;

    fn ca(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    fn leaf(ca: &Ca) -> Vec<CertificateDer<'static>> {
        let params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        vec![params.signed_by(&key, ca).unwrap().der().clone()]
    }

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_bundle_holding_the_servers_ca_is_served_with_its_digest() {
        let (old, new) = (ca("old"), ca("new"));
        let pem = format!("{}{}", old.pem(), new.pem());
        let good = check_bundle(
            Path::new("b.pem"),
            pem.as_bytes(),
            &leaf(&old),
            &crate::server::tls::provider(),
            UnixTime::now(),
        )
        .unwrap();
        assert_eq!(good.sha256, sha256_hex(pem.as_bytes()));
        assert_eq!(good.sha256.len(), 64);
    }

    #[test]
    fn a_bundle_without_the_servers_ca_is_refused_naming_the_file() {
        let (old, new) = (ca("old"), ca("new"));
        let err = check_bundle(
            Path::new("/etc/bundle.pem"),
            new.pem().as_bytes(),
            &leaf(&old),
            &crate::server::tls::provider(),
            UnixTime::now(),
        )
        .unwrap_err();
        assert!(matches!(err, CaBundleError::DoesNotVerifyServer { .. }));
        assert!(err.to_string().contains("/etc/bundle.pem"), "{err}");
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let old = ca("old");
        let err = check_bundle(
            Path::new("b.pem"),
            b"not pem",
            &leaf(&old),
            &crate::server::tls::provider(),
            UnixTime::now(),
        )
        .unwrap_err();
        assert!(matches!(err, CaBundleError::Parse { .. }), "{err}");
    }

    #[test]
    fn a_refused_change_keeps_the_last_good_bundle_and_a_cert_switch_rechecks() {
        let (old, new) = (ca("old"), ca("new"));
        let provider = crate::server::tls::provider();
        let dir = dir();
        let path = dir.path().join("bundle.pem");
        let bundle = ServedCa::default();
        assert!(
            bundle.refresh(&path, &leaf(&old), &provider).is_err(),
            "no file"
        );
        assert_eq!(bundle.current(), None);

        std::fs::write(&path, old.pem()).unwrap();
        let serving_old = leaf(&old);
        assert_eq!(
            bundle.refresh(&path, &serving_old, &provider).unwrap(),
            Refreshed::Served
        );
        let first = bundle.current().unwrap();
        assert_eq!(
            bundle.refresh(&path, &serving_old, &provider).unwrap(),
            Refreshed::Unchanged
        );

        std::fs::write(&path, new.pem()).unwrap();
        assert!(bundle.refresh(&path, &serving_old, &provider).is_err());
        assert_eq!(bundle.current(), Some(first.clone()), "last good kept");
        // Reported once per change, not on every tick.
        assert_eq!(
            bundle.refresh(&path, &serving_old, &provider).unwrap(),
            Refreshed::Unchanged
        );

        // The server switches to a certificate of the new CA: the new-only bundle now verifies it.
        assert_eq!(
            bundle.refresh(&path, &leaf(&new), &provider).unwrap(),
            Refreshed::Served
        );
        assert_eq!(
            bundle.current().unwrap().sha256,
            sha256_hex(new.pem().as_bytes())
        );
    }

    #[test]
    fn an_oversized_bundle_is_refused() {
        let old = ca("old");
        let dir = dir();
        let path = dir.path().join("bundle.pem");
        std::fs::write(&path, vec![b'a'; MAX_CA_BUNDLE_BYTES as usize + 1]).unwrap();
        let bundle = ServedCa::default();
        let err = bundle
            .refresh(&path, &leaf(&old), &crate::server::tls::provider())
            .unwrap_err();
        assert!(matches!(err, CaBundleError::Read(_)), "{err}");
    }
}
