//! `decide` as a table: each row a snapshot and a request, and what UpdateMachine writes and answers for it.
//! No store, no clock, no runtime.

use inplace_agent_api::KubeadmUpgradeMode;
use inplace_store::{Precondition, Revision};
use serde_json::json;

use super::decide::{Commit, Decision, Event, Snapshot, Write, decide, upgrade_mode};
use super::request::{UpdateAnswer, UpdateRequest};
use super::retry::RetryOutcome;
use crate::dispatch::floor::DispatchConfig;
use crate::dispatch::floor::records::{ApplyClaim, ProviderIndex};
use crate::dispatch::floor::run::{RunOutcome, RunView, StepState, UpdateRecord};
use crate::dispatch::licence::RefusalReason;
use crate::dispatch::testing::{request, request_of, verdict_for};

const NOW: u64 = 1_750_000_000_000;

type Committed = Commit;

fn commit(decision: Decision) -> Committed {
    match decision {
        Decision::Commit(commit) => *commit,
        other => panic!("expected a commit, got {other:?}"),
    }
}

fn judged(request: &UpdateRequest) -> Snapshot {
    Snapshot {
        verdict: Some(verdict_for(request, true)),
        ..Snapshot::default()
    }
}

fn decided(request: &UpdateRequest, snapshot: &Snapshot) -> Decision {
    decide(request, snapshot, &DispatchConfig::default(), NOW).unwrap()
}

/// The snapshot after committing `c` (as the next call would load it).
fn after(c: &Committed, snapshot: &Snapshot) -> Snapshot {
    let run = c.writes.iter().find_map(|w| match w {
        Write::Run(run) => Some(RunView::of(run)),
        _ => None,
    });
    Snapshot {
        record: Some((c.record.clone(), Revision(7))),
        run: run.or_else(|| Some(c.run.clone())),
        ..snapshot.clone()
    }
}

fn failed(c: &Committed) -> RunView {
    let mut run = c.run.clone();
    run.steps[0].state = StepState::Failed;
    run
}

#[test]
fn a_first_call_writes_the_record_and_its_run_in_one_commit() {
    let request = request("m-1", false, "v1.34.1", "hi");
    let c = commit(decided(&request, &judged(&request)));
    let kinds: Vec<&str> = c
        .writes
        .iter()
        .map(|w| match w {
            Write::Claim(_) => "claim",
            Write::Provider(_) => "provider",
            Write::Machine(_, Precondition::Absent) => "machine (create)",
            Write::Machine(..) => "machine",
            Write::Run(_) => "run",
        })
        .collect();
    assert_eq!(kinds, ["run", "machine (create)"]);
    assert_eq!(c.run.outcome(), RunOutcome::Waiting);
    assert_eq!(c.record.run_id, run_id(&c));
    assert!(
        matches!(&c.events[..], [Event::Recorded { steps, .. }] if *steps == c.run.steps.len())
    );
}

