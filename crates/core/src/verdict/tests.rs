use serde_json::{Value, json};

use super::*;
use crate::diff::ChangeKind;

fn kubeadm(spec: Value) -> Value {
    json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig", "spec": spec})
}

fn template(kind: &str, group: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{group}/v1beta2"), "kind": kind, "spec": {"template": {"spec": spec}}})
}

fn machine(spec: Value) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "spec": spec})
}

fn infra(spec: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachine", "spec": spec})
}

/// Machine: only what CAPI's `CleanupMachineSpecForDiff` keeps; the same for a MachineSet's template.
#[test]
fn machines_keep_only_what_capi_compares() {
    let spec = json!({
        "clusterName": "c", "version": "v1.34.1", "failureDomain": "fd-1", "providerID": "p://1",
        "bootstrap": {"configRef": {"name": "x"}, "dataSecretName": "x"}, "infrastructureRef": {"name": "y"},
        "minReadySeconds": 5, "readinessGates": [{"conditionType": "A"}], "taints": [{"key": "k"}],
        "deletion": {"nodeDrainTimeoutSeconds": 1, "nodeDeletionTimeoutSeconds": 10, "nodeVolumeDetachTimeoutSeconds": 2}
    });
    let expected = json!({"version": "v1.34.1", "failureDomain": "fd-1"});
    assert_eq!(
        normalize(ObjectRole::Machine, Scope::Object, &machine(spec.clone())),
        expected
    );
    let set = template("MachineSet", "cluster.x-k8s.io", spec);
    assert_eq!(
        normalize(ObjectRole::Machine, Scope::Template, &set),
        expected
    );
}

/// Every difference CAPI itself introduces between the KubeadmConfig CanUpdateMachine saw (after
/// `PrepareKubeadmConfigsForDiff`) and the live one UpdateMachine gets, absorbed case by case.
#[test]
fn kubeadm_configs_are_cleaned_as_kcp_cleans_them() {
    let judged = json!({"files": [{"path": "/etc/a", "content": "x"}], "format": "cloud-config",
        "joinConfiguration": {"nodeRegistration": {"imagePullPolicy": "IfNotPresent"}, "controlPlane": {}}});
    let cases: [(&str, Value); 9] = [
        ("as judged", judged.clone()),
        (
            "bootstrap token, CA hashes and endpoint written by CABPK",
            json!({"files": [{"path": "/etc/a", "content": "x"}],
                "joinConfiguration": {"controlPlane": {}, "discovery": {"bootstrapToken": {
                    "token": "abcdef.0123456789abcdef", "apiServerEndpoint": "10.0.0.1:6443",
                    "caCertHashes": ["sha256:00"]}}}}),
        ),
        (
            "defaults left out",
            json!({"files": [{"path": "/etc/a", "content": "x"}], "joinConfiguration": {"controlPlane": {}}}),
        ),
        (
            "defaults spelled out, also in initConfiguration",
            json!({"files": [{"path": "/etc/a", "content": "x"}], "format": "cloud-config",
                "initConfiguration": {"nodeRegistration": {"imagePullPolicy": "IfNotPresent"}},
                "joinConfiguration": {"nodeRegistration": {"imagePullPolicy": "IfNotPresent"}, "controlPlane": {}}}),
        ),
        (
            "empty lists and maps",
            json!({"files": [{"path": "/etc/a", "content": "x"}], "users": [], "mounts": [],
                "clusterConfiguration": {"apiServer": {"extraArgs": [], "certSANs": []}, "featureGates": {}},
                "joinConfiguration": {"controlPlane": {}, "nodeRegistration": {"kubeletExtraArgs": [], "ignorePreflightErrors": []}}}),
        ),
        (
            "controlPlaneEndpoint on a former init Machine, and DNS, which KCP overwrites",
            json!({"files": [{"path": "/etc/a", "content": "x"}],
                "clusterConfiguration": {"controlPlaneEndpoint": "10.0.0.1:6443", "dns": {"imageTag": "v1.12"}},
                "joinConfiguration": {"controlPlane": {}}}),
        ),
        (
            "health-check timeout converted from v1beta1",
            json!({"files": [{"path": "/etc/a", "content": "x"}],
                "joinConfiguration": {"controlPlane": {}, "timeouts": {"controlPlaneComponentHealthCheckSeconds": 240}}}),
        ),
        (
            "an orphaned initConfiguration of an object created by CAPI <= 1.11",
            json!({"files": [{"path": "/etc/a", "content": "x"}],
                "initConfiguration": {"localAPIEndpoint": {"advertiseAddress": "10.0.0.2"}, "bootstrapTokens": [{"token": "abcdef.0123456789abcdef"}]},
                "joinConfiguration": {"controlPlane": {}}}),
        ),
        (
            "nulls",
            json!({"files": [{"path": "/etc/a", "content": "x", "encoding": null}], "ntp": null,
                "joinConfiguration": {"controlPlane": {}, "patches": null}}),
        ),
    ];
    let want = normalize(ObjectRole::Bootstrap, Scope::Object, &kubeadm(judged));
    assert_eq!(
        want,
        json!({"files": [{"path": "/etc/a", "content": "x"}], "format": "cloud-config",
            "joinConfiguration": {"nodeRegistration": {"imagePullPolicy": "IfNotPresent"}}})
    );
    for (name, spec) in cases {
        let got = normalize(ObjectRole::Bootstrap, Scope::Object, &kubeadm(spec.clone()));
        assert_eq!(got, want, "{name}");
        let as_template = template("KubeadmConfigTemplate", "bootstrap.cluster.x-k8s.io", spec);
        assert_eq!(
            normalize(ObjectRole::Bootstrap, Scope::Template, &as_template),
            want,
            "{name} (template)"
        );
    }
}

