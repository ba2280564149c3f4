#![allow(clippy::unwrap_used)]

use super::*;
use crate::path::Seg;
use serde_json::json;

fn path(fields: &[&str]) -> Path {
    let mut p = Path::spec();
    for f in fields {
        p = p.child(Seg::Field((*f).to_owned()));
    }
    p
}

fn subject(
    kind: &'static str,
    group: &'static str,
    scope: Scope,
    control_plane: bool,
) -> Subject<'static> {
    Subject {
        kind,
        api_group: group,
        scope,
        control_plane,
    }
}

const KC: &str = "bootstrap.cluster.x-k8s.io";

#[test]
fn builtin_parses_and_is_the_printed_yaml() {
    let p = Policy::builtin();
    let reparsed = Policy::from_yaml(DEFAULT_POLICY_YAML).unwrap();
    let names = |p: &Policy| p.rules().iter().map(|r| r.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&p), names(&reparsed));
    assert!(names(&p).contains(&"kubernetes-version".to_owned()));
}

#[test]
fn template_kinds_reuse_object_rules() {
    let p = Policy::builtin();
    let ntp = path(&["ntp", "servers"]);
    for (kind, scope) in [
        ("KubeadmConfig", Scope::Object),
        ("KubeadmConfigTemplate", Scope::Template),
    ] {
        assert_eq!(
            p.judge(
                &subject(kind, KC, scope, false),
                &ntp,
                None,
                Some(&json!("a"))
            ),
            PathVerdict::Action(Action::Ntp)
        );
    }
    // A template kind in an object request is not a template.
    assert!(matches!(
        p.judge(
            &subject("KubeadmConfigTemplate", KC, Scope::Object, false),
            &ntp,
            None,
            None
        ),
        PathVerdict::Reject(_)
    ));
    let ms = subject("MachineSet", "cluster.x-k8s.io", Scope::Template, false);
    assert_eq!(
        p.judge(
            &ms,
            &path(&["version"]),
            Some(&json!("v1.33.0")),
            Some(&json!("v1.34.0"))
        ),
        PathVerdict::Action(Action::KubernetesVersion)
    );
    // The rule names the group: another group's KubeadmConfig is not covered.
    assert_eq!(
        p.judge(
            &subject("KubeadmConfig", "example.com", Scope::Object, false),
            &ntp,
            None,
            None
        ),
        PathVerdict::Reject(NO_RULE.into())
    );
}

#[test]
fn etcd_image_only_on_control_plane() {
    let p = Policy::builtin();
    let tag = path(&["clusterConfiguration", "etcd", "local", "imageTag"]);
    let (old, new) = (Some(json!("3.5.21-0")), Some(json!("3.5.22-0")));
    assert_eq!(
        p.judge(
            &subject("KubeadmConfig", KC, Scope::Object, true),
            &tag,
            old.as_ref(),
            new.as_ref()
        ),
        PathVerdict::Action(Action::EtcdImage)
    );
    let worker = p.judge(
        &subject("KubeadmConfigTemplate", KC, Scope::Template, false),
        &tag,
        old.as_ref(),
        new.as_ref(),
    );
    assert!(matches!(worker, PathVerdict::Reject(r) if r.contains("control-plane")));
}

#[test]
fn custom_rules_first_match_globs_accept_and_when() {
    let yaml = r#"
rules:
  - name: dirty-template
    objects: [{kind: "*Machine", apiGroup: "infrastructure.cluster.x-k8s.io"}]
    paths: [spec.template]
    accept: the VM template only matters for new machines
  - name: keys-for-ops
    objects: [{kind: KubeadmConfig}]
    paths: ["spec.files[path=/etc/ops/*]"]
    action: files
  - objects: [{kind: KubeadmConfig}]
    paths: [spec.files]
    reject: only /etc/ops files go in place here
  - name: workers-only
    objects: [{kind: "*"}]
    paths: ["spec.**.note"]
    when: worker
    accept: notes are harmless
"#;
    let p = Policy::from_yaml(yaml).unwrap();
    let vm = subject(
        "VSphereMachine",
        "infrastructure.cluster.x-k8s.io",
        Scope::Object,
        false,
    );
    assert!(
        matches!(p.judge(&vm, &path(&["template"]), None, None), PathVerdict::Accept(r) if r.contains("new machines"))
    );
    assert_eq!(
        p.judge(&vm, &path(&["memoryMiB"]), None, None),
        PathVerdict::Reject(NO_RULE.into())
    );
    let kc = subject("KubeadmConfig", KC, Scope::Object, false);
    let file = |f: &str| {
        Path::spec()
            .child(Seg::Field("files".into()))
            .child(Seg::Key {
                field: "path".into(),
                value: f.into(),
            })
    };
    assert_eq!(
        p.judge(&kc, &file("/etc/ops/a"), None, None),
        PathVerdict::Action(Action::Files)
    );
    assert!(
        matches!(p.judge(&kc, &file("/etc/other"), None, None), PathVerdict::Reject(r) if r.contains("/etc/ops"))
    );
    assert_eq!(p.rules()[2].name, "#3");
    let note = path(&["a", "b", "note"]);
    assert!(matches!(
        p.judge(&kc, &note, None, None),
        PathVerdict::Accept(_)
    ));
    let cp = subject("KubeadmConfig", KC, Scope::Object, true);
    assert_eq!(
        p.judge(&cp, &note, None, None),
        PathVerdict::Reject(NO_RULE.into())
    );
}

