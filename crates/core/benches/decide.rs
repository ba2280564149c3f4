//! The worst case: a KubeadmConfig with 200 files of 10 KiB (the API's maximum), current vs
//! desired with 20 changed files. Compares the whole decision (diff + policy + patch + self-check)
//! with the time serde_json needs just to parse the same CanUpdateMachine request.
//!
//! `cargo bench -p inplace-core` prints divan's table, then a summary line with medians and the ratio.
#![allow(clippy::unwrap_used)]

use inplace_core::patch::{self, Accepted, PatchType, Sides, capi};
use inplace_core::{Objects, Policy, Scope, Settings, decide, diff};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Files in the KubeadmConfig (the API's maximum).
const FILES: usize = 200;
/// Bytes of content per file.
const FILE_BYTES: usize = 10 * 1024;
/// Files whose content differs between current and desired.
const CHANGED: usize = 20;
/// Runs per measurement of the summary line.
const SUMMARY_RUNS: usize = 60;

fn content(seed: u64) -> String {
    // Printable, incompressible-looking text, the same for the same seed.
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..FILE_BYTES)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 64 == 63 {
                '\n'
            } else {
                (b' ' + ((x >> 33) % 95) as u8) as char
            }
        })
        .collect()
}

fn kubeadm_config(changed: bool) -> Value {
    let files: Vec<Value> = (0..FILES)
        .map(|i| {
            let mut c = content(i as u64);
            if changed && i % (FILES / CHANGED) == 0 {
                // Differ only at the very end: comparing has to read the whole content.
                c.pop();
                c.push('!');
            }
            json!({"path": format!("/etc/app/conf.d/{i:03}.conf"), "owner": "root:root", "permissions": "0644", "content": c})
        })
        .collect();
    json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
        "metadata": {"name": "prod-cp-1", "namespace": "default"},
        "spec": {
            "files": files,
            "users": [{"name": "capv", "sshAuthorizedKeys": ["ssh-ed25519 AAAA ops@example.com"]}],
            "ntp": {"servers": ["0.pool.ntp.org"]},
            "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "cloud-provider", "value": "external"}]}},
            "clusterConfiguration": {"etcd": {"local": {"imageTag": "3.5.21-0"}}}
        }
    })
}

fn machine() -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "prod-cp-1", "namespace": "default", "labels": {"cluster.x-k8s.io/control-plane": ""}},
        "spec": {"clusterName": "prod", "version": "v1.33.4",
                 "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "prod-cp-1"}},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "VSphereMachine", "name": "prod-cp-1"}}})
}

fn infra() -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "VSphereMachine",
        "metadata": {"name": "prod-cp-1", "namespace": "default"},
        "spec": {"template": "ubuntu-2404", "numCPUs": 4, "memoryMiB": 8192}})
}

struct Fixture {
    body: String,
    current: [Value; 3],
    desired: [Value; 3],
}

fn fixture() -> Fixture {
    let current = [machine(), kubeadm_config(false), infra()];
    let desired = [machine(), kubeadm_config(true), infra()];
    let body = serde_json::to_string(&json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "CanUpdateMachineRequest", "settings": {},
        "current": {"machine": current[0], "bootstrapConfig": current[1], "infrastructureMachine": current[2]},
        "desired": {"machine": desired[0], "bootstrapConfig": desired[1], "infrastructureMachine": desired[2]},
    }))
    .unwrap();
    Fixture {
        body,
        current,
        desired,
    }
}

fn objects(side: &[Value; 3]) -> Objects<'_> {
    Objects {
        machine: Some(&side[0]),
        bootstrap: Some(&side[1]),
        infra: Some(&side[2]),
    }
}

fn run_decide(f: &Fixture, settings: &Settings) -> inplace_core::Decision {
    decide(
        Scope::Object,
        &objects(&f.current),
        &objects(&f.desired),
        &Policy::builtin(),
        settings,
    )
}

#[divan::bench]
fn parse_request(bencher: divan::Bencher) {
    let f = fixture();
    bencher.bench(|| serde_json::from_str::<Value>(black_box(&f.body)).unwrap());
}

