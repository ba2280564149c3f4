//! The stored format: version 1 is the only shape this build reads and writes. Nothing was released before it,
//! so there is no migration: a store written by another version is refused at start-up, naming both versions,
//! before anything in it is read or changed.

use inplace_store::{Precondition, Write};
use serde::{Deserialize, Serialize};

use super::db::{Db, Put, decode};
use super::error::DispatchError;
use super::keys::FORMAT_KEY;

/// The stored format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// What [`FORMAT_KEY`] holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Format {
    /// The version of every record in the store.
    pub version: u32,
}

/// Checks the store's format, recording version 1 in a store that has none yet.
pub async fn check(db: &Db) -> Result<(), DispatchError> {
    let ours = Put::of(
        FORMAT_KEY.to_owned(),
        &Format {
            version: FORMAT_VERSION,
        },
        Precondition::Absent,
    )?;
    let found = match db
        .store()
        .put(FORMAT_KEY, ours.value, Precondition::Absent)
        .await?
    {
        Write::Done(_) => return Ok(()),
        Write::Conflict(Some(entry)) => decode::<Format>(FORMAT_KEY, &entry.value)?.version,
        Write::Conflict(None) => return Err(DispatchError::Contention(FORMAT_KEY.to_owned())),
    };
    if found != FORMAT_VERSION {
        return Err(DispatchError::Format {
            found,
            expected: FORMAT_VERSION,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use inplace_store::memory::MemoryStore;

    use super::*;

    #[tokio::test]
    async fn a_new_store_gets_version_1_and_another_version_is_refused_untouched() {
        let db = Db::new(Arc::new(MemoryStore::new()));
        check(&db).await.unwrap();
        check(&db).await.unwrap();
        assert_eq!(
            db.value::<Format>(FORMAT_KEY).await.unwrap(),
            Some(Format { version: 1 })
        );
        db.put_any(FORMAT_KEY, &Format { version: 2 })
            .await
            .unwrap();
        let err = check(&db).await.unwrap_err().to_string();
        assert!(
            err.contains("format version 2") && err.contains("only version 1"),
            "{err}"
        );
        assert_eq!(
            db.value::<Format>(FORMAT_KEY).await.unwrap(),
            Some(Format { version: 2 }),
            "nothing changed"
        );
    }
}
