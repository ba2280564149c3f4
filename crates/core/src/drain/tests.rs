use serde_json::json;

use super::*;

fn change(version: VersionChange, actions: &[Action]) -> NodeChange {
    NodeChange {
        version,
        actions: actions.iter().copied().collect(),
    }
}

const NONE: VersionSteps = VersionSteps {
    reboot_when_required: false,
    container_runtime: false,
};
const REBOOT: VersionSteps = VersionSteps {
    reboot_when_required: true,
    container_runtime: false,
};

const OPEN: MachineDrain = MachineDrain {
    excluded: false,
    asked_timeout_seconds: None,
};

#[test]
fn when_a_plan_drains_by_change_and_rules() {
    use Action::*;
    use VersionChange::*;
    let defaults = DrainRules::default();
    let no_patch = DrainRules {
        patch_version: false,
        ..defaults
    };
    let flags_on = DrainRules {
        kubelet_args: true,
        ..defaults
    };
    let everything_off = DrainRules {
        patch_version: false,
        kubelet_args: false,
        ..defaults
    };
    // (change, actions, rules, expected reason or None)
    let table: [(VersionChange, &[Action], DrainRules, Option<Why>); 16] = [
        (
            Minor,
            &[KubernetesVersion],
            defaults,
            Some(Why::MinorVersion),
        ),
        (
            Minor,
            &[KubernetesVersion],
            everything_off,
            Some(Why::MinorVersion),
        ),
        (
            Unknown,
            &[KubernetesVersion],
            everything_off,
            Some(Why::UnknownVersion),
        ),
        (
            Patch,
            &[KubernetesVersion],
            defaults,
            Some(Why::PatchVersion),
        ),
        (Patch, &[KubernetesVersion], no_patch, Option::None),
        (
            Patch,
            &[KubernetesVersion, KubeletArgs],
            DrainRules {
                patch_version: false,
                kubelet_args: true,
                ..defaults
            },
            Some(Why::KubeletArgs),
        ),
        (None, &[KubeletArgs], defaults, Option::None),
        (None, &[KubeletArgs], flags_on, Some(Why::KubeletArgs)),
        (None, &[Files], flags_on, Option::None),
        (None, &[SshKeys], defaults, Option::None),
        (None, &[Ntp], defaults, Option::None),
        (None, &[EtcdImage], flags_on, Option::None),
        (
            None,
            &[Files, SshKeys, Ntp, EtcdImage],
            defaults,
            Option::None,
        ),
        (None, &[], defaults, Option::None),
        (None, &[OsImage], defaults, Some(Why::OsImage)),
        (
            Patch,
            &[OsImage, KubernetesVersion],
            no_patch,
            Some(Why::OsImage),
        ),
    ];
    for (version, actions, rules, expected) in table {
        let got = decide(&change(version, actions), &rules, &OPEN, NONE);
        // A plan that may reboot after its package steps always drains; without a version change it has none.
        let rebooting = decide(&change(version, actions), &rules, &OPEN, REBOOT);
        // So does a plan that may restart containerd.
        let runtime = VersionSteps {
            container_runtime: true,
            ..NONE
        };
        let restarting = decide(&change(version, actions), &rules, &OPEN, runtime);
        if expected.is_none() {
            assert_eq!(
                rebooting.drain().map(|d| d.why),
                (version != None).then_some(Why::Reboot),
                "rebootWhenRequired {version:?} {actions:?}"
            );
            assert_eq!(
                restarting.drain().map(|d| d.why),
                (version != None).then_some(Why::ContainerRuntime),
                "upgradeContainerRuntime {version:?} {actions:?}"
            );
        }
        match expected {
            Some(why) => {
                let drain = got.drain().copied();
                assert_eq!(
                    drain.map(|d| (d.why, d.version_changes)),
                    Some((why, version != None)),
                    "{version:?} {actions:?} {rules:?}"
                );
            }
            Option::None => assert_eq!(
                got,
                DrainVerdict::NotNeeded,
                "{version:?} {actions:?} {rules:?}"
            ),
        }
    }
}

#[test]
fn the_exclude_annotation_turns_every_drain_off_and_says_why() {
    let excluded = MachineDrain {
        excluded: true,
        ..OPEN
    };
    let verdict = decide(
        &change(VersionChange::Minor, &[Action::KubernetesVersion]),
        &DrainRules::default(),
        &excluded,
        REBOOT,
    );
    assert_eq!(verdict, DrainVerdict::Excluded(Why::MinorVersion));
    // CAPI's knob skips the drain of an OS image change too (the node still reboots).
    assert_eq!(
        decide(
            &change(VersionChange::None, &[Action::OsImage]),
            &DrainRules::default(),
            &excluded,
            NONE
        ),
        DrainVerdict::Excluded(Why::OsImage)
    );
    let summary = verdict.summary().unwrap();
    assert!(
        summary.contains(EXCLUDE_NODE_DRAINING_ANNOTATION),
        "{summary}"
    );
    assert_eq!(
        decide(
            &change(VersionChange::None, &[Action::Files]),
            &DrainRules::default(),
            &excluded,
            REBOOT
        ),
        DrainVerdict::NotNeeded
    );
}

