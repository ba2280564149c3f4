//! A node in a directory: the `--root` sandbox the demo and the end-to-end tests give each agent. Its `bin/`
//! holds stand-ins for `kubeadm`, `kubelet`, `apt-get` and `systemctl` that record their arguments in
//! `calls.log` and keep the "installed" versions in files, so an upgrade really changes what the next
//! `kubeadm version` prints. A reboot is faked too: the node has a boot id, `systemctl reboot` only records the
//! request, and [`Sandbox::boot`] is the machine coming back (a new boot id, the default `bootc` entry booted)
//! while its owner restarts the agent — a restart without it is not a reboot. Each sandbox also gets the node's Kubernetes API as an in-process fake
//! (`inplace_drain::fake`, real TLS), so the agent's drain, readiness wait and uncordon steps run for real
//! against documented API answers. Nothing here touches the real machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inplace_drain::fake::{FakeApiServer, FakeNode};

/// The fake tools. Each appends its argv to `$INPLACE_ROOT/calls.log`.
const KUBEADM: &str = r#"#!/bin/sh
echo "kubeadm $*" >> "$INPLACE_ROOT/calls.log"
case "$1" in
  version) cat "$INPLACE_ROOT/var/lib/fake/kubeadm-version" ;;
  upgrade)
    if [ -e "$INPLACE_ROOT/pace" ]; then sleep "$(cat "$INPLACE_ROOT/pace")"; fi
    if [ -e "$INPLACE_ROOT/slow-kubeadm" ]; then sleep 5; fi
    while [ -e "$INPLACE_ROOT/gate-kubeadm" ]; do sleep 0.05; done
    if [ -e "$INPLACE_ROOT/fail-kubeadm" ]; then
      echo "[preflight] Running pre-flight checks." >&2
      echo "[ERROR CoreDNSUnsupportedPlugins]: fake failure injected by the test" >&2
      exit 1
    fi
    echo "[upgrade] upgrade $2 done" ;;
esac
"#;

const KUBELET: &str = r#"#!/bin/sh
echo "kubelet $*" >> "$INPLACE_ROOT/calls.log"
echo "Kubernetes $(cat "$INPLACE_ROOT/var/lib/fake/kubelet-version")"
"#;

const APT_GET: &str = r#"#!/bin/sh
echo "apt-get $*" >> "$INPLACE_ROOT/calls.log"
case "$*" in
  *--allow-downgrades*) while [ -e "$INPLACE_ROOT/gate-undo" ]; do sleep 0.05; done ;;
esac
if [ -e "$INPLACE_ROOT/pace" ]; then sleep "$(cat "$INPLACE_ROOT/pace")"; fi
for arg in "$@"; do
  case "$arg" in
    kubeadm=*) v="${arg#kubeadm=}"; echo "v${v%%-*}" > "$INPLACE_ROOT/var/lib/fake/kubeadm-version" ;;
    kubelet=*) v="${arg#kubelet=}"; echo "v${v%%-*}" > "$INPLACE_ROOT/var/lib/fake/kubelet-version" ;;
  esac
done
"#;

/// `dpkg-query -W -f=${Version} PACKAGE`: the "installed" package version, as Debian spells it (`1.33.4-1.1`).
const DPKG_QUERY: &str = r#"#!/bin/sh
echo "dpkg-query $*" >> "$INPLACE_ROOT/calls.log"
for package; do :; done
case "$package" in
  kubeadm) file=kubeadm-version ;;
  kubelet|kubectl) file=kubelet-version ;;
  *) echo "dpkg-query: no packages found matching $package" >&2; exit 1 ;;
esac
version=$(cat "$INPLACE_ROOT/var/lib/fake/$file")
printf '%s-1.1\n' "${version#v}"
"#;

const SYSTEMCTL: &str = r#"#!/bin/sh
echo "systemctl $*" >> "$INPLACE_ROOT/calls.log"
# A reboot only asks: the sandbox's machine goes down when its owner calls `Sandbox::boot`.
if [ "$1" = reboot ]; then : > "$INPLACE_ROOT/var/lib/fake/reboot-requested"; fi
if [ "$1 $2" = "restart kubelet" ] && [ -e "$INPLACE_ROOT/fail-kubelet-restart" ]; then
  rm -f "$INPLACE_ROOT/fail-kubelet-restart"
  echo "Job for kubelet.service failed because the control process exited with error code." >&2
  exit 1
