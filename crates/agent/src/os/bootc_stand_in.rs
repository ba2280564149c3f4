//! A stand-in `bootc` for sandboxed nodes — the demo's (`inplace-updater demo`) and the agent's tests — that
//! keeps what bootc keeps on an ostree system, so a test can see which image the node boots next; the agent
//! itself never uses it. Its state is in `<root>/var/lib/fake/bootc/`:
//!
//! - `booted`: the deployment running now; `entries`: the boot entries in order, the first the bootloader's
//!   default; `staged`: a deployment queued for the next boot (ostree finalizes it at shutdown into the first
//!   entry, beside the booted one; the previous rollback is pruned).
//! - the host spec, as bootc's `status.rs` computes it: the image is the staged deployment's, else the booted
//!   one's; `bootOrder` is `rollback` when the first entry is not the booted deployment (`rollbackQueued`),
//!   else `default`.
//! - `switch … IMAGE` changes the spec's image only: the same image is "Image specification is unchanged." and
//!   nothing happens (bootc's `switch_ostree`); another one is staged.
//! - `edit … --filename FILE` takes the spec from a BootcHost file: unchanged does nothing ("Edit cancelled, no
//!   changes made."); another `bootOrder` flips the entries (bootc's `deploy::rollback`, which `edit` calls;
//!   a staged deployment is dropped); another image is staged; both at once is refused, as bootc refuses it.
//! - `rollback` flips the entries; `status …` prints the spec and the booted image where bootc prints them
//!   (`/status/booted/image/image/image`).
//!
//! [`boot`] is the machine restarting: it finalizes a staged deployment, then boots the first entry — or, on
//! a fall back, when that entry is the deployment just finalized (its first boot fails: a boot counter runs
//! out), the other one, leaving the order as it is: the A/B fallback after which the image just switched to
//! is still the default entry.

use std::io;
use std::path::{Path, PathBuf};

/// The stand-in's script (POSIX sh, without the `#!` line: the sandboxes add theirs, which log the call).
pub const BOOTC_STAND_IN: &str = r#"d="$INPLACE_ROOT/var/lib/fake/bootc"
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

fn dir(root: &Path) -> PathBuf {
    root.join("var/lib/fake/bootc")
}

fn read(root: &Path, file: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir(root).join(file)).ok()?;
    Some(text.trim().to_owned())
}

/// Lays out a node at `root` booted from `image`, its only boot entry.
pub fn install(root: &Path, image: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir(root))?;
    std::fs::write(dir(root).join("booted"), format!("{image}\n"))?;
    std::fs::write(dir(root).join("entries"), format!("{image}\n"))
}

/// The image the node booted (empty when none is laid out).
pub fn booted(root: &Path) -> String {
    read(root, "booted").unwrap_or_default()
}

/// The boot entries, the default first.
pub fn entries(root: &Path) -> Vec<String> {
    read(root, "entries")
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The image the next boot starts, a fall back aside: the staged deployment, else the first entry.
pub fn next_boot(root: &Path) -> String {
    read(root, "staged").unwrap_or_else(|| entries(root).into_iter().next().unwrap_or_default())
}

/// The machine restarts (see the module doc; `fall_back`: a deployment staged for this boot fails to boot);
/// the caller gives it its new boot id.
pub fn boot(root: &Path, fall_back: bool) -> io::Result<()> {
    let booted = booted(root);
    let mut entries = entries(root);
    let staged = read(root, "staged");
    if let Some(staged) = &staged {
        entries = vec![staged.clone(), booted.clone()];
        std::fs::remove_file(dir(root).join("staged"))?;
    }
    let chosen = match (fall_back && staged.is_some(), entries.as_slice()) {
        (true, [_, other, ..]) => other.clone(),
        (_, [first, ..]) => first.clone(),
        (_, []) => booted,
    };
    std::fs::write(dir(root).join("booted"), format!("{chosen}\n"))?;
    std::fs::write(
        dir(root).join("entries"),
        format!("{}\n", entries.join("\n")),
    )
}
