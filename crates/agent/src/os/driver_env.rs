//! What every driver works with: the `--root` it changes, the `--config` that says how, the environment of
//! its commands, and the state dir where drivers keep their journals and backups. The inventory reads the
//! node through it too.

use std::path::PathBuf;

use crate::config::DriverConfig;
use crate::fsutil::{RootFs, euid};
use crate::sequence::process::CommandEnv;
use crate::undo::backup::Backups;

/// What every driver works with: the root, the config, the command environment, the state dir.
#[derive(Clone, Debug)]
pub(crate) struct DriverEnv {
    /// `--root`.
    pub fs: RootFs,
    /// The `--config` file.
    pub config: DriverConfig,
    /// Environment of commands.
    pub command_env: CommandEnv,
    /// `--state-dir` (driver journals live here).
    pub state_dir: PathBuf,
    /// Backups of replaced files.
    pub backups: Backups,
    /// True when the agent runs as root: owners are applied only then.
    pub is_root: bool,
}

impl DriverEnv {
    /// Builds the environment.
    pub fn new(root: PathBuf, config: DriverConfig, state_dir: PathBuf) -> Self {
        let root_text = root.display().to_string();
        let command_env = CommandEnv {
            path: config.path_env(&root_text),
            root: root.clone(),
            extra: config.env.clone(),
        };
        Self {
            fs: RootFs::new(root),
            backups: Backups::new(&state_dir),
            command_env,
            config,
            state_dir,
            is_root: euid() == 0,
        }
    }
}
