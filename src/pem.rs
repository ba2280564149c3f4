//! PEM certificate blocks, as the serving certificate and the client CA ([`crate::server::tls`]) and the CA
//! bundle agents are handed ([`crate::dispatch::upkeep::served_ca`]) are read.

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// Every `CERTIFICATE` block of `pem`, in file order; at least one, else what was wrong (for the caller to
/// name its file).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    match CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>() {
        Ok(chain) if !chain.is_empty() => Ok(chain),
        Ok(_) => Err("the file has no CERTIFICATE block".into()),
        Err(err) => Err(err.to_string()),
    }
}
