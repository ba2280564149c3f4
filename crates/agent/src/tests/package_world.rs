//! The worlds the package-undo tests run in: a local apt repository of stand-in kubelet, kubeadm and kubectl
//! `.deb`s (built with `dpkg-deb`, indexed with `dpkg-scanpackages`) installed into a sandbox root with the
//! real `apt-get`, `apt-mark` and `dpkg` (their root and admin-dir options, through `APT_CONFIG`, `DPKG_ROOT`
//! and `DPKG_ADMINDIR`: the host's dpkg database is never touched); and a root of release binaries with a
//! `curl` stand-in serving the new ones. A shim directory first on `PATH` holds the stand-ins (`systemctl`
//! logs its argv) and wraps the programs the configs run, to fail or block one invocation on demand
//! (`<case>/inject`: `fail <argv>`, `before <argv>` or `after <argv>`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use crate::config::DriverConfig;
use crate::os::driver_env::DriverEnv;
use crate::retry::RetryPolicy;

/// The Kubernetes version the node runs before the plan, and the plan's target.
pub(super) const FROM: &str = "1.33.4-1.1";
pub(super) const TO: &str = "1.34.1-1.1";
pub(super) const TOOLS: [&str; 3] = ["kubeadm", "kubelet", "kubectl"];

/// How the node installs Kubernetes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum World {
    /// crates/agent/config-examples/apt.yaml with the real apt and dpkg.
    Apt,
    /// crates/agent/config-examples/release-binaries.yaml with the real coreutils.
    Release,
}

/// The programs a world's configs run that a case may fail or block (wrapped in the shim dir).
fn wrapped(world: World) -> &'static [&'static str] {
    match world {
        World::Apt => &["apt-get", "apt-mark", "dpkg", "dpkg-query", "rm"],
        World::Release => &["cp", "rm", "install"],
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_exec(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A stand-in tool of Kubernetes `version` (`v1.33.4`): `--version` / `version -o short` like the real ones.
fn tool_script(tool: &str, version: &str) -> String {
    match tool {
        "kubelet" => format!("#!/bin/sh\necho \"Kubernetes {version}\"\n"),
        "kubeadm" => format!("#!/bin/sh\necho \"{version}\"\n"),
        _ => format!("#!/bin/sh\necho \"Client Version: {version}\"\n"),
    }
}

fn kube_version(deb_version: &str) -> String {
    format!("v{}", deb_version.split('-').next().unwrap())
}

/// The local apt repository (built once per test run): both versions of the three packages.
pub(super) fn repository() -> &'static Path {
    static REPO: OnceLock<tempfile::TempDir> = OnceLock::new();
    REPO.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        for tool in TOOLS {
            for version in [FROM, TO] {
                let tree = dir.path().join(format!("{tool}-{version}"));
                let control = format!(
                    "Package: {tool}\nVersion: {version}\nArchitecture: all\nMaintainer: tests <t@example.org>\n\
                     Description: stand-in {tool}\n"
                );
                write_exec(&tree.join("DEBIAN/control"), &control, 0o644);
                let script = tool_script(tool, &kube_version(version));
                write_exec(&tree.join(format!("usr/bin/{tool}")), &script, 0o755);
                let deb = repo.join(format!("{tool}_{version}_all.deb"));
                run(Command::new("dpkg-deb")
                    .args(["--root-owner-group", "-Zgzip", "--build"])
                    .arg(&tree)
                    .arg(&deb));
            }
        }
        let index = run(Command::new("dpkg-scanpackages")
            .args(["--multiversion", ".", "/dev/null"])
            .current_dir(&repo));
        std::fs::write(repo.join("Packages"), index).unwrap();
        dir
    })
    .path()
}

/// One case's node: its root, state dir, shim dir and driver environment.
pub(super) struct Node {
    _dir: tempfile::TempDir,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub state: PathBuf,
    pub world: World,
    pub env: Arc<DriverEnv>,
}

