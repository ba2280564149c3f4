//! What each hook costs on its own, with no network in between: the body bytes in, the answer bytes out,
//! exactly the function the server runs per call (decode, diff, policy, patch, self-check and the verdict's
//! fingerprints; UpdateMachine on the in-memory store). CanUpdateMachine is also measured with its verdict
//! written, on the in-memory and on the embedded redb (`file:`) store, whose every commit is fsync'd. Next to
//! each, the time serde_json needs just to parse the same body into a `serde_json::Value`, the floor any JSON
//! hook pays.
//!
//! `cargo bench --bench hooks` prints divan's table.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use inplace_updater::dispatch::{DispatchConfig, Dispatcher};
use inplace_updater::hooks::{self, Engine};

/// The binary's allocator, so the figures are the server's.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    divan::main();
}

fn fixture(name: &str) -> Bytes {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Bytes::from(std::fs::read(path).unwrap())
}

const CAN_UPDATE: [&str; 4] = [
    "can-update-machine-kcp-version.json",
    "can-update-machine-kcp-files-keys.json",
    "can-update-machine-kcp-mixed.json",
    "can-update-machine-unknown-infra.json",
];

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
});

fn engine(store: Arc<dyn inplace_store::Store>) -> Arc<Engine> {
    let dispatcher = RUNTIME.block_on(async {
        Dispatcher::new(
            store,
            DispatchConfig::default(),
            tokio_util::sync::CancellationToken::new(),
        )
    });
    Arc::new(Engine::builtin(dispatcher))
}

static ENGINE: LazyLock<Arc<Engine>> =
    LazyLock::new(|| engine(Arc::new(inplace_store::memory::MemoryStore::new())));

/// The embedded store in a scratch directory that lives as long as the process.
static FILE_ENGINE: LazyLock<Arc<Engine>> = LazyLock::new(|| {
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let store = RUNTIME
        .block_on(inplace_store::file::FileStore::open(dir.path()))
        .unwrap();
    engine(Arc::new(store))
});

/// CanUpdateMachine as the server answers it: judged, then its verdict written to the store.
fn judged_and_recorded(engine: &Arc<Engine>, body: &[u8]) -> hooks::Answer {
    let judged = hooks::can_update_machine(engine, body);
    RUNTIME.block_on(hooks::record(engine.clone(), judged))
}

#[divan::bench(args = CAN_UPDATE)]
fn can_update_machine(bencher: divan::Bencher, name: &str) {
    let body = fixture(name);
    bencher.bench(|| hooks::can_update_machine(&ENGINE, black_box(&body)));
}

#[divan::bench(args = ["memory", "file"])]
fn can_update_machine_recorded(bencher: divan::Bencher, store: &str) {
    let body = fixture(CAN_UPDATE[0]);
    let engine = if store == "file" {
        &*FILE_ENGINE
    } else {
        &*ENGINE
    };
    assert_eq!(
        judged_and_recorded(engine, &body).status.as_str(),
        "Success"
    );
    bencher.bench(|| judged_and_recorded(engine, black_box(&body)));
}

#[divan::bench(args = CAN_UPDATE)]
fn parse_only(bencher: divan::Bencher, name: &str) {
    let body = fixture(name);
    bencher.bench(|| serde_json::from_slice::<serde_json::Value>(black_box(&body)).unwrap());
}

#[divan::bench]
fn can_update_machine_set(bencher: divan::Bencher) {
    let body = fixture("can-update-machineset-md.json");
    bencher.bench(|| hooks::can_update_machine_set(&ENGINE, black_box(&body)));
}

#[divan::bench]
fn update_machine_in_progress(bencher: divan::Bencher) {
    let body = fixture("update-machine-kcp.json");
    // CAPI's CanUpdateMachine for this Machine first, then the call that records the run.
    judged_and_recorded(&ENGINE, &fixture("can-update-machine-kcp-version.json"));
    let first = RUNTIME.block_on(hooks::update_machine(ENGINE.clone(), body.clone()));
    assert_eq!(first.status.as_str(), "Success", "{}", first.message);
    bencher.bench(|| RUNTIME.block_on(hooks::update_machine(ENGINE.clone(), body.clone())));
}

/// The whole router for one call (routing, limits, deadline, metrics, one JSON log line to /dev/null as the
/// binary writes to stderr), with the cheapest hook: what every call costs before its own work.
#[divan::bench]
fn router_discovery(bencher: divan::Bencher) {
    use tower::ServiceExt as _;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(std::sync::Mutex::new(null))
            .try_init();
    }
    let router = inplace_updater::server::app(inplace_updater::server::AppState::new(
        ENGINE.clone(),
        Arc::new(inplace_updater::dispatch::upkeep::tokens::AgentTokens::none()),
    ));
    let body = fixture("discovery-request.json");
    let path = format!(
        "{}?timeout=10s",
        inplace_updater::api::Hook::Discovery.path()
    );
    bencher.bench(|| {
        let request = axum::http::Request::post(&path)
            .body(axum::body::Body::from(body.clone()))
            .unwrap();
        RUNTIME.block_on(router.clone().oneshot(request)).unwrap()
    });
}
