//! The JSON the server and the agent exchange, spelled out: these are the shapes README.md shows.
#![allow(clippy::unwrap_used)]

use inplace_agent_api::*;
use serde_json::json;

fn sample_plan() -> Plan {
    Plan {
        id: "3f2a9c".into(),
        machine: MachineRef::new("default", "cp-0"),
        cluster: "prod".into(),
        steps: vec![
            Step {
                index: 0,
                description: "write 1 file".into(),
                timeout_seconds: 60,
                action: StepAction::Files {
                    files: vec![FileSpec {
                        path: "/etc/motd".into(),
                        owner: Some("root:root".into()),
                        permissions: Some("0644".into()),
                        encoding: FileEncoding::GzipBase64,
                        append: false,
                        content: SecretString::new("H4sI-super-secret"),
                    }],
                },
            },
            Step {
                index: 1,
                description: "kubeadm upgrade apply (v1.34.1)".into(),
                timeout_seconds: 900,
                action: StepAction::KubeadmUpgrade {
                    version: "v1.34.1".into(),
                    mode: KubeadmUpgradeMode::Apply,
                },
            },
        ],
        control_plane: false,
    }
}

#[test]
fn plan_json_shape_is_camel_case_with_kind_tags() {
    let value = serde_json::to_value(sample_plan()).unwrap();
    assert_eq!(
        value,
        json!({
            "id": "3f2a9c",
            "machine": {"namespace": "default", "name": "cp-0"},
            "cluster": "prod",
            "steps": [
                {"index": 0, "description": "write 1 file", "timeoutSeconds": 60,
                 "action": {"kind": "files", "files": [{"path": "/etc/motd", "owner": "root:root",
                   "permissions": "0644", "encoding": "gzip+base64", "append": false,
                   "content": "H4sI-super-secret"}]}},
                {"index": 1, "description": "kubeadm upgrade apply (v1.34.1)", "timeoutSeconds": 900,
                 "action": {"kind": "kubeadmUpgrade", "version": "v1.34.1", "mode": "apply"}}
            ]
        })
    );
    let back: Plan = serde_json::from_value(value).unwrap();
    assert_eq!(back, sample_plan());
}

#[test]
fn every_action_kind_round_trips() {
    let actions = vec![
        StepAction::SshKeys {
            users: vec![SshUser {
                name: "capi".into(),
                authorized_keys: vec!["ssh-ed25519 AAAA".into()],
            }],
        },
        StepAction::Ntp {
            servers: vec!["time.example.org".into()],
            enabled: Some(true),
        },
        StepAction::EtcdImage {
            image_tag: "3.6.4-0".into(),
            image_repository: None,
        },
        StepAction::KubeletArgs {
            args: vec![KubeletArg {
                name: "max-pods".into(),
                value: "200".into(),
            }],
        },
        StepAction::InstallKubeadm {
            version: "v1.34.1".into(),
        },
        StepAction::InstallKubelet {
            version: "v1.34.1".into(),
        },
    ];
    let kinds: Vec<String> = actions
        .iter()
        .map(|a| {
            serde_json::to_value(a).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "sshKeys",
            "ntp",
            "etcdImage",
            "kubeletArgs",
            "installKubeadm",
            "installKubelet"
        ]
    );
    for action in actions {
        let text = serde_json::to_string(&action).unwrap();
        let back: StepAction = serde_json::from_str(&text).unwrap();
        assert_eq!(back, action);
        assert_eq!(serde_json::to_value(&back).unwrap()["kind"], back.kind());
        assert!(validate_action(&back).is_ok(), "{text}");
    }
}

#[test]
fn unknown_kind_decodes_as_unsupported_and_fails_validation() {
    let step: Step = serde_json::from_value(json!({
        "index": 0, "description": "from the future", "timeoutSeconds": 5,
        "action": {"kind": "someFutureKind", "after": "5m"}
    }))
    .unwrap();
    assert_eq!(step.action, StepAction::Unsupported);
    assert!(
        validate_action(&step.action)
            .unwrap_err()
            .contains("not supported")
    );
}

#[test]
fn debug_never_prints_contents_or_keys() {
    let mut plan = sample_plan();
    plan.steps.push(Step {
        index: 2,
        description: "keys".into(),
        timeout_seconds: 5,
        action: StepAction::SshKeys {
            users: vec![SshUser {
                name: "capi".into(),
                authorized_keys: vec!["ssh-rsa TOPSECRETKEY".into()],
            }],
        },
    });
    let printed = format!("{plan:?} {plan:#?}");
    assert!(!printed.contains("super-secret"), "{printed}");
    assert!(!printed.contains("TOPSECRETKEY"), "{printed}");
    assert!(printed.contains("<redacted 17 bytes>"), "{printed}");
}

#[test]
fn identity_and_poll_shapes() {
    let poll = PollRequest {
        agent: AgentIdentity::ProviderId("aws:///x/i-1".into()),
        current: Some(PlanProgress {
            plan_id: "abc".into(),
            status: PlanStatus::Failed,
            succeeded_steps: 1,
            total_steps: 3,
            failed_step: Some(1),
            hold: None,
            rollback: None,
        }),
        wait_seconds: DEFAULT_WAIT_SECONDS,
        facts: None,
    };
    assert_eq!(
        serde_json::to_value(&poll).unwrap(),
        json!({"agent": {"providerID": "aws:///x/i-1"},
               "current": {"planId": "abc", "status": "failed", "succeededSteps": 1, "totalSteps": 3, "failedStep": 1},
               "waitSeconds": 25})
    );
    let by_machine: PollRequest =
        serde_json::from_value(json!({"agent": {"machine": {"namespace": "ns", "name": "m"}}}))
            .unwrap();
    assert_eq!(
        by_machine.agent,
        AgentIdentity::Machine(MachineRef::new("ns", "m"))
    );
    assert_eq!(by_machine.wait_seconds, 0);
    assert_eq!(
        serde_json::to_value(PollResponse::nothing()).unwrap(),
        json!({})
    );
    let nothing: PollResponse = serde_json::from_value(json!({"plan": null})).unwrap();
    assert_eq!(nothing.plan, None);
}

