//! What a rollback undoes from, taken by the drivers before a step's first effect and kept in the state dir:
//! copies of replaced files (`backup`) and each step's undo record (`record`). Data and files only: the drivers
//! write them (`drivers/undo.rs`), the state keeps the records, the rollback phase (`rollback/`) uses them.

pub(crate) mod backup;
pub(crate) mod record;
