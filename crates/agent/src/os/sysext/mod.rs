//! The `sysextSwitch` sequence command: puts a systemd system extension image (`.raw`, squashfs) in
//! place the way Flatcar does, as a symlink `<extensionsDir>/<name>.raw` → the image, and merges it.
//! In order: the image's `extension-release.<name>` is checked against the node's os-release with
//! systemd-sysext's own rule (an incompatible image would make `refresh` unmerge everything and exit 0),
//! the link is switched atomically (a symlink at a temp name renamed over it), `systemd-sysext refresh`
//! runs, and `status`/`list --json=short` must show `<name>` merged from the link; if not, the link goes
//! back to its earlier target and is refreshed again. An empty image removes the link (and unmerges).
//!
//! Idempotent, so a resumed step may run it again after a kill at any point: a link already at the image
//! is left alone and only refreshed and verified. systemd-sysext runs without `--root`: v252 ignores a
//! symlink that leaves the extensions directory under `--root`, so the agent's node paths must be the
//! paths systemd-sysext sees (`--root /`, or a mount namespace arranged that way). Each switch that ends merged
//! is noted in the journal of linked images (`crate::os::sysext::images`), whose sweep removes old ones.

pub(crate) mod images;
pub(crate) mod release;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::fsutil::{FsError, fs_err, read_optional, remove_file, sync_dir, temp_beside};
use crate::os::driver_env::DriverEnv;
use crate::os::sysext::images::note_linked;
use crate::os::sysext::release::{
    Mismatch, compatibility, listed_path, merged_names, node_architecture, parse_release,
};
use crate::sequence::process::{
    CommandEnd, CommandOutput, STDOUT_TAIL_MAX_BYTES, display_argv, run_command,
};
use crate::sequence::template::{TemplateError, Vars, expand};

/// Longest time one `systemd-sysext` or `unsquashfs` run may take (within the step's own timeout): a
/// refresh mounts every image over a loop device, which takes well under a second per image.
pub const SYSEXT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest output of `unsquashfs -cat` (the extension-release file) and of `systemd-sysext list`/`status
/// --json=short` the agent reads; longer output is refused, since only its tail was kept.
pub const MAX_SYSEXT_OUTPUT_BYTES: usize = STDOUT_TAIL_MAX_BYTES;

/// Largest node os-release file read (`/etc/os-release`, else `/usr/lib/os-release`).
pub const MAX_OS_RELEASE_BYTES: u64 = 64 * 1024;

/// Why a `sysextSwitch` did not converge.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SysextError {
    /// The image is missing or not a regular file.
    #[error("image {image}: {detail}")]
    Image {
        /// Node path of the image.
        image: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The image would not be merged on this node (systemd-sysext would ignore it and unmerge the rest).
    #[error(
        "image {image} is not compatible with this node ({mismatch}); the link was left as it was"
    )]
    Incompatible {
        /// Node path of the image.
        image: String,
        /// The deciding field and both values.
        #[source]
        mismatch: Mismatch,
    },
    /// Something other than a symlink is at the link's path: the agent replaces only symlinks.
    #[error(
        "{link} is not a symlink; the agent switches only symlinks and leaves other files alone"
    )]
    NotALink {
        /// Node path of the link.
        link: String,
    },
    /// A file operation on the link or the os-release failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A command failed, or printed what the agent cannot read.
    #[error("`{command}`: {detail}")]
    Command {
        /// The argv as shown.
        command: String,
        /// How it failed (exit status, stderr tail, or the parse error).
        detail: String,
    },
    /// After the refresh, the extension is not merged as it should be; the link was put back.
    #[error("{what}; {restored}")]
    NotMerged {
        /// What the verification found.
        what: String,
        /// What happened to the link afterwards.
        restored: String,
    },
    /// What the verification after the refresh found instead of the extension merged from the link.
    #[error("{0}")]
    Found(String),
    /// A configured template or a node path is unusable, or the node lacks an os-release file.
    #[error("{0}")]
    Node(String),
    /// The agent is shutting down; the command runs again on resume.
    #[error("stopped: agent shutting down")]
    ShuttingDown,
}

/// What one run needs: the environment, the step's deadline and its cancel signal.
pub(crate) struct Run<'a> {
    /// Root, config, command environment.
    pub env: &'a DriverEnv,
    /// The step's deadline (each command gets at most [`SYSEXT_COMMAND_TIMEOUT`] of what is left).
    pub deadline: Instant,
    /// The agent's shutdown signal.
    pub cancel: &'a mut watch::Receiver<bool>,
}

