//! The real `inplace-updater serve` binary as a child process on port-0 loopback listeners, its log kept in a
//! file, stopped with SIGTERM (then SIGKILL) when dropped; and the plaintext GET that reads its `/readyz` and
//! `/metrics`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Longest the server may take to report its addresses.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest we wait for it to exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest one plaintext GET of `/readyz` or `/metrics` may take.
const ADMIN_GET_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between `/readyz` probes while a server starts (a poll interval, not a wait for an event).
const READY_POLL: Duration = Duration::from_millis(20);
/// Most bytes read from one admin answer (`/metrics` of a replica is a few KiB).
const ADMIN_ANSWER_LIMIT: u64 = 1 << 20;

pub struct ServerProcess {
    child: Child,
    pub hooks: SocketAddr,
    /// The plaintext `/healthz` + `/readyz` listener (not reported by the ceiling).
    pub health: Option<SocketAddr>,
    /// The plaintext `/metrics` listener (not reported by the ceiling).
    pub metrics: Option<SocketAddr>,
    pub log: PathBuf,
}

/// The addresses a server reports in its `listening` line.
#[derive(Clone, Copy)]
struct Listening {
    hooks: SocketAddr,
    health: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
}

impl Listening {
    fn parse(line: &str) -> Option<Listening> {
        let value = serde_json::from_str::<serde_json::Value>(line).ok()?;
        let field = |name: &str| value["fields"][name].as_str()?.parse::<SocketAddr>().ok();
        Some(Listening {
            hooks: field("hooks")?,
            health: field("health"),
            metrics: field("metrics"),
        })
    }
}

/// `GET path` over plain HTTP/1.0; the status code and the body.
pub fn admin_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use std::io::Read as _;
    let mut conn = std::net::TcpStream::connect_timeout(&addr, ADMIN_GET_TIMEOUT)?;
    conn.set_read_timeout(Some(ADMIN_GET_TIMEOUT))?;
    conn.set_write_timeout(Some(ADMIN_GET_TIMEOUT))?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    conn.take(ADMIN_ANSWER_LIMIT).read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status code")?;
    Ok((status, body.to_string()))
}

/// The flags every scenario gives its server: the dev certificate it serves, the agent token file and the store.
pub fn server_args(
    certs: &inplace_updater::cmd::certs::DevCertPaths,
    token_file: &Path,
    store: &str,
) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        certs.server_cert.display().to_string(),
        "--tls-key".into(),
        certs.server_key.display().to_string(),
        "--agent-tokens".into(),
        token_file.display().to_string(),
        "--store".into(),
        store.to_string(),
    ]
}

/// `target/release/inplace-updater` next to this example (`target/release/examples/load`).
pub fn default_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let release = exe
        .parent()
        .and_then(Path::parent)
        .context("cannot locate the target directory")?;
    Ok(release.join("inplace-updater"))
}

/// Refuses a missing binary and warns about one older than this harness (a stale build would be measured).
pub fn check_binary(path: &Path) -> anyhow::Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        bail!(
            "{} not found: build it first with `cargo build --release` (or pass --server-bin)",
            path.display()
        );
    };
    let ours = std::env::current_exe()
        .and_then(std::fs::metadata)
        .and_then(|m| m.modified());
    if let (Ok(bin), Ok(harness)) = (meta.modified(), ours)
        && bin + Duration::from_secs(5) < harness
    {
        eprintln!(
            "warning: {} is older than this harness; run `cargo build --release` so the measured server is current",
            path.display()
        );
    }
    Ok(())
}

impl ServerProcess {
    /// `inplace-updater serve` on port-0 loopback listeners with `args` added.
    pub fn start(binary: &Path, args: &[String], dir: &Path) -> anyhow::Result<ServerProcess> {
        check_binary(binary)?;
        let mut all: Vec<String> = [
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--health-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        all.extend_from_slice(args);
        Self::spawn(binary, &all, &dir.join("server.log"))
    }

    /// This harness as the bare ceiling server (`load ceiling-serve`).
    pub fn start_ceiling(cert: &Path, key: &Path, dir: &Path) -> anyhow::Result<ServerProcess> {
        let exe = std::env::current_exe()?;
        let args = [
            "ceiling-serve".to_string(),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
        ];
        Self::spawn(&exe, &args, &dir.join("ceiling.log"))
    }

    fn spawn(binary: &Path, args: &[String], log: &Path) -> anyhow::Result<ServerProcess> {
        let log = log.to_path_buf();
        let mut child = Command::new(binary)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {}", binary.display()))?;
        let stderr = child.stderr.take().context("server stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut file = std::fs::File::create(&log)?;
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(listening) = Listening::parse(&line) {
                    let _ = tx.send(listening);
                    sent = true;
                }
                let _ = writeln!(file, "{line}");
            }
        });
        let listening = match rx.recv_timeout(START_TIMEOUT) {
            Ok(listening) => listening,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("the server did not report its addresses; its log:\n{text}");
            }
        };
        Ok(ServerProcess {
            child,
            hooks: listening.hooks,
            health: listening.health,
            metrics: listening.metrics,
            log,
        })
    }

    /// Waits until `/readyz` answers 200 (the store is open and the listeners bound), within `START_TIMEOUT`.
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        let health = self
            .health
            .context("the server reported no health address")?;
        let started = Instant::now();
        loop {
            if let Ok((200, _)) = admin_get(health, "/readyz") {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!("the server was not ready within {START_TIMEOUT:?}; its log:\n{text}");
            }
            std::thread::sleep(READY_POLL);
        }
    }

    /// The sum of the series named `name` in the server's `/metrics` whose labels contain `labels` (e.g.
    /// `inplace_updater_agents_connected` and "", or `inplace_updater_hook_calls_total` and
    /// `hook="UpdateMachine"`); `None` when there is no such series (a labelled counter appears with its first
    /// count).
    pub fn metric(&self, name: &str, labels: &str) -> anyhow::Result<Option<f64>> {
        let metrics = self
            .metrics
            .context("the server reported no metrics address")?;
        let (status, body) = admin_get(metrics, "/metrics")?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        let values: Vec<f64> = body
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
                (series_name == name && series_labels.contains(labels))
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .collect();
        Ok((!values.is_empty()).then(|| values.iter().sum()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lines of the server log containing `needle`.
    pub fn log_lines_with(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|t| t.lines().filter(|l| l.contains(needle)).count())
            .unwrap_or(0)
    }

    /// SIGKILL, as a node failure or an OOM kill does: no drain, no last write; returns once it is reaped.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `STOP_TIMEOUT`; returns how long the exit took.
    pub fn stop(&mut self) -> Duration {
        let started = Instant::now();
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        while started.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = self.child.try_wait() {
                return started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        started.elapsed()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
