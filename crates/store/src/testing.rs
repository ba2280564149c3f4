//! Test support (feature `test-support`): starts a real etcd (Debian's `etcd-server`) on free
//! loopback ports with a temporary data dir, waits until it is healthy and kills it when dropped; or a
//! cluster of several such members ([`EtcdCluster`]).
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let etcd = inplace_store::testing::Etcd::start()?;
//! // `inplace-updater serve --store <url>` on as many replicas as you like:
//! let url = etcd.store_url(); // "etcd://127.0.0.1:PORT"
//! # Ok(()) }
//! ```

use std::io::{self, Read, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::StoreUrl;

/// How long etcd may take to become healthy (2 shared cores, fsync on a busy disk).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between health probes while waiting for etcd (a poll interval, not a wait for an event).
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How many times to pick new ports when another process grabbed one between our probe and
/// etcd's bind.
pub const PORT_ATTEMPTS: usize = 5;

/// Environment variable naming the etcd binary (default: `etcd` on `PATH`).
pub const ETCD_BIN_ENV: &str = "INPLACE_ETCD_BIN";

/// TLS files for the test etcd's client port. etcd then requires a client certificate signed by
/// `ca` (`--client-cert-auth`).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// CA (PEM) that signed the server and client certificates.
    pub ca: PathBuf,
    /// Server certificate (PEM), valid for 127.0.0.1.
    pub cert: PathBuf,
    /// Server key (PEM).
    pub key: PathBuf,
}

/// A running test etcd. Killed (SIGKILL) and its data dir removed on drop.
pub struct Etcd {
    /// Client endpoints, `127.0.0.1:PORT`.
    pub endpoints: Vec<String>,
    /// The data dir (inside a temp dir removed on drop).
    pub data_dir: PathBuf,
    /// The member's name (`test` for a single etcd).
    pub name: String,
    /// `--initial-cluster` of a cluster's member (`None`: a cluster of this member alone).
    initial_cluster: Option<String>,
    tls: Option<ServerTls>,
    ports: Ports,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

#[derive(Clone, Copy)]
struct Ports {
    client: u16,
    peer: u16,
    metrics: u16,
}

impl Etcd {
    /// Starts a plaintext etcd.
    pub fn start() -> io::Result<Etcd> {
        Etcd::start_with(None)
    }

