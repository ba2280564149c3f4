//! The shipped bootc example (`config-examples/bootc.yaml`) against a stand-in `bootc` that keeps what bootc
//! keeps on an ostree system, so the test can see which image the next boot starts:
//!
//! - `booted`: the deployment running now; `entries`: the boot entries in order, the first the bootloader's
//!   default; `staged`: a deployment queued for the next boot (ostree finalizes it at shutdown into the first
//!   entry, beside the booted one: the previous rollback is pruned).
//! - the host spec, as bootc's `status.rs` computes it: the image is the staged deployment's, else the
//!   booted one's; `bootOrder` is `rollback` when the first entry is not the booted deployment
//!   (`rollbackQueued`), else `default`.
//! - `switch IMAGE` changes the spec's image only: the same image is "Image specification is unchanged." and
//!   nothing happens (bootc's `switch_ostree`); another is staged.
//! - `edit --filename FILE` takes the spec from a BootcHost file: unchanged does nothing; another `bootOrder`
//!   flips the entries (bootc's `deploy::rollback`, which `edit` calls for it; a staged deployment is
//!   dropped); another image is staged; both at once is refused, as bootc refuses it.
//! - `status --booted --format json`: the booted image where bootc prints it.
//!
//! The machine's boot ([`boot`]) finalizes a staged deployment, then boots the first entry, or on a fall back
//! (a boot counter run out, a menu choice) the other one once, leaving the order as it is: that is the A/B
//! fallback of issue 43.2, where the image the step switched to stays the default boot entry.

use std::path::Path;

use super::os_image::{NEW, OLD, os_image, undo_attempt};
use super::reboot::{OnWait, assert_ok, attempt, reboot_node, reboot_sandbox};
use super::{Sandbox, record_context};
use crate::drivers::{DriverOutcome, UndoRecord, record_undo};

const BOOTC: &str = r#"d="$INPLACE_ROOT/bootc"
booted=$(cat "$d/booted")
staged=$(cat "$d/staged" 2>/dev/null)
first=$(head -n 1 "$d/entries")
spec=${staged:-$booted}
if [ "$first" = "$booted" ]; then order=default; else order=rollback; fi
stage() { echo "$1" > "$d/staged"; echo "Queued for next boot: $1"; }
swap() {
  other=$(grep -v -x -F "$booted" "$d/entries" | head -n 1)
  if [ -z "$other" ]; then echo "error: No rollback available" >&2; exit 1; fi
  rm -f "$d/staged"
  if [ "$order" = rollback ]; then
    echo "notice: Reverting queued rollback state"
    printf '%s\n%s\n' "$booted" "$other" > "$d/entries"
  else
    printf '%s\n%s\n' "$other" "$booted" > "$d/entries"
  fi
}
case "$1" in
  status)
    printf '{"apiVersion":"org.containers.bootc/v1","kind":"BootcHost","spec":{"image":{"image":"%s","transport":"registry"},"bootOrder":"%s"},"status":{"booted":{"image":{"image":{"image":"%s","transport":"registry"},"imageDigest":"sha256:00"}}}}\n' "$spec" "$order" "$booted" ;;
  switch)
    for image; do :; done
    if [ "$image" = "$spec" ]; then echo "Image specification is unchanged."; else stage "$image"; fi ;;
  edit)
    for file; do :; done
    image=$(sed -n 's/^ *image: *"\{0,1\}\([^" ][^" ]*\)"\{0,1\} *$/\1/p' "$file")
    want=$(sed -n 's/^ *bootOrder: *//p' "$file")
    want=${want:-default}
    if [ "$image" = "$spec" ] && [ "$want" = "$order" ]; then
      echo "Edit cancelled, no changes made."
    elif [ "$want" != "$order" ]; then
      if [ "$image" != "$spec" ]; then echo "error: Invalid state transition: rollback and image change" >&2; exit 1; fi
      swap
    else
      stage "$image"
    fi ;;
  rollback) swap ;;
  *) echo "bootc: unknown command $1" >&2; exit 2 ;;
esac"#;

/// A node booted from `OLD`, its only boot entry, with the stand-in `bootc` and `systemctl`.
fn sandbox() -> Sandbox {
    let sb = reboot_sandbox();
    sb.fake("bootc", BOOTC);
    sb.fake("systemctl", "exit 0");
    sb.write_node("/bootc/booted", &format!("{OLD}\n"));
    sb.write_node("/bootc/entries", &format!("{OLD}\n"));
    sb
}

fn read(sb: &Sandbox, file: &str) -> Option<String> {
    let text = std::fs::read_to_string(sb.node(&format!("/bootc/{file}"))).ok()?;
    Some(text.trim().to_owned())
}