#[test]
fn report_shape_and_bounds() {
    let report = StepReport {
        agent: AgentIdentity::Machine(MachineRef::new("ns", "m")),
        plan_id: "abc".into(),
        step_index: 2,
        status: StepStatus::Failed,
        attempt: 1,
        started_at_unix_ms: Some(1_700_000_000_000),
        finished_at_unix_ms: Some(1_700_000_001_000),
        exit_code: Some(1),
        stderr_tail: Some("boom".into()),
        message: Some("command kubeadm exited with 1".into()),
        undo: false,
        rollback: None,
    };
    let value = serde_json::to_value(&report).unwrap();
    assert_eq!(value["stepIndex"], 2);
    assert_eq!(value["status"], "failed");
    assert_eq!(value["stderrTail"], "boom");
    assert_eq!(value["startedAtUnixMs"], 1_700_000_000_000u64);
    assert!(validate_report(&report).is_ok());
    let too_long = StepReport {
        stderr_tail: Some("x".repeat(STDERR_TAIL_MAX_BYTES + 1)),
        ..report
    };
    assert_eq!(
        validate_report(&too_long),
        Err(ReportError::StderrTooLong(STDERR_TAIL_MAX_BYTES + 1))
    );
}

#[test]
fn versions_are_strict() {
    for good in ["v1.34.1", "v1.30.0-rc.1", "v10.0.12"] {
        assert!(is_valid_kubernetes_version(good), "{good}");
    }
    for bad in [
        "1.34.1",
        "v1.34",
        "v1.34.1;rm -rf /",
        "v1.34.1 ",
        "v1.34.1+k3s1",
        "v1..1",
        "v1.2.3-",
        "v1.2.3-a/b",
        "",
    ] {
        assert!(!is_valid_kubernetes_version(bad), "{bad:?}");
    }
}

#[test]
fn plan_validation_names_the_problem() {
    let mut plan = sample_plan();
    assert_eq!(validate_plan(&plan), Ok(()));
    plan.steps[1].index = 5;
    assert_eq!(
        validate_plan(&plan),
        Err(PlanError::BadIndex {
            position: 1,
            index: 5
        })
    );
    let mut plan = sample_plan();
    plan.id = "../../etc".into();
    assert!(matches!(validate_plan(&plan), Err(PlanError::BadId(_))));
    let mut plan = sample_plan();
    plan.steps[0].timeout_seconds = 0;
    assert!(matches!(
        validate_plan(&plan),
        Err(PlanError::BadTimeout {
            index: 0,
            timeout: 0
        })
    ));
    let mut plan = sample_plan();
    plan.steps[1].action = StepAction::InstallKubelet {
        version: "latest".into(),
    };
    let err = validate_plan(&plan).unwrap_err().to_string();
    assert!(
        err.contains("step 1 (installKubelet)") && err.contains("\"latest\""),
        "{err}"
    );
    let mut plan = sample_plan();
    if let StepAction::Files { files } = &mut plan.steps[0].action {
        files.push(files[0].clone());
    }
    assert!(
        validate_plan(&plan)
            .unwrap_err()
            .to_string()
            .contains("appears twice")
    );
}

#[test]
fn file_and_flag_checks() {
    let file = |path: &str, mode: Option<&str>| StepAction::Files {
        files: vec![FileSpec {
            path: path.into(),
            owner: None,
            permissions: mode.map(Into::into),
            encoding: FileEncoding::None,
            append: false,
            content: "x".into(),
        }],
    };
    assert!(validate_action(&file("/etc/a", Some("0600"))).is_ok());
    assert!(
        validate_action(&file("etc/a", None))
            .unwrap_err()
            .contains("not absolute")
    );
    assert!(
        validate_action(&file("/etc/../a", None))
            .unwrap_err()
            .contains("`..`")
    );
    assert!(
        validate_action(&file("/etc/a", Some("0999")))
            .unwrap_err()
            .contains("octal")
    );
    let flag = |value: &str| StepAction::KubeletArgs {
        args: vec![KubeletArg {
            name: "node-labels".into(),
            value: value.into(),
        }],
    };
    assert!(validate_action(&flag("a=b,c=d")).is_ok());
    assert!(validate_action(&flag("a b")).is_err());
    assert!(validate_action(&flag("$(reboot)")).is_err());
    assert_eq!(parse_mode("0644"), Some(0o644));
    assert_eq!(parse_mode("4755"), Some(0o4755));
    assert_eq!(parse_mode("-1"), None);
    assert_eq!(truncate_tail("héllo", 4), "llo");
    assert_eq!(
        MachineRef::parse("ns/name"),
        Some(MachineRef::new("ns", "name"))
    );
    assert_eq!(MachineRef::parse("ns/a/b"), None);
    assert_eq!(MachineRef::parse("/x"), None);
}
