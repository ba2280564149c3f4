//! Every file the agent reads, fed more than its bound from a source with no size (`/dev/zero`, a FIFO) or
//! a sparse file past it: each read stops at the bound and says which file and which bound, with memory
//! bounded, and the agent carries on (a refused step fails, a refused fact is absent).

use inplace_agent_api::{FileEncoding, FileSpec, KubeletArg, MachineRef, Plan, StepAction};
use inplace_bounded_read::testing::{assert_refused, fifo_with, peak_rss_bytes, zero_at};

use super::{Sandbox, run_action};
use crate::config::{DriverConfig, MAX_CONFIG_BYTES};
use crate::drivers::DriverOutcome;
use crate::limits::*;

fn file(path: &str, owner: Option<&str>, append: bool) -> FileSpec {
    FileSpec {
        path: path.into(),
        owner: owner.map(str::to_owned),
        permissions: None,
        encoding: FileEncoding::None,
        append,
        content: "x\n".into(),
    }
}

#[test]
fn the_config_and_the_ca_file_are_refused_past_their_bounds() {
    let err = DriverConfig::load("/dev/zero".as_ref()).unwrap_err();
    assert_refused(&err.to_string(), "/dev/zero", MAX_CONFIG_BYTES);
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_with(&dir.path().join("agent.yaml"), MAX_CONFIG_BYTES + 4096);
    let err = DriverConfig::load(&fifo).unwrap_err();
    assert_refused(
        &err.to_string(),
        &fifo.display().to_string(),
        MAX_CONFIG_BYTES,
    );

    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let err = crate::net::client::ServerClient::new(
        "https://127.0.0.1:1",
        "/dev/zero".as_ref(),
        &token,
        None,
    )
    .unwrap_err();
    assert_refused(&err.to_string(), "/dev/zero", MAX_CA_FILE_BYTES);
}

#[tokio::test]
async fn the_token_file_is_refused_past_its_bound_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert.pem()).unwrap();
    let token = zero_at(&dir.path().join("token"));
    let client =
        crate::net::client::ServerClient::new("https://127.0.0.1:1", &ca_file, &token, None)
            .unwrap();
    let err = client
        .post::<_, serde_json::Value>("/x", &1, std::time::Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, crate::net::client::ClientError::Token { .. }),
        "{err}"
    );
    assert_refused(
        &err.to_string(),
        &token.display().to_string(),
        MAX_TOKEN_FILE_BYTES,
    );
}

#[test]
fn state_json_past_its_bound_is_an_error_and_a_plan_file_past_it_is_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    zero_at(&dir.path().join("state.json"));
    let Err(err) = crate::state::StateStore::open(dir.path()) else {
        panic!("state.json of /dev/zero was read");
    };
    assert_refused(&err.to_string(), "state.json", MAX_STATE_BYTES);

    let dir = tempfile::tempdir().unwrap();
    let mut store = crate::state::StateStore::open(dir.path()).unwrap();
    let plan = Plan {
        id: "p1".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: Vec::new(),
        control_plane: false,
    };
    store.adopt(plan).unwrap();
    drop(store);
    let plan_file = dir.path().join("plan-p1.json");
    std::fs::remove_file(&plan_file).unwrap();
    zero_at(&plan_file);
    let store = super::rollback::reopen_store(dir.path());
    assert!(store.plan.is_none(), "the server sends the plan again");
    assert_eq!(store.state.current.as_ref().unwrap().plan_id, "p1");
}

#[tokio::test]
async fn node_files_and_journals_past_their_bounds_fail_the_step_naming_them() {
    let sb = Sandbox::new();
    sb.write_node("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n");
    let env = sb.env("");

    // The files driver's journal.
    let journal = zero_at(&sb.state.join("managed-files.json"));
    let files = vec![file("/etc/a", None, false)];
    let result = run_action(&env, "p1", StepAction::Files { files }, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(
        &result.message,
        &journal.display().to_string(),
        MAX_JOURNAL_BYTES,
    );
    std::fs::remove_file(&journal).unwrap();

    // The user database an owner is resolved in.
    std::fs::remove_file(sb.node("/etc/passwd")).unwrap();
    zero_at(&sb.node("/etc/passwd"));
    let files = vec![file("/etc/a", Some("alice"), false)];
    let result = run_action(&env, "p2", StepAction::Files { files }, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(&result.message, "/etc/passwd", MAX_USER_DB_BYTES);

    // A file appended to: its current content is read first.
    let hosts = fifo_with(&sb.node("/etc/hosts"), MAX_MANAGED_FILE_BYTES + 65536);
    let files = vec![file("/etc/hosts", None, true)];
    let result = run_action(&env, "p3", StepAction::Files { files }, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(
        &result.message,
        &hosts.display().to_string(),
        MAX_MANAGED_FILE_BYTES,
    );

    // A file replaced: it is backed up first (a sparse file, so the test writes nothing).
    let big = sb.node("/etc/big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_BACKUP_BYTES + 1)
        .unwrap();
    let files = vec![file("/etc/big", None, false)];
    let result = run_action(&env, "p4", StepAction::Files { files }, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(&result.message, "/etc/big", MAX_BACKUP_BYTES);
}

#[tokio::test]
async fn the_etcd_manifest_the_kubelet_flags_and_node_facts_are_bounded() {
    let sb = Sandbox::new();
    let env = sb.env("");
    std::fs::create_dir_all(sb.node("/etc/kubernetes/manifests")).unwrap();
    zero_at(&sb.node("/etc/kubernetes/manifests/etcd.yaml"));
    let action = StepAction::EtcdImage {
        image_tag: "3.5.21-0".into(),
        image_repository: None,
    };
    let result = run_action(&env, "p1", action, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(&result.message, "etcd.yaml", MAX_ETCD_MANIFEST_BYTES);

    std::fs::create_dir_all(sb.node("/var/lib/kubelet")).unwrap();
    zero_at(&sb.node("/var/lib/kubelet/kubeadm-flags.env"));
    let args = vec![KubeletArg {
        name: "v".into(),
        value: "2".into(),
    }];
    let action = StepAction::KubeletArgs { args: args.clone() };
    let result = run_action(&env, "p2", action, 60).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_refused(
        &result.message,
        "kubeadm-flags.env",
        MAX_KUBELET_FLAGS_BYTES,
    );
    zero_at(&sb.state.join("managed-kubelet-args.json"));
    let result = run_action(&env, "p3", StepAction::KubeletArgs { args }, 60).await;
    assert_refused(
        &result.message,
        "managed-kubelet-args.json",
        MAX_JOURNAL_BYTES,
    );

    std::fs::create_dir_all(sb.node("/proc/sys/kernel/random")).unwrap();
    zero_at(&sb.node("/proc/sys/kernel/random/boot_id"));
    assert_eq!(
        crate::os::inventory::boot_id(&env),
        None,
        "a refused fact is absent"
    );
    assert!(peak_rss_bytes() < 3 * MAX_NODE_FACT_BYTES + 512 * 1024 * 1024);
}
