//! The servers `load hooks` drives, each on its own runtime in its own thread: ours (in-process through
//! `inplace_updater::server::run`, the default embedded `file:` store in a temporary directory unless
//! `--store memory`, built-in policy) and the bare ceilings of `crate::ceiling`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use inplace_updater::dispatch::{DispatchConfig, Dispatcher};
use inplace_updater::hooks::Engine;
use inplace_updater::server::tls::TlsFiles;
use inplace_updater::server::{
    self, ConnLimits, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_SHUTDOWN_GRACE, DEFAULT_TLS_RELOAD_INTERVAL, Listeners,
    Metrics, Readiness, ServeConfig, Services,
};
use tokio_util::sync::CancellationToken;

use crate::ceiling::{App, Ceiling};

/// How long a server may take to bind and report its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A server on its own runtime in its own thread; dropped = stopped.
pub struct Hosted {
    pub addr: SocketAddr,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Hosted {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn host<F, Fut>(threads: usize, start: F) -> anyhow::Result<Hosted>
where
    F: FnOnce(std::sync::mpsc::Sender<SocketAddr>, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    let token = stop.clone();
    let thread = std::thread::spawn(move || runtime.block_on(start(tx, token)));
    let addr = rx.recv_timeout(START_TIMEOUT)?;
    Ok(Hosted {
        addr,
        stop,
        thread: Some(thread),
    })
}

pub fn start_ours(
    certs: &inplace_updater::cmd::certs::DevCertPaths,
    threads: usize,
    store_dir: Option<std::path::PathBuf>,
) -> anyhow::Result<Hosted> {
    let config = ServeConfig {
        tls: TlsFiles {
            cert: certs.server_cert.clone(),
            key: certs.server_key.clone(),
        },
        client_ca: None,
        agent_ca_bundle: None,
        tls_reload_interval: DEFAULT_TLS_RELOAD_INTERVAL,
        limits: ConnLimits {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        },
    };
    host(threads, move |tx, stop| async move {
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let Ok(listeners) = Listeners::bind(loopback, loopback, loopback).await else {
            return;
        };
        let Ok((hooks, _, _)) = listeners.local_addrs() else {
            return;
        };
        let store: Arc<dyn inplace_store::Store> = match store_dir {
            None => Arc::new(inplace_store::memory::MemoryStore::new()),
            Some(dir) => match inplace_store::file::FileStore::open(&dir).await {
                Ok(store) => Arc::new(store),
                Err(err) => {
                    eprintln!("our server's store: {err}");
                    return;
                }
            },
        };
        let dispatcher = Dispatcher::new(store, DispatchConfig::default(), stop.clone());
        let services = Services {
            engine: Arc::new(Engine {
                policy: inplace_core::Policy::builtin(),
                dispatcher,
                gates: Arc::new(inplace_gates::Gates::none()),
            }),
            tokens: Arc::new(inplace_updater::dispatch::upkeep::tokens::AgentTokens::none()),
            agent_image: None,
            management: None,
        };
        let _ = tx.send(hooks);
        if let Err(err) = server::run(
            config,
            listeners,
            services,
            Arc::new(Metrics::new()),
            Readiness::default(),
            stop,
        )
        .await
        {
            eprintln!("our server stopped: {err}");
        }
    })
}

/// A ceiling server; `durable_dir` makes it the durable ceiling, writing through a `file:` store there.
pub fn start_ceiling(
    certs: &inplace_updater::cmd::certs::DevCertPaths,
    threads: usize,
    ceiling: Ceiling,
    durable_dir: Option<std::path::PathBuf>,
) -> anyhow::Result<Hosted> {
    let config = crate::ceiling::tls_config(&certs.server_cert, &certs.server_key)?;
    host(threads, move |tx, stop| async move {
        let durable: Option<Arc<dyn inplace_store::Store>> = match durable_dir {
            None => None,
            Some(dir) => match inplace_store::file::FileStore::open(&dir).await {
                Ok(store) => Some(Arc::new(store)),
                Err(err) => {
                    eprintln!("the durable ceiling's store: {err}");
                    return;
                }
            },
        };
        let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await else {
            return;
        };
        let Ok(addr) = listener.local_addr() else {
            return;
        };
        let _ = tx.send(addr);
        crate::ceiling::serve(listener, config, stop, App { ceiling, durable }).await;
    })
}
