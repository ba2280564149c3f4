//! The remediation guard end to end, all real processes over TLS: the server with `--management-kubeconfig`
//! pointing at the fake management API of `inplace_drain::fake::management` (the RBAC the shipped components
//! grant, Machines' resourceVersion preconditions), two worker agents on sandboxed roots draining against their
//! node fakes, and a CAPI-faithful caller upgrading both from v1.33.4 to v1.34.1 (a minor change: it drains).
//! One Machine carries an operator's own skip-remediation value.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::collections::BTreeMap;

use capi_sim::{CapiDecision, UpdateOutcome};
use inplace_drain::fake::management::FakeManagementApi;
use serde_json::Value;

use crate::common;
use crate::e2e_rollout::{SETTLE, WORKERS};
use common::fleet::{Setup, update_request};

const SKIP: &str = "cluster.x-k8s.io/skip-remediation";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_update_is_guarded_from_before_the_cordon_and_an_operators_value_is_left_alone()
{
    let components = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/clusterctl/runtime-extension-components.yaml");
    let management = FakeManagementApi::start(&components).unwrap();
    let (guarded, operator) = (WORKERS[0], WORKERS[1]);
    management.add_machine("default", guarded, &BTreeMap::new());
    let operators = BTreeMap::from([(SKIP.to_owned(), "ops:ticket-9".to_owned())]);
    management.add_machine("default", operator, &operators);

    let setup = Setup::new();
    let store = format!("file:{}", setup.dir.path().join("data").display());
    let kubeconfig = management.kubeconfig_path().display().to_string();
    let (server, capi) = setup.serve(&store, &["--management-kubeconfig", &kubeconfig]);
    let agents: Vec<_> = [guarded, operator]
        .iter()
        .map(|name| setup.agent(&server, name, false))
        .collect();
    let can_set =
        serde_json::from_slice::<Value>(&common::fixture("can-update-machineset-md.json")).unwrap();
    assert_eq!(
        capi.can_update_machine_set(&can_set).await,
        CapiDecision::InPlace
    );
    for name in [guarded, operator] {
        let request = update_request("update-machine-worker.json", name);
        let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
        assert_eq!(outcome, UpdateOutcome::Done, "{name}: {messages:?}");
    }

    let patches: Vec<_> = management
        .machine_patches()
        .into_iter()
        .filter(|p| p.machine == format!("default/{guarded}"))
        .collect();
    assert_eq!(patches.len(), 2, "set once, removed once: {patches:?}");
    let value = patches[0].after.get(SKIP).cloned().unwrap();
    assert!(value.starts_with("inplace-updater:"), "{value}");
    assert!(patches[1].before.get(SKIP) == Some(&value) && !patches[1].after.contains_key(SKIP));
    let cordoned = agents[0]
        .sandbox
        .kube
        .first_cordon_at()
        .expect("the node was drained");
    assert!(
        patches[0].at < cordoned,
        "the guard is on the Machine before the drain begins"
    );
    assert!(patches[1].at > cordoned);
    assert_eq!(
        management
            .annotations("default", guarded)
            .unwrap()
            .get(SKIP),
        None
    );

    assert_eq!(
        management
            .annotations("default", operator)
            .unwrap()
            .get(SKIP)
            .map(String::as_str),
        Some("ops:ticket-9"),
        "an operator's own value is never touched"
    );
    assert!(
        management
            .machine_patches()
            .iter()
            .all(|p| p.machine != format!("default/{operator}")),
        "nothing was patched on the operator's Machine"
    );
    for seen in management.seen() {
        assert!(
            (200..300).contains(&seen.code),
            "only what the shipped RBAC grants was asked: {seen:?}"
        );
    }
    drop(server);
}