#[divan::bench]
fn diff_only(bencher: divan::Bencher) {
    let f = fixture();
    bencher.bench(|| {
        diff::diff(
            f.current[1].get("spec"),
            f.desired[1].get("spec"),
            diff::DiffOptions::default(),
        )
        .len()
    });
}

/// The patch alone (all changes accepted), and CAPI's application of it, per patch type.
#[divan::bench(args = ["JSONPatch", "JSONMergePatch"])]
fn patch_build_and_apply(bencher: divan::Bencher, patch_type: &str) {
    let f = fixture();
    let pt = if patch_type == "JSONPatch" {
        PatchType::JsonPatch
    } else {
        PatchType::JsonMergePatch
    };
    let sides = Sides {
        scope: Scope::Object,
        current_object: &f.current[1],
        current: f.current[1].get("spec"),
        desired: f.desired[1].get("spec"),
    };
    let changes = diff::diff(sides.current, sides.desired, diff::DiffOptions::default());
    let mut accepted = Accepted::default();
    changes.iter().for_each(|c| accepted.insert(c));
    bencher.bench(|| {
        let (patch, _) = patch::build(&sides, &accepted, pt);
        capi::apply(Scope::Object, &f.current[1], &patch.unwrap()).unwrap()
    });
}

#[divan::bench(args = ["JSONPatch", "JSONMergePatch"])]
fn decide_all(bencher: divan::Bencher, patch_type: &str) {
    let f = fixture();
    let settings = Settings::from_map(&BTreeMap::from([(
        "patchType".to_owned(),
        patch_type.to_owned(),
    )]))
    .unwrap();
    bencher.bench(|| run_decide(&f, black_box(&settings)));
}

/// Hostile-size lists (far past the API's 200 files, as a 20 MiB body allows): every other file
/// changed, every tenth one secret-sourced (so rejected), a tenth more added, the order reversed.
/// Times should grow linearly with the count.
#[divan::bench(args = [2_000, 20_000])]
fn many_small_files(bencher: divan::Bencher, count: usize) {
    let file = |i: usize, c: &str| {
        if i.is_multiple_of(10) {
            json!({"path": format!("/f/{i}"), "contentFrom": {"secret": {"name": c, "key": "k"}}})
        } else {
            json!({"path": format!("/f/{i}"), "content": c})
        }
    };
    let cur: Vec<Value> = (0..count).map(|i| file(i, "a")).collect();
    let mut des: Vec<Value> = (0..count + count / 10)
        .map(|i| file(i, if i % 2 == 0 { "b" } else { "a" }))
        .collect();
    des.reverse();
    let wrap = |files: Vec<Value>| json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "spec": {"files": files}});
    let (cur, des) = (wrap(cur), wrap(des));
    let objs = |o| Objects {
        bootstrap: Some(o),
        ..Objects::default()
    };
    bencher.bench(|| {
        decide(
            Scope::Object,
            &objs(&cur),
            &objs(&des),
            &Policy::builtin(),
            &Settings::default(),
        )
    });
}

fn median(mut run: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..SUMMARY_RUNS)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let f = fixture();
    let d = run_decide(&f, &Settings::default());
    assert_eq!(
        d.outcome,
        inplace_core::DecisionOutcome::InPlace,
        "{}",
        d.message
    );
    assert_eq!(d.changes.len(), CHANGED);
    divan::main();
    let parse = median(|| drop(black_box(serde_json::from_str::<Value>(&f.body).unwrap())));
    let decided = median(|| drop(black_box(run_decide(&f, &Settings::default()))));
    let patch_bytes = d.patches.bootstrap.as_ref().map_or(0, |p| p.bytes.len());
    println!(
        "summary: request {:.1} MiB, {CHANGED}/{FILES} files changed, patch {} KiB; median parse {:?}, median decide (diff+policy+patch+self-check) {:?}, decide/parse = {:.2}",
        f.body.len() as f64 / (1024.0 * 1024.0),
        patch_bytes / 1024,
        parse,
        decided,
        decided.as_secs_f64() / parse.as_secs_f64()
    );
}
