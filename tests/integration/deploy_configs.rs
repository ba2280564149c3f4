//! The configuration files shipped for operators parse with the real parsers: the policy ConfigMap, the node
//! agent's driver config, and the agent config examples.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::Path;

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn the_deployed_policy_is_the_built_in_one_and_parses() {
    let text = std::fs::read_to_string(repo("deploy/base/policy.yaml")).unwrap();
    let policy = inplace_core::Policy::from_yaml(&text).unwrap();
    assert_eq!(
        policy.rules().len(),
        inplace_core::Policy::builtin().rules().len()
    );
    assert_eq!(
        text,
        inplace_core::DEFAULT_POLICY_YAML,
        "deploy/base/policy.yaml drifted from `policy show`"
    );
}

#[test]
fn agent_driver_configs_parse_and_validate() {
    let mut files = vec![repo("deploy/node/agent.yaml")];
    for entry in std::fs::read_dir(repo("crates/agent/config-examples")).unwrap() {
        files.push(entry.unwrap().path());
    }
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let config = inplace_agent::DriverConfig::from_yaml(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        config
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            config.kubernetes.install_kubeadm.is_some(),
            "{}: no Kubernetes upgrade commands",
            file.display()
        );
    }
}
