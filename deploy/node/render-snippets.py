#!/usr/bin/env python3
"""Writes kubeadmconfigtemplate.yaml and kubeadmcontrolplane.yaml from the node files beside it.

The bootstrap snippets carry copies of agent.env, agent.yaml, the systemd unit and the two scripts in
their `files` entries. Edit those files, then run `python3 deploy/node/render-snippets.py`; tests/deploy
fails while a snippet and its source disagree.

The kubeadm bootstrap provider's cloud-init user-data is a Jinja template (it starts with
`## template: jinja`): cloud-init renders the whole of it, file contents included, before writing any file.
A file whose text holds a Jinja delimiter (the agent's `{{version}}` templates, a shell `${#var}`) is
therefore embedded base64-encoded, which Jinja leaves alone; every other file is embedded as plain text.

Cluster API's CRDs cap a file's `content` at 10240 characters (KubeadmConfig `files[].content`, maxLength): the
agent config is embedded without its comment lines (the same YAML: checked here), and a content over the cap is
an error here rather than an object the API server refuses.
"""

import base64
import pathlib
import textwrap

HERE = pathlib.Path(__file__).resolve().parent

# (path on the node, permissions, source file here)
EMBEDDED = [
    ("/etc/inplace-updater/agent.env", "0644", "agent.env"),
    ("/etc/inplace-updater/agent.yaml", "0644", "agent.yaml"),
    ("/etc/systemd/system/inplace-updater-agent.service", "0644", "inplace-updater-agent.service"),
    ("/usr/local/lib/inplace-updater/agent-start", "0755", "agent-start"),
    ("/usr/local/lib/inplace-updater/install-agent.sh", "0755", "install-agent.sh"),
]
SECRET = "my-cluster-inplace-updater-agent"
# install-agent.sh puts the node's architecture (amd64, arm64) where the URL says {arch}.
AGENT_URL = "https://downloads.example.com/inplace-updater/v0.1.0/inplace-agent-linux-{arch}"
# Deliberately not real digests: install-agent.sh refuses the download until you put yours here.
AGENT_SHA256 = {"amd64": "0" * 64, "arm64": "0" * 64}
# What starts a Jinja expression, statement or comment (Jinja's default delimiters).
JINJA_DELIMITERS = ("{{", "{%", "{#")
# Cluster API's maxLength of a bootstrap file's `content` (bootstrap.cluster.x-k8s.io KubeadmConfig files[]).
MAX_CONTENT_CHARS = 10240
# The embedded files whose comment lines are left out (YAML: the data is unchanged, which embedded_text checks).
WITHOUT_COMMENTS = {"agent.yaml"}


def embedded_text(src: str) -> str:
    """The text of deploy/node/<src> as the bootstrap snippets carry it."""
    text = (HERE / src).read_text()
    if src not in WITHOUT_COMMENTS:
        return text
    import yaml  # only here: the other files need no YAML parser

    kept = "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("#"))
    if yaml.safe_load(kept) != yaml.safe_load(text):
        raise SystemExit(f"deploy/node/{src}: leaving out its comment lines changes its data")
    return kept


def needs_encoding(text: str) -> bool:
    """Whether cloud-init's Jinja pass would change (or choke on) this text."""
    return any(delimiter in text for delimiter in JINJA_DELIMITERS)