fi
"#;

/// `bootc`: the agent crate's stand-in, which keeps the booted image, the boot entries and a staged deployment
/// as bootc does (`inplace_agent::bootc_stand_in`); [`Sandbox::boot`] is the machine restarting.
fn bootc_script() -> String {
    format!(
        "#!/bin/sh\necho \"bootc $*\" >> \"$INPLACE_ROOT/calls.log\"\n{}\n",
        inplace_agent::bootc_stand_in::BOOTC_STAND_IN
    )
}

/// The OS image a sandbox boots first.
pub const SANDBOX_OS_IMAGE: &str = "registry.example/node-os:1.0";

/// Agent driver config of a sandbox: package-manager style commands, all resolved in `{{root}}/bin` first; the
/// package installs record the version found before and undo by reinstalling it (as the shipped apt config).
pub const AGENT_CONFIG: &str = r#"path: ["{{root}}/bin", /usr/bin, /bin]
kubernetes:
  installKubeadm:
    skipIf: {run: [kubeadm, version, -o, short], stdoutEquals: "{{version}}"}
    record:
      - {name: kubeadm, run: [dpkg-query, -W, "-f=${Version}", kubeadm]}
    commands:
      - run: [apt-get, install, -y, "kubeadm={{bareVersion}}-*"]
    undo:
      commands:
        - run: [apt-get, install, -y, --allow-downgrades, "kubeadm={{record.kubeadm}}"]
  kubeadmUpgradeApply:
    commands:
      - run: [kubeadm, upgrade, apply, "{{version}}", --yes]
  kubeadmUpgradeNode:
    commands:
      - run: [kubeadm, upgrade, node]
  installKubelet:
    skipIf: {run: [kubelet, --version], stdoutEquals: "Kubernetes {{version}}"}
    record:
      - {name: kubelet, run: [dpkg-query, -W, "-f=${Version}", kubelet]}
    commands:
      - run: [apt-get, install, -y, "kubelet={{bareVersion}}-*", "kubectl={{bareVersion}}-*"]
      - run: [systemctl, restart, kubelet]
    undo:
      commands:
        - run: [apt-get, install, -y, --allow-downgrades, "kubelet={{record.kubelet}}", "kubectl={{record.kubelet}}"]
        - run: [systemctl, restart, kubelet]
inventory:
  kubeletVersion: [kubelet, --version]
  kubeadmVersion: [kubeadm, version, -o, short]
osImage:
  apply:
    commands:
      - writeFile:
          path: /var/lib/inplace-updater/bootc-host.yaml
          content: |
            apiVersion: org.containers.bootc/v1
            kind: BootcHost
            spec:
              image:
                image: "{{image}}"
                transport: registry
              bootOrder: default
      - run: [bootc, edit, --quiet, --filename, "{{root}}/var/lib/inplace-updater/bootc-host.yaml"]
  current: [bootc, status, --booted, --format, json]
  currentJsonPointer: /status/booted/image/image/image
# The sandbox's etcd manifest runs no member: the control-plane preflight checks the other Nodes only.
controlPlane:
  checkEtcd: false
"#;

