//! Table tests of the estimator: what a run's steps and the learned durations make CAPI wait.

use super::*;

/// A table that saw `samples` steps of each listed kind take exactly these milliseconds.
fn learned(kinds: &[(StepKind, u64)], samples: u32) -> StepDurations {
    let mut table = StepDurations::default();
    for &(kind, ms) in kinds {
        for _ in 0..samples {
            table.learn(kind, ms);
        }
    }
    table
}

/// A table whose listed kinds take exactly these milliseconds, every time (no spread), and are trusted.
fn exact(kinds: &[(StepKind, u64)]) -> StepDurations {
    let mut table = StepDurations::default();
    for &(kind, ms) in kinds {
        table.kinds[kind.index()] = Learned {
            mean_ms: ms as f64,
            variance: 0.0,
            samples: TRUSTED_AFTER_SAMPLES,
        };
    }
    table
}

const NOW: u64 = 1_800_000_000_000;

#[test]
fn wire_names_map_to_their_kinds_and_unknown_ones_to_unsupported() {
    let wire = [
        "files",
        "sshKeys",
        "ntp",
        "etcdImage",
        "kubeletArgs",
        "installKubeadm",
        "kubeadmUpgrade",
        "installKubelet",
        "drainNode",
        "waitNodeReady",
        "uncordonNode",
        "reboot",
        "osImage",
        "containerRuntime",
    ];
    // Table order is slot order: a new kind goes last, so every other kind keeps its slot.
    assert_eq!(wire.len(), StepKind::ALL.len());
    for (name, kind) in wire.iter().zip(StepKind::ALL) {
        assert_eq!(StepKind::of_wire(name), kind, "{name}");
        let decoded: StepKind = serde_json::from_value(serde_json::json!(name)).unwrap();
        assert_eq!(decoded, kind, "{name}");
    }
    assert_eq!(StepKind::of_wire("someFutureKind"), StepKind::Unsupported);
    // The wire name and the record's `kind` decode alike.
    let decoded: StepKind = serde_json::from_str("\"waitNodeReady\"").unwrap();
    assert_eq!(decoded, StepKind::of_wire("waitNodeReady"));
    let decoded: StepKind = serde_json::from_str("\"somethingNew\"").unwrap();
    assert_eq!(decoded, StepKind::Unsupported);
}

#[test]
fn answers_follow_the_expected_remaining_time() {
    use StepKind::*;
    let table = exact(&[
        (Files, 1_000),
        (InstallKubeadm, 5_000),
        (KubeadmUpgrade, 120_000),
        (InstallKubelet, 4_000),
        (UncordonNode, 500),
    ]);
    let plan = [
        Files,
        InstallKubeadm,
        KubeadmUpgrade,
        InstallKubelet,
        UncordonNode,
    ];
    // (running step, running for ms, fixed, max, expected answer, why)
    let cases: &[(usize, u64, i32, i32, i32, &str)] = &[
        (
            3,
            0,
            5,
            30,
            4,
            "installKubelet (4 s) + uncordon (0.5 s) left: call at 4 s",
        ),
        (3, 1_500, 5, 30, 3, "3 s left of the last long step"),
        (2, 10_000, 5, 30, 30, "long kubeadm upgrade: the maximum"),
        (2, 10_000, 5, 60, 60, "an operator's larger maximum"),
        (
            2,
            118_000,
            5,
            30,
            6,
            "the upgrade is about to end: 2 + 4 + 0.5 s",
        ),
        (4, 0, 5, 30, 1, "half a second left: 1 s"),
        (4, 3_000, 5, 30, 1, "overrun: 1 s"),
        (3, 14_000, 5, 30, 1, "10 s past its expected end: still 1 s"),
        (
            3,
            64_000,
            5,
            30,
            6,
            "a step 60 s overdue is asked about every 6 s",
        ),
        (
            3,
            10_000_000,
            5,
            30,
            30,
            "a step hanging for hours: the maximum",
        ),
    ];
    for &(current, running_ms, fixed, max, want, why) in cases {
        let pace = RunPace {
            kinds: &plan,
            current,
            current_since_ms: Some(NOW - running_ms),
        };
        let got = retry_after(&remaining(&pace, &table, NOW), fixed, max);
        assert_eq!(got, want, "{why}");
    }
}

