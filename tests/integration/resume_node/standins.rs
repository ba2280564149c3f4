//! Stand-ins for the programs the shipped agent configs run (apt-get, apt-mark, dpkg, dpkg-query, dnf, rpm,
//! curl, install, rm, cp, systemctl, kubeadm, kubelet). Each one behaves like the real program as far as repeating it goes (apt refuses
//! to work after an interrupted install until `dpkg --configure -a`, `systemctl start` leaves a running kubelet
//! alone, an interrupted download or `install` leaves a half-written file), keeps the node's state in files
//! under `<root>/var/lib/standin`, and logs `start <argv>` / `end <argv>` to `<root>/calls.log`; read-only
//! calls (version checks) log `query <argv>`, and systemctl logs `running kubelet <version|none>` after acting
//! on kubelet.
//!
//! The trap: when `<root>/trap` holds `before <argv>`, `inside <argv>` or `after <argv>`, the command with that
//! argv writes its pid (= its process group) to `<root>/blocked.pid`, logs `blocked …` and waits to be killed —
//! `before` any effect, `inside` part-way through its effect, `after` once its effect is done and its end is
//! logged.

/// Sourced by every stand-in.
pub const LIB: &str = r#"# stand-in library
SANDBOX_PATH=$PATH
PATH=/usr/bin:/bin
S="$INPLACE_ROOT/var/lib/standin"
LOG="$INPLACE_ROOT/calls.log"
me=
log() { echo "$*" >> "$LOG"; }
begin() { me="$*"; log "start $me"; checkpoint before; }
query() { [ -n "$NOLOG" ] || log "query $*"; }
checkpoint() {
  [ -f "$INPLACE_ROOT/trap" ] || return 0
  read -r trap < "$INPLACE_ROOT/trap"
  [ "$trap" = "$1 $me" ] || return 0
  echo $$ > "$INPLACE_ROOT/blocked.pid"
  log "blocked $1 $me"
  while [ -d "$INPLACE_ROOT" ]; do sleep 0.05; done
  exit 99
}
finish() { log "end $me"; checkpoint after; exit 0; }
fail() { echo "$*" >&2; log "failed $me"; exit 100; }
installed_kubelet() {
  out=$(PATH=$SANDBOX_PATH; NOLOG=1; export NOLOG; kubelet --version 2>/dev/null) || return 1
  echo "${out#Kubernetes }"
}
kubeadm_tool() {
  v=$1; shift
  case "$1" in
    version) query kubeadm "$@"; echo "$v" ;;
    upgrade) begin kubeadm "$@"; checkpoint inside; shift; echo "$*" > "$S/kubeadm-upgrade"; finish ;;
    *) me="kubeadm $*"; fail "kubeadm stand-in: unexpected arguments" ;;
  esac
}
kubelet_tool() {
  case "$2" in
    --version) query kubelet --version; echo "Kubernetes $1" ;;
    *) me="kubelet $*"; fail "kubelet stand-in: unexpected arguments" ;;
  esac
}
kubectl_tool() { query kubectl "$@"; echo "Client Version: $1"; }
"#;

const HEAD: &str = "#!/bin/sh\n. \"$INPLACE_ROOT/var/lib/standin/lib.sh\"\n";

/// A package-installed tool: reads the version apt/dnf installed.
fn packaged(tool: &str) -> String {
    format!("{HEAD}read -r v < \"$S/pkg-{tool}\"\n{tool}_tool \"$v\" \"$@\"\n")
}

/// A release binary of `version`: what the curl stand-in downloads (its bytes are what the pins pin).
pub fn release_binary(tool: &str, version: &str) -> String {
    format!("{HEAD}{tool}_tool {version} \"$@\"\n")
}

const APT_GET: &str = r#"begin apt-get "$@"
[ -e "$S/dpkg-interrupted" ] && fail "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem."
case "$1" in
  update) checkpoint inside ;;
  install)
    : > "$S/dpkg-interrupted"
    checkpoint inside
    for a in "$@"; do
      case "$a" in
        kubeadm=*|kubelet=*|kubectl=*) n=${a%%=*}; v=${a#*=}; echo "v${v%-\*}" > "$S/pkg-$n" ;;
      esac
    done
    rm -f "$S/dpkg-interrupted" ;;
  *) fail "apt-get stand-in: unexpected arguments" ;;
esac
finish
"#;

const APT_MARK: &str = r#"if [ "$1" = showhold ]; then
  query apt-mark "$@"
  shift
  for p in "$@"; do [ -e "$S/held-$p" ] && echo "$p"; done
  exit 0
fi
begin apt-mark "$@"
checkpoint inside
op=$1; shift
for p in "$@"; do
  case "$op" in
    hold) : > "$S/held-$p" ;;
    unhold) rm -f "$S/held-$p" ;;
    *) fail "apt-mark stand-in: unexpected arguments" ;;
  esac
done
finish
"#;

const DPKG: &str = r#"begin dpkg "$@"
[ "$*" = "--configure -a" ] || fail "dpkg stand-in: unexpected arguments"
checkpoint inside
rm -f "$S/dpkg-interrupted"
finish
"#;

