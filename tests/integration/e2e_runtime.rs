//! A Kubernetes minor upgrade that also moves containerd and the CNI plugins, end to end: the real server
//! (file store) under the registration setting `upgradeContainerRuntime: "true"`, CAPI's calls as
//! capi-sim makes them, a real agent process on a demo sandbox (its node API the drain's fake API server), and
//! the runtime artifacts pulled by digest from a real registry (Debian's docker-registry, TLS + htpasswd) through
//! the agent config's mirror rewrite, with its credentials file and CA file. The "binaries" are shell scripts
//! that print their version, packed as the upstream releases are (containerd and the CNI plugins as tarballs,
//! runc as one file), extracted by the node's own `tar`.
//!
//! What it does not prove: no real containerd runs or restarts (the sandbox's `systemctl` records the call),
//! and the Kubernetes API is the drain's fake.

#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::agent_side::registry;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use capi_sim::UpdateOutcome;
use serde_json::json;

use crate::agent_side::registry::Registry;
use crate::common::fleet::{Setup, update_request};

/// How long the update may take (artifact downloads included).
const SETTLE: Duration = Duration::from_secs(90);

/// A shell script printing `line` (what the component's `--version` prints).
fn script(line: &str) -> String {
    format!("#!/bin/sh\necho \"{line}\"\n")
}

/// A gzipped tarball of `files` (name, content, mode), built with the system's tar.
fn tarball(files: &[(&str, String)]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    for (name, content) in files {
        let path = tree.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let out = dir.path().join("out.tgz");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&tree)
        .arg("-czf")
        .arg(&out)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(out).unwrap()
}

fn install(root: &Path, path: &str, content: &str) {
    let path = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, content).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