#[test]
fn actions_for_desired_objects() {
    let p = Policy::builtin();
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"labels": {crate::objects::CONTROL_PLANE_LABEL: ""}}});
    let kc = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig"});
    let desired = Objects {
        machine: Some(&machine),
        bootstrap: Some(&kc),
        infra: None,
    };
    // os-image is off by default, and no Metal3Machine is among these objects anyway.
    let all: BTreeSet<Action> = Action::ALL
        .into_iter()
        .filter(|a| *a != Action::OsImage)
        .collect();
    assert_eq!(
        p.actions_for(Scope::Object, &desired, &Settings::default()),
        all
    );
    let mut worker_machine = machine.clone();
    worker_machine["metadata"]["labels"] = json!({});
    let worker = Objects {
        machine: Some(&worker_machine),
        ..desired
    };
    assert!(
        !p.actions_for(Scope::Object, &worker, &Settings::default())
            .contains(&Action::EtcdImage)
    );
    let narrowed = Settings {
        disabled_actions: [Action::Ntp].into(),
        ..Settings::default()
    };
    assert!(
        !p.actions_for(Scope::Object, &desired, &narrowed)
            .contains(&Action::Ntp)
    );
    let off = Settings {
        in_place: false,
        ..Settings::default()
    };
    assert!(p.actions_for(Scope::Object, &desired, &off).is_empty());
    // An RKE2 node is not upgraded with kubeadm: its plan never holds the version's steps.
    let rke2 = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "RKE2Config"});
    let other = Objects {
        bootstrap: Some(&rke2),
        ..desired
    };
    assert!(
        !p.actions_for(Scope::Object, &other, &Settings::default())
            .contains(&Action::KubernetesVersion)
    );
}

#[test]
fn bad_files_name_the_rule_and_problem() {
    let cases = [
        (
            "rules: [{objects: [{kind: X}], paths: [spec.a], action: reboot}]",
            "reboot",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [spec.a]}]",
            "exactly one",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [spec.a], accept: a, reject: b}]",
            "exactly one",
        ),
        (
            "rules: [{name: r, objects: [], paths: [spec.a], reject: x}]",
            "rule r: `objects` is empty",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [], reject: x}]",
            "`paths` is empty",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [\"spec[\"], reject: x}]",
            "unclosed",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [spec.a], reject: x, check: kubernetes-upgrade}]",
            "`check` only",
        ),
        (
            "rules: [{objects: [{kind: X}], paths: [spec.a], reject: x, colour: red}]",
            "colour",
        ),
        (
            "rules: [{name: a, objects: [{kind: X}], paths: [spec.a], reject: x}, {name: a, objects: [{kind: X}], paths: [spec.a], reject: x}]",
            "used by an earlier rule",
        ),
        (
            "rules: [{objects: [{kind: \"\"}], paths: [spec.a], reject: x}]",
            "empty kind",
        ),
        ("rules: {}", "policy file"),
        (": : :", "policy file"),
    ];
    for (yaml, needle) in cases {
        let err = Policy::from_yaml(yaml).unwrap_err().to_string();
        assert!(err.contains(needle), "{yaml}: {err}");
    }
}

