//! A real OCI registry for the artifact tests: Debian's `docker-registry` (the CNCF distribution registry)
//! on 127.0.0.1 with TLS (an rcgen CA) and htpasswd Basic auth, artifacts pushed to it with `skopeo copy`
//! from OCI layouts built here, and its storage reachable for the corruption recipes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::common::{TestPki, test_pki};

/// How long the registry may take to answer `/v2/`.
const READY_DEADLINE: Duration = Duration::from_secs(10);
pub const USER: &str = "agent";
pub const PASSWORD: &str = "s3cret";
const EMPTY_CONFIG: &[u8] = b"{}";

pub fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A running registry; killed on drop.
pub struct Registry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require(tool: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not on PATH: the artifact tests need a real registry; \
         install it with `apt-get install -y docker-registry skopeo apache2-utils`"
    );
}

impl Registry {
    pub async fn start() -> Self {
        for tool in ["docker-registry", "skopeo", "htpasswd"] {
            require(tool);
        }
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let TestPki {
            ca: ca_cert,
            cert,
            key,
        } = test_pki("registry test CA");
        std::fs::write(r.join("ca.crt"), ca_cert.pem()).unwrap();
        std::fs::create_dir(r.join("certs.d")).unwrap();
        std::fs::write(r.join("certs.d/ca.crt"), ca_cert.pem()).unwrap();
        std::fs::write(r.join("server.crt"), cert.pem()).unwrap();
        std::fs::write(r.join("server.key"), key.serialize_pem()).unwrap();
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .unwrap();
        assert!(htpasswd.status.success(), "htpasswd: {htpasswd:?}");
        std::fs::write(r.join("htpasswd"), htpasswd.stdout).unwrap();
        // A free port: bound, read, released (the registry binds it right after).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let auth = format!(
            "  htpasswd: {{realm: test-registry, path: {}/htpasswd}}\n",
            r.display()
        );
        let child = serve(r, port, &auth);
        let registry = Self { dir, port, child };
        registry.wait_ready().await;
        registry
    }

    /// Stops the registry and serves the same storage again with `auth` (the YAML under `auth:`).
    pub async fn restart_with_auth(&mut self, auth: &str) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = serve(self.dir.path(), self.port, auth);
        self.wait_ready().await;
    }

    /// The registry's TLS certificate and key (PEM), for another server on 127.0.0.1 the same CA vouches for.
    pub fn server_cert(&self) -> (Vec<u8>, Vec<u8>) {
        let r = self.dir.path();
        (
            std::fs::read(r.join("server.crt")).unwrap(),
            std::fs::read(r.join("server.key")).unwrap(),
        )
    }

    /// Polls `GET /v2/` over TLS until it answers 401 (up, asking for credentials).
    async fn wait_ready(&self) {
        let ca = std::fs::read(self.dir.path().join("ca.crt")).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        use rustls_pki_types::pem::PemObject as _;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let start = Instant::now();
        loop {
            let answer = async {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .ok()?;
                let name = rustls_pki_types::ServerName::try_from("127.0.0.1").ok()?;
                let mut tls = connector.connect(name, tcp).await.ok()?;
                tls.write_all(b"GET /v2/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    .await
                    .ok()?;
                let mut head = vec![0; 12];
                tls.read_exact(&mut head).await.ok()?;
                Some(String::from_utf8_lossy(&head).into_owned())
            };
            if answer.await.is_some_and(|h| h.ends_with("401")) {
                return;
            }
            assert!(
                start.elapsed() < READY_DEADLINE,
                "docker-registry did not answer /v2/ within {READY_DEADLINE:?}; its log:\n{}",
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Waits until the registry's log (its access log is written after the answer is sent) has at least
    /// `count` occurrences of `needle`; answers how many it has.
    pub async fn wait_log(&self, needle: &str, count: usize) -> usize {
        let start = Instant::now();
        loop {
            let seen = self.log().matches(needle).count();
            if seen >= count {
                return seen;
            }
            assert!(
                start.elapsed() < READY_DEADLINE,
                "the registry log has {seen} of {count} {needle:?} after {READY_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The stored blob's data file.
    pub fn blob_data(&self, hex: &str) -> PathBuf {
        self.dir.path().join(format!(
            "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
            &hex[..2]
        ))
    }

    /// The repository's link to a layer blob.
    pub fn layer_link(&self, repository: &str, hex: &str) -> PathBuf {
        self.dir.path().join(format!(
            "data/docker/registry/v2/repositories/{repository}/_layers/sha256/{hex}/link"
        ))
    }

    /// Pushes an index with one artifact manifest per `(architecture, layer)` to `repository:v1` with
    /// `skopeo copy --all`; answers the index digest (hex; the registry keeps it as pushed).
    pub fn push(&self, repository: &str, platforms: &[(&str, &[u8])]) -> String {
        let layout = tempfile::tempdir().unwrap();
        let l = layout.path();
        std::fs::create_dir_all(l.join("blobs/sha256")).unwrap();
        let put = |bytes: &[u8]| {
            let hex = sha256(bytes);
            std::fs::write(l.join("blobs/sha256").join(&hex), bytes).unwrap();
            hex
        };
        let config = put(EMPTY_CONFIG);
        let mut entries = Vec::new();
        for (arch, layer) in platforms {
            let layer_hex = put(layer);
            let manifest = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "artifactType": "application/vnd.example.sysext.v1",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                           "digest": format!("sha256:{config}"), "size": EMPTY_CONFIG.len()},
                "layers": [{"mediaType": "application/vnd.example.sysext.raw.v1",
                            "digest": format!("sha256:{layer_hex}"), "size": layer.len()}],
            });
            let bytes = serde_json::to_vec(&manifest).unwrap();
            entries.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", put(&bytes)), "size": bytes.len(),
                "platform": {"os": "linux", "architecture": arch},
            }));
        }
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries,
        }))
        .unwrap();
        let index_hex = put(&index);
        let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": format!("sha256:{index_hex}"), "size": index.len(),
            "annotations": {"org.opencontainers.image.ref.name": "v1"}}]});
        std::fs::write(l.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
        std::fs::write(l.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let out = Command::new("skopeo")
            .args(["copy", "--all", "--quiet", "--dest-cert-dir"])
            .arg(self.dir.path().join("certs.d"))
            .args(["--dest-creds", &format!("{USER}:{PASSWORD}")])
            .arg(format!("oci:{}:v1", l.display()))
            .arg(format!("docker://{}/{repository}:v1", self.host()))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        index_hex
    }
}