impl Node {
    /// A node of `world` at [`FROM`] (`with_kubectl`: kubectl installed too), running the shipped config.
    pub fn new(world: World, with_kubectl: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        let (root, state, shims) = (base.join("root"), base.join("state"), base.join("shims"));
        for d in [&root, &state, &shims] {
            std::fs::create_dir_all(d).unwrap();
        }
        let mut env = BTreeMap::new();
        let shipped = match world {
            World::Apt => {
                let template = apt_template(with_kubectl);
                run(Command::new("cp")
                    .arg("-a")
                    .arg(template.join("root/."))
                    .arg(&root));
                let conf = apt_conf(&base, &root);
                env.insert("APT_CONFIG".to_owned(), conf.display().to_string());
                env.insert("DPKG_ROOT".to_owned(), root.display().to_string());
                let admin = root.join("var/lib/dpkg");
                env.insert("DPKG_ADMINDIR".to_owned(), admin.display().to_string());
                env.insert("DEBIAN_FRONTEND".to_owned(), "noninteractive".to_owned());
                "config-examples/apt.yaml"
            }
            World::Release => {
                release_sandbox(&base, &root, with_kubectl);
                "config-examples/release-binaries.yaml"
            }
        };
        write_shims(&shims, &base, world);
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(shipped)).unwrap();
        let mut config = DriverConfig::from_yaml(&text).unwrap();
        config.path = [shims.display().to_string()]
            .into_iter()
            .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(String::from))
            .collect();
        config.env = env;
        // No Kubernetes API here: the rollback ends "not verified" (tests/rollback_node.rs verifies).
        config.node = None;
        if world == World::Release {
            config.pins = BTreeMap::from([("v1.34.1".to_owned(), release_pins())]);
        }
        // Zero retry delays, the shipped attempts.
        let fast = |retry: &mut Option<RetryPolicy>| {
            if let Some(policy) = retry {
                policy.initial_delay_seconds = 0;
                policy.max_delay_seconds = 0;
            }
        };
        let k = &mut config.kubernetes;
        for sequence in [&mut k.install_kubeadm, &mut k.install_kubelet]
            .into_iter()
            .flatten()
        {
            fast(&mut sequence.retry);
            if let Some(undo) = &mut sequence.undo {
                fast(&mut undo.retry);
            }
        }
        let env = Arc::new(DriverEnv::new(root.clone(), config, state.clone()));
        Self {
            _dir: dir,
            dir: base,
            root,
            state,
            world,
            env,
        }
    }

    /// Runs an apt/dpkg program against the sandbox (the real one, not the shim).
    pub fn apt(&self, argv: &[&str]) -> String {
        apt_in(&self.root, &self.dir.join("apt.conf"), argv)
    }

    /// What a case sets for the shims: `fail <argv>`, `before <argv>`, `after <argv>`, or nothing.
    pub fn inject(&self, what: Option<&str>) {
        let path = self.dir.join("inject");
        match what {
            Some(text) => std::fs::write(path, text).unwrap(),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// The argv the shim blocked in, once it is blocked (its pid = its process group).
    pub fn blocked(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("blocked.pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    }

    /// Kills the blocked command's process group (what a SIGKILL of the agent's unit does) and forgets it.
    pub fn kill_blocked(&self) {
        if let Some(pid) = self.blocked().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = std::fs::remove_file(self.dir.join("blocked.pid"));
    }

    /// The invocations the shims let through so far (`program args…`).
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Whether a shim failed an invocation as injected.
    pub fn failed_injection(&self) -> bool {
        self.dir.join("failed").exists()
    }

    /// The `systemctl` calls so far.
    pub fn systemctl(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("systemctl.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// What the node is, as a rollback must restore it: installed versions and holds (apt), and every file
    /// under the root's `/etc` and `/usr` with its mode and content digest.
    pub fn fingerprint(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.world == World::Apt {
            let status = self.apt(&[
                "dpkg-query",
                "--show",
                "--showformat=${Package} ${Version} ${db:Status-Abbrev}\n",
            ]);
            out.extend(status.lines().map(|l| format!("package {}", l.trim())));
            let holds = self.apt(&["apt-mark", "showhold"]);
            out.extend(holds.lines().map(|l| format!("held {l}")));
        }
        for top in ["etc", "usr"] {
            walk(&self.root.join(top), &self.root, &mut out);
        }
        out.sort();
        out
    }
}

fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.map(Result::unwrap) {
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let name = path.strip_prefix(root).unwrap().display().to_string();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            out.push(format!("dir /{name} {mode:o}"));
            walk(&path, root, out);
        } else {
            let digest = Sha256::digest(std::fs::read(&path).unwrap());
            out.push(format!("file /{name} {mode:o} {digest:x}"));
        }
    }
}

/// Runs an apt/dpkg program (the real one) against the sandbox `root` with `conf`.
fn apt_in(root: &Path, conf: &Path, argv: &[&str]) -> String {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).env_clear();
    cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    cmd.env("APT_CONFIG", conf);
    cmd.env("DPKG_ROOT", root);
    cmd.env("DPKG_ADMINDIR", root.join("var/lib/dpkg"));
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    run(&mut cmd)
}

/// A root at [`FROM`] (built once per test run, copied by each case): kubeadm and kubelet installed and held
/// as image-builder holds them, kubectl installed (`with_kubectl`) but deliberately not held, so the undo must
/// restore each hold as it was.
fn apt_template(with_kubectl: bool) -> &'static Path {
    static WITH: OnceLock<tempfile::TempDir> = OnceLock::new();
    static WITHOUT: OnceLock<tempfile::TempDir> = OnceLock::new();
    let cell = if with_kubectl { &WITH } else { &WITHOUT };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        apt_dirs(&root);
        let conf = apt_conf(dir.path(), &root);
        let mut install = vec!["apt-get", "install", "-y", "-q"];
        let packages: Vec<String> = ["kubeadm", "kubelet", "kubectl"]
            .iter()
            .filter(|tool| with_kubectl || **tool != "kubectl")
            .map(|tool| format!("{tool}={FROM}"))
            .collect();
        install.extend(packages.iter().map(String::as_str));
        apt_in(&root, &conf, &["apt-get", "update", "-q"]);
        apt_in(&root, &conf, &install);
        apt_in(&root, &conf, &["apt-mark", "hold", "kubeadm", "kubelet"]);
        dir
    })
    .path()
}