fn run_id(c: &Committed) -> String {
    c.writes
        .iter()
        .find_map(|w| match w {
            Write::Run(run) => Some(run.plan.id.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[test]
fn a_repeated_call_writes_nothing_and_judges_nothing() {
    let request = request("m-1", false, "v1.34.1", "hi");
    let first = commit(decided(&request, &judged(&request)));
    // No verdict in the snapshot: a repeat is not judged again (the load does not even read one).
    let repeat = Snapshot {
        verdict: None,
        ..after(&first, &judged(&request))
    };
    let c = commit(decided(&request, &repeat));
    assert!(c.writes.is_empty(), "{:?}", c.writes);
    assert_eq!(c.record, first.record);
    assert!(c.events.is_empty());
}

#[test]
fn a_state_no_verdict_accepted_is_refused_and_nothing_is_written() {
    let request = request("m-1", false, "v1.34.1", "hi");
    let Decision::Refused(refusal) = decided(&request, &Snapshot::default()) else {
        panic!("expected a refusal")
    };
    assert_eq!(refusal.reason, RefusalReason::NoVerdict);
    let rollout = Snapshot {
        verdict: Some(verdict_for(&request, false)),
        ..Snapshot::default()
    };
    let Decision::Refused(refusal) = decided(&request, &rollout) else {
        panic!("expected a refusal")
    };
    assert_eq!(refusal.reason, RefusalReason::NotInPlace);
}

#[test]
fn the_operator_may_accept_exactly_the_refused_state() {
    let plain = request("m-1", false, "v1.34.1", "hi");
    let Decision::Refused(refusal) = decided(&plain, &Snapshot::default()) else {
        panic!("expected a refusal")
    };
    let mut machine = plain.machine.clone();
    machine["metadata"]["annotations"] =
        json!({ "inplace-updater.dev/accept-unjudged": refusal.fingerprint });
    let accepted = request_of(
        &machine,
        &json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } }),
    );
    // The annotation is metadata, which the state's fingerprint leaves out.
    let c = commit(decided(&accepted, &Snapshot::default()));
    assert!(matches!(
        &c.events[..],
        [Event::GrantedByOperator { .. }, Event::Recorded { .. }]
    ));
}

#[test]
fn a_closed_window_holds_a_new_run_and_claims_nothing() {
    let mut request = request("cp-1", true, "v1.34.1", "hi");
    // Closed all week but one minute on Sunday night.
    request.window = Some(
        inplace_core::window::parse_setting("days=sun start=23:58 end=23:59 tz=UTC")
            .unwrap()
            .unwrap(),
    );
    let snapshot = Snapshot {
        claim: Some(None),
        ..judged(&request)
    };
    let Decision::Answer(UpdateAnswer::InProgress { message, .. }) = decided(&request, &snapshot)
    else {
        panic!("expected the window's answer")
    };
    assert!(message.ends_with("the update starts then"), "{message}");
}

#[test]
fn the_first_control_plane_machine_claims_apply_and_the_others_run_node() {
    let request = request("cp-1", true, "v1.34.1", "hi");
    let free = Snapshot {
        claim: Some(None),
        ..judged(&request)
    };
    assert_eq!(
        upgrade_mode(&request, free.claim.as_ref()),
        KubeadmUpgradeMode::Apply
    );
    let c = commit(decided(&request, &free));
    assert!(
        c.writes
            .iter()
            .any(|w| matches!(w, Write::Claim(ApplyClaim { machine, claimed_ms }) if machine == "cp-1" && *claimed_ms == NOW))
    );
    let taken = Snapshot {
        claim: Some(Some(ApplyClaim {
            machine: "cp-0".into(),
            claimed_ms: 1,
        })),
        ..judged(&request)
    };
    assert_eq!(
        upgrade_mode(&request, taken.claim.as_ref()),
        KubeadmUpgradeMode::Node
    );
    let c2 = commit(decided(&request, &taken));
    assert!(!c2.writes.iter().any(|w| matches!(w, Write::Claim(_))));
    assert_ne!(
        c.record.input_hash, c2.record.input_hash,
        "the mode is part of the input"
    );
}

/// The step kinds of the run `c` records.
fn planned_kinds(c: &Committed) -> Vec<&'static str> {
    let plan = c.writes.iter().find_map(|w| match w {
        Write::Run(run) => Some(&run.plan),
        _ => None,
    });
    plan.expect("a new run")
        .steps
        .iter()
        .map(|s| s.action.kind())
        .collect()
}

/// Issue 43: one file changed on a control-plane Machine at the version it runs (what CanUpdateMachine judged)
/// is planned as that file's step alone, and claims no `kubeadm upgrade apply`; unjudged (an operator's
/// accept-unjudged), every allowed action is planned as before.
#[test]
fn a_change_that_leaves_the_version_plans_no_upgrade_and_claims_no_apply() {
    use inplace_core::Action;
    use inplace_core::drain::{NodeChange, VersionChange};
    let request = request("cp-1", true, "v1.33.4", "one new line");
    let mut verdict = verdict_for(&request, true);
    verdict.node_change = Some(NodeChange {
        version: VersionChange::None,
        actions: [Action::Files].into(),
    });
    let files_only = Snapshot {
        claim: Some(None),
        verdict: Some(verdict),
        ..Snapshot::default()
    };
    let c = commit(decided(&request, &files_only));
    assert_eq!(planned_kinds(&c), ["files"]);
    assert!(
        !c.writes.iter().any(|w| matches!(w, Write::Claim(_))),
        "no kubeadm upgrade, so no apply claim"
    );
    assert_eq!(c.record.node_change.actions, [Action::Files].into());
    // The same desired state again, spelled otherwise: the record's judgement plans it, the run is kept.
    let mut respelled = request.clone();
    respelled.machine_text =
        serde_json::value::RawValue::from_string(format!(" {}", request.machine_text.get()))
            .unwrap();
    respelled.hashed = Default::default();
    let again = commit(decided(
        &respelled,
        &Snapshot {
            verdict: None,
            ..after(&c, &files_only)
        },
    ));
    assert_eq!(again.record.run_id, c.record.run_id);
    assert_eq!(again.record.state_hash, c.record.state_hash);
    // Accepted by the operator, no verdict: nothing says what moved, so the version's steps are planned too,
    // drained as a version change of unknown size (the agent passes over what the node already runs).
    let mut machine = request.machine.clone();
    let fingerprint = request.desired_print().unwrap().fingerprint;
    machine["metadata"]["annotations"] = serde_json::json!({
        inplace_core::knobs::ACCEPT_UNJUDGED_ANNOTATION:
            inplace_core::verdict::operator_fingerprint(&fingerprint)
    });
    let unjudged = crate::dispatch::testing::with_machine(&request, machine);
    let c = commit(decided(
        &unjudged,
        &Snapshot {
            claim: Some(None),
            ..Snapshot::default()
        },
    ));
    assert_eq!(
        planned_kinds(&c),
        [
            "files",
            "installKubeadm",
            "kubeadmUpgrade",
            "drainNode",
            "installKubelet",
            "waitNodeReady",
            "uncordonNode"
        ]
    );
    assert!(c.writes.iter().any(|w| matches!(w, Write::Claim(_))));
}