/// `dpkg-query --show --showformat=${Version} <pkg>` (the apt config's `record:`): the version installed.
const DPKG_QUERY: &str = r#"query dpkg-query "$@"
for p; do :; done
[ -f "$S/pkg-$p" ] || { echo "dpkg-query: no packages found matching $p" >&2; exit 1; }
read -r v < "$S/pkg-$p"
echo "${v#v}-1.1"
"#;

/// `rpm -q --qf %{VERSION}-%{RELEASE} <pkg>` (the dnf config's `record:`): the version installed.
const RPM: &str = r#"query rpm "$@"
for p; do :; done
[ -f "$S/pkg-$p" ] || { echo "package $p is not installed"; exit 1; }
read -r v < "$S/pkg-$p"
echo "${v#v}-150500.1.1"
"#;

/// `cp` (the release-binaries config's `record:` keeps the binaries aside).
const CP: &str = r#"query cp "$@"
exec /bin/cp "$@"
"#;

const DNF: &str = r#"begin dnf "$@"
[ "$1" = install ] || fail "dnf stand-in: unexpected arguments"
checkpoint inside
for a in "$@"; do
  case "$a" in
    kubeadm-*|kubelet-*|kubectl-*) echo "v${a#*-}" > "$S/pkg-${a%%-*}" ;;
  esac
done
finish
"#;

const SYSTEMCTL: &str = r#"begin systemctl "$@"
checkpoint inside
case "$1:$2" in
  daemon-reload:) ;;
  restart:kubelet) installed_kubelet > "$S/kubelet-running" || rm -f "$S/kubelet-running" ;;
  stop:kubelet) rm -f "$S/kubelet-running" ;;
  start:kubelet) [ -e "$S/kubelet-running" ] || installed_kubelet > "$S/kubelet-running" || rm -f "$S/kubelet-running" ;;
  restart:*) ;;
  *) fail "systemctl stand-in: unexpected arguments" ;;
esac
if [ "$2" = kubelet ]; then
  r=none; [ -e "$S/kubelet-running" ] && read -r r < "$S/kubelet-running"
  log "running kubelet $r"
fi
finish
"#;

const CURL: &str = r#"begin curl "$@"
out=; url=
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2 ;;
    --retry) shift 2 ;;
    -*) shift ;;
    *) url=$1; shift ;;
  esac
done
rest=${url#*/release/}
src="$S/dist/${url##*/}-${rest%%/*}"
[ -f "$src" ] || fail "curl: (22) The requested URL returned error: 404"
echo "half a download" > "$out"
checkpoint inside
cp "$src" "$out"
finish
"#;

const INSTALL: &str = r#"begin install "$@"
[ "$1" = -m ] || fail "install stand-in: unexpected arguments"
[ -f "$3" ] || fail "install: cannot stat '$3': No such file or directory"
echo "half a binary" > "$4"
checkpoint inside
/usr/bin/install -m "$2" "$3" "$4"
finish
"#;

const RM: &str = r#"begin rm "$@"
[ "$1" = -f ] || fail "rm stand-in: unexpected arguments"
shift
/bin/rm -f "$1"
checkpoint inside
/bin/rm -f "$@"
finish
"#;

/// A simulated reboot, run with the agent's `PATH`: services come back with what is installed.
pub const REBOOT: &str = r#". "$INPLACE_ROOT/var/lib/standin/lib.sh"
installed_kubelet > "$S/kubelet-running" || rm -f "$S/kubelet-running"
"#;

/// How a node installs Kubernetes, by shipped config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    Apt,
    Dnf,
    Release,
}

/// The stand-ins of `world` as (node path, script).
pub fn tools(world: World, from: &str) -> Vec<(String, String)> {
    let mut tools: Vec<(String, String)> = vec![("/usr/bin/systemctl".into(), SYSTEMCTL.into())];
    match world {
        World::Apt => {
            for (name, body) in [
                ("apt-get", APT_GET),
                ("apt-mark", APT_MARK),
                ("dpkg", DPKG),
                ("dpkg-query", DPKG_QUERY),
            ] {
                tools.push((format!("/usr/bin/{name}"), body.into()));
            }
        }
        World::Dnf => {
            tools.push(("/usr/bin/dnf".into(), DNF.into()));
            tools.push(("/usr/bin/rpm".into(), RPM.into()));
        }
        World::Release => {
            for (name, body) in [("curl", CURL), ("install", INSTALL), ("rm", RM), ("cp", CP)] {
                tools.push((format!("/usr/bin/{name}"), body.into()));
            }
        }
    }
    let mut scripts: Vec<(String, String)> = tools
        .into_iter()
        .map(|(path, body)| (path, format!("{HEAD}{body}")))
        .collect();
    for tool in ["kubeadm", "kubelet", "kubectl"] {
        if world == World::Release {
            scripts.push((format!("/usr/local/bin/{tool}"), release_binary(tool, from)));
        } else {
            scripts.push((format!("/usr/bin/{tool}"), packaged(tool)));
        }
    }
    scripts
}
