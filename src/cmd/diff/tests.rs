//! `diff`'s decision against the hooks' on the same objects, its settings flags and its error messages.

#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use super::*;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

fn yaml_documents(side: &Value, keys: [&str; 3]) -> String {
    keys.iter()
        .filter_map(|key| side.get(key))
        .map(|object| serde_yaml_ng::to_string(object).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn summary(report: &DiffReport) -> (DecisionOutcome, usize, i32, String) {
    (
        report.decision.outcome,
        report.decision.changes.len(),
        report.exit_code,
        report.decision.message.clone(),
    )
}

#[test]
fn yaml_object_sets_decide_like_the_whole_request() {
    let policy = Policy::builtin();
    let none = BTreeMap::new();
    for (name, keys) in [
        (
            "can-update-machine-kcp-mixed.json",
            ["machine", "bootstrapConfig", "infrastructureMachine"],
        ),
        (
            "can-update-machineset-md.json",
            [
                "machineSet",
                "bootstrapConfigTemplate",
                "infrastructureMachineTemplate",
            ],
        ),
    ] {
        let body = fixture(name);
        let whole = decide_inputs(Input { name, text: &body }, None, &policy, &none).unwrap();
        assert!(!whole.decision.changes.is_empty(), "{name}");
        let request: Value = serde_json::from_str(&body).unwrap();
        let settings: BTreeMap<String, String> = request
            .get("settings")
            .map(|s| serde_json::from_value(s.clone()).unwrap())
            .unwrap_or_default();
        let current = yaml_documents(&request["current"], keys);
        let desired = yaml_documents(&request["desired"], keys);
        let pair = decide_inputs(
            Input {
                name: "current.yaml",
                text: &current,
            },
            Some(Input {
                name: "desired.yaml",
                text: &desired,
            }),
            &policy,
            &settings,
        )
        .unwrap();
        assert_eq!(summary(&pair), summary(&whole), "{name}");
    }
}

#[test]
fn settings_flags_override_the_request_settings() {
    let body = fixture("can-update-machine-kcp-version.json");
    let input = Input {
        name: "request.json",
        text: &body,
    };
    let policy = Policy::builtin();
    let allowed = decide_inputs(input, None, &policy, &BTreeMap::new()).unwrap();
    let off = BTreeMap::from([parse_setting("inPlace=false").unwrap()]);
    let refused = decide_inputs(input, None, &policy, &off).unwrap();
    assert_eq!(
        allowed.exit_code, EXIT_IN_PLACE,
        "{}",
        allowed.decision.message
    );
    assert_eq!(
        refused.exit_code, EXIT_ROLLOUT,
        "{}",
        refused.decision.message
    );
}

#[test]
fn request_settings_that_are_not_strings_are_refused_like_the_hook_refuses_them() {
    let machine = r#"{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "m"}}"#;
    let body = format!(
        r#"{{"settings": {{"mode": "in-place-only", "inPlace": 7}}, "current": {{"machine": {machine}}}, "desired": {{"machine": {machine}}}}}"#
    );
    let err = decide_inputs(
        Input {
            name: "request.json",
            text: &body,
        },
        None,
        &Policy::builtin(),
        &BTreeMap::new(),
    )
    .unwrap_err();
    let hook =
        crate::hooks::can_update_machine(&crate::hooks::Engine::in_memory(), body.as_bytes());
    assert_eq!(hook.answer.verdict, "bad-request");
    assert_eq!(
        err.to_string(),
        format!("request.json: {}", hook.answer.message)
    );
    assert!(err.to_string().contains("settings.inPlace"), "{err}");
}

#[test]
fn object_sets_are_checked_by_the_request_rules_and_errors_name_the_file() {
    let machine = |name: &str, spec: &str| {
        format!(
            "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Machine\nmetadata:\n  name: {name}\nspec: {spec}\n"
        )
    };
    let (good, bad) = (machine("m", "{}"), machine("Not_A_Name", "{}"));
    let decide = |current: &str, desired: &str| {
        decide_inputs(
            Input {
                name: "current.yaml",
                text: current,
            },
            Some(Input {
                name: "desired.yaml",
                text: desired,
            }),
            &Policy::builtin(),
            &BTreeMap::new(),
        )
    };
    let err = decide(&good, &bad).unwrap_err().to_string();
    assert!(
        err.starts_with("desired.yaml: machine.metadata.name: "),
        "{err}"
    );
    let err = decide(&bad, &good).unwrap_err().to_string();
    assert!(
        err.starts_with("current.yaml: machine.metadata.name"),
        "{err}"
    );
    let spec = machine("m", "{version: v1.34.1}");
    let report = decide(&good, &spec).unwrap();
    assert_eq!(report.decision.changes.len(), 1, "{}", render_text(&report));
}

#[test]
fn setting_flags_split_at_the_first_equals_sign() {
    assert_eq!(
        parse_setting("mode=a=b").unwrap(),
        ("mode".to_string(), "a=b".to_string())
    );
    assert!(parse_setting("mode").unwrap_err().contains("KEY=VALUE"));
}

#[test]
fn packed_inputs_split_at_the_first_two_nul_bytes() {
    let packed = PackedInputs::unpack("a\0b\0mode=in-place-only\nbogus\n\0x=y");
    assert_eq!(packed.current.text, "a");
    assert_eq!(packed.desired.map(|d| d.text), Some("b"));
    assert_eq!(
        packed.settings,
        BTreeMap::from([
            ("mode".to_string(), "in-place-only".to_string()),
            ("\0x".to_string(), "y".to_string()),
        ])
    );
    let alone = PackedInputs::unpack("{}");
    assert!(alone.desired.is_none() && alone.settings.is_empty());
}

#[test]
fn errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("current.yaml");
    std::fs::write(&current, "kind: [unclosed").unwrap();
    let missing = dir.path().join("missing.yaml");
    let policy = Policy::builtin();
    let none = BTreeMap::new();
    let err = run(&current, None, &policy, &none).unwrap_err();
    assert!(matches!(err, DiffError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("current.yaml"), "{err}");
    let err = run(&missing, None, &policy, &none).unwrap_err();
    assert!(matches!(err, DiffError::Read(_)), "{err}");
    assert!(err.to_string().contains("missing.yaml"), "{err}");
}