#[test]
fn the_provider_index_is_written_with_a_new_record_only() {
    let mut machine = request("m-1", false, "v1.34.1", "hi").machine;
    machine["spec"]["providerID"] = json!("metal3://m-1");
    let request = request_of(&machine, &json!({ "spec": { "files": [] } }));
    let c = commit(decided(&request, &judged(&request)));
    assert!(c.writes.iter().any(|w| matches!(w, Write::Provider(_))));
    let indexed = Snapshot {
        provider: Some(ProviderIndex {
            machine: request.desired.facts.machine.clone(),
        }),
        ..judged(&request)
    };
    let c = commit(decided(&request, &indexed));
    assert!(!c.writes.iter().any(|w| matches!(w, Write::Provider(_))));
}

#[test]
fn a_new_desired_state_gets_a_new_run_chained_to_the_old() {
    let first_request = request("m-1", false, "v1.34.1", "a");
    let first = commit(decided(&first_request, &judged(&first_request)));
    let second_request = request("m-1", false, "v1.34.1", "b");
    let snapshot = Snapshot {
        verdict: Some(verdict_for(&second_request, true)),
        ..after(&first, &judged(&first_request))
    };
    let second = commit(decided(&second_request, &snapshot));
    assert_ne!(second.record.run_id, first.record.run_id);
    assert_eq!(
        second.record.run_id,
        super::request::run_id(&second.record.state_hash, Some(&first.record.run_id))
    );
    assert!(
        second
            .writes
            .iter()
            .any(|w| matches!(w, Write::Machine(_, Precondition::Revision(Revision(7)))))
    );
}

#[test]
fn a_retry_restarts_a_failed_run_once_and_is_ignored_on_one_that_did_not_fail() {
    let plain = request("m-1", false, "v1.34.1", "hi");
    let first = commit(decided(&plain, &judged(&plain)));
    let mut machine = plain.machine.clone();
    machine["metadata"]["annotations"] = json!({ "inplace-updater.dev/retry": "1" });
    let retried = request_of(
        &machine,
        &json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } }),
    );

    let on_failed = Snapshot {
        run: Some(failed(&first)),
        ..after(&first, &judged(&plain))
    };
    let c = commit(decided(&retried, &on_failed));
    let fresh: Vec<&UpdateRecord> = c
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::Run(run) => Some(run),
            _ => None,
        })
        .collect();
    assert_eq!(fresh.len(), 1, "one fresh run");
    assert_eq!(fresh[0].plan.id, c.record.run_id);
    assert_ne!(c.record.run_id, first.record.run_id);
    assert_eq!(
        c.record.state_hash, first.record.state_hash,
        "the same desired state"
    );
    assert!(matches!(
        &c.events[..],
        [Event::Retry {
            outcome: RetryOutcome::Started { .. },
            ..
        }]
    ));

    // The same value again, on the fresh run: a repeat of the input, nothing happens.
    let again = commit(decided(&retried, &after(&c, &on_failed)));
    assert!(again.writes.is_empty());

    let on_running = after(&first, &judged(&plain));
    let c = commit(decided(&retried, &on_running));
    assert!(!c.writes.iter().any(|w| matches!(w, Write::Run(_))));
    let mark = c.record.retry.clone().unwrap();
    assert!(mark.ignored && mark.run_id == first.record.run_id);
    assert!(matches!(
        &c.events[..],
        [Event::Retry {
            outcome: RetryOutcome::Ignored {
                state: "waiting for its agent"
            },
            ..
        }]
    ));
}

#[test]
fn holds_are_recorded_on_every_call() {
    let plain = request("m-1", false, "v1.34.1", "hi");
    let first = commit(decided(&plain, &judged(&plain)));
    let mut paused = plain.clone();
    paused.paused_setting = Some("freeze".into());
    let c = commit(decided(&paused, &after(&first, &judged(&plain))));
    assert_eq!(
        c.record.paused.as_deref(),
        Some("ExtensionConfig setting paused=freeze")
    );
    assert!(matches!(&c.events[..], [Event::Paused(Some(_))]));
    assert!(
        matches!(&c.writes[..], [Write::Machine(..)]),
        "{:?}",
        c.writes
    );

    let mut machine = plain.machine.clone();
    machine["metadata"]["annotations"] = json!({ "inplace-updater.dev/cancel": "stop" });
    let cancel = request_of(
        &machine,
        &json!({ "spec": { "files": [ { "path": "/etc/motd", "content": "hi" } ] } }),
    );
    let c = commit(decided(&cancel, &after(&first, &judged(&cancel))));
    let mark = c.record.cancel.clone().unwrap();
    assert_eq!(
        (mark.value.as_str(), mark.run_id.as_str()),
        ("stop", first.record.run_id.as_str())
    );
}
