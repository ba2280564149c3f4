//! A metrics endpoint in the test process: `site_storage_degraded{node="…"} 0|1`, values the test sets.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Answers every HTTP/1.1 request on `listener` with the body `respond` gives for it, until the runtime ends.
pub fn serve<F>(listener: tokio::net::TcpListener, respond: F)
where
    F: Fn(&hyper::Request<hyper::body::Incoming>) -> String + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let respond = respond.clone();
            let service = service_fn(move |request| {
                let body = respond(&request);
                async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body)))) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
}

/// The exporter's address and the values it serves, per node.
#[derive(Clone)]
pub struct Exporter {
    pub addr: SocketAddr,
    degraded: Arc<Mutex<BTreeMap<String, u8>>>,
}

impl Exporter {
    /// Serves on a loopback port until the test's runtime ends.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let exporter = Self {
            addr: listener.local_addr().unwrap(),
            degraded: Arc::default(),
        };
        let degraded = exporter.degraded.clone();
        serve(listener, move |_request| {
            degraded
                .lock()
                .unwrap()
                .iter()
                .map(|(node, value)| format!("site_storage_degraded{{node=\"{node}\"}} {value}\n"))
                .collect()
        });
        exporter
    }

    /// Sets `site_storage_degraded{node}`.
    pub fn set(&self, node: &str, degraded: bool) {
        self.degraded
            .lock()
            .unwrap()
            .insert(node.to_string(), u8::from(degraded));
    }
}