/// The dirs and empty databases apt and dpkg need in a fresh root.
fn apt_dirs(root: &Path) {
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "etc/apt/sources.list.d",
        "etc/apt/apt.conf.d",
        "etc/apt/preferences.d",
        "var/log/apt",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in ["var/lib/dpkg/status", "var/lib/dpkg/available"] {
        std::fs::write(root.join(f), "").unwrap();
    }
}

/// The sandbox's apt.conf (in `base`): apt's state, cache and config dirs and dpkg's root and admin dir in
/// `root`, sources from the local repository only (so the shipped config's writeFile of the pkgs.k8s.io line
/// lands in the root and is checked, but never used).
fn apt_conf(base: &Path, root: &Path) -> PathBuf {
    let unused = base.join("sources.list.d-unused");
    std::fs::create_dir_all(&unused).unwrap();
    let sources = base.join("sources.list");
    let repo = repository().join("repo");
    std::fs::write(
        &sources,
        format!("deb [trusted=yes] file:{} ./\n", repo.display()),
    )
    .unwrap();
    let r = root.display();
    let conf = format!(
        "Dir \"{r}/\";\nDir::State \"{r}/var/lib/apt/\";\nDir::State::status \"{r}/var/lib/dpkg/status\";\n\
         Dir::Cache \"{r}/var/cache/apt/\";\nDir::Etc \"{r}/etc/apt/\";\nDir::Etc::sourcelist \"{}\";\n\
         Dir::Etc::sourceparts \"{}\";\nDir::Log \"{r}/var/log/apt/\";\nDir::Bin::dpkg \"/usr/bin/dpkg\";\n\
         DPkg::Options {{ \"--root={r}\"; \"--admindir={r}/var/lib/dpkg\"; \"--force-script-chrootless\"; \
         \"--force-unsafe-io\"; }};\nDpkg::Use-Pty \"false\";\nAPT::Sandbox::User \"root\";\n",
        sources.display(),
        unused.display()
    );
    let path = base.join("apt.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

/// The release-binaries node: v1.33.4 binaries in `/usr/local/bin` (kubectl mode 0750, to see modes
/// restored), and the v1.34.1 ones the `curl` stand-in serves from `<case>/dist`.
fn release_sandbox(base: &Path, root: &Path, with_kubectl: bool) {
    for tool in TOOLS {
        if tool == "kubectl" && !with_kubectl {
            continue;
        }
        let mode = if tool == "kubectl" { 0o750 } else { 0o755 };
        let path = root.join(format!("usr/local/bin/{tool}"));
        write_exec(&path, &tool_script(tool, &kube_version(FROM)), mode);
        let dist = base.join(format!("dist/{tool}-v1.34.1"));
        write_exec(&dist, &tool_script(tool, &kube_version(TO)), 0o644);
    }
}

fn release_pins() -> BTreeMap<String, String> {
    TOOLS
        .iter()
        .map(|tool| {
            let digest = Sha256::digest(tool_script(tool, &kube_version(TO)).as_bytes());
            (format!("{tool}Sha256"), format!("{digest:x}"))
        })
        .collect()
}

/// The shim dir: `systemctl` and `curl` stand-ins, and a wrapper per program a case may fail or block.
fn write_shims(shims: &Path, base: &Path, world: World) {
    let b = base.display();
    let gate = format!(
        "#!/bin/sh\n# shim: fail or block the injected invocation, else run the real program\n\
         me=\"$(basename \"$0\") $*\"\ninject=\nread -r inject < \"{b}/inject\" 2>/dev/null\n\
         case \"$inject\" in\n  \"fail $me\") : > \"{b}/failed\"; echo \"injected failure\" >&2; exit 100 ;;\n\
           \"before $me\") echo $$ > \"{b}/blocked.pid\"; while :; do sleep 1; done ;;\nesac\n\
         echo \"$me\" >> \"{b}/calls.log\"\n"
    );
    for program in wrapped(world) {
        let real = format!("/usr/bin/{program}");
        let real = if Path::new(&real).exists() {
            real
        } else {
            format!("/bin/{program}")
        };
        let script = format!(
            "{gate}if [ \"$inject\" = \"after $me\" ]; then\n  \"{real}\" \"$@\" || exit $?\n  \
             echo $$ > \"{b}/blocked.pid\"; while :; do sleep 1; done\nfi\nexec \"{real}\" \"$@\"\n"
        );
        write_exec(&shims.join(program), &script, 0o755);
    }
    let systemctl = format!(
        "{gate}echo \"$*\" >> \"{b}/systemctl.log\"\nif [ \"$inject\" = \"after $me\" ]; then\n  \
         echo $$ > \"{b}/blocked.pid\"; while :; do sleep 1; done\nfi\n"
    );
    write_exec(&shims.join("systemctl"), &systemctl, 0o755);
    // curl -fsSL --retry 3 -o OUT https://dl.k8s.io/release/vX/bin/linux/amd64/TOOL
    let curl = format!(
        "{gate}out=; url=\nwhile [ $# -gt 0 ]; do case \"$1\" in -o) out=$2; shift 2 ;; --retry) shift 2 ;; \
         -*) shift ;; *) url=$1; shift ;; esac; done\nrest=${{url#*/release/}}\n\
         /bin/cp \"{b}/dist/${{url##*/}}-${{rest%%/*}}\" \"$out\"\n"
    );
    write_exec(&shims.join("curl"), &curl, 0o755);
}
