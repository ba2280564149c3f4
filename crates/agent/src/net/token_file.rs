//! The agent's bearer token and its rotated successor. A successor the server offers is written to
//! `<token-file>.next` (atomically, 0600, file and directory fsynced) and used from the next request on; the
//! first 2xx answer to a request made with it proves the server knows it, and `.next` is renamed over the
//! token file. A 401 to it drops `.next` and goes back to the token file. At start an existing `.next` is
//! tried first. So a crash at any instant leaves a token that works: the old one stays in the token file
//! until the new one has been accepted.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use inplace_agent_api::SecretString;

use crate::fsutil::{FileMeta, FsError, atomic_write, fs_err, remove_file, sync_dir};
use crate::limits::MAX_TOKEN_FILE_BYTES;

/// Suffix of the file holding a successor token not yet accepted by the server.
pub const NEXT_TOKEN_SUFFIX: &str = ".next";

/// Which of the two files the next request uses, and whether moving `.next` in place already failed once.
#[derive(Debug, Default)]
struct Choice {
    next: bool,
    promote_failed: bool,
}

/// The token file and its successor beside it.
#[derive(Debug)]
pub(crate) struct TokenFiles {
    current: PathBuf,
    next: PathBuf,
    choice: Mutex<Choice>,
}

/// A token read for a request: the value (never logged) and whether it is the successor.
pub(crate) struct Presented {
    /// The token.
    pub token: SecretString,
    /// Whether it came from `.next`.
    pub successor: bool,
}

impl TokenFiles {
    /// The files of `--token-file`; an existing `.next` is tried first.
    pub fn new(current: &Path) -> TokenFiles {
        let mut next = current.as_os_str().to_owned();
        next.push(NEXT_TOKEN_SUFFIX);
        let next = PathBuf::from(next);
        let choice = Choice {
            next: next.exists(),
            promote_failed: false,
        };
        TokenFiles {
            current: current.to_path_buf(),
            next,
            choice: Mutex::new(choice),
        }
    }

    /// The token file (`--token-file`).
    pub fn path(&self) -> &Path {
        &self.current
    }

    fn choice(&self) -> std::sync::MutexGuard<'_, Choice> {
        self.choice.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token for the next request: the successor while there is one, else the token file. Errors name
    /// the token file and what is wrong with it, never its content.
    pub fn read(&self) -> Result<Presented, String> {
        if self.choice().next {
            match read_token(&self.next) {
                Ok(token) => {
                    return Ok(Presented {
                        token,
                        successor: true,
                    });
                }
                Err(reason) => {
                    tracing::warn!(file = %self.next.display(), %reason, "successor token unusable; back to the token file");
                    self.choice().next = false;
                }
            }
        }
        read_token(&self.current).map(|token| Presented {
            token,
            successor: false,
        })
    }

    /// Keeps a successor the server offered: written to `.next`, used from the next request on.
    pub fn keep_successor(&self, token: &SecretString) -> Result<(), FsError> {
        let meta = FileMeta {
            mode: 0o600,
            owner: None,
        };
        atomic_write(&self.next, format!("{}\n", token.expose()).as_bytes(), meta)?;
        *self.choice() = Choice {
            next: true,
            promote_failed: false,
        };
        Ok(())
    }

    /// After an answer to a request made with the successor: a 2xx moves it over the token file, a 401
    /// drops it. Other statuses (and transport errors) say nothing about the token.
    pub fn answered(&self, presented_successor: bool, status: Option<u16>) {
        if !presented_successor {
            return;
        }
        match status {
            Some(200..=299) => {
                if let Err(err) = self.promote() {
                    let mut choice = self.choice();
                    if !choice.promote_failed {
                        choice.promote_failed = true;
                        tracing::warn!(error = %err, "cannot move the successor token over the token file; it stays in use from its .next file");
                    }
                    return;
                }
                self.choice().next = false;
                tracing::info!(file = %self.current.display(), "successor token accepted by the server and now in the token file");
            }
            Some(401) => {
                tracing::warn!(file = %self.next.display(), "the server refused the successor token; back to the token file");
                if let Err(err) = remove_file(&self.next) {
                    tracing::warn!(error = %err, "cannot remove the refused successor token");
                }
                self.choice().next = false;
            }
            _ => {}
        }
    }

    fn promote(&self) -> Result<(), FsError> {
        std::fs::rename(&self.next, &self.current).map_err(fs_err("rename onto", &self.current))?;
        match self.current.parent() {
            Some(dir) => sync_dir(dir),
            None => Ok(()),
        }
    }
}

fn read_token(path: &Path) -> Result<SecretString, String> {
    let text = inplace_bounded_read::read_to_string(path, MAX_TOKEN_FILE_BYTES)
        .map_err(|e| e.to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("empty".into());
    }
    Ok(SecretString::new(token))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn files() -> (tempfile::TempDir, TokenFiles) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "iu1_old\n").unwrap();
        let files = TokenFiles::new(&path);
        (dir, files)
    }

    fn sent(files: &TokenFiles) -> (String, bool) {
        let presented = files.read().unwrap();
        (presented.token.expose().to_string(), presented.successor)
    }

    #[test]
    fn a_successor_is_used_at_once_and_replaces_the_token_file_after_a_2xx() {
        let (dir, files) = files();
        assert_eq!(sent(&files), ("iu1_old".into(), false));
        files.keep_successor(&SecretString::new("iu1_new")).unwrap();
        let next = dir.path().join("token.next");
        assert_eq!(
            std::fs::metadata(&next).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(sent(&files), ("iu1_new".into(), true));
        files.answered(true, Some(503));
        assert!(next.exists(), "a 503 says nothing about the token");
        files.answered(true, Some(200));
        assert!(!next.exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("token")).unwrap(),
            "iu1_new\n"
        );
        assert_eq!(sent(&files), ("iu1_new".into(), false));
    }

    #[test]
    fn a_refused_successor_is_dropped_and_the_token_file_used_again() {
        let (dir, files) = files();
        files.keep_successor(&SecretString::new("iu1_new")).unwrap();
        files.answered(true, Some(401));
        assert!(!dir.path().join("token.next").exists());
        assert_eq!(sent(&files), ("iu1_old".into(), false));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("token")).unwrap(),
            "iu1_old\n"
        );
    }

    #[test]
    fn after_a_restart_an_existing_successor_is_tried_first() {
        let (dir, files) = files();
        files.keep_successor(&SecretString::new("iu1_new")).unwrap();
        drop(files);
        let restarted = TokenFiles::new(&dir.path().join("token"));
        assert_eq!(sent(&restarted), ("iu1_new".into(), true));
        // And a .next that vanished falls back to the token file.
        std::fs::remove_file(dir.path().join("token.next")).unwrap();
        assert_eq!(sent(&restarted), ("iu1_old".into(), false));
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let (_dir, files) = files();
        files.keep_successor(&SecretString::new("iu1_new")).unwrap();
        let presented = files.read().unwrap();
        assert!(!format!("{:?} {files:?}", presented.token).contains("iu1_"));
    }
}
