//! One sandboxed node per case of tests/integration/e2e_resume.rs: a `--root` holding the stand-ins for one shipped agent
//! config, that config's text with only `path:` (pointed into the root) and the pins (digests of what the curl
//! stand-in downloads) rewritten, and a real `inplace-updater agent` process that can be SIGKILLed together with
//! its command's process group, SIGTERMed, and started again on the same state dir.

pub mod expect;
pub mod standins;

use std::path::{Path, PathBuf};
use std::time::Duration;

use inplace_agent::DriverConfig;
use sha2::Digest as _;
use standins::World;

/// The version the nodes start at.
pub const FROM: &str = "v1.33.4";
/// The version the fixtures' Machines ask for.
pub const TO: &str = "v1.34.1";

/// One shipped agent config.
pub struct Shipped {
    /// Path in the repository.
    pub file: &'static str,
    pub text: String,
    pub world: World,
    pub config: DriverConfig,
}

impl Shipped {
    /// Every agent config the project ships.
    pub fn all() -> Vec<Shipped> {
        [
            ("deploy/node/agent.yaml", World::Apt),
            ("crates/agent/config-examples/apt.yaml", World::Apt),
            ("crates/agent/config-examples/dnf.yaml", World::Dnf),
            (
                "crates/agent/config-examples/release-binaries.yaml",
                World::Release,
            ),
        ]
        .into_iter()
        .map(|(file, world)| {
            let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
                .expect("shipped config");
            let config = DriverConfig::from_yaml(&text).expect("shipped config parses");
            Shipped {
                file,
                text,
                world,
                config,
            }
        })
        .collect()
    }