def files_section(ind: int) -> str:
    i = " " * ind
    out = f"""{i}# The agent's token and the server's CA, from a Secret in this Cluster's namespace (docs/install.md,
{i}# step 7). The in-place policy rejects changes to contentFrom; that is fine, these are read once, at
{i}# bootstrap. Rotating the token means changing the Secret's content, not this spec.
{i}- path: /etc/inplace-updater/token
{i}  owner: root:root
{i}  permissions: "0600"
{i}  contentFrom:
{i}    secret:
{i}      name: {SECRET}
{i}      key: token
{i}- path: /etc/inplace-updater/ca.crt
{i}  owner: root:root
{i}  permissions: "0644"
{i}  contentFrom:
{i}    secret:
{i}      name: {SECRET}
{i}      key: ca.crt
{i}# Each content below is a copy of deploy/node/<file> (render-snippets.py); tests/deploy checks they match.
"""
    for path, mode, src in EMBEDDED:
        text = embedded_text(src)
        out += f"""{i}- path: {path}
{i}  owner: root:root
{i}  permissions: "{mode}"
"""
        if needs_encoding(text):
            encoded = base64.b64encode(text.encode()).decode()
            if len(encoded) > MAX_CONTENT_CHARS:
                raise SystemExit(
                    f"deploy/node/{src}: {len(encoded)} characters base64-encoded, over Cluster API's "
                    f"{MAX_CONTENT_CHARS} for a bootstrap file's content"
                )
            without = " without its comment lines," if src in WITHOUT_COMMENTS else ""
            out += f"""{i}  # deploy/node/{src},{without} base64-encoded: cloud-init's Jinja pass over the user-data would
{i}  # otherwise rewrite its templates. `base64 -d` shows it; edit the source and re-render.
{i}  encoding: base64
{i}  content: {encoded}
"""
        else:
            out += f"""{i}  content: |
{textwrap.indent(text, " " * (ind + 4))}"""
    return out


def commands(ind: int) -> str:
    i = " " * ind
    digests = " ".join(f"{arch}={digest}" for arch, digest in AGENT_SHA256.items())
    return f"""{i}preKubeadmCommands:
{i}  # Installs the agent binary for the node's architecture before kubeadm runs; refuses a download whose
{i}  # sha256 differs. Replace URL and digests with your release (or mirror) and each binary's sha256sum.
{i}  - /usr/local/lib/inplace-updater/install-agent.sh {AGENT_URL} {digests}
{i}postKubeadmCommands:
{i}  # Started after kubeadm: the agent finds its Machine through the Node that kubeadm just registered.
{i}  - systemctl daemon-reload
{i}  - systemctl enable --now inplace-updater-agent.service
"""


def kubeadm_config_template() -> str:
    return f"""# Worker nodes: the agent, its config and its token on every new Machine of a MachineDeployment.
# Generated by render-snippets.py. Merge `files`, `preKubeadmCommands` and `postKubeadmCommands` into
# your own KubeadmConfigTemplate (lists are atomic: keep your existing entries next to these).
# Names are examples: cluster my-cluster in namespace default.
apiVersion: bootstrap.cluster.x-k8s.io/v1beta2
kind: KubeadmConfigTemplate
metadata:
  name: my-cluster-md-0
  namespace: default
spec:
  template:
    spec:
      files:
{files_section(8)}{commands(6)}"""


def kubeadm_control_plane() -> str:
    return f"""# Control-plane nodes: the same agent install in a KubeadmControlPlane's kubeadmConfigSpec.
# Generated by render-snippets.py. Merge `files`, `preKubeadmCommands` and `postKubeadmCommands` into
# your own KubeadmControlPlane (lists are atomic: keep your existing entries next to these).
# Names are examples: cluster my-cluster in namespace default on CAPD. Bumping spec.version is what
# starts the first in-place update in docs/install.md.
apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: KubeadmControlPlane
metadata:
  name: my-cluster-control-plane
  namespace: default
spec:
  replicas: 3
  version: v1.34.1
  machineTemplate:
    spec:
      infrastructureRef:
        apiGroup: infrastructure.cluster.x-k8s.io
        kind: DockerMachineTemplate
        name: my-cluster-control-plane
  kubeadmConfigSpec:
    files:
{files_section(6)}{commands(4)}"""


SNIPPETS = {
    "kubeadmconfigtemplate.yaml": kubeadm_config_template,
    "kubeadmcontrolplane.yaml": kubeadm_control_plane,
}

if __name__ == "__main__":
    for name, render in SNIPPETS.items():
        (HERE / name).write_text(render())
        print(f"wrote deploy/node/{name}")
