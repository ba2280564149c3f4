//! `sysextSwitch` with the real systemd-sysext, squashfs images from mksquashfs, loop devices and the
//! executor's state dir, run inside a private mount namespace so the host never sees a link or a merge:
//! the outer test builds the images and starts this test binary again under `unshare -m` (tmpfs on
//! `/run`, an overlay over `/etc` for `/etc/extensions`, the images bound on `/opt`, `/` made shared so
//! sysext's merge propagates back), where [`inside_a_mount_namespace`] runs plans on `--root /` with the
//! Flatcar layout, and an installKubelet whose kubelet the switch already merged is restarted while the Node (the
//! drain crate's fake API) still reports the old one. Needs root; skipped, saying why, only where the kernel
//! has no loop devices or squashfs.

use std::ops::ControlFlow;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use inplace_agent_api::{OnFailure, Plan, Step, StepAction};
use inplace_drain::fake::{FakeApiServer, FakeNode};
use tokio::time::Instant;

use super::rollback::{Host, file, files_step, rolled_back, run};
use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;
use crate::os::sysext::release::{node_architecture, parse_release};
use crate::shutdown::Shutdown;
use crate::state::LocalStepStatus;

/// The scenario directory, handed to the test binary inside the namespace.
const DIR_ENV: &str = "INPLACE_SYSEXT_TEST_DIR";
/// The merged program each image ships; it prints its version.
pub(super) const KUBELET: &str = "/usr/bin/inplace-sysext-test-kubelet";
pub(super) const LINK: &str = "/etc/extensions/kubernetes.raw";
/// The version whose image says `ID=not-this-os`.
const INCOMPATIBLE: &str = "v1.35.0";
/// Bound on the whole namespace run (a failure bound; it takes about two seconds).
const NAMESPACE_LIMIT: Duration = Duration::from_secs(120);

pub(super) fn image(version: &str) -> String {
    format!(
        "/opt/extensions/kubernetes/kubernetes-{version}-{}.raw",
        node_architecture()
    )
}

/// Why this machine cannot run the test at all (the kernel lacks what systemd-sysext needs).
fn kernel_lacks() -> Option<String> {
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (no loop device support)".to_owned());
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    for fs in ["squashfs", "overlay"] {
        if !filesystems.split_whitespace().any(|f| f == fs) {
            return Some(format!("the kernel lists no {fs} in /proc/filesystems"));
        }
    }
    None
}

