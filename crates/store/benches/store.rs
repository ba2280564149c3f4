//! Store benchmark: compare-and-swap writes per second on each backend (one writer, and several
//! writers on separate keys), a 4-key transaction against 4 sequential puts on the file store, and
//! change-feed latency from the start of a put on one handle to its
//! arrival on another handle's feed (two replicas on one real etcd; one process for redb).
//!
//! Run: `cargo bench -p inplace-store --bench store`. Prints a table; bounded in count and time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_store::testing::Etcd;
use inplace_store::{
    EtcdOptions, Precondition, Revision, Store, StoreUrl, TxnOp, TxnOutcome, Write,
};

/// Sequential CAS writes per measurement.
const SEQUENTIAL_WRITES: usize = 1000;
/// Concurrent writers (each on its own key) in the parallel measurement.
const PARALLEL_WRITERS: usize = 8;
/// CAS writes per concurrent writer.
const PARALLEL_WRITES_EACH: usize = 250;
/// Keys written together in the transaction measurement.
const SET_KEYS: usize = 4;
/// Sets of [`SET_KEYS`] keys each writer writes in the transaction measurement.
const SETS_EACH: usize = 200;
/// Latency samples per change-feed measurement.
const FEED_SAMPLES: usize = 500;
/// Size of each written value (a typical update record is a few hundred bytes of JSON).
const VALUE_BYTES: usize = 512;
/// Give up on a change that does not arrive (the benchmark must stop by itself).
const FEED_DEADLINE: Duration = Duration::from_secs(5);

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let etcd = Etcd::start().expect("start etcd (apt-get install etcd-server)");
    let options = EtcdOptions::default();
    let memory = open(&StoreUrl::Memory, &options).await;
    let file = open(&StoreUrl::File(tmp.path().join("bench")), &options).await;
    let etcd_a = open(&etcd.url(), &options).await;
    let etcd_b = open(&etcd.url(), &options).await;

    println!(
        "{:<34} {:>14} {:>14}",
        "CAS writes (512 B values)", "1 writer/s", "8 writers/s"
    );
    for (name, store) in [
        ("memory", &memory),
        ("redb (group commit)", &file),
        ("etcd (1 member, loopback)", &etcd_a),
    ] {
        let one = sequential(store).await;
        let many = parallel(store).await;
        println!("{name:<34} {one:>14.0} {many:>14.0}");
    }

    println!();
    println!(
        "{:<34} {:>14} {:>14}",
        "redb: sets of 4 keys (CAS each)", "1 writer/s", "8 writers/s"
    );
    for (name, txn) in [
        ("4 sequential puts", false),
        ("one 4-key transaction", true),
    ] {
        let one = sets(&file, 1, txn).await;
        let many = sets(&file, PARALLEL_WRITERS, txn).await;
        println!("{name:<34} {one:>14.0} {many:>14.0}");
    }

    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>9}   (put start -> other handle's feed)",
        "change-feed latency", "p50", "p99", "max"
    );
    for (name, writer, reader) in [
        ("redb, same process", &file, &file),
        ("etcd, replica A -> replica B", &etcd_a, &etcd_b),
    ] {
        let mut samples = feed_latency(writer, reader).await;
        samples.sort();
        let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        println!(
            "{name:<34} {:>9} {:>9} {:>9}",
            ms(pick(0.50)),
            ms(pick(0.99)),
            ms(samples[samples.len() - 1])
        );
    }
    drop((etcd_a, etcd_b));
    drop(etcd);
}

async fn open(url: &StoreUrl, options: &EtcdOptions) -> Arc<dyn Store> {
    inplace_store::open(url, options).await.expect("open store")
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Writes `count` CAS updates of `key`, each on the revision the previous one returned.
async fn cas_chain(store: &dyn Store, key: &str, count: usize) {
    let value = vec![b'x'; VALUE_BYTES];
    let mut precondition = match store.get(key).await.expect("get") {
        None => Precondition::Absent,
        Some(e) => Precondition::Revision(e.revision),
    };
    for _ in 0..count {
        match store
            .put(key, value.clone(), precondition)
            .await
            .expect("put")
        {
            Write::Done(r) => precondition = Precondition::Revision(r),
            Write::Conflict(e) => panic!("unexpected conflict on {key}: {e:?}"),
        }
    }
}

async fn sequential(store: &Arc<dyn Store>) -> f64 {
    let started = Instant::now();
    cas_chain(store.as_ref(), "bench/seq", SEQUENTIAL_WRITES).await;
    SEQUENTIAL_WRITES as f64 / started.elapsed().as_secs_f64()
}

async fn parallel(store: &Arc<dyn Store>) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..PARALLEL_WRITERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                cas_chain(
                    store.as_ref(),
                    &format!("bench/par/{i}"),
                    PARALLEL_WRITES_EACH,
                )
                .await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    (PARALLEL_WRITERS * PARALLEL_WRITES_EACH) as f64 / started.elapsed().as_secs_f64()
}

/// Sets of [`SET_KEYS`] keys per second from `writers` concurrent writers, each on keys of its own
/// and each key a CAS on its last revision: as one transaction, or as that many puts in a row.
async fn sets(store: &Arc<dyn Store>, writers: usize, txn: bool) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let keys: Vec<String> = (0..SET_KEYS)
                    .map(|k| format!("bench/set/{txn}/{writers}/{w}/{k}"))
                    .collect();
                let mut preconditions = vec![Precondition::Absent; SET_KEYS];
                let value = vec![b'z'; VALUE_BYTES];
                for _ in 0..SETS_EACH {
                    if txn {
                        let ops = keys
                            .iter()
                            .zip(&preconditions)
                            .map(|(key, pre)| TxnOp::put(key.clone(), value.clone(), *pre))
                            .collect();
                        match store.commit(ops).await.expect("commit") {
                            TxnOutcome::Done(r) => preconditions.fill(Precondition::Revision(r)),
                            other => panic!("unexpected {other:?}"),
                        }
                    } else {
                        for (key, pre) in keys.iter().zip(&mut preconditions) {
                            let r: Revision = match store.put(key, value.clone(), *pre).await {
                                Ok(Write::Done(r)) => r,
                                other => panic!("unexpected {other:?}"),
                            };
                            *pre = Precondition::Revision(r);
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("writer task");
    }
    (writers * SETS_EACH) as f64 / started.elapsed().as_secs_f64()
}

async fn feed_latency(writer: &Arc<dyn Store>, reader: &Arc<dyn Store>) -> Vec<Duration> {
    // Arrival times are taken by a task that only listens, so a change that beats the writer's
    // acknowledgement is timed when it arrives, not when the writer gets round to looking.
    let mut feed = reader.subscribe();
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(async move {
        while let Ok(change) = feed.recv().await {
            if arrived_tx.send((change.key, Instant::now())).is_err() {
                break;
            }
        }
    });
    let mut samples = Vec::with_capacity(FEED_SAMPLES);
    for i in 0..FEED_SAMPLES {
        let key = format!("bench/feed/{i}");
        let started = Instant::now();
        writer
            .put(&key, vec![b'y'; VALUE_BYTES], Precondition::Any)
            .await
            .expect("put");
        loop {
            let (got, at) = tokio::time::timeout(FEED_DEADLINE, arrived.recv())
                .await
                .expect("change did not arrive")
                .expect("feed closed");
            if got == key {
                samples.push(at - started);
                break;
            }
        }
    }
    listener.abort();
    samples
}