/// The node path of the boot id (the agent's default `reboot.bootIdFile`).
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The `n`th boot id of a sandbox (its first 8 characters tell boots apart in the agent's messages).
fn boot_id(n: u32) -> String {
    format!("{n:08x}-5a4d-4b00-8000-00000000b007\n")
}

const ETCD_MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\nspec:\n  containers:\n  - name: etcd\n    image: registry.k8s.io/etcd:3.5.16-0\n    command:\n    - etcd\n";

/// The `node:` section of a sandbox's agent config: the node's kubeconfig (written by [`Sandbox::create`] for its
/// fake API server) and short polls, so a sandboxed drain takes fractions of a second.
const NODE_CONFIG: &str = r#"node:
  kubeconfig: /etc/kubernetes/kubelet.conf
  name: "{{node}}"
  pollIntervalMillis: 100
  evictionRetryMillis: 200
"#;

/// One sandboxed node.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The agent's `--root`.
    pub root: PathBuf,
    /// The agent's `--state-dir` (outside the root, as on a real node it would be under /var/lib).
    pub state_dir: PathBuf,
    /// The agent's `--config`.
    pub config: PathBuf,
    /// The node's Kubernetes API: a [`FakeApiServer`] serving this node (Ready, at the sandbox's kubelet version,
    /// read from the file the fake `apt-get install kubelet` writes), whose kubeconfig is the node's
    /// `/etc/kubernetes/kubelet.conf`. It answers the drainer's calls the way the API documents them; it is not
    /// Kubernetes. Shut down when the last clone of the sandbox is dropped.
    pub kube: Arc<FakeApiServer>,
    /// The Node's name in `kube`.
    pub node: String,
}