/// What normalisation keeps: real changes, other timeouts, an empty taint list, and kubelet flags of an init
/// configuration (the plan reads them when the join configuration has none).
#[test]
fn normalisation_keeps_what_matters_on_the_node() {
    let spec = json!({
        "diskSetup": {"partitions": [{"device": "/dev/sdb"}]},
        "joinConfiguration": {"timeouts": {"kubeletHealthCheckSeconds": 40}, "nodeRegistration": {"taints": []}},
        "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "v", "value": "2"}]}}
    });
    let got = normalize(ObjectRole::Bootstrap, Scope::Object, &kubeadm(spec));
    assert_eq!(
        got,
        json!({
            "diskSetup": {"partitions": [{"device": "/dev/sdb"}]},
            "format": "cloud-config",
            "joinConfiguration": {"timeouts": {"kubeletHealthCheckSeconds": 40}, "nodeRegistration": {
                "taints": [], "imagePullPolicy": "IfNotPresent", "kubeletExtraArgs": [{"name": "v", "value": "2"}]}}
        })
    );
    // The join configuration's own flags win, as in the plan.
    let both = json!({
        "joinConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "a", "value": "1"}]}},
        "initConfiguration": {"nodeRegistration": {"kubeletExtraArgs": [{"name": "b", "value": "2"}]}}
    });
    let got = normalize(ObjectRole::Bootstrap, Scope::Object, &kubeadm(both));
    assert_eq!(
        got.pointer("/joinConfiguration/nodeRegistration/kubeletExtraArgs"),
        Some(&json!([{"name": "a", "value": "1"}]))
    );
    // Another bootstrap provider's `discovery` is not CABPK's: kept.
    let talos = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1alpha3", "kind": "TalosConfig",
        "spec": {"joinConfiguration": {"discovery": {"x": 1}}, "empty": []}});
    assert_eq!(
        normalize(ObjectRole::Bootstrap, Scope::Object, &talos),
        json!({"joinConfiguration": {"discovery": {"x": 1}}})
    );
    // Infrastructure objects as they are, minus empty members.
    assert_eq!(
        normalize(
            ObjectRole::Infra,
            Scope::Object,
            &infra(json!({"a": {"b": []}, "c": 0, "d": false}))
        ),
        json!({"c": 0, "d": false})
    );
}

fn prints_of(spec: Value) -> FingerprintMap {
    fingerprints(&spec).1
}