fn entries(sb: &Sandbox) -> Vec<String> {
    read(sb, "entries")
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The image the next boot starts (the bootloader's default), a fall back aside.
fn next_boot(sb: &Sandbox) -> String {
    read(sb, "staged").unwrap_or_else(|| entries(sb)[0].clone())
}

/// The machine restarts under `boot_id` (see the module doc).
fn boot(sb: &Sandbox, boot_id: &str, fall_back: bool) {
    let booted = read(sb, "booted").unwrap();
    let mut entries = entries(sb);
    if let Some(staged) = read(sb, "staged") {
        entries = vec![staged, booted];
        std::fs::remove_file(sb.node("/bootc/staged")).unwrap();
    }
    let chosen = if fall_back { &entries[1] } else { &entries[0] };
    sb.write_node("/bootc/booted", &format!("{chosen}\n"));
    sb.write_node("/bootc/entries", &format!("{}\n", entries.join("\n")));
    reboot_node(sb, boot_id);
}

/// The shipped example without its `node:` section (no API server here: the Node Ready wait is skipped).
fn example_env(sb: &Sandbox) -> std::sync::Arc<crate::drivers::DriverEnv> {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config-examples/bootc.yaml"),
    )
    .unwrap();
    let example: Vec<&str> = example
        .split("\n\n")
        .filter(|block| !block.contains("\nnode:\n"))
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
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Stop).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Interrupted,
        "{}",
        result.message
    );
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
    assert_eq!(next_boot(&sb), NEW);
    boot(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_ok(&result);
    assert_eq!(
        entries(&sb),
        [NEW, OLD],
        "the previous deployment is kept for rollback"
    );
}

#[tokio::test]
async fn the_undo_of_a_fallen_back_boot_makes_the_previous_image_the_default_again_without_a_reboot()
 {
    let sb = sandbox();
    let env = example_env(&sb);
    let record = record_undo(
        env.clone(),
        record_context(super::reboot::PLAN, os_image(NEW)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        record,
        UndoRecord::OsImage {
            previous_image: OLD.into()
        }
    );
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Stop).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Interrupted,
        "{}",
        result.message
    );
    // The new image's boot fails and the bootloader falls back to the previous entry, once.
    boot(&sb, "boot-bbbbbbbbbbbb", true);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert_eq!(
        result.message,
        format!("booted the previous image {OLD} instead of {NEW} (the boot fell back)")
    );
    assert_eq!(read(&sb, "booted").as_deref(), Some(OLD));
    assert_eq!(
        next_boot(&sb),
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
    assert_eq!(next_boot(&sb), NEW);

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
        next_boot(&sb),
        OLD,
        "the default boot entry is the previous image"
    );
    assert_eq!(entries(&sb), [OLD, NEW]);
    assert_eq!(reboots(&sb), 1, "no reboot for the undo");

    // Run again (a kill before the undo's end was recorded): it converges, it does not flip the entries back.
    let again = undo_attempt(env.clone(), &record, false).await;
    assert_ok(&again);
    assert_eq!(next_boot(&sb), OLD);
    assert_eq!(reboots(&sb), 1);

    // The node's next reboot stays on the previous image.
    boot(&sb, "boot-cccccccccccc", false);
    assert_eq!(read(&sb, "booted").as_deref(), Some(OLD));
}

#[tokio::test]
async fn the_undo_of_a_step_that_booted_its_image_switches_back_and_reboots() {
    let sb = sandbox();
    let env = example_env(&sb);
    let record = UndoRecord::OsImage {
        previous_image: OLD.into(),
    };
    let (_, _) = attempt(&env, os_image(NEW), 30, OnWait::Stop).await;
    boot(&sb, "boot-bbbbbbbbbbbb", false);
    let (result, _) = attempt(&env, os_image(NEW), 30, OnWait::Keep).await;
    assert_ok(&result);
    // A later step failed: the undo stages the previous image, reboots into it and verifies it.
    let stopped = undo_attempt(env.clone(), &record, true).await;
    assert_eq!(
        stopped.outcome,
        DriverOutcome::Interrupted,
        "{}",
        stopped.message
    );
    assert_eq!(next_boot(&sb), OLD);
    boot(&sb, "boot-cccccccccccc", false);
    let undone = undo_attempt(env.clone(), &record, false).await;
    assert_ok(&undone);
    assert!(
        undone.message.starts_with(&format!("now on {OLD}")),
        "{}",
        undone.message
    );
    assert_eq!(reboots(&sb), 2);
}
