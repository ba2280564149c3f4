//! Starting Prometheus and Alertmanager for a test: a private directory, a free loopback port, ready when
//! `/-/ready` answers 200; killed when the handle drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long a daemon may take to answer `/-/ready`.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a test waits for a scraped value to turn into a firing (or resolved) alert.
pub const SETTLE_WITHIN: Duration = Duration::from_secs(20);
/// Between two looks at something that changes on Prometheus' 1 s cycles.
pub const POLL: Duration = Duration::from_millis(100);

/// A running daemon: its address, its directory (config, data, log).
pub struct Daemon {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl Daemon {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A loopback port nothing listens on (bound, then released).
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn binary(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: install Debian's {package} (scripts/install-deps {name}:{package})",
        path.display()
    );
    path
}

/// Starts `program` with `args` (`{dir}` replaced by the daemon's directory, `{addr}` by its address) after
/// writing `files` into its directory, and waits for `/-/ready` (`scheme` http or https).
pub async fn start(
    program: &str,
    package: &str,
    files: &[(&str, String)],
    args: &[&str],
    ready_client: &HttpClient,
    scheme: &str,
) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let addr = free_port();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("{dir}", dir.path().to_str().unwrap())
                .replace("{addr}", &addr.to_string())
        })
        .collect();
    let child = tokio::process::Command::new(binary(program, package))
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let daemon = Daemon {
        addr,
        dir,
        _child: child,
    };
    let ready = format!("{scheme}://localhost:{}/-/ready", addr.port());
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    loop {
        if let Ok((200, _)) = ready_client.get(&ready).await {
            return daemon;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{program} not ready within {READY_WITHIN:?}; its log:\n{}",
            std::fs::read_to_string(daemon.dir.path().join("log")).unwrap_or_default()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// An HTTP client for the tests' own requests (readiness, posting alerts and silences).
pub struct HttpClient(Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>);

impl HttpClient {
    /// Trusting `tls` (plain http works too).
    pub fn new(tls: rustls::ClientConfig) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
        let connector = connector.https_or_http().enable_http1().build();
        Self(Client::builder(TokioExecutor::new()).build(connector))
    }

    /// Plain http only (no trust roots needed).
    pub fn plain() -> Self {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Self::new(tls)
    }

    pub async fn get(&self, url: &str) -> Result<(u16, String), String> {
        self.send(hyper::Method::GET, url, String::new()).await
    }

    pub async fn post_json(&self, url: &str, body: String) -> Result<(u16, String), String> {
        self.send(hyper::Method::POST, url, body).await
    }

    async fn send(
        &self,
        method: hyper::Method,
        url: &str,
        body: String,
    ) -> Result<(u16, String), String> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.0.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ))
    }
}
