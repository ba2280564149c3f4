//! Table tests of the drain decisions; cases follow Cluster API's `filters_test.go` and
//! `drain_test.go` (DaemonSet, static/mirror, finished, drain label, local storage, unmanaged).
#![allow(clippy::unwrap_used)]

use super::*;

fn pod(name: &str) -> PodFacts {
    PodFacts {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller_kind: Some("ReplicaSet".into()),
        phase: Some("Running".into()),
        ..PodFacts::default()
    }
}

#[test]
fn classify_table() {
    let none = DrainOptions::default();
    let both = DrainOptions {
        delete_empty_dir_data: true,
        force_unmanaged: true,
    };
    let cases: Vec<(&str, PodFacts, DrainOptions, Verdict)> = vec![
        ("replicaset pod is evicted", pod("a"), none, Verdict::Evict),
        (
            "daemonset pod is skipped",
            PodFacts {
                controller_kind: Some("DaemonSet".into()),
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::DaemonSet),
        ),
        (
            "daemonset pod with emptyDir is still skipped",
            PodFacts {
                controller_kind: Some("DaemonSet".into()),
                empty_dir: true,
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::DaemonSet),
        ),
        (
            "mirror (static) pod is skipped, even without a controller",
            PodFacts {
                mirror: true,
                controller_kind: None,
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::Mirror),
        ),
        (
            "succeeded pod needs no eviction",
            PodFacts {
                phase: Some("Succeeded".into()),
                controller_kind: None,
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::Finished),
        ),
        (
            "failed pod with emptyDir needs no eviction",
            PodFacts {
                phase: Some("Failed".into()),
                empty_dir: true,
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::Finished),
        ),
        (
            "drain label skip",
            PodFacts {
                skip_label: true,
                controller_kind: None,
                ..pod("a")
            },
            none,
            Verdict::Skip(SkipReason::Label),
        ),
        (
            "pod being deleted is waited for",
            PodFacts {
                deleting: true,
                ..pod("a")
            },
            none,
            Verdict::WaitDeleting,
        ),
        (
            "finished pod still being deleted is waited for (volumes not torn down yet)",
            PodFacts {
                deleting: true,
                phase: Some("Succeeded".into()),
                ..pod("a")
            },
            none,
            Verdict::WaitDeleting,
        ),
        (
            "emptyDir blocks without the option",
            PodFacts {
                empty_dir: true,
                ..pod("a")
            },
            none,
            Verdict::Block(BlockReason::EmptyDir),
        ),
        (
            "emptyDir evicted with deleteEmptyDirData",
            PodFacts {
                empty_dir: true,
                ..pod("a")
            },
            DrainOptions {
                delete_empty_dir_data: true,
                force_unmanaged: false,
            },
            Verdict::Evict,
        ),
        (
            "unmanaged blocks without the option",
            PodFacts {
                controller_kind: None,
                ..pod("a")
            },
            DrainOptions {
                delete_empty_dir_data: true,
                force_unmanaged: false,
            },
            Verdict::Block(BlockReason::Unmanaged),
        ),
        (
            "unmanaged with emptyDir names emptyDir first",
            PodFacts {
                controller_kind: None,
                empty_dir: true,
                ..pod("a")
            },
            none,
            Verdict::Block(BlockReason::EmptyDir),
        ),
        (
            "unmanaged with emptyDir evicted with both options",
            PodFacts {
                controller_kind: None,
                empty_dir: true,
                ..pod("a")
            },
            both,
            Verdict::Evict,
        ),
    ];
    for (name, facts, options, want) in cases {
        assert_eq!(classify(&facts, options), want, "{name}");
    }
}

#[test]
fn facts_from_api_pod() {
    let api: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "web-1", "namespace": "shop", "uid": "u1",
            "labels": {"cluster.x-k8s.io/drain": "skip"},
            "annotations": {"kubernetes.io/config.mirror": "abc"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "1"},
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "2", "controller": true}
            ],
            "deletionTimestamp": "2026-01-01T00:00:00Z"
        },
        "spec": {"containers": [], "volumes": [{"name": "scratch", "emptyDir": {}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let facts = PodFacts::from_pod(&api);
    assert_eq!(facts.key(), "shop/web-1");
    assert_eq!(facts.controller_kind.as_deref(), Some("StatefulSet"));
    assert!(facts.mirror && facts.skip_label && facts.empty_dir && facts.deleting);
    // A label with another value does not skip.
    let other: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "a", "namespace": "n", "labels": {"cluster.x-k8s.io/drain": "true"}}
    }))
    .unwrap();
    let facts = PodFacts::from_pod(&other);
    assert!(!facts.skip_label);
    assert_eq!(facts.controller_kind, None);
}

#[test]
fn plan_sorts_by_namespace_then_name_and_drops_skips() {
    let pods = vec![
        PodFacts {
            namespace: "b".into(),
            ..pod("a")
        },
        PodFacts {
            controller_kind: Some("DaemonSet".into()),
            ..pod("0-ds")
        },
        pod("z"),
        pod("c"),
    ];
    let keys: Vec<String> = plan(&pods, DrainOptions::default())
        .iter()
        .map(|(p, _)| p.key())
        .collect();
    assert_eq!(keys, ["b/a", "default/c", "default/z"]);
}

#[test]
fn progress_texts() {
    let keys: Vec<String> = (0..8).map(|i| format!("web/p{i}")).collect();
    let cases: Vec<(&[String], Option<Waiting>, String)> = vec![
        (&keys[..1], None, "draining node-a: 1 pod left (web/p0)".into()),
        (
            &keys[..4],
            Some(Waiting::Pdb("web/pdb".into())),
            "draining node-a: 4 pods left (web/p0, web/p1, web/p2, web/p3), waiting on PDB web/pdb".into(),
        ),
        (
            &keys[..],
            Some(Waiting::Terminating),
            "draining node-a: 8 pods left (web/p0, web/p1, web/p2, web/p3, web/p4 and 3 more), waiting for evicted pods to terminate".into(),
        ),
        (&[], None, "draining node-a: 0 pods left".into()),
    ];
    for (remaining, waiting, want) in cases {
        assert_eq!(progress_text("node-a", remaining, waiting.as_ref()), want);
    }
    let long: Vec<String> = (0..3)
        .map(|i| format!("ns/{}{i}", "x".repeat(300)))
        .collect();
    let text = progress_text("node-a", &long, Some(&Waiting::Other("é".repeat(300))));
    assert!(text.len() <= MAX_SUMMARY_BYTES, "{}", text.len());
}

#[test]
fn pdb_named_in_refusal() {
    let causes =
        vec!["The disruption budget web-pdb needs 2 healthy pods and has 2 currently".to_owned()];
    assert_eq!(
        pdb_from_refusal("web", &causes).as_deref(),
        Some("web/web-pdb")
    );
    assert_eq!(pdb_from_refusal("web", &["other".to_owned()]), None);
}
