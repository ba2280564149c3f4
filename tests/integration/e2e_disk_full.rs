//! Full disks end to end (issue 43.7), all real processes over TLS, inside a private mount namespace (the outer
//! test starts this test binary again under `unshare -m`): the agent's state dir is a 1 MiB tmpfs and the
//! server's `file:` store a 16 MiB one. The agent's state dir fills while `kubeadm upgrade` runs: CAPI's
//! UpdateMachine message names the disk (`state dir full: N bytes free at PATH`), the step is not counted as
//! interrupted, and once the space is freed the update finishes by itself. Then the store's disk fills: the
//! hooks answer a Failure naming the cause, `/readyz` stays ready (the server answers), and once the space is
//! freed the hooks work again without a restart, nothing stored lost. Needs root and `unshare`: skipped, saying
//! why, where a mount namespace cannot be made. (Every write point: the agent's and the store's own tests.)
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use capi_sim::{CapiDecision, UpdateOutcome};
use common::fleet::{AgentProcess, Setup, can_update_request, update_request};
use inplace_updater::cmd::demo::Sandbox;

/// Set for the test binary started inside the namespace.
const INSIDE_ENV: &str = "INPLACE_E2E_DISK_FULL";
/// Bound on the namespace run (a failure bound).
const NAMESPACE_LIMIT: Duration = Duration::from_secs(300);
const SETTLE: Duration = Duration::from_secs(60);
const FIRST: &str = "edge-01-control-plane-aaaaa";
const SECOND: &str = "edge-01-control-plane-bbbbb";
/// Verdicts recorded on the full disk before one must fail (a failure bound: a few hundred fill redb's free pages).
const MAX_VERDICTS_ON_A_FULL_DISK: usize = 5000;