/// Writes the config (storage in `dir/data`, TLS, `auth`) and starts `docker-registry serve`, its output
/// appended to `dir/registry.log`.
fn serve(dir: &std::path::Path, port: u16, auth: &str) -> Child {
    let d = dir.display();
    let config = format!(
        "version: 0.1\nlog: {{level: info, accesslog: {{disabled: false}}}}\n\
         storage:\n  filesystem: {{rootdirectory: {d}/data}}\n  delete: {{enabled: true}}\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: artifact-test\n  tls: {{certificate: {d}/server.crt, key: {d}/server.key}}\n\
         auth:\n{auth}"
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("registry.log"))
        .unwrap();
    Command::new("docker-registry")
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `len` bytes that differ for every `seed` (blobs are stored once per digest across repositories).
pub fn content(seed: &str, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = sha2::Sha256::digest(seed.as_bytes());
    while out.len() < len {
        out.extend_from_slice(&block);
        block = sha2::Sha256::digest(block);
    }
    out.truncate(len);
    out
}

/// A loopback TCP proxy in front of the registry (TLS passes through untouched: the registry's certificate
/// names 127.0.0.1) that forwards at most `budget` bytes of answers in all and then stalls every answer,
/// holding the connections open, until [`StallingProxy::release`]. Counts the connections it accepted.
pub struct StallingProxy {
    pub port: u16,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

struct ProxyState {
    budget: std::sync::atomic::AtomicU64,
    released: tokio::sync::watch::Sender<bool>,
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StallingProxy {
    pub async fn start(target_port: u16, budget: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ProxyState {
            budget: budget.into(),
            released: tokio::sync::watch::channel(false).0,
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let server = tokio::net::TcpStream::connect(("127.0.0.1", target_port))
                        .await
                        .unwrap();
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    });
                    let mut buffer = vec![0u8; 16 * 1024];
                    while let Ok(n) = server_read.read(&mut buffer).await {
                        if n == 0 {
                            break;
                        }
                        let mut sent = 0;
                        while sent < n {
                            let allowed = take(&state.budget, (n - sent) as u64) as usize;
                            if allowed == 0 {
                                // Stalled: wait for the release (or forever).
                                let mut released = state.released.subscribe();
                                if released.wait_for(|r| *r).await.is_err() {
                                    return;
                                }
                                continue;
                            }
                            if client_write
                                .write_all(&buffer[sent..sent + allowed])
                                .await
                                .is_err()
                            {
                                return;
                            }
                            sent += allowed;
                        }
                    }
                    let _ = client_write.shutdown().await;
                    up.abort();
                });
            }
        });
        Self { port, state, task }
    }

    /// Forwards everything from now on.
    pub fn release(&self) {
        self.state
            .budget
            .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        self.state.released.send_replace(true);
    }
}

/// Takes up to `wanted` from `budget`; answers how much was taken.
fn take(budget: &std::sync::atomic::AtomicU64, wanted: u64) -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    let mut taken = 0;
    let _ = budget.fetch_update(SeqCst, SeqCst, |left| {
        taken = left.min(wanted);
        Some(left - taken)
    });
    taken
}