    /// The config text for a sandbox: every `path:` directory moved under `{{root}}`, pins replaced by the
    /// digests of the stand-in downloads, and `controlPlane.checkEtcd: false` (the sandbox's etcd manifest runs
    /// no member). Nothing else changes.
    pub fn for_sandbox(&self) -> String {
        let dirs: Vec<String> = self
            .config
            .path
            .iter()
            .map(|dir| format!("\"{{{{root}}}}{dir}\""))
            .collect();
        let mut replaced = 0;
        let mut lines: Vec<String> = self
            .text
            .lines()
            .map(|line| {
                if line.starts_with("path:") {
                    replaced += 1;
                    format!("path: [{}]", dirs.join(", "))
                } else {
                    line.to_string()
                }
            })
            .collect();
        assert_eq!(replaced, 1, "{}: one top-level path: line", self.file);
        let control_plane = lines
            .iter()
            .position(|line| line == "controlPlane:")
            .unwrap_or_else(|| panic!("{}: a top-level controlPlane: section", self.file));
        lines.insert(control_plane + 1, "  checkEtcd: false".to_owned());
        for tool in ["kubeadm", "kubelet", "kubectl"] {
            let key = format!("{tool}Sha256:");
            let digest = hex(&sha2::Sha256::digest(standins::release_binary(tool, TO)));
            for line in lines
                .iter_mut()
                .filter(|l| l.trim_start().starts_with(&key))
            {
                let indent = &line[..line.len() - line.trim_start().len()];
                *line = format!("{indent}{key} \"{digest}\"");
            }
        }
        lines.join("\n") + "\n"
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A sandboxed node and its agent process.
pub struct Node {
    pub root: PathBuf,
    pub state: PathBuf,
    /// The agent's `PATH` (what the stand-ins see).
    pub path_env: String,
    log: PathBuf,
    args: Vec<String>,
    agent: Option<tokio::process::Child>,
    /// The node's Kubernetes API (the TLS fake) the shipped config's `node:` section reaches through
    /// `/etc/kubernetes/kubelet.conf`; its kubelet version is the stand-in's running kubelet.
    pub kube: inplace_drain::fake::FakeApiServer,
}

fn write(path: &Path, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

impl Node {
    /// Lays out a node at `dir` (control plane or worker) for `shipped`, agent not started yet.
    pub fn create(
        dir: &Path,
        shipped: &Shipped,
        server: &str,
        ca: &Path,
        token_file: &Path,
        machine: &str,
    ) -> Node {
        let root = dir.join("root");
        let put = |node_path: &str, text: &str, mode: u32| {
            write(&root.join(node_path.trim_start_matches('/')), text, mode)
        };
        put("/var/lib/standin/lib.sh", standins::LIB, 0o644);
        for (path, script) in standins::tools(shipped.world, FROM) {
            put(&path, &script, 0o755);
        }
        for tool in ["kubeadm", "kubelet", "kubectl"] {
            put(
                &format!("/var/lib/standin/pkg-{tool}"),
                &format!("{FROM}\n"),
                0o644,
            );
            put(
                &format!("/var/lib/standin/dist/{tool}-{TO}"),
                &standins::release_binary(tool, TO),
                0o644,
            );
        }
        put(
            "/var/lib/standin/kubelet-running",
            &format!("{FROM}\n"),
            0o644,
        );
        put(
            "/proc/sys/kernel/random/boot_id",
            "0b5c6c5e-1111-2222-3333-444455556666\n",
            0o644,
        );
        put("/proc/sys/kernel/hostname", &format!("{machine}\n"), 0o644);
        put(
            "/etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\ncapi:x:1000:1000:capi:/home/capi:/bin/sh\n",
            0o644,
        );
        put(
            "/var/lib/kubelet/kubeadm-flags.env",
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n",
            0o644,
        );
        put(
            "/etc/kubernetes/manifests/etcd.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\nspec:\n  containers:\n  - name: etcd\n    image: registry.k8s.io/etcd:3.5.16-0\n",
            0o600,
        );
        put("/calls.log", "", 0o644);
        let kube = inplace_drain::fake::FakeApiServer::start(inplace_drain::fake::FakeNode {
            kubelet_version: FROM.to_owned(),
            kubelet_version_file: Some(root.join("var/lib/standin/kubelet-running")),
            ..inplace_drain::fake::FakeNode::new(machine)
        })
        .expect("fake API server");
        kube.write_kubeconfig(&root.join("etc/kubernetes/kubelet.conf"))
            .expect("kubeconfig");
        let config = dir.join("agent.yaml");
        write(&config, &shipped.for_sandbox(), 0o644);
        let state = dir.join("state");
        let root_text = root.display().to_string();
        let path_env = shipped
            .config
            .path
            .iter()
            .map(|d| format!("{root_text}{d}"))
            .collect::<Vec<_>>()
            .join(":");
        let args = [
            "agent",
            "--server",
            server,
            "--ca-file",
            &ca.display().to_string(),
            "--token-file",
            &token_file.display().to_string(),
            "--machine",
            &format!("default/{machine}"),
            "--config",
            &config.display().to_string(),
            "--state-dir",
            &state.display().to_string(),
            "--root",
            &root_text,
        ]
        .map(String::from)
        .to_vec();
        Node {
            root,
            state,
            path_env,
            log: dir.join("agent.log"),
            args,
            agent: None,
            kube,
        }
    }

    /// A file under the root.
    pub fn path(&self, node_path: &str) -> PathBuf {
        self.root.join(node_path.trim_start_matches('/'))
    }

    /// Starts the agent (its output appended to `agent.log`).
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let child = tokio::process::Command::new(super::common::binary())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn agent");
        self.agent = Some(child);
    }

    /// SIGKILL to the agent, then to the process group of the command it was running (`blocked.pid`), as a
    /// crash, an OOM kill or the end of systemd's stop timeout would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.agent.take() {
            child.kill().await.expect("kill agent");
        }
        self.kill_blocked_command();
    }

    fn kill_blocked_command(&self) {
        let pid = std::fs::read_to_string(self.path("/blocked.pid")).unwrap_or_default();
        if let Some(group) = pid
            .trim()
            .parse()
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            // ESRCH: the group is already gone.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }

    /// SIGTERM to the agent only (systemd's `KillMode=mixed` stop); waits for it to exit, then SIGKILLs what
    /// is left of the command's group, as systemd does at the end of the stop.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.agent.take().expect("agent running");
        let pid = child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32));
        rustix::process::kill_process(pid.expect("pid"), rustix::process::Signal::TERM)
            .expect("SIGTERM");
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("the agent exits after SIGTERM")
            .expect("wait");
        self.kill_blocked_command();
        status
    }

    /// A simulated reboot: the kubelet service comes back with whatever is installed.
    pub fn reboot(&self) {
        let status = std::process::Command::new("/bin/sh")
            .args(["-c", standins::REBOOT])
            .env_clear()
            .env("PATH", &self.path_env)
            .env("INPLACE_ROOT", &self.root)
            .status()
            .expect("reboot");
        assert!(status.success());
    }

    /// The stand-ins' log.
    pub fn calls(&self) -> String {
        std::fs::read_to_string(self.path("/calls.log")).unwrap_or_default()
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A stand-in state file (`var/lib/standin/<name>`), trimmed; `None` when absent.
    pub fn standin(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.path(&format!("/var/lib/standin/{name}")))
            .ok()
            .map(|s| s.trim().to_string())
    }
}
