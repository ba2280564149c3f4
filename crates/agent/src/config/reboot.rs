//! The `reboot:` and `osImage:` sections of the agent's `--config`: how this node reboots, how it says a
//! reboot is required, where it shows its boot id, and how it switches to an OS image and tells which image
//! it booted. The agent never runs a shell: every command is an argv.

use serde::Deserialize;

use crate::config::CommandSequence;
use crate::sequence::command::{check_argv_in, check_node_path};
use crate::sequence::template::Scope;

/// Default `reboot.command`.
pub const DEFAULT_REBOOT_COMMAND: [&str; 2] = ["systemctl", "reboot"];
/// Default `reboot.bootIdFile`: the kernel's boot id, new on every boot.
pub const DEFAULT_BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";
/// Default `reboot.required.file`: Debian's and Ubuntu's "a reboot is required" flag.
pub const DEFAULT_REBOOT_REQUIRED_FILE: &str = "/var/run/reboot-required";

/// `reboot:`. Every key has a default, so the section is optional.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RebootConfig {
    /// Reboots the node (argv; `{{root}}` allowed). It may return before the machine goes down.
    #[serde(default = "default_reboot_command")]
    pub command: Vec<String>,
    /// Node path (under `--root`) of the boot id: a different one after the command means the reboot happened.
    #[serde(default = "default_boot_id_file")]
    pub boot_id_file: String,
    /// How the node says a reboot is required (`when: ifRequired`).
    #[serde(default)]
    pub required: RebootRequired,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            command: default_reboot_command(),
            boot_id_file: default_boot_id_file(),
            required: RebootRequired::default(),
        }
    }
}

fn default_reboot_command() -> Vec<String> {
    DEFAULT_REBOOT_COMMAND.map(String::from).to_vec()
}

fn default_boot_id_file() -> String {
    DEFAULT_BOOT_ID_FILE.to_owned()
}

/// `reboot.required:` — exactly one of `file` and `command`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RebootRequired {
    /// A node path whose existence means "reboot required" (Debian family).
    #[serde(default)]
    pub file: Option<String>,
    /// A command (argv): exit 1 = required, exit 0 = not required, anything else fails the step (dnf family:
    /// `[needs-restarting, -r]`).
    #[serde(default)]
    pub command: Option<Vec<String>>,
}

impl Default for RebootRequired {
    fn default() -> Self {
        Self {
            file: Some(DEFAULT_REBOOT_REQUIRED_FILE.to_owned()),
            command: None,
        }
    }
}

/// How the node says a reboot is required, once validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequiredCheck {
    /// This node path exists.
    File(String),
    /// This command exits 1.
    Command(Vec<String>),
}

impl RebootRequired {
    /// The check; the error names the keys when not exactly one is set.
    pub fn check(&self) -> Result<RequiredCheck, String> {
        match (&self.file, &self.command) {
            (Some(file), None) => Ok(RequiredCheck::File(file.clone())),
            (None, Some(argv)) => Ok(RequiredCheck::Command(argv.clone())),
            _ => Err(
                "reboot.required: set exactly one of `file` (a node path) and `command` (an argv)"
                    .into(),
            ),
        }
    }
}

impl RebootConfig {
    /// Checks the values (names the key).
    pub fn validate(&self) -> Result<(), String> {
        check_argv_in(&self.command, Scope::Root).map_err(|e| format!("reboot.command: {e}"))?;
        check_node_path(&self.boot_id_file).map_err(|e| format!("reboot.bootIdFile: {e}"))?;
        match self.required.check()? {
            RequiredCheck::File(file) => {
                check_node_path(&file).map_err(|e| format!("reboot.required.file: {e}"))
            }
            RequiredCheck::Command(argv) => check_argv_in(&argv, Scope::Root)
                .map_err(|e| format!("reboot.required.command: {e}")),
        }
    }
}

/// `osImage:`. Without it the node refuses osImage steps (it cannot apply OS images).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsImageConfig {
    /// Stages the image for the next boot (`{{image}}` is the step's image): a command sequence like
    /// `kubernetes.installKubeadm` (`onResume`, `commands`, `retry`; not `skipIf`, `record`, `undo` — `current`
    /// says whether the node is on the image, and the undo is this sequence with the previous image).
    pub apply: CommandSequence,
    /// Prints the image the node booted (argv; `{{root}}`, `{{image}}` allowed): its trimmed first stdout line, or with
    /// [`OsImageConfig::current_json_pointer`] the string at that pointer of its JSON stdout.
    pub current: Vec<String>,
    /// A JSON pointer (RFC 6901, e.g. `/status/booted/image/image/image` for `bootc status --format json`)
    /// into the stdout of `current`, when it prints JSON rather than one line.
    #[serde(default)]
    pub current_json_pointer: Option<String>,
}

impl OsImageConfig {
    /// Checks the values (names the key).
    pub fn validate(&self) -> Result<(), String> {
        check_argv_in(&self.current, Scope::OsImage)
            .map_err(|e| format!("osImage.current: {e}"))?;
        if let Some(pointer) = &self.current_json_pointer
            && !pointer.starts_with('/')
        {
            return Err(format!(
                "osImage.currentJsonPointer: {pointer:?} is not a JSON pointer (it starts with `/`)"
            ));
        }
        let apply = &self.apply;
        if apply.skip_if.is_some() {
            return Err("osImage.apply.skipIf: not used: osImage.current says whether the node is on the image".into());
        }
        if !apply.record.is_empty() || apply.undo.is_some() {
            return Err("osImage.apply: no `record`/`undo`: the undo of an osImage step is osImage.apply with the previous image".into());
        }
        apply
            .validate_with_image()
            .map_err(|e| format!("osImage.apply: {e}"))
    }
}