#[test]
fn a_full_agent_state_dir_and_a_full_store_are_named_to_capi_and_recovered_from() {
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "true"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!(
                "SKIPPED e2e_disk_full: cannot make a private mount namespace here (`unshare -m` needs root or \
                 CAP_SYS_ADMIN): {other:?}"
            );
            return;
        }
    }
    let started = Instant::now();
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "e2e_disk_full::inside_",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INSIDE_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waited.is_finished() {
        assert!(
            started.elapsed() < NAMESPACE_LIMIT,
            "the namespace run took longer than {NAMESPACE_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waited.join().unwrap();
    let shown = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inside the namespace:\n{shown}");
    assert!(shown.contains("disk full end to end: passed"), "{shown}");
    eprintln!(
        "e2e_disk_full namespace run: {:?}\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tmpfs of `size` at `dir` (created), in this process's private mount namespace.
fn tmpfs(dir: &Path, size: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let mount = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .output()
        .unwrap();
    assert!(mount.status.success(), "mount: {mount:?}");
}

/// Fills the filesystem of `dir` to the last byte with `<dir>/filler`.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    for chunk in [1024 * 1024, 4096, 1] {
        let zeros = vec![0u8; chunk];
        while matches!(file.write(&zeros), Ok(n) if n > 0) {}
    }
    filler
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_full_agent_state_dir_and_a_full_store_are_named_to_capi_and_recovered_from inside its namespace"]
async fn inside_small_filesystems() {
    assert!(
        std::env::var_os(INSIDE_ENV).is_some(),
        "{INSIDE_ENV} is not set: this test runs only inside the namespace its outer test makes"
    );
    let setup = Setup::new();
    let store_fs = setup.dir.path().join("store-fs");
    tmpfs(&store_fs, "16m");
    let store = format!("file:{}", store_fs.join("data").display());
    let (server, capi) = setup.serve(&store, &[]);
    let sandbox = Sandbox::create(&setup.dir.path().join(FIRST), "v1.33.4", true).unwrap();
    let state_dir = sandbox.state_dir.clone();
    tmpfs(&state_dir, "1m");
    let agent = AgentProcess::start(
        &server,
        &setup.certs.paths.ca_cert,
        &setup.token_file,
        FIRST,
        sandbox,
    );

    // The agent's state dir fills while `kubeadm upgrade apply` runs (held by its gate).
    agent.sandbox.gate_kubeadm(true).unwrap();
    capi.kcp_judges(FIRST).await;
    let request = update_request("update-machine-kcp.json", FIRST);
    let started = Instant::now();
    while !agent
        .sandbox
        .calls()
        .iter()
        .any(|c| c.starts_with("kubeadm upgrade apply"))
    {
        assert!(started.elapsed() < SETTLE, "{:?}", agent.sandbox.calls());
        let outcome = capi.update_machine(&request).await;
        assert!(
            matches!(outcome, UpdateOutcome::InProgress { .. }),
            "{outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let filler = fill(&state_dir);
    agent.sandbox.gate_kubeadm(false).unwrap();
    let wanted = format!(" bytes free at {}", state_dir.display());
    let started = Instant::now();
    let named = loop {
        let outcome = capi.update_machine(&request).await;
        let UpdateOutcome::InProgress { message, .. } = &outcome else {
            panic!("{outcome:?}\n{}", agent.log())
        };
        if message.contains("state dir full: ") && message.contains(&wanted) {
            break message.clone();
        }
        assert!(
            started.elapsed() < SETTLE,
            "never named the disk: {message}\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("CAPI's message while the state dir is full: {named}");
    std::fs::remove_file(&filler).unwrap();
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(
        outcome,
        UpdateOutcome::Done,
        "{messages:?}\n{}",
        agent.log()
    );
    let log = agent.log();
    assert!(!log.contains("interrupted"), "{log}");
    assert_eq!(
        agent
            .sandbox
            .calls()
            .iter()
            .filter(|c| c.starts_with("kubeadm upgrade apply"))
            .count(),
        1,
        "the point of no return ran once"
    );

    // The store's disk fills: the hooks say why, the server stays ready, and recovers once there is room. redb
    // first reuses the pages its earlier commits freed inside its file: verdicts for new Machines are recorded
    // until a commit needs a page the disk no longer has.
    let filler = fill(&store_fs);
    let mut recorded = 0;
    let failure = loop {
        let name = format!("edge-01-control-plane-f{recorded:04}");
        let request = can_update_request("can-update-machine-kcp-version.json", &name);
        match capi.can_update_machine(&request).await {
            CapiDecision::InPlace => recorded += 1,
            CapiDecision::Error { message } => break message,
            other => panic!("{other:?}"),
        }
        assert!(
            recorded < MAX_VERDICTS_ON_A_FULL_DISK,
            "the store never ran out of room"
        );
    };
    eprintln!("after {recorded} verdicts on the full disk, CanUpdateMachine: {failure}");
    let second = can_update_request("can-update-machine-kcp-version.json", SECOND);
    for message in [failure, String::new()] {
        let message = if message.is_empty() {
            match capi.can_update_machine(&second).await {
                CapiDecision::Error { message } => message,
                other => panic!("{other:?}"),
            }
        } else {
            message
        };
        assert!(message.contains("No space left on device"), "{message}");
        assert!(!message.contains("restart"), "{message}");
    }
    let (status, body) = common::plain_get(server.health, "/readyz").unwrap();
    assert_eq!(status, 200, "{body}");
    std::fs::remove_file(&filler).unwrap();
    capi.kcp_judges(SECOND).await;
    let waiting = capi
        .update_machine(&update_request("update-machine-kcp.json", SECOND))
        .await;
    assert!(
        matches!(&waiting, UpdateOutcome::InProgress { message, .. } if message.starts_with("waiting for agent")),
        "{waiting:?}"
    );
    // Nothing stored was lost: the first Machine's update is still done.
    assert_eq!(capi.update_machine(&request).await, UpdateOutcome::Done);
    drop(agent);
    drop(server);
    for dir in [&state_dir, &store_fs] {
        let _ = Command::new("umount").arg(dir).output();
    }
    eprintln!("disk full end to end: passed");
}