fn first_line(root: &Path, argv0: &str) -> String {
    let out = Command::new(root.join(argv0.trim_start_matches('/')))
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The agent config's artifact and runtime sections: the install sequence and version commands exactly as
/// `crates/agent/config-examples/release-binaries.yaml` ships them, a matrix whose v1.34 bundle names the pushed
/// artifacts by their upstream names, and the site's mirror, credentials and CA.
fn runtime_config(registry: &Registry, creds: &Path, digests: &[String; 3]) -> String {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/agent/config-examples/release-binaries.yaml"
    );
    let example: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(example).unwrap()).unwrap();
    let [containerd, runc, cni] = digests;
    let zero = "0".repeat(64);
    let source = |repository: &str, digest: &str| {
        format!("oci://registry.example.com/k8s/{repository}@sha256:{digest}")
    };
    let config = json!({
        "artifacts": {
            "mirrors": [{"prefix": "registry.example.com/k8s", "replacement": format!("{}/k8s", registry.host())}],
            "credentialsFile": creds.display().to_string(),
            "caFile": registry.ca_file().display().to_string(),
        },
        "runtime": {
            "matrix": [
                {"kubernetes": "v1.33",
                 "containerd": {"version": "1.7.28", "source": source("containerd", &zero)},
                 "runc": {"version": "1.3.3", "source": source("runc", &zero)},
                 "cniPlugins": {"version": "1.7.1", "source": source("cni-plugins", &zero)}},
                {"kubernetes": "v1.34",
                 "containerd": {"version": "2.1.4", "source": source("containerd", containerd)},
                 "runc": {"version": "1.3.3", "source": source("runc", runc)},
                 "cniPlugins": {"version": "1.8.0", "source": source("cni-plugins", cni)}},
            ],
            "versions": serde_json::to_value(&example["runtime"]["versions"]).unwrap(),
            "install": serde_json::to_value(&example["runtime"]["install"]).unwrap(),
        },
    });
    format!("\n{}", serde_yaml_ng::to_string(&config).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minor_upgrade_moves_containerd_and_the_cni_plugins_from_the_mirror() {
    let registry = Registry::start().await;
    let arch = inplace_agent_api::go_arch(std::env::consts::ARCH);
    let containerd_line = "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7";
    let digests = [
        registry.push(
            "k8s/containerd",
            &[(
                arch,
                &tarball(&[
                    ("bin/containerd", script(containerd_line)),
                    (
                        "bin/containerd-shim-runc-v2",
                        script("containerd-shim-runc-v2 v2.1.4"),
                    ),
                ]),
            )],
        ),
        registry.push(
            "k8s/runc",
            &[(arch, script("runc version 1.3.3").as_bytes())],
        ),
        registry.push(
            "k8s/cni-plugins",
            &[(
                arch,
                &tarball(&[("loopback", script("CNI loopback plugin v1.8.0"))]),
            )],
        ),
    ];

    let setup = Setup::new();
    let (server, capi) = setup.serve_on_file_store();
    let creds = setup.dir.path().join("registry.json");
    let auth = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("{}:{}", registry::USER, registry::PASSWORD),
    );
    std::fs::write(
        &creds,
        json!({"auths": {registry.host(): {"auth": auth}}}).to_string(),
    )
    .unwrap();

    let name = "edge-01-md-0";
    let sandbox =
        inplace_updater::cmd::demo::Sandbox::create(&setup.dir.path().join(name), "v1.33.4", false)
            .unwrap();
    install(
        &sandbox.root,
        "/usr/local/bin/containerd",
        &script("containerd github.com/containerd/containerd v1.7.28 05044ec"),
    );
    install(
        &sandbox.root,
        "/usr/local/bin/containerd-shim-runc-v2",
        &script("containerd-shim-runc-v2 v1.7.28"),
    );
    install(
        &sandbox.root,
        "/usr/local/sbin/runc",
        &script("runc version 1.3.3"),
    );
    install(
        &sandbox.root,
        "/opt/cni/bin/loopback",
        &script("CNI loopback plugin v1.7.1"),
    );
    let mut config = std::fs::read_to_string(&sandbox.config).unwrap();
    config.push_str(&runtime_config(&registry, &creds, &digests));
    std::fs::write(&sandbox.config, config).unwrap();
    let root = sandbox.root.clone();
    let agent = crate::common::fleet::AgentProcess::start(
        &server,
        &setup.certs.paths.ca_cert,
        &setup.token_file,
        name,
        sandbox,
    );

    let mut request = update_request("update-machine-worker.json", name);
    request["settings"] = json!({"upgradeContainerRuntime": "true"});
    let mut judged = crate::common::fleet::can_update_before(&request, "v1.33.4");
    judged["settings"] = request["settings"].clone();
    assert_eq!(
        capi.can_update_machine(&judged).await,
        capi_sim::CapiDecision::InPlace
    );
    let (outcome, messages) = capi.update_until_settled(&request, SETTLE).await;
    assert_eq!(
        outcome,
        UpdateOutcome::Done,
        "{messages:?}\nagent log:\n{}",
        agent.log()
    );
    // The agent logs every step it starts; CAPI's messages are samples (a quick step may run between two
    // calls and never be shown), so the plan's runtime step is looked for where every step is written.
    let agent_log = agent.log();
    assert!(
        agent_log.lines().any(|l| l.contains("step started")
            && l.contains("containerd, runc and CNI plugins of the node's runtime matrix")),
        "{messages:?}\nagent log:\n{agent_log}"
    );

    assert_eq!(
        first_line(&root, "/usr/local/bin/containerd"),
        containerd_line
    );
    assert_eq!(
        first_line(&root, "/usr/local/sbin/runc"),
        "runc version 1.3.3"
    );
    assert_eq!(
        first_line(&root, "/opt/cni/bin/loopback"),
        "CNI loopback plugin v1.8.0"
    );
    let calls = agent.sandbox.calls();
    let restart = calls
        .iter()
        .position(|c| c == "systemctl restart containerd")
        .unwrap_or_else(|| panic!("{calls:?}"));
    assert_eq!(
        calls
            .iter()
            .filter(|c| *c == "systemctl restart containerd")
            .count(),
        1,
        "{calls:?}"
    );
    // containerd restarted after the kubeadm upgrade and before the new kubelet.
    let upgrade = calls
        .iter()
        .position(|c| c.starts_with("kubeadm upgrade node"))
        .unwrap();
    let kubelet = calls
        .iter()
        .position(|c| c.starts_with("apt-get") && c.contains("kubelet="))
        .unwrap();
    assert!(upgrade < restart && restart < kubelet, "{calls:?}");
    // Every blob came through the mirror (the upstream name was never asked for), with credentials.
    let log = registry.log();
    for (repository, digest) in ["containerd", "runc", "cni-plugins"].iter().zip(&digests) {
        assert!(
            log.contains(&format!("/v2/k8s/{repository}/manifests/sha256:{digest}")),
            "the registry never served k8s/{repository}@sha256:{digest}:\n{log}"
        );
    }
    assert!(
        !agent.log().contains(registry::PASSWORD),
        "a credential reached the log"
    );
}
