//! Shared test support: development certificates, a TLS client that speaks HTTP/1.1 or HTTP/2, and the real
//! `inplace-updater` binary started as a child process on port-0 listeners.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod fleet;
pub mod unit;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use inplace_updater::cmd::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Longest any test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(20);

/// A directory of freshly generated development certificates.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub paths: DevCertPaths,
}

pub fn certs() -> Certs {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = DevCertsSpec::with_defaults(dir.path().to_owned(), vec![], vec![]);
    let paths = write_dev_certs(&spec).expect("dev certs");
    Certs { dir, paths }
}

/// A response as the test saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
    pub http2: bool,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!("not JSON ({err}): {}", String::from_utf8_lossy(&self.body))
        })
    }
}

/// How a test client connects.
#[derive(Clone)]
pub struct Client {
    config: Arc<rustls::ClientConfig>,
}

impl Client {
    /// Trusts `ca`; offers h2 and http/1.1 unless `http1_only`.
    pub fn new(ca: &Path, client_cert: Option<(&Path, &Path)>, http1_only: bool) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).expect("ca file") {
            roots.add(cert.expect("ca pem")).expect("ca");
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        let mut config = match client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
                    .expect("cert")
                    .map(|c| c.expect("cert pem"))
                    .collect();
                let key = PrivateKeyDer::from_pem_file(key).expect("key");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("client auth")
            }
        };
        config.alpn_protocols = if http1_only {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        Self {
            config: Arc::new(config),
        }
    }

    async fn tls(
        &self,
        addr: SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        TlsConnector::from(self.config.clone())
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
    }

    /// The DER of the certificate the server presents to a new handshake.
    pub async fn served_cert(&self, addr: SocketAddr) -> Vec<u8> {
        let tls = self.tls(addr).await.expect("handshake");
        tls.get_ref().1.peer_certificates().expect("server cert")[0].to_vec()
    }

    /// One request on a new connection.
    pub async fn request(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> std::io::Result<Reply> {
        self.send(addr, method, path, body, &[]).await
    }

    /// One POST with extra headers (e.g. `authorization`) on a new connection.
    pub async fn request_with(
        &self,
        addr: SocketAddr,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Reply> {
        self.send(addr, "POST", path, body, headers).await
    }

    /// A `GET` with `headers`.
    pub async fn get_with(
        &self,
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Reply> {
        self.send(addr, "GET", path, Vec::new(), headers).await
    }

    async fn send(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Reply> {
        let tls = self.tls(addr).await?;
        let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = hyper_util::rt::TokioIo::new(tls);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("https://localhost:{}{path}", addr.port()))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        let response = if http2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            sender
                .send_request(request)
                .await
                .map_err(std::io::Error::other)?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(conn);
            sender
                .send_request(request)
                .await
                .map_err(std::io::Error::other)?
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes()
            .to_vec();
        Ok(Reply {
            status,
            headers,
            body,
            http2,
        })
    }

    pub async fn post(&self, addr: SocketAddr, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        self.request(addr, "POST", path, body.into())
            .await
            .expect("request")
    }
}

/// The real server binary, running as a child process.
pub struct ServerProcess {
    child: Child,
    pub hooks: SocketAddr,
    pub health: SocketAddr,
    pub metrics: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

/// The `inplace-updater` the tests run: the one cargo built, or [`SERVER_BIN_VAR`]'s (`.ci/run` points it at the
/// static release binary of `scripts/build-release` for one end-to-end rollout).
pub fn binary() -> PathBuf {
    chosen_binary(SERVER_BIN_VAR)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_inplace-updater")))
}

/// Names another `inplace-updater` for the tests to run (the release binary, in `.ci/run`).
pub const SERVER_BIN_VAR: &str = "INPLACE_TEST_SERVER_BIN";
/// Names an `inplace-agent` for the tests' agent processes to run instead of `inplace-updater agent`.
pub const AGENT_BIN_VAR: &str = "INPLACE_TEST_AGENT_BIN";

/// The binary the variable `name` names, when it is set; a name that is no file fails the test at once (a
/// misspelled path must not quietly test the cargo-built binary instead).
pub fn chosen_binary(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(name)?);
    assert!(path.is_file(), "{name}={} is no file", path.display());
    Some(path)
}

/// The most of `intervals` (each from the first to the last look that found a thing there) that overlap at one
/// instant: intervals that overlap were truly there at once, however long one sweep of looks takes.
pub fn most_at_once(intervals: &[(Instant, Instant)]) -> usize {
    intervals
        .iter()
        .map(|(at, _)| intervals.iter().filter(|(f, l)| f <= at && at <= l).count())
        .max()
        .unwrap_or(0)
}

/// What `inplace-updater status ARGS --server http://HEALTH` prints, as an operator runs it.
pub fn status_text(health: SocketAddr, args: &[&str]) -> String {
    let out = Command::new(binary())
        .arg("status")
        .args(args)
        .args(["--server", &format!("http://{health}")])
        .output()
        .expect("inplace-updater status");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `inplace-updater --log-format json serve` with its hook port on `listen` and its health and metrics ports on
/// free loopback ports (the addresses come from its `listening` line).
fn serve_command(listen: &str) -> Command {
    let mut command = Command::new(binary());
    command.args([
        "--log-format",
        "json",
        "serve",
        "--listen",
        listen,
        "--health-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    command
}

fn addr_field(line: &serde_json::Value, name: &str) -> Option<SocketAddr> {
    line["fields"][name].as_str()?.parse().ok()
}

impl ServerProcess {
    /// Starts `inplace-updater serve` on port-0 loopback listeners with the given cert files and extra args,
    /// waits until it reports its addresses and `/readyz` answers 200.
    pub fn start(certs: &DevCertPaths, extra: &[&str]) -> Self {
        Self::start_in(certs, extra, None)
    }

    pub fn start_in(certs: &DevCertPaths, extra: &[&str], cwd: Option<&Path>) -> Self {
        Self::start_at(certs, "127.0.0.1:0", extra, cwd)
    }

    /// [`ServerProcess::start`] with `env` set in the server's environment.
    pub fn start_env(certs: &DevCertPaths, extra: &[&str], env: &[(&str, &Path)]) -> Self {
        let mut command = Self::command_at(certs, "127.0.0.1:0", extra);
        command.envs(env.iter().copied());
        Self::spawn(command)
    }

    /// Starts on a given hook address (a restarted server takes over its predecessor's port, so agents
    /// configured with that URL reconnect to it).
    pub fn start_at(
        certs: &DevCertPaths,
        listen: &str,
        extra: &[&str],
        cwd: Option<&Path>,
    ) -> Self {
        let mut command = Self::command_at(certs, listen, extra);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        Self::spawn(command)
    }

    fn command_at(certs: &DevCertPaths, listen: &str, extra: &[&str]) -> Command {
        let mut command = serve_command(listen);
        command
            .arg("--tls-cert")
            .arg(&certs.server_cert)
            .arg("--tls-key")
            .arg(&certs.server_key)
            .args(extra)
            // Tests run side by side: each server gets its own (in-memory) store unless the test picks one.
            .args(if extra.contains(&"--store") {
                &[][..]
            } else {
                &["--store", "memory:"][..]
            });
        command
    }

    /// Starts `inplace-updater serve --dev` in `cwd` as the README starts it (certificates generated in
    /// ./certs, the store in ./data), but on port-0 loopback listeners instead of the fixed development ports,
    /// so that a `serve --dev` a developer left running on this machine does not collide with it.
    pub fn start_dev(cwd: &Path) -> Self {
        let mut command = serve_command("127.0.0.1:0");
        command.arg("--dev").current_dir(cwd);
        Self::spawn(command)
    }

    /// Spawns a `serve` command that logs JSON, learns its addresses from its `listening` line and waits
    /// until `/readyz` answers 200.
    fn spawn(mut command: Command) -> Self {
        command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn server");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (addrs_tx, addrs_rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line)
                    && let (Some(h), Some(he), Some(m)) = (
                        addr_field(&json, "hooks"),
                        addr_field(&json, "health"),
                        addr_field(&json, "metrics"),
                    )
                {
                    let _ = addrs_tx.send((h, he, m));
                }
                sink.lock().expect("logs").push(line);
            }
        });
        let (hooks, health, metrics) = match addrs_rx.recv_timeout(WAIT) {
            Ok(addrs) => addrs,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "server did not report its addresses; logs: {:?}",
                    logs.lock().expect("logs")
                );
            }
        };
        let server = Self {
            child,
            hooks,
            health,
            metrics,
            logs,
        };
        server.wait_ready();
        server
    }

    pub fn wait_ready(&self) {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if plain_get(self.health, "/readyz").map(|(status, _)| status) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server never became ready; logs: {:?}", self.logs());
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().expect("logs").clone()
    }

    /// Waits until some log line contains `needle`.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(line) = self.logs().into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no log line contains {needle:?}; logs: {:?}", self.logs());
    }

    /// SIGKILL: no shutdown, no flush, as a crash or an OOM kill would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its exit code and how long it took.
    pub fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, Duration) {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status.code(), started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("server did not exit within {limit:?}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET (health and metrics ports), blocking; `None` when nothing answers.
pub fn plain_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// `request` with these ExtensionConfig settings (none: left out, as CAPI leaves out an empty map).
pub fn with_settings(
    mut request: serde_json::Value,
    settings: &[(&str, &str)],
) -> serde_json::Value {
    if !settings.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        request["settings"] = serde_json::Value::Object(map);
    }
    request
}

/// Sends `request` to an in-process router (`oneshot`): the HTTP status and the body's bytes.
pub async fn respond(
    router: axum::Router,
    request: axum::http::Request<axum::body::Body>,
) -> (u16, Vec<u8>) {
    use tower::ServiceExt as _;
    let response = router.oneshot(request).await.expect("the router answers");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body is read")
        .to_bytes();
    (status, body.to_vec())
}

/// Reads a fixture from tests/fixtures.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// One kept-alive HTTP/1.1 connection, to show that open connections survive certificate rotation.
pub struct KeptConnection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    port: u16,
}

impl Client {
    pub async fn keep_alive(&self, addr: SocketAddr) -> KeptConnection {
        let tls = self.tls(addr).await.expect("handshake");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("http1");
        tokio::spawn(conn);
        KeptConnection {
            sender,
            port: addr.port(),
        }
    }
}

impl KeptConnection {
    pub async fn post(&mut self, path: &str, body: Vec<u8>) -> std::io::Result<(u16, Vec<u8>)> {
        self.sender.ready().await.map_err(std::io::Error::other)?;
        let request = hyper::Request::post(format!("https://localhost:{}{path}", self.port))
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(std::io::Error::other)?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        Ok((status, body.to_vec()))
    }
}