/// Paths in the diff's vocabulary, short hashes, never a value.
#[test]
fn fingerprints_are_paths_and_hashes_only() {
    let secret = "-----BEGIN PRIVATE KEY-----MIIEvQ";
    let map = prints_of(json!({
        "files": [{"path": "/etc/x", "content": secret}],
        "users": [{"name": "u", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"]}],
        "ntp": {"servers": ["a"]}
    }));
    let paths: Vec<&str> = map.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "spec.files",
            "spec.files[path=/etc/x].content",
            "spec.files[path=/etc/x].path",
            "spec.ntp.servers[0]",
            "spec.users",
            "spec.users[name=u].name",
            "spec.users[name=u].sshAuthorizedKeys[0]",
        ]
    );
    for print in map.values() {
        assert_eq!(print.len(), FINGERPRINT_HEX);
        assert!(print.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let text = serde_json::to_string(&map).unwrap();
    assert!(
        !text.contains("PRIVATE") && !text.contains("AAAA"),
        "{text}"
    );
    // The same value at another path has another fingerprint (nothing to learn by comparing them).
    let twice = prints_of(json!({"a": "same", "b": "same"}));
    assert_ne!(twice["spec.a"], twice["spec.b"]);
}

/// A reorder of a keyed list is a change (the diff reports it), seen in the list's own entry.
#[test]
fn keyed_list_order_is_fingerprinted() {
    let a = prints_of(json!({"files": [{"path": "/a"}, {"path": "/b"}]}));
    let b = prints_of(json!({"files": [{"path": "/b"}, {"path": "/a"}]}));
    assert_ne!(a["spec.files"], b["spec.files"]);
    assert_eq!(a["spec.files[path=/a].path"], b["spec.files[path=/a].path"]);
}

/// Over the bound a map is one hash per top-level field, then one for the whole spec; each fits.
#[test]
fn big_maps_fall_back_to_coarser_fingerprints() {
    let files: Vec<Value> = (0..3000)
        .map(|i| json!({"path": format!("/etc/many/file-{i:05}"), "content": "x"}))
        .collect();
    let (granularity, map) = fingerprints(&json!({"files": files, "ntp": {"enabled": true}}));
    assert_eq!(granularity, Granularity::Fields);
    assert_eq!(map.keys().collect::<Vec<_>>(), ["spec.files", "spec.ntp"]);
    let members: serde_json::Map<String, Value> = (0..8000)
        .map(|i| (format!("member-{i:05}-with-a-long-name"), json!(i)))
        .collect();
    let (granularity, map) = fingerprints(&Value::Object(members));
    assert_eq!(granularity, Granularity::Whole);
    assert_eq!(map.keys().collect::<Vec<_>>(), ["spec"]);
    assert!(serde_json::to_string(&map).unwrap().len() <= MAX_FINGERPRINT_BYTES);
}

fn side(machine_spec: Value, bootstrap: Value, infra_spec: Value) -> [Value; 3] {
    [machine(machine_spec), kubeadm(bootstrap), infra(infra_spec)]
}

fn normalized(scope: Scope, objects: &[Value; 3]) -> Normalized {
    Normalized::of(
        scope,
        &Objects {
            machine: Some(&objects[0]),
            bootstrap: Some(&objects[1]),
            infra: Some(&objects[2]),
        },
    )
}

fn shown(mismatches: &[Mismatch]) -> Vec<String> {
    mismatches.iter().map(ToString::to_string).collect()
}

/// Exact mode: any path of either side that differs, an added subtree named once at its root.
#[test]
fn exact_checks_name_every_path_that_was_not_judged() {
    let judged = side(
        json!({"version": "v1.34.1"}),
        json!({"files": [{"path": "/a", "content": "1"}]}),
        json!({"image": "x"}),
    );
    let prints = normalized(Scope::Object, &judged).prints();
    let same = side(
        json!({"version": "v1.34.1", "providerID": "p://1"}),
        json!({"files": [{"path": "/a", "content": "1"}], "joinConfiguration": {"discovery": {"bootstrapToken": {"token": "t"}}}}),
        json!({"image": "x"}),
    );
    assert!(
        check(
            &prints,
            &Desired::new(normalized(Scope::Object, &same)),
            CheckMode::Exact
        )
        .is_empty()
    );

    let later = side(
        json!({"version": "v1.34.2"}),
        json!({"files": [{"path": "/a", "content": "2"}, {"path": "/b", "contentFrom": {"secret": {"name": "s", "key": "k"}}}],
            "diskSetup": {"partitions": [{"device": "/dev/sdb", "layout": true}], "filesystems": [{"device": "/dev/sdb1"}]}}),
        json!({"image": "x", "extra": 1}),
    );
    let found = check(
        &prints,
        &Desired::new(normalized(Scope::Object, &later)),
        CheckMode::Exact,
    );
    assert_eq!(
        shown(&found),
        [
            "Machine spec.version (changed)",
            "KubeadmConfig spec.files (changed)",
            "KubeadmConfig spec.files[path=/a].content (changed)",
            "KubeadmConfig spec.diskSetup (added)",
            "KubeadmConfig spec.files[path=/b] (added)",
            "DevMachine spec.extra (added)",
        ]
    );
    assert_eq!(found[0].change, ChangeKind::Changed);

    // An object gone, or of another kind.
    let mut other = same.clone();
    other[2]["kind"] = json!("OtherMachine");
    let found = check(
        &prints,
        &Desired::new(normalized(Scope::Object, &other)),
        CheckMode::Exact,
    );
    assert_eq!(shown(&found), ["OtherMachine spec (changed)"]);
    let without = Normalized {
        bootstrap: None,
        ..normalized(Scope::Object, &same)
    };
    assert_eq!(
        shown(&check(&prints, &Desired::new(without), CheckMode::Exact)),
        ["KubeadmConfig spec (removed)"]
    );
}

/// Template mode: judged template paths must hold; instance fields of infrastructure objects are ignored,
/// but the Machine and a KubeadmConfig must match exactly (their instance fields are normalised away).
#[test]
fn template_checks_ignore_instance_fields_only_where_they_can_be() {
    let templates = [
        template(
            "MachineSet",
            "cluster.x-k8s.io",
            json!({"version": "v1.34.1", "bootstrap": {"configRef": {"name": "t"}}}),
        ),
        template(
            "KubeadmConfigTemplate",
            "bootstrap.cluster.x-k8s.io",
            json!({"files": [{"path": "/a", "content": "1"}]}),
        ),
        template(
            "DevMachineTemplate",
            "infrastructure.cluster.x-k8s.io",
            json!({"image": "x"}),
        ),
    ];
    let prints = normalized(Scope::Template, &templates).prints();
    let honest = side(
        json!({"version": "v1.34.1", "providerID": "p://1", "bootstrap": {"dataSecretName": "d"}}),
        json!({"files": [{"path": "/a", "content": "1"}], "joinConfiguration": {"discovery": {"bootstrapToken": {"token": "t"}}}}),
        json!({"image": "x", "providerID": "p://1", "instanceID": "i-1"}),
    );
    let honest = Desired::new(normalized(Scope::Object, &honest));
    assert!(check(&prints, &honest, CheckMode::TemplateSubset).is_empty());
    assert!(
        !check(&prints, &honest, CheckMode::Exact).is_empty(),
        "exact mode would see the instance fields"
    );

    let drifted = side(
        json!({"version": "v1.34.1", "failureDomain": "fd-2"}),
        json!({"files": [{"path": "/a", "content": "2"}], "diskSetup": {"partitions": [{"device": "/dev/sdb"}]}}),
        json!({"image": "y", "providerID": "p://1"}),
    );
    let found = check(
        &prints,
        &Desired::new(normalized(Scope::Object, &drifted)),
        CheckMode::TemplateSubset,
    );
    assert_eq!(
        shown(&found),
        [
            "Machine spec.failureDomain (added)",
            "KubeadmConfig spec.files[path=/a].content (changed)",
            "KubeadmConfig spec.diskSetup (added)",
            "DevMachine spec.image (changed)",
        ]
    );
}

/// A subtree added or removed as a whole is named once, at its root; ancestors respect keyed and quoted
/// segments whose text holds dots or brackets.
#[test]
fn whole_subtrees_are_named_at_their_root() {
    let judged = side(
        json!({"version": "v1"}),
        json!({"users": [{"name": "capi", "sshAuthorizedKeys": ["a", "b"]}], "ntp": {"servers": ["x"]}}),
        json!({}),
    );
    let prints = normalized(Scope::Object, &judged).prints();
    let later = side(
        json!({"version": "v1"}),
        json!({"ntp": {"servers": ["x"]}, "files": [{"path": "/etc/a.conf", "content": "1"}]}),
        json!({}),
    );
    assert_eq!(
        shown(&check(
            &prints,
            &Desired::new(normalized(Scope::Object, &later)),
            CheckMode::Exact
        )),
        [
            "KubeadmConfig spec.users (removed)",
            "KubeadmConfig spec.files (added)"
        ]
    );
    let cut: Vec<&str> = check::ancestors("spec.files[path=/etc/a.conf].content").collect();
    assert_eq!(cut, ["spec.files", "spec.files[path=/etc/a.conf]"]);
    let cut: Vec<&str> = check::ancestors(r#"spec["a.b[c"].d[0]"#).collect();
    assert_eq!(cut, [r#"spec["a.b[c"]"#, r#"spec["a.b[c"].d"#]);
}

#[test]
fn state_fingerprints_tell_states_apart() {
    let a = normalized(
        Scope::Object,
        &side(json!({"version": "v1"}), json!({}), json!({})),
    );
    let b = normalized(
        Scope::Object,
        &side(json!({"version": "v2"}), json!({}), json!({})),
    );
    let fa = a.prints().fingerprint();
    assert_eq!(fa.len(), 64);
    assert_eq!(fa, a.prints().fingerprint());
    assert_ne!(fa, b.prints().fingerprint());
    assert_eq!(operator_fingerprint(&fa).len(), OPERATOR_FINGERPRINT_HEX);
}

/// CAPI's own test vectors for `format.MustFormatValue`.
#[test]
fn set_name_label_values_match_capi() {
    assert_eq!(label_value("machineSetName"), "machineSetName");
    let long = "machineSetName".repeat(12);
    assert_eq!(label_value(&long), "hash_FR_ghQ_z");
    assert!(is_label_value("hash_FR_ghQ_z"));
    assert!(!is_label_value(&"a".repeat(64)));
    assert!(!is_label_value("-a"));
    assert_eq!(label_value(&"a".repeat(63)), "a".repeat(63));
}

/// Fingerprints are stored in verdict records and compared with ones computed by a later release: the hash
/// of every leaf and of a whole state stays the same whatever way it is computed (these are the values of
/// the first release that stored them).
#[test]
fn fingerprints_are_stable_across_releases() {
    let spec = json!({
        "files": [
            {"path": "/etc/a", "content": "x\n\"quoted\"\t\u{1}", "permissions": "0644"},
            {"path": "/etc/ünï cödé", "content": "", "append": true},
            {"path": "/etc/odd]=\"", "encoding": "base64", "content": "AAAA"}
        ],
        "users": [{"name": "u", "sshAuthorizedKeys": ["ssh-ed25519 AAAA", "ssh-rsa BBBB"], "uid": 1000}],
        "ntp": {"enabled": null, "servers": []},
        "weird key.with dots": {"": {}, "n": -1.5e-7, "big": 18446744073709551615u64},
    });
    let object = NormalizedObject {
        kind: "KubeadmConfig".into(),
        api_group: "bootstrap.cluster.x-k8s.io".into(),
        spec: spec.clone(),
    };
    let prints = object.prints();
    let printed: Vec<String> = prints
        .entries
        .iter()
        .map(|(path, print)| format!("{path} {print}"))
        .collect();
    let fields = fingerprints_at(&spec, Granularity::Fields);
    let whole = fingerprints_at(&spec, Granularity::Whole);
    let state = Prints {
        bootstrap: Some(prints),
        ..Prints::default()
    };
    let expected = [
        r#"spec.files f79412d87ff57fb5"#,
        r#"spec.files[path="/etc/odd]=\""].content 3c8af8284e85e77c"#,
        r#"spec.files[path="/etc/odd]=\""].encoding b92d22f663eee3b8"#,
        r#"spec.files[path="/etc/odd]=\""].path 84177d7fa4d5c39b"#,
        r#"spec.files[path=/etc/a].content f09bc60fba968d98"#,
        r#"spec.files[path=/etc/a].path 99c438bbc3d5e21b"#,
        r#"spec.files[path=/etc/a].permissions c9fe57a2f1204adf"#,
        r#"spec.files[path=/etc/ünï cödé].append a4a3e35770b68a7c"#,
        r#"spec.files[path=/etc/ünï cödé].content 4869bf97ee64ebae"#,
        r#"spec.files[path=/etc/ünï cödé].path 5eaef60914281624"#,
        r#"spec.ntp.enabled fa76aa0972d825a5"#,
        r#"spec.ntp.servers 5773158cf456b095"#,
        r#"spec.users 2d6d45b20a35e5cc"#,
        r#"spec.users[name=u].name 1d534b0d7ea3eb5a"#,
        r#"spec.users[name=u].sshAuthorizedKeys[0] 9c0482bb1733639e"#,
        r#"spec.users[name=u].sshAuthorizedKeys[1] 1d4c131e7380197c"#,
        r#"spec.users[name=u].uid 3533950027a18802"#,
        r#"spec["weird key.with dots"].big fd0bc3e502150bb8"#,
        r#"spec["weird key.with dots"].n c539c7f420df28f7"#,
        r#"spec["weird key.with dots"][""] 43240ddbc8b2b646"#,
    ];
    assert_eq!(printed, expected);
    let pairs = |map: &FingerprintMap| -> Vec<(String, String)> {
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        pairs(&fields),
        owned(&[
            ("spec.files", "26960fa860437d95"),
            ("spec.ntp", "2172a22693b2b7fd"),
            ("spec.users", "14ca4ad590065e64"),
            (r#"spec["weird key.with dots"]"#, "a465e358570f44fa"),
        ])
    );
    assert_eq!(pairs(&whole), owned(&[("spec", "159b07dad7b85042")]));
    assert_eq!(
        state.fingerprint(),
        "0141b41e1476091575792a6d396db59c5195a08e192ac2955feafd33faf379de"
    );
}