#[test]
fn drain_flags_come_from_the_rules() {
    let rules = DrainRules {
        delete_empty_dir_data: true,
        force_unmanaged: true,
        ..DrainRules::default()
    };
    let drain = *decide(&change(VersionChange::Patch, &[]), &rules, &OPEN, NONE)
        .drain()
        .unwrap();
    assert!(drain.delete_empty_dir_data && drain.force_unmanaged);
    assert_eq!(drain.timeout_seconds, DEFAULT_DRAIN_TIMEOUT_SECONDS);
}

#[test]
fn overrides_replace_only_what_they_set() {
    let policy = DrainRules {
        kubelet_args: true,
        ..DrainRules::default()
    };
    let overrides = DrainOverrides {
        patch_version: Some(false),
        force_unmanaged: Some(true),
        ..DrainOverrides::default()
    };
    assert_eq!(
        policy.with(&overrides),
        DrainRules {
            patch_version: false,
            kubelet_args: true,
            delete_empty_dir_data: false,
            force_unmanaged: true,
        }
    );
}

#[test]
fn version_changes_are_classified() {
    let table = [
        (Some("v1.33.4"), Some("v1.33.5"), VersionChange::Patch),
        (Some("v1.33.4"), Some("v1.34.0"), VersionChange::Minor),
        (Some("v1.34.0-rc.1"), Some("v1.34.0"), VersionChange::Patch),
        (Some("v1.34.0"), Some("v2.34.0"), VersionChange::Minor),
        (Some("v1.34.0"), Some("v1.34.0"), VersionChange::None),
        (None, None, VersionChange::None),
        (None, Some("v1.34.0"), VersionChange::Unknown),
        (Some("v1.34.0"), Some("latest"), VersionChange::Unknown),
    ];
    for (current, desired, expected) in table {
        assert_eq!(
            VersionChange::of(current, desired),
            expected,
            "{current:?}→{desired:?}"
        );
    }
    assert_eq!(NodeChange::unknown(false).version, VersionChange::None);
    assert_eq!(NodeChange::unknown(true).version, VersionChange::Unknown);
}

#[test]
fn machine_knobs_are_read_from_v1beta2_v1beta1_and_templates() {
    let v1beta2 = json!({"metadata": {"annotations": {EXCLUDE_NODE_DRAINING_ANNOTATION: ""}},
        "spec": {"deletion": {"nodeDrainTimeoutSeconds": 90}}});
    assert_eq!(
        MachineDrain::of(Scope::Object, &v1beta2),
        MachineDrain {
            excluded: true,
            asked_timeout_seconds: Some(90)
        }
    );
    let v1beta1 = json!({"spec": {"nodeDrainTimeout": "5m30s"}});
    assert_eq!(
        MachineDrain::of(Scope::Object, &v1beta1),
        MachineDrain {
            excluded: false,
            asked_timeout_seconds: Some(330)
        }
    );
    let set = json!({"spec": {"template": {"metadata": {"annotations": {EXCLUDE_NODE_DRAINING_ANNOTATION: "true"}},
        "spec": {"deletion": {"nodeDrainTimeoutSeconds": 7200}}}}});
    let knobs = MachineDrain::of(Scope::Template, &set);
    assert!(knobs.excluded);
    assert_eq!(knobs.timeout_seconds(), MAX_DRAIN_TIMEOUT_SECONDS);
    // Unreadable values are not asked for.
    let garbage = json!({"spec": {"deletion": {"nodeDrainTimeoutSeconds": "ten"}, "nodeDrainTimeout": "soon"}});
    assert_eq!(MachineDrain::of(Scope::Object, &garbage), OPEN);
}

#[test]
fn the_drain_timeout_is_bounded() {
    let asked = |s| {
        MachineDrain {
            excluded: false,
            asked_timeout_seconds: s,
        }
        .timeout_seconds()
    };
    assert_eq!(asked(None), DEFAULT_DRAIN_TIMEOUT_SECONDS);
    assert_eq!(
        asked(Some(0)),
        MAX_DRAIN_TIMEOUT_SECONDS,
        "CAPI's 'no timeout' is still bounded"
    );
    assert_eq!(asked(Some(45)), 45);
    assert_eq!(asked(Some(3601)), MAX_DRAIN_TIMEOUT_SECONDS);
    assert_eq!(asked(Some(u64::MAX)), MAX_DRAIN_TIMEOUT_SECONDS);
}
