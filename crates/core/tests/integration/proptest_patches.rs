//! Property: for random mutations of realistic objects, in both scopes, with both patch types and
//! several settings, CAPI applying our patches finds every accepted path as desired and every
//! rejected path as current, reaches the outcome we announce, and our self-check never fires.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use inplace_core::{ObjectRole, Policy};
use proptest::prelude::*;
use serde_json::{Value, json};

use ObjectRole::{Bootstrap, Infra, Machine};

#[derive(Clone, Debug)]
enum Mutation {
    Version(usize),
    FailureDomain,
    MachineIgnored(usize),
    FileContent(usize, String),
    FileAdd(usize, usize, bool),
    FileRemove(usize),
    FileSwap(usize, usize),
    FileField(usize, usize),
    KeyAdd(usize, String),
    KeyRemove(usize),
    UserShell(usize),
    UserAdd,
    UsersReverse,
    NtpServers(Vec<String>),
    NtpRemove,
    NtpEnabledNull,
    EtcdTag,
    EtcdRepo,
    KubeletArg(bool, usize, String),
    KubeletArgAdd(bool),
    KubeletArgRemove(bool),
    ApiServerDuplicateArg,
    Infra(usize),
    Commands(bool),
    NullField(usize),
    CurrentLacksNtp,
}

const VERSIONS: &[&str] = &[
    "v1.32.9",
    "v1.33.3",
    "v1.33.5",
    "v1.34.0",
    "v1.34.1-rc.0",
    "v1.35.0",
    "banana",
];
const NEW_PATHS: &[&str] = &[
    "/etc/a~b/c",
    "/etc/kubernetes/x.yaml",
    "/opt/data",
    "/etc/[odd]",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    let text = "[a-z0-9 ]{0,12}";
    prop_oneof![
        1 => (0..VERSIONS.len()).prop_map(Mutation::Version),
        1 => Just(Mutation::FailureDomain),
        1 => (0usize..4).prop_map(Mutation::MachineIgnored),
        4 => (0usize..8, text).prop_map(|(i, s)| Mutation::FileContent(i, s)),
        4 => (0..NEW_PATHS.len(), 0usize..8, any::<bool>()).prop_map(|(i, at, secret)| Mutation::FileAdd(i, at, secret)),
        4 => (0usize..8).prop_map(Mutation::FileRemove),
        4 => (0usize..8, 0usize..8).prop_map(|(a, b)| Mutation::FileSwap(a, b)),
        1 => (0usize..8, 0usize..3).prop_map(|(a, b)| Mutation::FileField(a, b)),
        4 => (0usize..4, "ssh-ed25519 [A-Za-z]{4}").prop_map(|(u, k)| Mutation::KeyAdd(u, k)),
        4 => (0usize..4).prop_map(Mutation::KeyRemove),
        1 => (0usize..4).prop_map(Mutation::UserShell),
        1 => Just(Mutation::UserAdd),
        1 => Just(Mutation::UsersReverse),
        1 => proptest::collection::vec("[a-z]{1,5}\\.example", 0..3).prop_map(Mutation::NtpServers),
        1 => Just(Mutation::NtpRemove),
        1 => Just(Mutation::NtpEnabledNull),
        1 => Just(Mutation::EtcdTag),
        1 => Just(Mutation::EtcdRepo),
        1 => (any::<bool>(), 0usize..4, "[0-9]{1,3}").prop_map(|(j, i, v)| Mutation::KubeletArg(j, i, v)),
        4 => any::<bool>().prop_map(Mutation::KubeletArgAdd),
        4 => any::<bool>().prop_map(Mutation::KubeletArgRemove),
        1 => Just(Mutation::ApiServerDuplicateArg),
        1 => (0usize..5).prop_map(Mutation::Infra),
        1 => any::<bool>().prop_map(Mutation::Commands),
        1 => (0usize..6).prop_map(Mutation::NullField),
        1 => Just(Mutation::CurrentLacksNtp),
    ]
}

fn arr(v: &mut Value) -> &mut Vec<Value> {
    if !v.is_array() {
        *v = json!([]);
    }
    v.as_array_mut().unwrap()
}