impl Run<'_> {
    /// `sysextSwitch {name, image}`: `image` is an expanded node path, or empty to remove the link.
    pub async fn switch(&mut self, name: &str, image: &str) -> Result<String, SysextError> {
        let link_node = self.link_node(name)?;
        let link = self.real(&link_node)?;
        let before = read_link(&link, &link_node)?;
        if image.is_empty() {
            if before.is_some() {
                remove_file(&link)?;
            }
            self.refresh().await?;
            let merged = self.merged().await?;
            if merged.iter().any(|n| n == name) {
                return Err(SysextError::NotMerged {
                    what: format!("{name} is still merged after removing {link_node}"),
                    restored: "the link stays removed".to_owned(),
                });
            }
            note_linked(&self.env.state_dir, name, image, before.as_deref());
            return Ok(format!("{link_node} removed; {name} is not merged"));
        }
        self.check_image(name, image).await?;
        let switched = before.as_deref() != Some(image);
        if switched {
            set_link(&link, image)?;
        }
        self.refresh().await?;
        let what = match self.verify(name, &link_node).await {
            Ok(()) => {
                note_linked(&self.env.state_dir, name, image, before.as_deref());
                return Ok(format!("{link_node} → {image}; {name} merged"));
            }
            // Resumed, the run finds the link switched: refreshed and verified again.
            Err(SysextError::ShuttingDown) => return Err(SysextError::ShuttingDown),
            Err(e) => e.to_string(),
        };
        match what {
            what if switched => {
                let restored = match &before {
                    Some(target) => {
                        set_link(&link, target).map(|()| format!("{link_node} → {target} again"))
                    }
                    None => remove_file(&link).map(|_| format!("{link_node} removed again")),
                };
                let restored = match restored {
                    Ok(done) => match self.refresh().await {
                        Ok(()) => format!("{done}, refreshed"),
                        // Resumed, the run switches, fails and puts back again.
                        Err(SysextError::ShuttingDown) => return Err(SysextError::ShuttingDown),
                        Err(e) => format!("{done}, but the refresh failed: {e}"),
                    },
                    Err(e) => format!("putting the link back failed: {e}"),
                };
                Err(SysextError::NotMerged { what, restored })
            }
            what => Err(SysextError::NotMerged {
                what,
                restored: format!(
                    "{link_node} already pointed at {image} when this run began (an interrupted earlier \
                     run?), so it stays; the step's undo puts the recorded link back"
                ),
            }),
        }
    }

    fn link_node(&self, name: &str) -> Result<String, SysextError> {
        link_node(self.env, name).map_err(|e| SysextError::Node(e.into()))
    }

    fn real(&self, node_path: &str) -> Result<PathBuf, SysextError> {
        self.env
            .fs
            .path(node_path)
            .map_err(|e| SysextError::Node(e.into()))
    }

    /// (a): the image is a file whose extension-release.<name> systemd-sysext would accept here.
    async fn check_image(&mut self, name: &str, image: &str) -> Result<(), SysextError> {
        let real = self.real(image)?;
        let image_err = |detail: String| SysextError::Image {
            image: image.to_owned(),
            detail,
        };
        match std::fs::metadata(&real) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(image_err("not a regular file".to_owned())),
            Err(e) => return Err(image_err(e.to_string())),
        }
        let inside = format!("usr/lib/extension-release.d/extension-release.{name}");
        let mut argv = self.argv(&self.env.config.sysext.unsquashfs)?;
        argv.extend([
            "-cat".to_owned(),
            real.display().to_string(),
            inside.clone(),
        ]);
        let text = self.output(&argv).await.map_err(|e| match e {
            SysextError::ShuttingDown => e,
            e => image_err(format!(
                "cannot read {inside} (is it an extension named {name}?): {e}"
            )),
        })?;
        let node = self.node_release()?;
        compatibility(&parse_release(&text), &node, node_architecture()).map_err(|mismatch| {
            SysextError::Incompatible {
                image: image.to_owned(),
                mismatch,
            }
        })
    }

    /// The node's os-release fields, as systemd-sysext reads them: `/etc/os-release`, else
    /// `/usr/lib/os-release`.
    fn node_release(&self) -> Result<std::collections::BTreeMap<String, String>, SysextError> {
        for node_path in ["/etc/os-release", "/usr/lib/os-release"] {
            let path = self.real(node_path)?;
            if let Some(bytes) = read_optional(&path, MAX_OS_RELEASE_BYTES)? {
                return Ok(parse_release(&String::from_utf8_lossy(&bytes)));
            }
        }
        Err(SysextError::Node(
            "this node has neither /etc/os-release nor /usr/lib/os-release".to_owned(),
        ))
    }

    /// (d): `status` lists `name` merged, and `list` says its image is the link. A command that fails
    /// fails the verification too (`ShuttingDown` aside): nothing then says the image is merged.
    async fn verify(&mut self, name: &str, link_node: &str) -> Result<(), SysextError> {
        let merged = self.merged().await?;
        if !merged.iter().any(|n| n == name) {
            return Err(SysextError::Found(format!(
                "{name} is not merged after the refresh (merged: {})",
                if merged.is_empty() {
                    "none".to_owned()
                } else {
                    merged.join(", ")
                }
            )));
        }
        let argv = self.sysext_argv(&["list", "--json=short"])?;
        let listed = self.output(&argv).await?;
        let found = match listed_path(&listed, name) {
            Ok(Some(path)) if path == link_node => return Ok(()),
            Ok(Some(path)) => format!(
                "{name} is merged from {path}, not from {link_node} (an extension of the same name in a \
                 directory systemd-sysext prefers)"
            ),
            Ok(None) => format!("`list` does not show {name}"),
            Err(e) => {
                return Err(SysextError::Command {
                    command: display_argv(&argv),
                    detail: e.to_string(),
                });
            }
        };
        Err(SysextError::Found(found))
    }

    async fn merged(&mut self) -> Result<Vec<String>, SysextError> {
        let argv = self.sysext_argv(&["status", "--json=short"])?;
        let text = self.output(&argv).await?;
        merged_names(&text).map_err(|e| SysextError::Command {
            command: display_argv(&argv),
            detail: e.to_string(),
        })
    }

    async fn refresh(&mut self) -> Result<(), SysextError> {
        let argv = match &self.env.config.sysext.refresh {
            Some(configured) => self.argv(configured)?,
            None => self.sysext_argv(&["refresh"])?,
        };
        self.output(&argv).await.map(drop)
    }

    fn sysext_argv(&self, args: &[&str]) -> Result<Vec<String>, SysextError> {
        let mut argv = self.argv(&self.env.config.sysext.command)?;
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        Ok(argv)
    }

    fn argv(&self, configured: &[String]) -> Result<Vec<String>, SysextError> {
        let vars = Vars::root_only(&self.env.command_env.root.display().to_string());
        configured
            .iter()
            .map(|a| expand(a, &vars))
            .collect::<Result<_, _>>()
            .map_err(|e| SysextError::Node(e.into()))
    }

    /// Runs `argv` (at most [`SYSEXT_COMMAND_TIMEOUT`]); its stdout when it exits 0.
    async fn output(&mut self, argv: &[String]) -> Result<String, SysextError> {
        let deadline = self.deadline.min(Instant::now() + SYSEXT_COMMAND_TIMEOUT);
        let output = run_command(argv, &self.env.command_env, deadline, self.cancel).await;
        command_result(argv, output)
    }
}

