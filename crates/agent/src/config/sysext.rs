//! The `sysext:` section of the agent config: how `sysextSwitch` commands (`crate::os::sysext`) reach
//! systemd-sysext and unsquashfs, and where the `<name>.raw` links live.

use serde::Deserialize;

use crate::sequence::command::{check_argv_in, check_node_path};
use crate::sequence::template;

/// The `sysext:` section of the agent config: how `sysextSwitch` commands reach systemd-sysext.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SysextConfig {
    /// `systemd-sysext` (argv; `status --json=short`, `list --json=short` and, unless `refresh` is set,
    /// `refresh` are appended).
    #[serde(default = "default_command")]
    pub command: Vec<String>,
    /// The refresh (argv). Default: `<command> refresh`. Flatcar's systemd 252 wants
    /// `[systemctl, restart, systemd-sysext, ensure-sysext]` (the service runs the refresh, then
    /// ensure-sysext reloads systemd and starts the units the images ship).
    #[serde(default)]
    pub refresh: Option<Vec<String>>,
    /// `unsquashfs` (argv; `-cat <image> <path>` is appended): reads an image's extension-release.
    #[serde(default = "default_unsquashfs")]
    pub unsquashfs: Vec<String>,
    /// Node path of the directory holding the `<name>.raw` links (Flatcar: `/etc/extensions`).
    #[serde(default = "default_extensions_dir")]
    pub extensions_dir: String,
}

impl Default for SysextConfig {
    fn default() -> Self {
        Self {
            command: default_command(),
            refresh: None,
            unsquashfs: default_unsquashfs(),
            extensions_dir: default_extensions_dir(),
        }
    }
}

fn default_command() -> Vec<String> {
    vec!["systemd-sysext".to_owned()]
}

fn default_unsquashfs() -> Vec<String> {
    vec!["unsquashfs".to_owned()]
}

fn default_extensions_dir() -> String {
    "/etc/extensions".to_owned()
}

impl SysextConfig {
    /// Checks both argvs (they may use `{{root}}` only) and the directory.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for (key, argv) in [
            ("sysext.command", Some(&self.command)),
            ("sysext.refresh", self.refresh.as_ref()),
            ("sysext.unsquashfs", Some(&self.unsquashfs)),
        ] {
            let Some(argv) = argv else { continue };
            check_argv_in(argv, template::Scope::Root).map_err(|e| format!("{key}: {e}"))?;
        }
        check_node_path(&self.extensions_dir).map_err(|e| format!("sysext.extensionsDir: {e}"))?;
        template::check_in(&self.extensions_dir, template::Scope::Root)
            .map_err(|e| format!("sysext.extensionsDir: {e}"))
    }
}