fn apply(req: &mut Req, m: &Mutation) {
    match m {
        Mutation::Version(i) => req.desired_spec(Machine)["version"] = json!(VERSIONS[*i]),
        Mutation::FailureDomain => req.desired_spec(Machine)["failureDomain"] = json!("fd-9"),
        Mutation::MachineIgnored(i) => {
            let m = req.desired_spec(Machine);
            match i {
                0 => m["minReadySeconds"] = json!(10),
                1 => m["readinessGates"] = json!([]),
                2 => m["deletion"]["nodeDeletionTimeoutSeconds"] = json!(1),
                _ => m["taints"] = json!([{"key": "a", "effect": "NoSchedule"}]),
            }
        }
        Mutation::FileContent(i, s) => {
            let f = arr(&mut req.desired_spec(Bootstrap)["files"]);
            if !f.is_empty() {
                let n = f.len();
                f[i % n]["content"] = json!(s);
            }
        }
        Mutation::FileAdd(i, at, secret) => {
            let f = arr(&mut req.desired_spec(Bootstrap)["files"]);
            let path = NEW_PATHS[*i];
            if f.iter().all(|x| x["path"] != json!(path)) {
                let item = if *secret {
                    json!({"path": path, "contentFrom": {"secret": {"name": "s", "key": "k"}}})
                } else {
                    json!({"path": path, "content": "c", "permissions": "0600"})
                };
                let at = at % (f.len() + 1);
                f.insert(at, item);
            }
        }
        Mutation::FileRemove(i) => {
            let f = arr(&mut req.desired_spec(Bootstrap)["files"]);
            if !f.is_empty() {
                let n = f.len();
                f.remove(i % n);
            }
        }
        Mutation::FileSwap(a, b) => {
            let f = arr(&mut req.desired_spec(Bootstrap)["files"]);
            if !f.is_empty() {
                let n = f.len();
                f.swap(a % n, b % n);
            }
        }
        Mutation::FileField(i, which) => {
            let f = arr(&mut req.desired_spec(Bootstrap)["files"]);
            if !f.is_empty() {
                let n = f.len();
                let item = &mut f[i % n];
                match which {
                    0 => item["permissions"] = json!("0755"),
                    1 => item["owner"] = json!("nobody:nogroup"),
                    _ => item["encoding"] = json!("base64"),
                }
            }
        }
        Mutation::KeyAdd(u, k) => {
            let users = arr(&mut req.desired_spec(Bootstrap)["users"]);
            if !users.is_empty() {
                let n = users.len();
                arr(&mut users[u % n]["sshAuthorizedKeys"]).push(json!(k));
            }
        }
        Mutation::KeyRemove(u) => {
            let users = arr(&mut req.desired_spec(Bootstrap)["users"]);
            if !users.is_empty() {
                let n = users.len();
                arr(&mut users[u % n]["sshAuthorizedKeys"]).pop();
            }
        }
        Mutation::UserShell(u) => {
            let users = arr(&mut req.desired_spec(Bootstrap)["users"]);
            if !users.is_empty() {
                let n = users.len();
                users[u % n]["shell"] = json!("/bin/sh");
            }
        }
        Mutation::UserAdd => {
            let users = arr(&mut req.desired_spec(Bootstrap)["users"]);
            if users.iter().all(|u| u["name"] != json!("ops")) {
                users.push(json!({"name": "ops", "sshAuthorizedKeys": ["k"]}));
            }
        }
        Mutation::UsersReverse => arr(&mut req.desired_spec(Bootstrap)["users"]).reverse(),
        Mutation::NtpServers(s) => req.desired_spec(Bootstrap)["ntp"]["servers"] = json!(s),
        Mutation::NtpRemove => {
            req.desired_spec(Bootstrap)
                .as_object_mut()
                .unwrap()
                .remove("ntp");
        }
        Mutation::NtpEnabledNull => req.desired_spec(Bootstrap)["ntp"]["enabled"] = Value::Null,
        Mutation::EtcdTag => {
            req.desired_spec(Bootstrap)["clusterConfiguration"]["etcd"]["local"]["imageTag"] =
                json!("3.6.0-0")
        }
        Mutation::EtcdRepo => {
            req.desired_spec(Bootstrap)["clusterConfiguration"]["etcd"]["local"]["imageRepository"] =
                json!("m.example")
        }
        Mutation::KubeletArg(join, i, v) => {
            let args = kubelet_args(req, *join);
            if !args.is_empty() {
                let n = args.len();
                args[i % n]["value"] = json!(v);
            }
        }
        Mutation::KubeletArgAdd(join) => {
            let args = kubelet_args(req, *join);
            if args.iter().all(|a| a["name"] != json!("v")) {
                args.insert(0, json!({"name": "v", "value": "2"}));
            }
        }
        Mutation::KubeletArgRemove(join) => {
            kubelet_args(req, *join).pop();
        }
        Mutation::ApiServerDuplicateArg => {
            arr(&mut req.desired_spec(Bootstrap)["clusterConfiguration"]["apiServer"]["extraArgs"])
                .push(json!({"name": "audit-log-path", "value": "/b"}))
        }
        Mutation::Infra(i) => {
            let s = req.desired_spec(Infra);
            match i {
                0 => s["memoryMiB"] = json!(4096),
                1 => s["template"] = json!("ubuntu-2404-kube-v1.34.0"),
                2 => s["network"]["devices"][0]["gateway4"] = Value::Null,
                3 => s["tags"] = json!(["a"]),
                _ => {
                    s.as_object_mut().unwrap().remove("diskGiB");
                }
            }
        }
        Mutation::Commands(push) => {
            let c = arr(&mut req.desired_spec(Bootstrap)["preKubeadmCommands"]);
            if *push {
                c.push(json!("echo more"));
            } else {
                c.pop();
            }
        }
        Mutation::NullField(i) => {
            let s = req.desired_spec(Bootstrap);
            let key = ["format", "mounts", "users", "files", "ntp", "verbosity"][*i];
            s[key] = Value::Null;
        }
        Mutation::CurrentLacksNtp => {
            req.current_spec(Bootstrap)
                .as_object_mut()
                .unwrap()
                .remove("ntp");
        }
    }
}

fn kubelet_args(req: &mut Req, join: bool) -> &mut Vec<Value> {
    let which = if join {
        "joinConfiguration"
    } else {
        "initConfiguration"
    };
    arr(&mut req.desired_spec(Bootstrap)[which]["nodeRegistration"]["kubeletExtraArgs"])
}

const SETTINGS: &[&[(&str, &str)]] = &[
    &[],
    &[("patchType", "JSONMergePatch")],
    &[("disableActions", "ntp,files")],
    &[("mode", "in-place-only")],
    &[("inPlace", "false"), ("patchType", "JSONMergePatch")],
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn capi_reads_our_patches_as_decided(
        template in any::<bool>(),
        mutations in proptest::collection::vec(mutation(), 1..8),
        preset in 0..SETTINGS.len(),
    ) {
        let mut req = if template { Req::machine_set("v1.33.4") } else { Req::machine("v1.33.4") };
        for m in &mutations {
            apply(&mut req, m);
        }
        let d = req.decide_with(&Policy::builtin(), &settings(SETTINGS[preset]));
        prop_assert!(d.self_check_failures.is_empty(), "{}", d.message);
        assert_capi_agrees(&req, &d);
    }
}