fn write(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

impl Sandbox {
    /// Lays out a node at `dir` running Kubernetes `version` (e.g. `v1.33.4`), with its API server started. The
    /// Node is named after `dir`'s last component.
    pub fn create(dir: &Path, version: &str, control_plane: bool) -> std::io::Result<Sandbox> {
        let root = dir.join("root");
        for (name, script) in [
            ("kubeadm", KUBEADM),
            ("kubelet", KUBELET),
            ("apt-get", APT_GET),
            ("dpkg-query", DPKG_QUERY),
            ("systemctl", SYSTEMCTL),
        ] {
            write(&root.join("bin").join(name), script, 0o755)?;
        }
        write(&root.join("bin/bootc"), &bootc_script(), 0o755)?;
        write(
            &root.join("var/lib/fake/kubeadm-version"),
            &format!("{version}\n"),
            0o644,
        )?;
        write(
            &root.join("var/lib/fake/kubelet-version"),
            &format!("{version}\n"),
            0o644,
        )?;
        write(
            &root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\ncapi:x:1000:1000:capi:/home/capi:/bin/sh\n",
            0o644,
        )?;
        write(
            &root.join("var/lib/kubelet/kubeadm-flags.env"),
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n",
            0o644,
        )?;
        if control_plane {
            write(
                &root.join("etc/kubernetes/manifests/etcd.yaml"),
                ETCD_MANIFEST,
                0o600,
            )?;
        }
        inplace_agent::bootc_stand_in::install(&root, SANDBOX_OS_IMAGE)?;
        write(
            &root.join(BOOT_ID.trim_start_matches('/')),
            &boot_id(1),
            0o644,
        )?;
        write(&root.join("calls.log"), "", 0o644)?;
        let node = dir
            .file_name()
            .map_or_else(|| "node".into(), |n| n.to_string_lossy().into_owned());
        let kube = FakeApiServer::start(FakeNode {
            kubelet_version: version.to_owned(),
            kubelet_version_file: Some(root.join("var/lib/fake/kubelet-version")),
            boot_id_file: Some(root.join(BOOT_ID.trim_start_matches('/'))),
            ..FakeNode::new(node.clone())
        })?;
        kube.write_kubeconfig(&root.join("etc/kubernetes/kubelet.conf"))?;
        let config = dir.join("agent.yaml");
        let node_config = NODE_CONFIG.replace("{{node}}", &node);
        write(&config, &format!("{AGENT_CONFIG}{node_config}"), 0o644)?;
        let state_dir = dir.join("state");
        Ok(Sandbox {
            root,
            state_dir,
            config,
            kube: Arc::new(kube),
            node,
        })
    }

    /// A node path inside the sandbox.
    pub fn path(&self, node_path: &str) -> PathBuf {
        self.root.join(node_path.trim_start_matches('/'))
    }

    /// Every command the fake tools saw, in order.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("/calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Makes every later `kubeadm upgrade` fail with a recognisable stderr (or stops doing so).
    pub fn fail_kubeadm(&self, fail: bool) -> std::io::Result<()> {
        let marker = self.path("/fail-kubeadm");
        if fail {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// Makes every later `kubeadm upgrade` take 5 s (to catch an agent mid-step), or stops doing so.
    pub fn slow_kubeadm(&self, slow: bool) -> std::io::Result<()> {
        let marker = self.path("/slow-kubeadm");
        if slow {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// Makes every later `kubeadm upgrade` wait while the gate is closed (to hold an agent mid-step for as long
    /// as a test needs), or opens it.
    pub fn gate_kubeadm(&self, closed: bool) -> std::io::Result<()> {
        let marker = self.path("/gate-kubeadm");
        if closed {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// Makes every later undo install (`apt-get install --allow-downgrades`) wait while the gate is closed (to
    /// kill an agent inside an undo command), or opens it.
    pub fn gate_undo(&self, closed: bool) -> std::io::Result<()> {
        let marker = self.path("/gate-undo");
        if closed {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// Makes the next `systemctl restart kubelet` fail (once: the restart the rollback runs again succeeds), or
    /// not.
    pub fn fail_kubelet_restart(&self, fail: bool) -> std::io::Result<()> {
        let marker = self.path("/fail-kubelet-restart");
        if fail {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// Makes each fake install and upgrade take `seconds` (the demo uses it so progress is visible).
    pub fn set_pace(&self, seconds: &str) -> std::io::Result<()> {
        std::fs::write(self.path("/pace"), seconds)
    }

    /// The kubelet version the node now runs.
    pub fn kubelet_version(&self) -> String {
        std::fs::read_to_string(self.path("/var/lib/fake/kubelet-version"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// How many times the node was asked to reboot (`systemctl reboot`, the agent's default reboot command).
    pub fn reboots(&self) -> usize {
        self.calls()
            .iter()
            .filter(|call| call.as_str() == "systemctl reboot")
            .count()
    }

    /// Whether a reboot was asked for since the last [`Sandbox::boot`].
    pub fn reboot_requested(&self) -> bool {
        self.path("/var/lib/fake/reboot-requested").exists()
    }

    /// The node's boot id now.
    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.path(BOOT_ID))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The machine comes back from a reboot: a new boot id, the reboot request and Debian's
    /// `/var/run/reboot-required` gone (a tmpfs), and the default boot entry booted (a staged OS image first
    /// becomes it), or with [`Sandbox::fall_back_next_boot`] the other entry, the order left as it is. The
    /// caller stops the agent first and starts it again after, as the machine would. Returns the new boot id.
    pub fn boot(&self) -> std::io::Result<String> {
        let current = self.boot_id();
        let n = current
            .get(..8)
            .and_then(|head| u32::from_str_radix(head, 16).ok())
            .unwrap_or(0);
        let fall_back = self.path("/var/lib/fake/os-fallback").exists();
        inplace_agent::bootc_stand_in::boot(&self.root, fall_back)?;
        for flag in ["/var/lib/fake/reboot-requested", "/var/run/reboot-required"] {
            std::fs::remove_file(self.path(flag)).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })?;
        }
        write(&self.path(BOOT_ID), &boot_id(n + 1), 0o644)?;
        Ok(self.boot_id())
    }

    /// Makes the node say a reboot is required (Debian's `/var/run/reboot-required`), as a package upgrade does.
    pub fn require_reboot(&self) -> std::io::Result<()> {
        write(
            &self.path("/var/run/reboot-required"),
            "*** System restart required ***\n",
            0o644,
        )
    }

    /// Makes every boot into a newly staged OS image come back on the image booted before (an A/B fallback:
    /// the new image stays the default boot entry), or stops doing so.
    pub fn fall_back_next_boot(&self, fall_back: bool) -> std::io::Result<()> {
        let marker = self.path("/var/lib/fake/os-fallback");
        if fall_back {
            std::fs::write(marker, "")
        } else {
            std::fs::remove_file(marker).or(Ok(()))
        }
    }

    /// The OS image the node booted.
    pub fn os_image(&self) -> String {
        inplace_agent::bootc_stand_in::booted(&self.root)
    }

    /// The OS image the node's next boot starts (its default boot entry, or the deployment staged for it).
    pub fn next_os_image(&self) -> String {
        inplace_agent::bootc_stand_in::next_boot(&self.root)
    }
}
