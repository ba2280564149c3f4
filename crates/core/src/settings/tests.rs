//! The settings parser: each key's values, defaults and errors.

use super::*;

fn parse(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::from_map(
        &pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[test]
fn paused_is_any_non_empty_text_and_bounded() {
    assert_eq!(
        parse(&[("paused", " change freeze (ops) ")])
            .unwrap()
            .paused,
        Some("change freeze (ops)".to_owned())
    );
    assert_eq!(parse(&[("paused", "  ")]).unwrap().paused, None);
    let long = "x".repeat(MAX_PAUSED_BYTES + 1);
    let err = parse(&[("paused", &long)]).unwrap_err().to_string();
    assert!(
        err.contains("setting paused") && err.contains("256 bytes"),
        "{err}"
    );
}

#[test]
fn defaults_when_empty() {
    assert_eq!(parse(&[]).unwrap(), Settings::default());
    assert!(Settings::default().allows(Action::Files));
}

#[test]
fn parses_every_setting() {
    let s = parse(&[
        ("inPlace", "TRUE"),
        ("disableActions", "ssh-keys, ntp,"),
        ("mode", "in-place-only"),
        ("patchType", "JSONMergePatch"),
    ])
    .unwrap();
    assert!(s.in_place);
    assert_eq!(s.disabled_actions, [Action::SshKeys, Action::Ntp].into());
    assert_eq!(s.mode, Mode::InPlaceOnly);
    assert_eq!(s.patch_type, PatchType::JsonMergePatch);
    let w = parse(&[(
        "maintenanceWindow",
        "days=sat start=01:00 end=05:00 tz=Europe/Berlin",
    )])
    .unwrap()
    .maintenance_window
    .unwrap();
    assert_eq!(w.spec(), "days=sat start=01:00 end=05:00 tz=Europe/Berlin");
    assert_eq!(
        parse(&[("maintenanceWindow", "none")]).unwrap(),
        Settings::default()
    );
    assert_eq!(
        parse(&[("maintenanceWindow", "")]).unwrap(),
        Settings::default()
    );
    assert!(!s.allows(Action::Ntp) && s.allows(Action::Files));
    let off = parse(&[("inPlace", "false")]).unwrap();
    assert!(!off.allows(Action::Files));
}

#[test]
fn drain_settings_are_booleans_and_minor_drains_cannot_be_turned_off() {
    let s = parse(&[
        ("drainPatchVersion", "False"),
        ("drainKubeletArgs", "true"),
        ("drainDeleteEmptyDirData", " TRUE "),
        ("drainForceUnmanaged", "false"),
    ])
    .unwrap();
    assert_eq!(
        s.drain,
        DrainOverrides {
            patch_version: Some(false),
            kubelet_args: Some(true),
            delete_empty_dir_data: Some(true),
            force_unmanaged: Some(false),
        }
    );
    assert_eq!(parse(&[]).unwrap().drain, DrainOverrides::default());
    let err = parse(&[("drainKubeletArgs", "yes")])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "setting drainKubeletArgs: invalid value \"yes\", expected \"true\" or \"false\""
    );
    let err = parse(&[("drainMinorVersion", "false")])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "setting drainMinorVersion: refused: a minor Kubernetes version change always drains"
        ),
        "{err}"
    );
}

#[test]
fn errors_name_the_problem() {
    let e = parse(&[("disableAction", "ntp")]).unwrap_err();
    assert!(e.to_string().contains("disableAction"), "{e}");
    let e = parse(&[("disableActions", "ntp,reboot")]).unwrap_err();
    assert!(e.to_string().contains("ntp,reboot"), "{e}");
    assert!(parse(&[("inPlace", "yes")]).is_err());
    let e = parse(&[("maintenanceWindow", "days=mon start=9")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "setting maintenanceWindow: invalid value \"days=mon start=9\": \
         start \"9\" is not a time HH:MM between 00:00 and 23:59"
    );
    assert!(parse(&[("mode", "strict")]).is_err());
    assert!(parse(&[("patchType", "strategic")]).is_err());
    assert!(matches!(
        parse(&[("inPlace", "false"), ("mode", "in-place-only")]),
        Err(SettingsError::Conflict(_))
    ));
}

#[test]
fn on_failure_setting_is_rollback_or_hold() {
    let of = |value: &str| {
        Settings::from_map(&BTreeMap::from([(
            ON_FAILURE_SETTING.to_owned(),
            value.to_owned(),
        )]))
    };
    assert_eq!(of("hold").unwrap().on_failure, Some(OnFailure::Hold));
    assert_eq!(
        of(" rollback ").unwrap().on_failure,
        Some(OnFailure::Rollback)
    );
    assert_eq!(of("").unwrap().on_failure, None);
    assert_eq!(
        of("undo").unwrap_err().to_string(),
        "setting onFailure: invalid value \"undo\", expected \"rollback\" or \"hold\""
    );
}

#[test]
fn remediation_guard_past_deadline_is_lift_or_keep() {
    let of = |value: &str| {
        Settings::from_map(&BTreeMap::from([(
            REMEDIATION_GUARD_PAST_DEADLINE_SETTING.to_owned(),
            value.to_owned(),
        )]))
    };
    assert!(
        !Settings::default().keep_guard_past_deadline,
        "lift by default"
    );
    assert!(of(" keep ").unwrap().keep_guard_past_deadline);
    assert!(!of("lift").unwrap().keep_guard_past_deadline);
    assert!(!of("").unwrap().keep_guard_past_deadline);
    assert_eq!(
        of("forever").unwrap_err().to_string(),
        "setting remediationGuardPastDeadline: invalid value \"forever\", expected \"lift\" (remediation \
         may act once a step's deadline passed) or \"keep\""
    );
}
