//! The node's user database as the agent reads it: `<root>/etc/passwd` and `<root>/etc/group`, to resolve a
//! file's owner (`user`, `user:group`, `uid:gid`) and a user's home directory. A missing file means "no such
//! user"; the agent never creates accounts.

use crate::fsutil::{FsError, PathError, RootFs, read_optional};
use crate::limits::MAX_USER_DB_BYTES;

/// One `/etc/passwd` entry (the fields the agent needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PasswdEntry {
    /// Numeric user id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory (a node path).
    pub home: String,
}

/// Why the node's user database cannot answer (or has no such user or group).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnerError {
    /// `<root>/etc/passwd` or `<root>/etc/group` could not be read.
    #[error(transparent)]
    Read(#[from] FsError),
    /// The database's node path names nothing under `--root`.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The owner names a user the node does not have.
    #[error("owner {owner:?}: no user {user:?} in <root>/etc/passwd")]
    NoUser {
        /// The owner as given.
        owner: String,
        /// Its user.
        user: String,
    },
    /// The owner names a group the node does not have.
    #[error("owner {owner:?}: no group {group:?} in <root>/etc/group")]
    NoGroup {
        /// The owner as given.
        owner: String,
        /// Its group.
        group: String,
    },
}

/// Looks `name` up in `<root>/etc/passwd`. A missing file means "no such user".
pub(crate) fn lookup_user(fs: &RootFs, name: &str) -> Result<Option<PasswdEntry>, OwnerError> {
    let path = fs.path("/etc/passwd")?;
    let Some(bytes) = read_optional(&path, MAX_USER_DB_BYTES)? else {
        return Ok(None);
    };
    Ok(String::from_utf8_lossy(&bytes).lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0] != name {
            return None;
        }
        Some(PasswdEntry {
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home: fields[5].to_owned(),
        })
    }))
}

/// Looks a group name up in `<root>/etc/group`.
pub(crate) fn lookup_group(fs: &RootFs, name: &str) -> Result<Option<u32>, OwnerError> {
    let path = fs.path("/etc/group")?;
    let Some(bytes) = read_optional(&path, MAX_USER_DB_BYTES)? else {
        return Ok(None);
    };
    Ok(String::from_utf8_lossy(&bytes).lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 3 && fields[0] == name)
            .then(|| fields[2].parse().ok())
            .flatten()
    }))
}

/// Resolves a KubeadmConfig `owner` (`user`, `user:group`, `uid:gid`; `None` = `root:root`) to
/// numeric ids through the node's own user database. `root` resolves to 0 even without one.
pub(crate) fn resolve_owner(fs: &RootFs, owner: Option<&str>) -> Result<(u32, u32), OwnerError> {
    let owner = owner.unwrap_or("root:root");
    let (user, group) = match owner.split_once([':', '.']) {
        Some((user, group)) => (user, Some(group)),
        None => (owner, None),
    };
    let (uid, primary_gid) = if let Ok(uid) = user.parse::<u32>() {
        (uid, uid)
    } else if user == "root" {
        (0, 0)
    } else {
        let entry = lookup_user(fs, user)?.ok_or_else(|| OwnerError::NoUser {
            owner: owner.to_owned(),
            user: user.to_owned(),
        })?;
        (entry.uid, entry.gid)
    };
    let gid = match group {
        None | Some("") => primary_gid,
        Some(group) => {
            if let Ok(gid) = group.parse::<u32>() {
                gid
            } else if group == "root" {
                0
            } else {
                lookup_group(fs, group)?.ok_or_else(|| OwnerError::NoGroup {
                    owner: owner.to_owned(),
                    group: group.to_owned(),
                })?
            }
        }
    };
    Ok((uid, gid))
}