#[test]
fn the_drain_section_sets_defaults_and_refuses_turning_off_minor_drains() {
    use crate::drain::{DrainOverrides, DrainRules};
    assert_eq!(Policy::builtin().drain(), DrainRules::default());
    let rules = "rules: [{objects: [{kind: X}], paths: [spec.a], accept: ok}]\n";
    let no_section = Policy::from_yaml(rules).unwrap();
    assert_eq!(no_section.drain(), DrainRules::default());
    let p = Policy::from_yaml(&format!(
        "{rules}drain: {{patchVersion: false, forceUnmanaged: true}}\n"
    ))
    .unwrap();
    assert_eq!(
        p.drain(),
        DrainRules {
            patch_version: false,
            force_unmanaged: true,
            ..DrainRules::default()
        }
    );
    let settings = Settings {
        drain: DrainOverrides {
            patch_version: Some(true),
            ..DrainOverrides::default()
        },
        ..Settings::default()
    };
    assert!(p.drain_for(&settings).patch_version);
    let err = Policy::from_yaml(&format!("{rules}drain: {{minorVersion: false}}\n")).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "policy drain.minorVersion: refused: a minor Kubernetes version change always drains"
        ),
        "{err}"
    );
    let err = Policy::from_yaml(&format!("{rules}drain: {{patchversion: false}}\n")).unwrap_err();
    assert!(err.to_string().contains("patchversion"), "{err}");
    assert!(Policy::from_yaml(&format!("{rules}drain: {{kubeletArgs: maybe}}\n")).is_err());
}

fn metal3(url: &str) -> serde_json::Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
        "spec": {"image": {"url": url, "checksum": "sha256:00", "checksumType": "sha256", "diskFormat": "raw"}}
    })
}

fn os_image_on() -> Settings {
    let map = [("enableActions".to_owned(), "os-image".to_owned())].into();
    Settings::from_map(&map).unwrap()
}

#[test]
fn os_image_rules_name_the_field_only_when_the_registration_turns_the_action_on() {
    let p = Policy::builtin();
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine"});
    let infra = metal3("https://images.example/ubuntu-24.04.raw");
    let desired = Objects {
        machine: Some(&machine),
        bootstrap: None,
        infra: Some(&infra),
    };
    assert_eq!(p.os_image_field(&desired, &Settings::default()), None);
    assert!(
        !p.actions_for(Scope::Object, &desired, &Settings::default())
            .contains(&Action::OsImage)
    );
    let field = p.os_image_field(&desired, &os_image_on()).unwrap();
    assert_eq!(field.as_str(), "spec.image.url");
    assert_eq!(
        field.read(&infra).unwrap().as_deref(),
        Some("https://images.example/ubuntu-24.04.raw")
    );
    assert!(
        p.actions_for(Scope::Object, &desired, &os_image_on())
            .contains(&Action::OsImage)
    );
    // A kind no rule maps (vSphere's webhook forbids changing spec.template): no field, a rollout.
    let vsphere =
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "VSphereMachine"});
    let other = Objects {
        infra: Some(&vsphere),
        ..desired
    };
    assert_eq!(p.os_image_field(&other, &os_image_on()), None);
    // A template of a mapped kind is judged by the same rule (CanUpdateMachineSet).
    let template = subject(
        "Metal3MachineTemplate",
        "infrastructure.cluster.x-k8s.io",
        Scope::Template,
        false,
    );
    assert_eq!(
        p.judge(&template, &path(&["image", "url"]), None, None),
        PathVerdict::Action(Action::OsImage)
    );
}

#[test]
fn image_fields_read_strings_numbers_and_objects_and_refuse_the_rest() {
    let field = |t: &str| ImageField::parse(t).unwrap();
    let object = json!({"spec": {"templateID": 104, "image": {"type": "name", "name": "rocky-9"}, "bad": [1], "empty": ""}});
    assert_eq!(
        field("spec.templateID").read(&object).unwrap().as_deref(),
        Some("104")
    );
    assert_eq!(
        field("spec.image").read(&object).unwrap().as_deref(),
        Some(r#"{"name":"rocky-9","type":"name"}"#)
    );
    assert_eq!(field("spec.missing").read(&object).unwrap(), None);
    assert_eq!(field("spec.empty").read(&object).unwrap(), None);
    let err = field("spec.bad").read(&object).unwrap_err();
    assert!(err.contains("spec.bad is [1]"), "{err}");
    for bad in ["image.url", "spec", "spec.", "spec.files[0]", "spec.*.url"] {
        assert!(ImageField::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn os_image_rules_need_an_image_field_and_only_they_take_one() {
    let rule = |extra: &str| {
        format!(
            "rules:\n  - name: r\n    objects: [{{kind: FooMachine}}]\n    paths: [spec.image]\n{extra}"
        )
    };
    let err = Policy::from_yaml(&rule("    action: os-image\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("policy rule r: an os-image rule needs `imageField:`"),
        "{err}"
    );
    let err = Policy::from_yaml(&rule("    action: files\n    imageField: spec.image\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`imageField` only applies to os-image rules"),
        "{err}"
    );
    let err = Policy::from_yaml(&rule(
        "    action: os-image\n    imageField: spec.images[0]\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("not a dotted path"), "{err}");
    assert!(
        Policy::from_yaml(&rule(
            "    action: os-image\n    imageField: spec.image.ref\n"
        ))
        .is_ok()
    );
}