#[test]
fn guessed_durations_never_answer_later_than_the_fixed_answer() {
    use StepKind::*;
    let plan = [DrainNode, KubeadmUpgrade];
    let pace = RunPace {
        kinds: &plan,
        current: 0,
        current_since_ms: Some(NOW),
    };
    // Nothing learned: the guesses say minutes, the answer stays the fixed one.
    let guessed = remaining(&pace, &StepDurations::default(), NOW);
    assert!(!guessed.learned);
    assert_eq!(retry_after(&guessed, 5, 30), 5);
    // One sample of each is not trusted yet either.
    let once = learned(&[(DrainNode, 60_000), (KubeadmUpgrade, 60_000)], 1);
    assert_eq!(retry_after(&remaining(&pace, &once, NOW), 5, 30), 5);
    // Learned: the answer may exceed the fixed one.
    let trusted = learned(
        &[(DrainNode, 60_000), (KubeadmUpgrade, 60_000)],
        TRUSTED_AFTER_SAMPLES,
    );
    assert_eq!(retry_after(&remaining(&pace, &trusted, NOW), 5, 30), 30);
    // 10 s into a guessed 90 s upgrade: the fixed answer, not a second (no margin on a guess).
    let upgrading = RunPace {
        kinds: &plan,
        current: 1,
        current_since_ms: Some(NOW - 10_000),
    };
    assert_eq!(
        retry_after(
            &remaining(&upgrading, &StepDurations::default(), NOW),
            5,
            30
        ),
        5
    );
    // A guess that is short still answers short.
    let short = RunPace {
        kinds: &[Files],
        current: 0,
        current_since_ms: None,
    };
    assert_eq!(
        retry_after(&remaining(&short, &StepDurations::default(), NOW), 5, 30),
        1
    );
}

#[test]
fn spread_durations_make_the_answer_come_earlier() {
    use StepKind::*;
    let plan = [InstallKubeadm, InstallKubelet];
    let pace = RunPace {
        kinds: &plan,
        current: 0,
        current_since_ms: Some(NOW),
    };
    let steady = exact(&[(InstallKubeadm, 10_000), (InstallKubelet, 10_000)]);
    let mut spread = StepDurations::default();
    for ms in [6_000, 14_000, 7_000, 13_000, 8_000, 12_000, 10_000, 10_000] {
        spread.learn(InstallKubeadm, ms);
        spread.learn(InstallKubelet, ms);
    }
    let steady_answer = retry_after(&remaining(&pace, &steady, NOW), 5, 30);
    let spread_answer = retry_after(&remaining(&pace, &spread, NOW), 5, 30);
    assert_eq!(steady_answer, 20, "no spread: the expected end");
    assert!(
        (1..steady_answer).contains(&spread_answer),
        "spread {spread_answer} vs steady {steady_answer}"
    );
}

#[test]
fn learning_follows_a_changed_duration_and_ignores_hung_steps() {
    let mut table = learned(&[(StepKind::Ntp, 2_000)], 5);
    table.learn(StepKind::Ntp, MAX_LEARNED_STEP_MS + 1);
    let (mean, _, learned) = table.of(StepKind::Ntp);
    assert!(learned);
    assert!((mean - 2_000.0).abs() < 1.0, "{mean}");
    for _ in 0..60 {
        table.learn(StepKind::Ntp, 8_000);
    }
    let (mean, variance, _) = table.of(StepKind::Ntp);
    assert!((mean - 8_000.0).abs() < 50.0, "{mean}");
    assert!(variance.sqrt() < 100.0, "{variance}");
    // Other kinds are untouched.
    assert!(!table.of(StepKind::Files).2);
}

#[test]
fn a_pending_step_counts_from_the_previous_steps_end_or_not_at_all() {
    use StepKind::*;
    let table = learned(&[(Ntp, 4_000)], TRUSTED_AFTER_SAMPLES);
    let plan = [Ntp, Ntp];
    let since = |current_since_ms| RunPace {
        kinds: &plan,
        current: 1,
        current_since_ms,
    };
    let unknown = remaining(&since(None), &table, NOW);
    assert_eq!(unknown.mean_ms, 4_000.0);
    let later = remaining(&since(Some(NOW - 3_000)), &table, NOW);
    assert_eq!(later.mean_ms, 1_000.0);
    // A start in the future (an agent clock ahead of ours) counts as just started.
    let ahead = remaining(&since(Some(NOW + 60_000)), &table, NOW);
    assert_eq!(ahead.mean_ms, 4_000.0);
}