    /// Starts an etcd that serves clients over TLS with client-certificate auth when `tls` is set.
    pub fn start_with(tls: Option<ServerTls>) -> io::Result<Etcd> {
        let mut etcd = Etcd::unstarted("test", tls)?;
        let mut attempt = 1;
        loop {
            etcd.endpoints = vec![format!("127.0.0.1:{}", etcd.ports.client)];
            match etcd.launch() {
                Ok(()) => return Ok(etcd),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < PORT_ATTEMPTS => {
                    // Another process took a port between our probe and etcd's bind: new ports,
                    // and a fresh data dir (the failed member may have written one).
                    let _ = std::fs::remove_dir_all(&etcd.data_dir);
                    etcd.ports = free_ports()?;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A member named `name` on fresh free ports, not started.
    fn unstarted(name: &str, tls: Option<ServerTls>) -> io::Result<Etcd> {
        let dir = tempfile::Builder::new().prefix("inplace-etcd-").tempdir()?;
        let ports = free_ports()?;
        Ok(Etcd {
            endpoints: vec![format!("127.0.0.1:{}", ports.client)],
            data_dir: dir.path().join("data"),
            name: name.to_owned(),
            initial_cluster: None,
            tls,
            ports,
            child: None,
            log: dir.path().join("etcd.log"),
            _dir: dir,
        })
    }

    /// The client URL: `https://127.0.0.1:PORT` with TLS, else `http://…`.
    pub fn client_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.ports.client)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.peer)
    }

    /// `etcd://127.0.0.1:PORT`, for `--store`.
    pub fn store_url(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }

    /// The same as a parsed [`StoreUrl`].
    pub fn url(&self) -> StoreUrl {
        StoreUrl::Etcd(self.endpoints.clone())
    }

    /// Where etcd serves `/metrics` and `/health` (plain HTTP, also when the client port is TLS).
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.ports.metrics))
    }

    /// The etcd process id while it runs (for reading its memory and CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the etcd process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Kills etcd (SIGKILL, like a crash) and waits for it to exit. Data stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills etcd and starts it again on the same ports and data: an etcd outage.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.launch() {
                // The old process's sockets can linger for a moment.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                    std::thread::sleep(POLL_INTERVAL);
                }
                other => return other,
            }
        }
    }

    /// The tail of etcd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }

    fn launch(&mut self) -> io::Result<()> {
        self.spawn()?;
        self.wait_healthy()
    }

    fn spawn(&mut self) -> io::Result<()> {
        let metrics = self.ports.metrics;
        let client_url = self.client_url();
        let peer_url = self.peer_url();
        let initial_cluster = self
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{}={peer_url}", self.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let bin = std::env::var_os(ETCD_BIN_ENV).unwrap_or_else(|| "etcd".into());
        let mut command = Command::new(&bin);
        command
            .arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            // Plain-HTTP /health even when the client port is TLS.
            .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()))
                .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = command.spawn().map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                io::Error::new(
                    e.kind(),
                    format!(
                        "etcd binary `{}` not found: install it with `apt-get install etcd-server` \
                         (or point {ETCD_BIN_ENV} at one)",
                        Path::new(&bin).display()
                    ),
                )
            } else {
                e
            }
        })?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let health = SocketAddr::from((Ipv4Addr::LOCALHOST, self.ports.metrics));
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                let log = self.log_tail();
                let kind = if log.contains("address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                return Err(io::Error::new(
                    kind,
                    format!("etcd exited with {status} while starting; its log ends:\n{log}"),
                ));
            }
            if probe_health(health) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "etcd not healthy within {START_TIMEOUT:?}; its log ends:\n{}",
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

/// A running test etcd cluster: one [`Etcd`] per member on loopback (client URLs with the same TLS, peers
/// over plain HTTP), started together and each waited on until healthy. Killed on drop.
pub struct EtcdCluster {
    /// The members, in the order their names were given.
    pub members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts a cluster of members named `names`, serving clients over TLS with client-certificate auth when
    /// `tls` is set.
    pub fn start(names: &[&str], tls: Option<ServerTls>) -> io::Result<EtcdCluster> {
        let mut attempt = 1;
        loop {
            let mut members = names
                .iter()
                .map(|name| Etcd::unstarted(name, tls.clone()))
                .collect::<io::Result<Vec<_>>>()?;
            let initial_cluster = members
                .iter()
                .map(|m| format!("{}={}", m.name, m.peer_url()))
                .collect::<Vec<_>>()
                .join(",");
            // Every member is started before any is waited on: none is healthy before a quorum runs.
            let started = members.iter_mut().try_for_each(|member| {
                member.initial_cluster = Some(initial_cluster.clone());
                member.spawn()
            });
            match started.and_then(|()| members.iter_mut().try_for_each(Etcd::wait_healthy)) {
                Ok(()) => return Ok(EtcdCluster { members }),
                // Another process took a port between our probe and a member's bind: all anew.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < PORT_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three distinct free loopback ports (bound and released; etcd cannot report a port 0 bind).
fn free_ports() -> io::Result<Ports> {
    let listeners = [
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?,
    ];
    let port = |l: &TcpListener| l.local_addr().map(|a| a.port());
    Ok(Ports {
        client: port(&listeners[0])?,
        peer: port(&listeners[1])?,
        metrics: port(&listeners[2])?,
    })
}

/// `GET /health` on the metrics port answers `{"health":"true"}` once etcd serves requests.
fn probe_health(addr: SocketAddr) -> bool {
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    if conn
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