fn build_image(dir: &Path, version: &str, release: &str) {
    let tree = dir.join(format!("tree-{version}"));
    let bin = tree.join("usr/bin");
    let meta = tree.join("usr/lib/extension-release.d");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(meta.join("extension-release.kubernetes"), release).unwrap();
    let program = bin.join("inplace-sysext-test-kubelet");
    std::fs::write(&program, format!("#!/bin/sh\necho Kubernetes {version}\n")).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let raw = dir.join(image(version).trim_start_matches('/'));
    std::fs::create_dir_all(raw.parent().unwrap()).unwrap();
    let out = Command::new("mksquashfs")
        .arg(&tree)
        .arg(&raw)
        .args(["-all-root", "-noappend", "-quiet", "-no-progress"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mksquashfs: {out:?}");
}

#[test]
fn sysext_switch_merges_upgrades_refuses_and_rolls_back_with_the_real_systemd_sysext() {
    if let Some(why) = kernel_lacks() {
        eprintln!("SKIPPED sysext test: {why}; systemd-sysext cannot merge images on this kernel");
        return;
    }
    assert_eq!(
        crate::fsutil::euid(),
        0,
        "this test needs root (a mount namespace and loop devices for systemd-sysext): run it as root, as \
         .ci/run does"
    );
    for (tool, package) in [
        ("systemd-sysext", "systemd"),
        ("mksquashfs", "squashfs-tools"),
        ("unsquashfs", "squashfs-tools"),
        ("unshare", "util-linux"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        assert!(
            found.status.success(),
            "{tool} is missing: install Debian's {package} (.ci/run does)"
        );
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let host = parse_release(&std::fs::read_to_string("/etc/os-release").unwrap());
    let matching = format!(
        "ID={}\nVERSION_ID={}\nARCHITECTURE={}\n",
        host["ID"],
        host.get("VERSION_ID").map_or("", String::as_str),
        node_architecture()
    );
    build_image(dir, "v1.33.4", &matching);
    build_image(dir, "v1.34.1", &matching);
    build_image(dir, INCOMPATIBLE, "ID=not-this-os\nVERSION_ID=1\n");
    std::fs::create_dir(dir.join("ov")).unwrap();
    let etc_extensions_before = Path::new("/etc/extensions").exists();

    let script = r#"set -eu
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs "$INPLACE_SYSEXT_TEST_DIR/ov"
mkdir "$INPLACE_SYSEXT_TEST_DIR/ov/upper" "$INPLACE_SYSEXT_TEST_DIR/ov/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$INPLACE_SYSEXT_TEST_DIR/ov/upper,workdir=$INPLACE_SYSEXT_TEST_DIR/ov/work" /etc
mount --bind "$INPLACE_SYSEXT_TEST_DIR/opt" /opt
mount --make-rshared /
exec "$0" --exact tests::sysext::inside_a_mount_namespace --ignored --nocapture --test-threads=1"#;
    let started = std::time::Instant::now();
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(std::env::current_exe().unwrap())
        .env(DIR_ENV, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::thread::spawn(move || {
        let out = child.wait_with_output();
        out.unwrap()
    });
    let deadline = std::time::Instant::now() + NAMESPACE_LIMIT;
    while !waited.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
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
    assert!(
        shown.contains("sysext scenarios passed"),
        "the inner test did not run:\n{shown}"
    );
    eprintln!(
        "sysext namespace run: {:?}\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !Path::new(KUBELET).exists(),
        "the host's /usr was merged into"
    );
    assert_eq!(
        Path::new("/etc/extensions").exists(),
        etc_extensions_before,
        "the host's /etc changed"
    );
}

/// Completes once the blocking refresh stand-in has started (a failure bound of 30 s).
async fn blocked(marker: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the refresh never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What `/usr/bin/inplace-sysext-test-kubelet` prints (`None`: nothing merged provides it).
pub(super) fn merged_kubelet() -> Option<String> {
    let out = Command::new(KUBELET).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub(super) fn link() -> Option<String> {
    std::fs::read_link(LINK)
        .ok()
        .map(|t| t.display().to_string())
}

/// The agent config of the scenarios; its `kubernetes:` map comes last, so a caller may append keys to it.
pub(super) fn config(command: &str, extensions_dir: &str) -> String {
    format!(
        r#"
sysext:
  command: [{command}]
  extensionsDir: {extensions_dir}
kubernetes:
  installKubeadm:
    record:
      - name: previousKubernetes
        run: [readlink, "{{{{root}}}}/etc/extensions/kubernetes.raw"]
        absentOnExit: [1]
    commands:
      - sysextSwitch: {{name: kubernetes, image: "/opt/extensions/kubernetes/kubernetes-{{{{version}}}}-{arch}.raw"}}
    undo:
      commands:
        - sysextSwitch: {{name: kubernetes, image: "{{{{record.previousKubernetes}}}}"}}
"#,
        arch = node_architecture()
    )
}

fn env(dir: &Path, state: &str, command: &str) -> Arc<DriverEnv> {
    env_in(dir, state, command, "/etc/extensions")
}

fn env_in(dir: &Path, state: &str, command: &str, extensions_dir: &str) -> Arc<DriverEnv> {
    let config = DriverConfig::from_yaml(&config(command, extensions_dir)).unwrap();
    Arc::new(DriverEnv::new(PathBuf::from("/"), config, dir.join(state)))
}

/// `installKubeadm version`, then (when `fail_after`) a files step that fails: the rollback undoes both.
fn plan(id: &str, version: &str, fail_after: bool) -> Plan {
    let mut steps = vec![Step {
        index: 0,
        description: format!("install kubeadm {version}"),
        timeout_seconds: 60,
        action: StepAction::InstallKubeadm {
            version: version.to_owned(),
        },
    }];
    if fail_after {
        steps.push(files_step(
            1,
            vec![file("/etc/inplace-sysext-test-blocked", "never\n")],
        ));
    }
    Plan {
        id: id.to_owned(),
        machine: inplace_agent_api::MachineRef::new("default", "m"),
        cluster: "c".into(),
        steps,
        control_plane: false,
    }
}

async fn first_step(host: &mut Host) {
    let mut shutdown: Shutdown = Box::pin(std::future::pending());
    let flow = crate::run::executor::run_step(host, 0, &mut shutdown).await;
    assert_eq!(flow, ControlFlow::Continue(()));
}

/// Step 0's message, once it ended `status`.
fn assert_step(host: &Host, status: LocalStepStatus) -> String {
    let step = &host.store.state.current.as_ref().unwrap().steps[0];
    let message = step.message.clone().unwrap_or_default();
    assert_eq!(step.status, status, "{message}");
    message
}

/// The scenarios, in one namespace, each starting where the one before ended.
#[tokio::test]
#[ignore = "run by sysext_switch_merges_upgrades_refuses_and_rolls_back_with_the_real_systemd_sysext inside its namespace"]
async fn inside_a_mount_namespace() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        eprintln!(
            "{DIR_ENV} is not set: this test runs only inside the namespace its outer test sets up"
        );
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir("/etc/extensions").unwrap();
    std::fs::create_dir("/etc/inplace-sysext-test-blocked").unwrap();
    assert_eq!(merged_kubelet(), None);
    let sysext = "systemd-sysext";

    // 1. No extension yet: the record is empty; the rollback of a failed plan removes the link again.
    let mut host = Host::open(&dir.join("s1"), env(&dir, "s1", sysext));
    host.store.adopt(plan("p1", "v1.33.4", true)).unwrap();
    let t = Instant::now();
    first_step(&mut host).await;
    eprintln!("fresh switch + refresh + verify: {:?}", t.elapsed());
    assert_step(&host, LocalStepStatus::Succeeded);
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));
    assert_eq!(link(), Some(image("v1.33.4")));
    run(&mut host, None).await;
    rolled_back(&host);
    assert_eq!(link(), None, "the undo of an empty record removes the link");
    assert_eq!(merged_kubelet(), None, "and unmerges the extension");

    // 2. Install v1.33.4 for good.
    let mut host = Host::open(&dir.join("s2"), env(&dir, "s2", sysext));
    host.store.adopt(plan("p2", "v1.33.4", false)).unwrap();
    run(&mut host, None).await;
    assert_step(&host, LocalStepStatus::Succeeded);
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    // 3. v1.33.4 → v1.34.1, then a later step fails: the undo switches back to the recorded link.
    let mut host = Host::open(&dir.join("s3"), env(&dir, "s3", sysext));
    host.store.adopt(plan("p3", "v1.34.1", true)).unwrap();
    let t = Instant::now();
    first_step(&mut host).await;
    eprintln!("switch v1.33.4 → v1.34.1: {:?}", t.elapsed());
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.34.1"));
    assert_eq!(link(), Some(image("v1.34.1")));
    run(&mut host, None).await;
    rolled_back(&host);
    assert_eq!(link(), Some(image("v1.33.4")));
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    // 4. An image for another OS is refused before the link moves: v1.33.4 stays merged.
    let mut host = Host::open(&dir.join("s4"), env(&dir, "s4", sysext));
    host.store.adopt(plan("p4", INCOMPATIBLE, false)).unwrap();
    first_step(&mut host).await;
    let message = assert_step(&host, LocalStepStatus::Failed);
    let expected = format!(
        "image {} is not compatible with this node (ID is \"not-this-os\" in the extension, {:?} on this node)",
        image(INCOMPATIBLE),
        parse_release(&std::fs::read_to_string("/etc/os-release").unwrap())["ID"]
    );
    assert!(message.contains(&expected), "{message}");
    assert_eq!(link(), Some(image("v1.33.4")), "the link never moved");
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));
    run(&mut host, None).await;
    rolled_back(&host);
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    // 5. Killed between the link switch and the refresh: the resumed step converges to v1.34.1 merged.
    let blocking = dir.join("sysext-blocks-refresh");
    let marker = dir.join("refresh-blocked");
    std::fs::write(
        &blocking,
        format!(
            "#!/bin/sh\nif [ \"$1\" = refresh ]; then touch {}; exec sleep 600; fi\nexec systemd-sysext \"$@\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&blocking, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut host = Host::open(
        &dir.join("s5"),
        env(&dir, "s5", &blocking.display().to_string()),
    );
    host.store.adopt(plan("p5", "v1.34.1", false)).unwrap();
    let killed = tokio::select! {
        () = first_step(&mut host) => false,
        () = blocked(&marker) => true,
    };
    assert!(killed, "the step ended before its refresh");
    // The agent dies here: the step's future (and the blocked refresh's process group) is dropped.
    drop(host);
    assert_eq!(link(), Some(image("v1.34.1")), "the link was switched");
    assert_eq!(
        merged_kubelet().as_deref(),
        Some("Kubernetes v1.33.4"),
        "but not refreshed"
    );
    let mut host = Host::open(&dir.join("s5"), env(&dir, "s5", sysext));
    run(&mut host, None).await;
    let record = &host.store.state.current.as_ref().unwrap().steps[0];
    assert_eq!(
        record.status,
        LocalStepStatus::Succeeded,
        "{:?}",
        record.message
    );
    assert_eq!(record.attempt, 2, "the step resumed");
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.34.1"));
    assert_eq!(link(), Some(image("v1.34.1")));

    // 5b. A clean shutdown (SIGTERM) during the refresh of v1.34.1 → v1.33.4: the refresh's process group is
    // stopped, the step goes back to pending (not failed, the link not put back), and runs again at the next
    // start to v1.33.4 merged.
    std::fs::remove_file(&marker).unwrap();
    let mut host = Host::open(
        &dir.join("s5b"),
        env(&dir, "s5b", &blocking.display().to_string()),
    );
    host.store.adopt(plan("p5b", "v1.33.4", false)).unwrap();
    let marker_seen = marker.clone();
    let mut shutdown: Shutdown = Box::pin(async move { blocked(&marker_seen).await });
    let flow = crate::run::executor::run_step(&mut host, 0, &mut shutdown).await;
    assert_eq!(flow, ControlFlow::Break(()));
    assert_step(&host, LocalStepStatus::Pending);
    assert_eq!(link(), Some(image("v1.33.4")), "the link stays switched");
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.34.1"));
    drop(host);
    let mut host = Host::open(&dir.join("s5b"), env(&dir, "s5b", sysext));
    run(&mut host, None).await;
    assert_step(&host, LocalStepStatus::Succeeded);
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    // 6. A link that systemd-sysext does not use (an extension of the same name in /etc/extensions, which
    // it prefers to /run/extensions) fails the verification: the new link is removed again.
    let mut host = Host::open(
        &dir.join("s6"),
        env_in(&dir, "s6", sysext, "/run/extensions"),
    );
    host.store.adopt(plan("p6", "v1.34.1", false)).unwrap();
    host.store.state.current.as_mut().unwrap().on_failure = Some(OnFailure::Hold);
    first_step(&mut host).await;
    let message = assert_step(&host, LocalStepStatus::Failed);
    assert!(
        message.contains(
            "kubernetes is merged from /etc/extensions/kubernetes.raw, not from /run/extensions/kubernetes.raw"
        ) && message.contains("/run/extensions/kubernetes.raw removed again, refreshed"),
        "{message}"
    );
    assert!(!Path::new("/run/extensions/kubernetes.raw").exists());
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.33.4"));

    // 7. A regular file where the link goes is the operator's: refused, left alone, nothing refreshed.
    std::fs::remove_file(LINK).unwrap();
    std::fs::copy(dir.join(image("v1.34.1").trim_start_matches('/')), LINK).unwrap();
    let mut host = Host::open(&dir.join("s7"), env(&dir, "s7", sysext));
    host.store.adopt(plan("p7", "v1.34.1", false)).unwrap();
    host.store.state.current.as_mut().unwrap().on_failure = Some(OnFailure::Hold);
    first_step(&mut host).await;
    let message = assert_step(&host, LocalStepStatus::Failed);
    assert!(
        message.contains("/etc/extensions/kubernetes.raw is not a symlink"),
        "{message}"
    );
    assert!(std::fs::symlink_metadata(LINK).unwrap().is_file());
    assert_eq!(
        merged_kubelet().as_deref(),
        Some("Kubernetes v1.33.4"),
        "no refresh ran (it would have merged the file's v1.34.1)"
    );
    // 8. The kubelet comes in the same image (installKubeadm switches it): installKubelet restarts it while
    // the Node still reports the old one, although the merged file already says the new version (issue 43).
    std::fs::remove_file(LINK).unwrap();
    let api = FakeApiServer::start(FakeNode {
        kubelet_version: "v1.33.4".into(),
        ..FakeNode::new("n1")
    })
    .unwrap();
    let kubeconfig = dir.join("kubelet.conf");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let restarts = dir.join("restarts.log");
    let systemctl = dir.join("systemctl");
    std::fs::write(
        &systemctl,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", restarts.display()),
    )
    .unwrap();
    std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubelet_env = |state: &str| {
        let yaml = format!(
            "{}{}",
            config(sysext, "/etc/extensions"),
            kubelet_config(&systemctl, &kubeconfig)
        );
        let config = DriverConfig::from_yaml(&yaml).unwrap();
        Arc::new(DriverEnv::new(PathBuf::from("/"), config, dir.join(state)))
    };
    let mut host = Host::open(&dir.join("s8"), kubelet_env("s8"));
    host.store.adopt(kubelet_plan("p8", true)).unwrap();
    run(&mut host, None).await;
    assert_eq!(merged_kubelet().as_deref(), Some("Kubernetes v1.34.1"));
    let record = host.store.state.current.as_ref().unwrap();
    let kubelet = &record.steps[1];
    assert_eq!(
        kubelet.status,
        LocalStepStatus::Succeeded,
        "{:?}",
        kubelet.message
    );
    assert!(!kubelet.passed_over, "{:?}", kubelet.message);
    assert_eq!(
        std::fs::read_to_string(&restarts).unwrap_or_default(),
        "restart kubelet\n",
        "the running kubelet (the Node's v1.33.4) is restarted on the merged v1.34.1"
    );
    // The restarted kubelet reports the new version: the next plan's installKubelet is passed over.
    api.set_kubelet_version("v1.34.1");
    let mut host = Host::open(&dir.join("s8b"), kubelet_env("s8b"));
    host.store.adopt(kubelet_plan("p8b", false)).unwrap();
    run(&mut host, None).await;
    let kubelet = &host.store.state.current.as_ref().unwrap().steps[0];
    assert!(kubelet.passed_over, "{:?}", kubelet.message);
    assert_eq!(
        kubelet.message.as_deref(),
        Some("already done for v1.34.1: skipIf check passed and the Node reports kubelet v1.34.1")
    );
    assert_eq!(
        std::fs::read_to_string(&restarts).unwrap(),
        "restart kubelet\n",
        "no second restart"
    );

    // 9. A failure after `kubeadm upgrade node`: the rollback stops there (tests/sysext_no_return.rs).
    super::sysext_no_return::a_rollback_stopped_at_the_point_of_no_return(&dir).await;
    println!("sysext scenarios passed");
}

/// `installKubelet` as `config-examples/sysext.yaml` has it (its skipIf reads the merged binary; restarting
/// is the whole step), the restart through `systemctl` (a stand-in that logs), and the node API.
fn kubelet_config(systemctl: &Path, kubeconfig: &Path) -> String {
    format!(
        r#"  installKubelet:
    skipIf: {{run: [{KUBELET}, --version], stdoutEquals: "Kubernetes {{{{version}}}}"}}
    commands:
      - run: [{systemctl}, restart, kubelet]
    undo:
      commands:
        - run: [{systemctl}, restart, kubelet]
node:
  kubeconfig: {kubeconfig}
  name: n1
  pollIntervalMillis: 50
"#,
        systemctl = systemctl.display(),
        kubeconfig = kubeconfig.display()
    )
}

/// `installKubeadm v1.34.1` (when `switch`), then `installKubelet v1.34.1`.
fn kubelet_plan(id: &str, switch: bool) -> Plan {
    let mut plan = plan(id, "v1.34.1", false);
    if !switch {
        plan.steps.clear();
    }
    plan.steps.push(Step {
        index: plan.steps.len() as u32,
        description: "install kubelet and kubectl v1.34.1, restart kubelet".into(),
        timeout_seconds: 60,
        action: StepAction::InstallKubelet {
            version: "v1.34.1".into(),
        },
    });
    plan
}

/// The Flatcar example (crates/agent/config-examples/sysext.yaml) fetches the version's image by digest, then
/// switches it with `sysextSwitch`, and refreshes the way Flatcar's systemd 252 wants it.
#[test]
fn the_flatcar_example_fetches_then_switches() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config-examples/sysext.yaml");
    let config = DriverConfig::load(std::path::Path::new(path)).unwrap();
    let install = config.kubernetes.install_kubeadm.unwrap();
    let specs: Vec<&crate::config::CommandSpec> =
        install.commands.iter().map(|c| &c.spec).collect();
    let fetch = specs
        .iter()
        .position(|s| matches!(s, crate::config::CommandSpec::Fetch { source, .. } if source == "{{pin.kubernetesSysext}}"))
        .unwrap();
    let switch = specs
        .iter()
        .position(|s| matches!(s, crate::config::CommandSpec::SysextSwitch { name, .. } if name == "kubernetes"))
        .unwrap();
    assert!(fetch < switch, "the image is fetched before the link moves");
    assert_eq!(
        config.sysext.refresh.unwrap(),
        ["systemctl", "restart", "systemd-sysext", "ensure-sysext"]
    );
}

/// What loading a config says about a bad `sysextSwitch` or `sysext:` entry.
#[test]
fn bad_sysext_entries_fail_at_load_naming_the_key() {
    let cases = [
        (
            "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: ../k, image: /opt/k.raw}}]\n",
            "kubernetes.installKubeadm: commands[0]: sysextSwitch name \"../k\" is not an extension name",
        ),
        (
            "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: k, image: opt/k.raw}}]\n",
            "kubernetes.installKubeadm: commands[0]: \"opt/k.raw\" is not an absolute node path",
        ),
        (
            "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: k, image: \"/opt/{{record.x}}\"}}]\n",
            "`record.` values exist only in `undo:` commands",
        ),
        (
            "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: k, image: /k.raw}, run: [x]}]\n",
            "a command needs exactly one of `run`, `writeFile`, `verifySha256`, `fetch`, `sysextSwitch`",
        ),
        (
            "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: k}}]\n",
            "missing field `image`",
        ),
        (
            "sysext: {command: []}\n",
            "sysext.command: argv needs a program",
        ),
        (
            "sysext: {refresh: [systemctl, \"{{version}}\"]}\n",
            "sysext.refresh: unknown variable {{version}}",
        ),
        (
            "sysext: {extensionsDir: etc/extensions}\n",
            "sysext.extensionsDir: \"etc/extensions\" is not an absolute node path",
        ),
    ];
    for (yaml, expected) in cases {
        let error = DriverConfig::from_yaml(yaml).unwrap_err().to_string();
        assert!(error.contains(expected), "{yaml}\n{error}");
    }
    // An empty image is the undo of "there was no extension": it removes the link.
    let ok = "kubernetes:\n  installKubeadm:\n    commands: [{sysextSwitch: {name: kubernetes, image: \"\"}}]\n";
    assert!(DriverConfig::from_yaml(ok).is_ok());
}
