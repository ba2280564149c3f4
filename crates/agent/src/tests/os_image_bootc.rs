//! The shipped bootc example (`config-examples/bootc.yaml`) against the stand-in `bootc` of
//! `crate::os::bootc_stand_in`, which keeps the boot entries, the booted and the staged deployment as bootc
//! computes its host spec, so the test sees which image the next boot starts. Its [`boot`] with a fall back
//! is the A/B fallback of issue 43.2: the image the step switched to stays the default boot entry.

use std::path::Path;

use super::Sandbox;
use super::os_image::{
    NEW, OLD, os_image, recorded_previous, undo_attempt, undo_reboots_into_the_previous_image,
    until_the_reboot,
};
use super::reboot::{OnWait, assert_ok, attempt, reboot_node, reboot_sandbox};
use crate::drivers::{DriverOutcome, UndoRecord};
use crate::os::bootc_stand_in::{BOOTC_STAND_IN, booted, entries, next_boot};

/// A node booted from `OLD`, its only boot entry, with the stand-in `bootc` and `systemctl`.
fn sandbox() -> Sandbox {
    let sb = reboot_sandbox();
    sb.fake("bootc", BOOTC_STAND_IN);
    sb.fake("systemctl", "exit 0");
    crate::os::bootc_stand_in::install(&sb.root, OLD).unwrap();
    sb
}

/// The machine restarts under `boot_id`, on a fall back into the other entry.
fn boot(sb: &Sandbox, boot_id: &str, fall_back: bool) {
    crate::os::bootc_stand_in::boot(&sb.root, fall_back).unwrap();
    reboot_node(sb, boot_id);
}

/// The shipped example without its `node:` and `verify:` sections (no API server here: the Node Ready wait is
/// skipped, and the node verification, which reads the node's pods through it, is the executor's, not a driver's).
fn example_env(sb: &Sandbox) -> std::sync::Arc<crate::drivers::DriverEnv> {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config-examples/bootc.yaml"),
    )
    .unwrap();
    let example: Vec<&str> = example
        .split("\n\n")
        .filter(|block| !block.contains("\nnode:\n") && !block.contains("\nverify:\n"))
        .collect();
    sb.env(&example.join("\n\n"))
}

/// How many times the example's reboot command ran.
fn reboots(sb: &Sandbox) -> usize {
    sb.calls()
        .iter()
        .filter(|c| *c == "systemctl reboot")
        .count()
}

fn apply_calls(sb: &Sandbox) -> Vec<String> {
    sb.calls()
        .into_iter()
        .filter(|c| c.starts_with("bootc edit") || c.starts_with("bootc switch"))
        .collect()
}

#[tokio::test]
async fn the_shipped_bootc_example_stages_the_image_reboots_into_it_and_verifies_it() {
    let sb = sandbox();
    let env = example_env(&sb);
    until_the_reboot(&env, NEW).await;
    let host_file = sb.node("/var/lib/inplace-updater/bootc-host.yaml");
    assert_eq!(
        apply_calls(&sb),
        [format!(
            "bootc edit --quiet --filename {}",
            host_file.display()
        )]
    );
    assert!(
        std::fs::read_to_string(&host_file)
            .unwrap()
            .contains(&format!(
                "image: \"{NEW}\"\n    transport: registry\n  bootOrder: default\n"
            )),
    );
    assert_eq!(reboots(&sb), 1);
    assert_eq!(next_boot(&sb.root), NEW);
    boot(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(
        entries(&sb.root),
        [NEW, OLD],
        "the previous deployment is kept for rollback"
    );
}

#[tokio::test]
async fn the_undo_of_a_fallen_back_boot_makes_the_previous_image_the_default_again_without_a_reboot()
 {
    let sb = sandbox();
    let env = example_env(&sb);
    let record = recorded_previous(&env).await;
    until_the_reboot(&env, NEW).await;
    // The new image's boot fails and the bootloader falls back to the previous entry, once.
    boot(&sb, "boot-bbbbbbbbbbbb", true);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        format!("booted the previous image {OLD} instead of {NEW} (the boot fell back)")
    );
    assert_eq!(booted(&sb.root), OLD);
    assert_eq!(
        next_boot(&sb.root),
        NEW,
        "the failed image is still the default entry"
    );

    // What `bootc switch` (the example's apply before) would do here: nothing, the image is unchanged.
    let switch = std::process::Command::new(sb.bin.join("bootc"))
        .args(["switch", "--transport", "registry", OLD])
        .env("INPLACE_ROOT", &sb.root)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&switch.stdout),
        "Image specification is unchanged.\n"
    );
    assert_eq!(next_boot(&sb.root), NEW);

    // The rollback: apply with the previous image sets the default entry back; the node runs it: no reboot.
    let calls_before = apply_calls(&sb).len();
    let undone = undo_attempt(env.clone(), &record, false).await;
    assert_ok(&undone);
    assert_eq!(
        undone.message,
        format!(
            "{OLD} is booted already; osImage.apply made it the next boot's image again (no reboot)"
        )
    );
    assert_eq!(
        apply_calls(&sb).len(),
        calls_before + 1,
        "apply ran with the previous image"
    );
    assert_eq!(
        next_boot(&sb.root),
        OLD,
        "the default boot entry is the previous image"
    );
    assert_eq!(entries(&sb.root), [OLD, NEW]);
    assert_eq!(reboots(&sb), 1, "no reboot for the undo");

    // Run again (a kill before the undo's end was recorded): it converges, it does not flip the entries back.
    let again = undo_attempt(env.clone(), &record, false).await;
    assert_ok(&again);
    assert_eq!(next_boot(&sb.root), OLD);
    assert_eq!(reboots(&sb), 1);

    // The node's next reboot stays on the previous image.
    boot(&sb, "boot-cccccccccccc", false);
    assert_eq!(booted(&sb.root), OLD);
}

#[tokio::test]
async fn the_undo_of_a_step_that_booted_its_image_switches_back_and_reboots() {
    let sb = sandbox();
    let env = example_env(&sb);
    let record = UndoRecord::OsImage {
        previous_image: OLD.into(),
    };
    until_the_reboot(&env, NEW).await;
    boot(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_ok(&result);
    // A later step failed: the undo stages the previous image, reboots into it and verifies it.
    undo_reboots_into_the_previous_image(&env, &record, || {
        assert_eq!(next_boot(&sb.root), OLD);
        boot(&sb, "boot-cccccccccccc", false);
    })
    .await;
    assert_eq!(reboots(&sb), 2);
}
