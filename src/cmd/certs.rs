//! Development certificates (`inplace-updater certs`, `serve --dev`): a CA, a server certificate and a
//! client certificate, written as PEM files in the layout cert-manager uses (`ca.crt`, `tls.crt`, `tls.key`).
//! In a cluster cert-manager issues these; see certs/README.md.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Validity of the development CA.
pub const DEV_CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// Validity of the development server and client certificates.
pub const DEV_LEAF_VALIDITY: time::Duration = time::Duration::days(365);
/// Backdating of `notBefore`, so clocks that are slightly behind accept fresh certificates.
pub const CLOCK_SKEW_ALLOWANCE: time::Duration = time::Duration::hours(1);

/// DNS names the server certificate carries by default: loopback and the deploy/ Service.
pub const DEFAULT_DNS_NAMES: [&str; 3] = [
    "localhost",
    "inplace-updater-webhook-service.inplace-updater-system.svc",
    "inplace-updater-webhook-service.inplace-updater-system.svc.cluster.local",
];

/// Common name of the development client certificate (what CAPI presents under mTLS).
pub const CLIENT_COMMON_NAME: &str = "cluster-api-runtime-client";

/// Why certificates could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// rcgen refused the parameters (e.g. a DNS name that is not IA5).
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What to put in the development certificates.
#[derive(Debug, Clone)]
pub struct DevCertsSpec {
    /// Directory to write into (created when missing).
    pub out: PathBuf,
    /// DNS names of the server certificate.
    pub dns_names: Vec<String>,
    /// IP addresses of the server certificate.
    pub ips: Vec<IpAddr>,
}

impl DevCertsSpec {
    /// The default SANs (loopback and deploy/ Service names) in `out`, plus any extra names.
    pub fn with_defaults(out: PathBuf, extra_dns: Vec<String>, extra_ips: Vec<IpAddr>) -> Self {
        let mut dns_names: Vec<String> = DEFAULT_DNS_NAMES.iter().map(|s| s.to_string()).collect();
        dns_names.extend(extra_dns);
        dns_names.dedup();
        let mut ips: Vec<IpAddr> = vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ];
        ips.extend(extra_ips);
        ips.dedup();
        Self {
            out,
            dns_names,
            ips,
        }
    }
}

/// The files written by [`write_dev_certs`].
#[derive(Debug, Clone)]
pub struct DevCertPaths {
    /// CA certificate (`ca.crt`): what CAPI's `caBundle` and agents' `--ca-file` hold.
    pub ca_cert: PathBuf,
    /// CA key (`ca.key`).
    pub ca_key: PathBuf,
    /// Server certificate (`tls.crt`).
    pub server_cert: PathBuf,
    /// Server key (`tls.key`).
    pub server_key: PathBuf,
    /// Client certificate (`client.crt`).
    pub client_cert: PathBuf,
    /// Client key (`client.key`).
    pub client_key: PathBuf,
}

impl DevCertPaths {
    /// The paths of the files in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("tls.crt"),
            server_key: dir.join("tls.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }

    /// Whether the server pair and the CA certificate all exist.
    pub fn server_files_exist(&self) -> bool {
        [&self.ca_cert, &self.server_cert, &self.server_key]
            .iter()
            .all(|p| p.is_file())
    }
}

fn validity(params: &mut CertificateParams, lifetime: time::Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW_ALLOWANCE;
    params.not_after = now + lifetime;
}

/// Generates a CA, a server certificate and a client certificate and writes them to `spec.out`
/// (keys with mode 0600). Existing files are replaced.
pub fn write_dev_certs(spec: &DevCertsSpec) -> Result<DevCertPaths, CertsError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "inplace-updater development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut ca_params, DEV_CA_VALIDITY);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut sans: Vec<String> = spec.dns_names.clone();
    sans.extend(spec.ips.iter().map(IpAddr::to_string));
    let mut server_params = CertificateParams::new(sans)?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "inplace-updater");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    validity(&mut server_params, DEV_LEAF_VALIDITY);
    let server_key = KeyPair::generate()?;
    let server_cert = server_params.signed_by(&server_key, &ca)?;

    let mut client_params = CertificateParams::new(Vec::<String>::new())?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, CLIENT_COMMON_NAME);
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    validity(&mut client_params, DEV_LEAF_VALIDITY);
    let client_key = KeyPair::generate()?;
    let client_cert = client_params.signed_by(&client_key, &ca)?;

    let paths = DevCertPaths::in_dir(&spec.out);
    std::fs::create_dir_all(&spec.out).map_err(|source| CertsError::Write {
        path: spec.out.clone(),
        source,
    })?;
    write_file(&paths.ca_cert, ca.pem().as_bytes(), 0o644)?;
    write_file(&paths.ca_key, ca.key().serialize_pem().as_bytes(), 0o600)?;
    write_file(&paths.server_cert, server_cert.pem().as_bytes(), 0o644)?;
    write_file(
        &paths.server_key,
        server_key.serialize_pem().as_bytes(),
        0o600,
    )?;
    write_file(&paths.client_cert, client_cert.pem().as_bytes(), 0o644)?;
    write_file(
        &paths.client_key,
        client_key.serialize_pem().as_bytes(),
        0o600,
    )?;
    Ok(paths)
}

/// Writes a file via a temporary sibling and a rename, so a watcher never sees half a PEM file.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertsError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| CertsError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    file.write_all(bytes).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn writes_a_usable_set_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DevCertsSpec::with_defaults(
            dir.path().to_owned(),
            vec!["extra.example".into()],
            vec![],
        );
        let paths = write_dev_certs(&spec).unwrap();
        assert!(paths.server_files_exist());
        for key in [&paths.ca_key, &paths.server_key, &paths.client_key] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{key:?}");
        }
        let pem = std::fs::read_to_string(&paths.server_cert).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
