//! The real `inplace-updater serve` binary as a child process on port-0 loopback listeners, its log kept in a
//! file, stopped with SIGTERM (then SIGKILL) when dropped.

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

pub struct ServerProcess {
    child: Child,
    pub hooks: SocketAddr,
    pub log: PathBuf,
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
    if let (Ok(bin), Ok(harness)) = (meta.modified(), ours) {
        if bin + Duration::from_secs(5) < harness {
            eprintln!(
                "warning: {} is older than this harness; run `cargo build --release` so the measured server is current",
                path.display()
            );
        }
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
                if !sent {
                    let hooks = serde_json::from_str::<serde_json::Value>(&line)
                        .ok()
                        .and_then(|v| v["fields"]["hooks"].as_str()?.parse::<SocketAddr>().ok());
                    if let Some(hooks) = hooks {
                        let _ = tx.send(hooks);
                        sent = true;
                    }
                }
                let _ = writeln!(file, "{line}");
            }
        });
        let hooks = match rx.recv_timeout(START_TIMEOUT) {
            Ok(hooks) => hooks,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("the server did not report its addresses; its log:\n{text}");
            }
        };
        Ok(ServerProcess { child, hooks, log })
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
