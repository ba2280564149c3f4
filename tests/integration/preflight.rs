//! The agent's control-plane preflight against a real three-member etcd cluster (Debian's `etcd`) serving
//! clients over TLS with client-certificate auth, asked with a health-check client certificate from the
//! node's `/etc/kubernetes/pki/etcd` as kubeadm lays it out: all healthy passes; with one member killed
//! another member's preflight waits, then fails naming the killed member and the lost quorum; a node without
//! an etcd manifest does not look at etcd; a node whose own member is stopped passes while the other two keep
//! the quorum, asking them for the member list (issue 43.4). (The other control-plane Nodes' side is tested
//! in the agent crate against the fake API server.)
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::path::Path;
use std::time::{Duration, Instant};

use inplace_agent::{DriverConfig, control_plane_preflight};
use inplace_store::testing::{EtcdCluster, ServerTls};

/// A CA, a serving certificate for 127.0.0.1 and a health-check client certificate, written as kubeadm
/// does under `<root>/etc/kubernetes/pki/etcd`; the serving pair beside it.
fn kubeadm_pki(root: &Path) -> ServerTls {
    let pki = root.join("etc/kubernetes/pki/etcd");
    std::fs::create_dir_all(&pki).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "etcd-ca");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    std::fs::write(pki.join("ca.crt"), ca.pem()).unwrap();
    for (name, cn) in [
        ("server", "cp-1"),
        ("healthcheck-client", "kube-etcd-healthcheck-client"),
    ] {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(pki.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(pki.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    ServerTls {
        ca: pki.join("ca.crt"),
        cert: pki.join("server.crt"),
        key: pki.join("server.key"),
    }
}

fn agent_config(endpoint: &str) -> DriverConfig {
    DriverConfig::from_yaml(&format!("controlPlane:\n  etcdEndpoint: {endpoint}\n")).unwrap()
}

#[tokio::test]
async fn the_preflight_sees_a_real_etcd_cluster_lose_a_member() {
    let node = tempfile::tempdir().unwrap();
    let root = node.path().to_path_buf();
    let tls = kubeadm_pki(&root);
    let manifest = root.join("etc/kubernetes/manifests/etcd.yaml");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(&manifest, "kind: Pod\n").unwrap();
    let started = Instant::now();
    let mut cluster = EtcdCluster::start(&["cp-1", "cp-2", "cp-3"], Some(tls)).unwrap();
    eprintln!("3-member TLS etcd up in {:?}", started.elapsed());
    // This node runs cp-1; the local endpoint tells its member id.
    let config = agent_config(&cluster.members[0].client_url());

    let state = tempfile::tempdir().unwrap();
    let state = state.path().to_path_buf();
    let ok = control_plane_preflight(
        config.clone(),
        root.clone(),
        state.clone(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(
        ok.contains("etcd: the 2 other members are healthy, quorum 2 of 3 holds without cp-1"),
        "{ok}"
    );
    assert!(
        ok.contains("other control-plane Nodes not checked (no `node:` section"),
        "{ok}"
    );

    // Without the manifest the node runs no member: etcd is not asked (the endpoint is not even up).
    let etcdless = tempfile::tempdir().unwrap();
    let ok = control_plane_preflight(
        agent_config("https://127.0.0.1:1"),
        etcdless.path().to_path_buf(),
        etcdless.path().join("state"),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(
        ok.contains("no local etcd member (no etcd manifest)"),
        "{ok}"
    );

    cluster.members[2].kill();
    let killed = cluster.members[2].client_url();
    let asked = Instant::now();
    // Long enough for a look after the election a killed leader causes (meanwhile cp-2 answers unhealthy too):
    // the failure tells the last look.
    let failed = control_plane_preflight(
        config.clone(),
        root.clone(),
        state.clone(),
        Duration::from_secs(8),
    )
    .await
    .unwrap_err();
    eprintln!("blocked after {:?}: {failed}", asked.elapsed());
    assert!(
        failed.starts_with("control-plane preflight failed after ")
            && failed.contains(&format!("etcd member cp-3 ({killed}) unhealthy: "))
            && failed.contains("quorum without this member needs 2 healthy, 1 is"),
        "{failed}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "bounded by the wait given"
    );

    // The health-check key is the node's: without it etcd is not asked, and the failure names the key.
    std::fs::remove_file(root.join("etc/kubernetes/pki/etcd/healthcheck-client.key")).unwrap();
    let failed = control_plane_preflight(config, root, state, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        failed.contains("etcd: controlPlane.etcdKeyFile: "),
        "{failed}"
    );
}

#[tokio::test]
async fn a_node_whose_own_member_is_stopped_passes_while_the_others_keep_the_quorum() {
    let node = tempfile::tempdir().unwrap();
    let root = node.path().join("root");
    let tls = kubeadm_pki(&root);
    let manifest = root.join("etc/kubernetes/manifests/etcd.yaml");
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(&manifest, "kind: Pod\n").unwrap();
    let state = node.path().join("state");
    let mut cluster = EtcdCluster::start(&["cp-1", "cp-2", "cp-3"], Some(tls)).unwrap();
    let config = agent_config(&cluster.members[0].client_url());
    let within = Duration::from_secs(15);

    // A look while the local member answers: the agent learns the members (and which one is its own).
    control_plane_preflight(config.clone(), root.clone(), state.clone(), within)
        .await
        .unwrap();
    assert!(state.join("etcd-members.json").exists());

    // This node's member is stopped (a crash, the reboot a step made): it is not needed while cp-2 and cp-3
    // keep the quorum, and they are asked for the member list instead.
    cluster.members[0].kill();
    let asked = Instant::now();
    let ok = control_plane_preflight(config.clone(), root.clone(), state.clone(), within)
        .await
        .unwrap();
    eprintln!("passed after {:?}: {ok}", asked.elapsed());
    let others = [
        cluster.members[1].client_url(),
        cluster.members[2].client_url(),
    ];
    assert!(
        ok.contains("etcd: the 2 other members are healthy, quorum 2 of 3 holds without cp-1 (members listed by ")
            && others.iter().any(|url| ok.contains(&format!("listed by {url}: the local endpoint did not answer)"))),
        "{ok}"
    );

    // An agent that never saw the members cannot ask the others: it waits, then fails saying so.
    let fresh = node.path().join("fresh-state");
    let failed =
        control_plane_preflight(config.clone(), root.clone(), fresh, Duration::from_secs(1))
            .await
            .unwrap_err();
    assert!(
        failed.contains(&format!(
            "etcd: {}/v3/cluster/member/list: ",
            cluster.members[0].client_url()
        )) && failed
            .contains("(no other member known to ask: the agent learns them from a listing)"),
        "{failed}"
    );

    // One of the other two stopped too: the quorum is gone, the preflight blocks naming it.
    cluster.members[2].kill();
    let failed = control_plane_preflight(config, root, state, Duration::from_secs(4))
        .await
        .unwrap_err();
    assert!(
        failed.contains(&format!(
            "etcd member cp-3 ({}) unhealthy: ",
            cluster.members[2].client_url()
        )) && failed.contains("quorum without this member needs 2 healthy, "),
        "{failed}"
    );
}
