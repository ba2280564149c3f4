//! A sysext node's rollback that stops at the point of no return (issue 43, 11b), run inside the namespace of
//! `tests::sysext` with the real systemd-sysext: installKubeadm switches the Kubernetes image (kubeadm, kubelet
//! and kubectl in one image, as `config-examples/sysext.yaml` ships it), `kubeadm upgrade node` succeeds, and the
//! kubelet restart of installKubelet fails. The rollback undoes installKubelet only (a restart: the kubelet then
//! runs the new image's binary) and stops at the upgrade, so the switched image stays merged: the verification
//! must not wait for the kubelet version before the plan, which cannot come back, and ends at once saying why.
//!
//! The node's API is the drain crate's fake; its kubelet version is what the stand-in `systemctl restart
//! kubelet` last started: the merged kubelet's `--version`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{KubeadmUpgradeMode, MachineRef, Plan, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};
use tokio::time::Instant;

use super::rollback::{Host, rolled_back, run};
use super::sysext::{LINK, image, link, merged_kubelet};
use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;
use crate::state::LocalStepStatus;

/// The verification borrows this timeout from the plan's waitNodeReady step: before the fix it waited it out.
const WAIT_READY_SECONDS: u32 = 10;

fn stand_in(path: &Path, script: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The namespace run's installKubeadm (the shipped example's, the image local), then `kubeadm upgrade node` and
/// installKubelet as the example has them, with `kubeadm` and `systemctl` stood in for by scripts in `dir`.
fn config(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        r#"{}  kubeadmUpgradeNode:
    commands:
      - run: [{dir}/kubeadm, upgrade, node]
  installKubelet:
    commands:
      - run: [{dir}/systemctl, restart, kubelet]
    undo:
      commands:
        - run: [{dir}/systemctl, restart, kubelet]
node:
  kubeconfig: /etc/kubernetes/kubelet.conf
  name: n1
  pollIntervalMillis: 50
"#,
        super::sysext::config("systemd-sysext", "/etc/extensions")
    )
}

fn plan() -> Plan {
    let step = |index: u32, description: &str, action: StepAction, timeout_seconds: u32| Step {
        index,
        description: description.to_owned(),
        timeout_seconds,
        action,
    };
    let version = "v1.34.1".to_owned();
    Plan {
        id: "p8".into(),
        machine: MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps: vec![
            step(
                0,
                "install kubeadm v1.34.1",
                StepAction::InstallKubeadm {
                    version: version.clone(),
                },
                60,
            ),
            step(
                1,
                "kubeadm upgrade node [point of no return]",
                StepAction::KubeadmUpgrade {
                    version: version.clone(),
                    mode: KubeadmUpgradeMode::Node,
                },
                60,
            ),
            step(
                2,
                "install kubelet v1.34.1",
                StepAction::InstallKubelet {
                    version: version.clone(),
                },
                60,
            ),
            step(
                3,
                "wait for the node",
                StepAction::WaitNodeReady {
                    kubelet_version: Some(version),
                },
                WAIT_READY_SECONDS,
            ),
        ],
        control_plane: false,
    }
}

/// Scenario 8, the last of the namespace run.
pub(super) async fn a_rollback_stopped_at_the_point_of_no_return(dir: &Path) {
    // The scenarios before left the link switched: v1.33.4 linked and merged again, as before a plan.
    std::fs::remove_file(LINK).unwrap();
    std::os::unix::fs::symlink(image("v1.33.4"), LINK).unwrap();
    let refresh = Command::new("systemd-sysext")
        .arg("refresh")
        .output()
        .unwrap();
    assert!(refresh.status.success(), "{refresh:?}");
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    let running = dir.join("kubelet-running");
    std::fs::write(&running, "v1.33.4\n").unwrap();
    let fail_once = dir.join("fail-kubelet-restart");
    std::fs::write(&fail_once, "").unwrap();
    stand_in(&dir.join("kubeadm"), "echo \"[upgrade] upgrade node done\"");
    stand_in(
        &dir.join("systemctl"),
        &format!(
            "if [ -e {fail} ]; then rm {fail}; echo 'Job for kubelet.service failed' >&2; exit 1; fi\n\
             {kubelet} | sed 's/^Kubernetes //' > {running}",
            fail = fail_once.display(),
            kubelet = super::sysext::KUBELET,
            running = running.display()
        ),
    );
    let api = FakeApiServer::start(FakeNode {
        kubelet_version: "v1.33.4".into(),
        kubelet_version_file: Some(running.clone()),
        ..FakeNode::new("n1")
    })
    .unwrap();
    api.write_kubeconfig(Path::new("/etc/kubernetes/kubelet.conf"))
        .unwrap();
    let config = DriverConfig::from_yaml(&config(dir)).unwrap();
    let env = Arc::new(DriverEnv::new("/".into(), config, dir.join("s9")));
    let mut host = Host::open(&dir.join("s9"), env);
    host.store.adopt(plan()).unwrap();

    let started = Instant::now();
    run(&mut host, None).await;
    let took = started.elapsed();
    eprintln!("rollback stopped at the point of no return: {took:?}");
    let record = host.store.state.current.as_ref().unwrap();
    let statuses: Vec<LocalStepStatus> = record.steps.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses[..3],
        [
            LocalStepStatus::Succeeded,
            LocalStepStatus::Succeeded,
            LocalStepStatus::Failed
        ],
        "{:?}",
        record.steps
    );
    let rollback = rolled_back(&host);
    assert_eq!((rollback.failed_step, rollback.undone), (2, 1));
    assert!(
        rollback.message.starts_with(
            "node n1 is Ready (kubelet v1.34.1) (the rollback stopped at step 2 (kubeadm upgrade node \
             [point of no return]), a point of no return: the steps up to it stay done, so the kubelet \
             version before the plan, v1.33.4, is not expected back)"
        ),
        "{}",
        rollback.message
    );
    assert!(
        took < Duration::from_secs(u64::from(WAIT_READY_SECONDS)),
        "the verification answered at once, not after its timeout: {took:?}"
    );
    // What the rollback could not undo stays: the new image is linked and merged, its kubelet runs.
    assert_eq!(link(), Some(image("v1.34.1")));
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.34.1"));
    assert_eq!(std::fs::read_to_string(&running).unwrap().trim(), "v1.34.1");
}
