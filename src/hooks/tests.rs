//! The CanUpdate hooks with an updater: a `Success` carries its verdict, stored before the answer leaves, and
//! an answer whose verdict cannot be stored becomes a `Failure` CAPI does not act on.

use std::sync::Arc;

use inplace_store::Store;
use inplace_store::memory::MemoryStore;
use tokio_util::sync::CancellationToken;

use super::{Engine, can_update_machine, can_update_machine_set, record};
use crate::dispatch::faulty_store::{FaultyStore, unavailable};
use crate::dispatch::{DispatchConfig, Dispatcher};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// The in-memory store, except that verdicts cannot be written (an etcd that lost its quorum).
fn no_verdicts() -> Arc<dyn Store> {
    Arc::new(FaultyStore::new(
        Arc::new(MemoryStore::new()),
        Box::new(|key| {
            let refused = key.starts_with("verdicts/");
            Box::pin(async move {
                if refused {
                    Err(unavailable("no leader"))
                } else {
                    Ok(())
                }
            })
        }),
    ))
}

fn engine(store: Arc<dyn Store>) -> Arc<Engine> {
    Arc::new(Engine::builtin(Dispatcher::new(
        store,
        DispatchConfig::default(),
        CancellationToken::new(),
    )))
}

#[tokio::test]
async fn a_success_is_sent_only_once_its_verdict_is_stored() {
    let store = Arc::new(MemoryStore::new());
    let engine = engine(store.clone());
    let body = fixture("can-update-machine-kcp-version.json");
    let judged = can_update_machine(&engine, &body);
    let (key, verdict) = judged
        .verdict
        .clone()
        .expect("a Success carries its verdict");
    assert_eq!(key, "verdicts/machines/default/edge-01-control-plane-abcde");
    assert!(verdict.in_place);
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "not stored before record()"
    );
    let answer = record(engine.clone(), judged).await;
    assert_eq!(answer.status.as_str(), "Success");
    assert!(store.get(&key).await.unwrap().is_some());

    // A MachineSet verdict is keyed by the set-name label value of its Machines.
    let set = can_update_machine_set(&engine, &fixture("can-update-machineset-md.json"));
    let (key, verdict) = set.verdict.clone().unwrap();
    assert_eq!(key, "verdicts/machinesets/default/edge-01-md-0-q9vdm");
    assert_eq!(verdict.template_hash.as_deref(), Some("2017329940-q9vdm"));

    // A rollout answer is a verdict too (not in place); a Failure is none.
    let mixed = can_update_machine(&engine, &fixture("can-update-machine-kcp-mixed.json"));
    assert!(!mixed.verdict.unwrap().1.in_place);
}

#[tokio::test]
async fn an_answer_whose_verdict_cannot_be_stored_is_a_failure_capi_does_not_act_on() {
    let engine = engine(no_verdicts());
    let body = fixture("can-update-machine-kcp-version.json");
    let answer = record(engine.clone(), can_update_machine(&engine, &body)).await;
    assert_eq!(answer.status.as_str(), "Failure");
    assert!(
        answer.message.contains("cannot record the verdict")
            && answer.message.contains("CAPI will ask again"),
        "{}",
        answer.message
    );
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let decision = capi_sim::can_update_machine(&request, &answer.body);
    assert!(
        matches!(decision, capi_sim::CapiDecision::Error { .. }),
        "CAPI's reconcile fails and asks again later: {decision:?}"
    );
}

/// The verdict's fingerprint is that of the whole desired objects as CAPI sent them, although the hook parsed
/// only what differs of each object and puts the rest back for the verdict: UpdateMachine, which gets the
/// whole objects, must come out with the same fingerprint.
#[test]
fn verdicts_fingerprint_the_whole_desired_objects() {
    use inplace_core::verdict::{Desired, Normalized};
    use inplace_core::{Objects, Scope};
    type Hook = fn(&Engine, &[u8]) -> super::Judged;
    let engine = engine(Arc::new(MemoryStore::new()));
    let mut judged = 0;
    for entry in
        std::fs::read_dir(format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"))).unwrap()
    {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let (scope, fields, hook): (_, [&str; 3], Hook) =
            if name.starts_with("can-update-machineset") {
                (
                    Scope::Template,
                    [
                        "machineSet",
                        "bootstrapConfigTemplate",
                        "infrastructureMachineTemplate",
                    ],
                    can_update_machine_set,
                )
            } else if name.starts_with("can-update-machine-") {
                (
                    Scope::Object,
                    ["machine", "bootstrapConfig", "infrastructureMachine"],
                    can_update_machine,
                )
            } else {
                continue;
            };
        let body = fixture(&name);
        let Some((_, verdict)) = hook(&engine, &body).verdict else {
            continue;
        };
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let desired = fields.map(|field| request["desired"].get(field).filter(|v| !v.is_null()));
        let whole = Desired::new(Normalized::of(
            scope,
            &Objects {
                machine: desired[0],
                bootstrap: desired[1],
                infra: desired[2],
            },
        ));
        assert_eq!(verdict.prints, whole.prints, "{name}");
        assert_eq!(verdict.fingerprint, whole.fingerprint, "{name}");
        judged += 1;
    }
    assert!(judged >= 5, "{judged}");
}
