//! Which pods the node verification records before the drain and waits for after the last step.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::drivers::pods_before_drain::to_record;

fn pod(namespace: &str, name: &str) -> PodFacts {
    PodFacts {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller_kind: Some("ReplicaSet".into()),
        controller_name: Some("web-5d9".into()),
        phase: Some("Running".into()),
        ready: true,
        ..PodFacts::default()
    }
}

fn daemon(name: &str) -> PodFacts {
    PodFacts {
        controller_kind: Some("DaemonSet".into()),
        controller_name: Some("kube-proxy".into()),
        ..pod("kube-system", name)
    }
}

fn not_ready(pod: PodFacts) -> PodFacts {
    PodFacts {
        ready: false,
        ready_gap: "Ready False (ContainersNotReady: containers with unready status: [c])".into(),
        ..pod
    }
}

#[test]
fn only_running_and_ready_pods_are_recorded_in_order() {
    let mut pending = pod("web", "pending");
    pending.phase = Some("Pending".into());
    let mut done = pod("jobs", "done");
    done.phase = Some("Succeeded".into());
    let mut going = pod("web", "going");
    going.deleting = true;
    let mirror = PodFacts {
        mirror: true,
        controller_kind: Some("Node".into()),
        ..pod("kube-system", "kube-apiserver-n1")
    };
    let recorded = to_record(&[
        pod("web", "web-1"),
        not_ready(pod("web", "flaky")),
        pending,
        done,
        going,
        daemon("kube-proxy-abc"),
        mirror,
    ]);
    let keys: Vec<String> = recorded.iter().map(RecordedPod::key).collect();
    assert_eq!(
        keys,
        [
            "kube-system/kube-apiserver-n1",
            "kube-system/kube-proxy-abc",
            "web/web-1"
        ]
    );
    assert_eq!(recorded[1].daemon_set.as_deref(), Some("kube-proxy"));
    assert!(recorded[0].mirror);
}

#[test]
fn evicted_pods_that_moved_away_are_not_waited_for() {
    let recorded = to_record(&[pod("web", "web-1"), pod("web", "web-2")]);
    // web-1 now runs elsewhere, web-2's replacement landed here under another name.
    let found = check(&recorded, &[pod("web", "web-2x")]);
    assert!(found.passed(), "{found:?}");
    assert_eq!(found.moved, 2);
    assert_eq!(
        found.text(),
        "0 pod(s) Running and Ready again (2 moved off the node, not waited for)"
    );
}

#[test]
fn a_pod_back_on_the_node_must_be_ready_and_says_why_not() {
    let recorded = to_record(&[pod("db", "db-0"), pod("web", "kept")]);
    let found = check(
        &recorded,
        &[not_ready(pod("db", "db-0")), pod("web", "kept")],
    );
    assert!(!found.passed());
    assert_eq!(found.ready, ["web/kept"]);
    assert_eq!(
        found.text(),
        "1 pod(s) not Running and Ready: db/db-0: Running, Ready False (ContainersNotReady: containers with unready status: [c])"
    );
    let mut pending = pod("db", "db-0");
    pending.phase = Some("Pending".into());
    pending.ready = false;
    pending.ready_gap = "no Ready condition".into();
    let found = check(&recorded, &[pending, pod("web", "kept")]);
    assert_eq!(found.not_ready, ["db/db-0: Pending, no Ready condition"]);
}

#[test]
fn a_daemonset_pod_is_matched_by_its_daemonset_and_must_come_back() {
    let recorded = to_record(&[daemon("kube-proxy-abc")]);
    // Replaced under another name: that one counts.
    let found = check(&recorded, &[daemon("kube-proxy-xyz")]);
    assert!(found.passed(), "{found:?}");
    assert_eq!(found.ready, ["kube-system/kube-proxy-xyz"]);
    // The old one being deleted and no replacement yet: waited for.
    let mut going = daemon("kube-proxy-abc");
    going.deleting = true;
    let found = check(&recorded, &[going]);
    assert_eq!(
        found.not_ready,
        [
            "kube-system/kube-proxy-abc: not back on the node (no pod of DaemonSet kube-system/kube-proxy)"
        ]
    );
    // Another DaemonSet's pod is not its replacement.
    let other = PodFacts {
        controller_name: Some("node-exporter".into()),
        ..daemon("node-exporter-1")
    };
    assert!(!check(&recorded, &[other]).passed());
}

#[test]
fn a_static_pods_mirror_must_come_back_under_its_name() {
    let mirror = PodFacts {
        mirror: true,
        controller_kind: Some("Node".into()),
        ..pod("kube-system", "etcd-n1")
    };
    let recorded = to_record(std::slice::from_ref(&mirror));
    assert!(!check(&recorded, &[]).passed());
    let found = check(&recorded, &[not_ready(mirror.clone())]);
    assert!(!found.passed());
    assert!(check(&recorded, &[mirror]).passed());
}

#[test]
fn the_failure_text_is_bounded() {
    let many: Vec<PodFacts> = (0..50).map(|i| pod("web", &format!("w-{i:02}"))).collect();
    let recorded = to_record(&many);
    let now: Vec<PodFacts> = many.into_iter().map(not_ready).collect();
    let text = check(&recorded, &now).text();
    assert!(
        text.starts_with("50 pod(s) not Running and Ready: web/w-00: "),
        "{text}"
    );
    assert!(
        text.len() <= inplace_drain::decide::MAX_SUMMARY_BYTES,
        "{text}"
    );
}
