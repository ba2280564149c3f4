//! The `files` driver: the full set of files the updater manages. Each file is decoded, then
//! written atomically with its mode and owner unless it already matches; files an earlier plan
//! wrote that the set dropped are removed. Whatever is replaced or removed is backed up first.
//! The managed set is journaled in `<state-dir>/managed-files.json` before anything is written,
//! so a crash mid-step never forgets a file the agent created.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use inplace_agent_api::{FileEncoding, FileSpec, StepAction, StepKind, parse_mode};
use serde::{Deserialize, Serialize};

use super::driver::{Driver, StepFuture, blocking_step, wrong_kind};
use super::error::DriverError;
use super::step::StepContext;
use super::undo::Place;
use crate::fsutil::{
    FileMeta, JournalError, atomic_write, matches, read_journal, read_optional, remove_file,
    write_journal,
};
use crate::os::driver_env::DriverEnv;
use crate::os::users::resolve_owner;

/// Largest decoded file (gzip can expand a lot: this stops a bomb).
pub(crate) const MAX_DECODED_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Mode of a file whose `permissions` is unset.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Journal of the paths the files driver owns.
const JOURNAL: &str = "managed-files.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Journal {
    paths: BTreeSet<String>,
}

/// The `files` driver.
pub(crate) struct Files;

impl Driver for Files {
    fn kind(&self) -> StepKind {
        StepKind::Files
    }

    fn run(&self, env: Arc<DriverEnv>, ctx: StepContext) -> StepFuture {
        let StepAction::Files { files } = ctx.step.action.clone() else {
            return wrong_kind(self.kind(), &ctx.step.action);
        };
        blocking_step(env, ctx, move |env, plan_id| apply(env, plan_id, &files))
    }

    fn undo_places(
        &self,
        env: &DriverEnv,
        action: &StepAction,
    ) -> Result<Option<Vec<Place>>, DriverError> {
        let StepAction::Files { files } = action else {
            return Ok(None);
        };
        // The listed files, the ones an earlier plan wrote that this one drops (removed), and the journal.
        let mut places: BTreeSet<Place> =
            files.iter().map(|f| Place::Node(f.path.clone())).collect();
        places.extend(load_journal(env)?.paths.into_iter().map(Place::Node));
        places.insert(Place::State(JOURNAL.to_owned()));
        Ok(Some(places.into_iter().collect()))
    }
}

fn load_journal(env: &DriverEnv) -> Result<Journal, JournalError> {
    read_journal(
        &env.state_dir.join(JOURNAL),
        "move it away to forget managed files",
    )
}

fn save_journal(env: &DriverEnv, journal: &Journal) -> Result<(), JournalError> {
    write_journal(&env.state_dir.join(JOURNAL), journal)
}

/// Decodes a file's content per its encoding (never logs it).
pub(crate) fn decode(file: &FileSpec) -> Result<Vec<u8>, DriverError> {
    let raw = file.content.expose();
    let base64 = |text: &str| {
        let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| {
                DriverError::refused(format!("{}: content is not valid base64 ({e})", file.path))
            })
    };
    let gunzip = |bytes: &[u8]| {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(MAX_DECODED_FILE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| {
                DriverError::refused(format!("{}: content is not valid gzip ({e})", file.path))
            })?;
        if out.len() as u64 > MAX_DECODED_FILE_BYTES {
            return Err(DriverError::refused(format!(
                "{}: decoded content exceeds {MAX_DECODED_FILE_BYTES} bytes",
                file.path
            )));
        }
        Ok(out)
    };
    match file.encoding {
        FileEncoding::None => Ok(raw.as_bytes().to_vec()),
        FileEncoding::Base64 => base64(raw),
        FileEncoding::Gzip => gunzip(raw.as_bytes()),
        FileEncoding::GzipBase64 => gunzip(&base64(raw)?),
    }
}

struct Prepared<'a> {
    spec: &'a FileSpec,
    content: Vec<u8>,
    meta: FileMeta,
}

/// Converges the node to `files`; returns a summary for the report.
fn apply(env: &DriverEnv, plan_id: &str, files: &[FileSpec]) -> Result<String, DriverError> {
    // Everything is decoded and resolved before the first byte is written.
    let mut prepared = Vec::with_capacity(files.len());
    for spec in files {
        let content = decode(spec)?;
        let mode = match &spec.permissions {
            Some(text) => parse_mode(text).ok_or_else(|| {
                DriverError::refused(format!("{}: bad permissions {text:?}", spec.path))
            })?,
            None => DEFAULT_FILE_MODE,
        };
        let owner = resolve_owner(&env.fs, spec.owner.as_deref())
            .map_err(|e| DriverError::from(e).at(&spec.path))?;
        let meta = FileMeta {
            mode,
            owner: env.is_root.then_some(owner),
        };
        prepared.push(Prepared {
            spec,
            content,
            meta,
        });
    }

    let mut journal = load_journal(env)?;
    let desired: BTreeSet<String> = files.iter().map(|f| f.path.clone()).collect();
    let owned_now: BTreeSet<String> = files
        .iter()
        .filter(|f| !f.append)
        .map(|f| f.path.clone())
        .collect();
    journal.paths.extend(owned_now.iter().cloned());
    save_journal(env, &journal)?;

    let (mut written, mut unchanged, mut removed) = (0usize, 0usize, 0usize);
    for file in &prepared {
        let real = env.fs.path(&file.spec.path)?;
        if converge(env, plan_id, file, &real)? {
            written += 1;
        } else {
            unchanged += 1;
        }
    }
    for dropped in journal.paths.difference(&desired) {
        let real = env.fs.path(dropped)?;
        env.backups.save(plan_id, dropped, &real)?;
        if remove_file(&real)? {
            removed += 1;
        }
    }
    journal.paths = owned_now;
    save_journal(env, &journal)?;
    let mut summary = format!(
        "{} files: {written} written, {unchanged} unchanged, {removed} removed",
        files.len()
    );
    if !env.is_root && files.iter().any(|f| f.owner.is_some()) {
        summary.push_str(" (owners not applied: agent is not root)");
    }
    Ok(summary)
}

/// Writes one file when it differs; true when it wrote.
fn converge(
    env: &DriverEnv,
    plan_id: &str,
    file: &Prepared<'_>,
    real: &Path,
) -> Result<bool, DriverError> {
    let desired = if file.spec.append {
        let existing =
            read_optional(real, crate::limits::MAX_MANAGED_FILE_BYTES)?.unwrap_or_default();
        // Already appended (by an earlier attempt, or an identical earlier plan): nothing to do
        // except mode and owner.
        if file.content.is_empty() || existing.ends_with(&file.content) {
            existing
        } else {
            let mut joined = existing;
            joined.extend_from_slice(&file.content);
            joined
        }
    } else {
        file.content.clone()
    };
    if matches(real, &desired, file.meta)? {
        return Ok(false);
    }
    env.backups.save(plan_id, &file.spec.path, real)?;
    atomic_write(real, &desired, file.meta)?;
    Ok(true)
}