/// The node path of extension `name`'s link: `<extensionsDir>/<name>.raw`.
pub(crate) fn link_node(env: &DriverEnv, name: &str) -> Result<String, TemplateError> {
    let dir = expand(
        &env.config.sysext.extensions_dir,
        &Vars::root_only(&env.command_env.root.display().to_string()),
    )?;
    Ok(format!("{}/{name}.raw", dir.trim_end_matches('/')))
}

/// The stdout of a command that exited 0 with output under [`MAX_SYSEXT_OUTPUT_BYTES`], else the error.
fn command_result(argv: &[String], output: CommandOutput) -> Result<String, SysextError> {
    let failed = |detail: String| SysextError::Command {
        command: display_argv(argv),
        detail,
    };
    let stderr = output.stderr_tail.trim();
    let stderr = if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    };
    match output.end {
        CommandEnd::Exited(0) if output.stdout_tail.len() >= MAX_SYSEXT_OUTPUT_BYTES => {
            Err(failed(format!(
                "printed more than MAX_SYSEXT_OUTPUT_BYTES ({MAX_SYSEXT_OUTPUT_BYTES})"
            )))
        }
        CommandEnd::Exited(0) => Ok(output.stdout_tail),
        CommandEnd::Cancelled => Err(SysextError::ShuttingDown),
        CommandEnd::Exited(code) => Err(failed(format!("exited with {code}{stderr}"))),
        CommandEnd::Signaled(signal) => Err(failed(format!("killed by signal {signal}{stderr}"))),
        CommandEnd::TimedOut => Err(failed(format!(
            "timed out (SYSEXT_COMMAND_TIMEOUT {} s, or the step's timeout), process group killed",
            SYSEXT_COMMAND_TIMEOUT.as_secs()
        ))),
        CommandEnd::SpawnFailed(e) => Err(failed(e)),
    }
}

/// The link's target (as written), `None` when there is no link; an error when something else is there.
fn read_link(link: &Path, link_node: &str) -> Result<Option<String>, SysextError> {
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => std::fs::read_link(link)
            .map(|t| Some(t.display().to_string()))
            .map_err(|e| fs_err("read link", link)(e).into()),
        Ok(_) => Err(SysextError::NotALink {
            link: link_node.to_owned(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_err("inspect", link)(e).into()),
    }
}

/// Points `link` at `target` in one step: a symlink at the temp name beside it (`.<name>.raw.inplace-tmp`:
/// systemd-sysext skips hidden names), renamed over it, the directory fsync'd. Creates the directory when
/// missing.
fn set_link(link: &Path, target: &str) -> Result<(), FsError> {
    let (dir, temp) = temp_beside(link, "create symlink", |p| std::fs::remove_file(p))?;
    std::os::unix::fs::symlink(target, &temp).map_err(fs_err("create symlink", &temp))?;
    std::fs::rename(&temp, link).map_err(fs_err("rename onto", link))?;
    sync_dir(dir)
}
