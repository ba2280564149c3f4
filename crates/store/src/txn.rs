//! Multi-key transactions ([`crate::Store::commit`]): several puts and deletes, each with its own
//! [`Precondition`], applied all together or not at all — the shape of one etcd `Txn`.
//!
//! This module holds what every backend shares: the types, the bounds, the checks a transaction
//! passes before any backend sees it ([`check_txn`]) and the precondition walk that finds the first
//! conflicting op ([`first_conflict`]).

use std::collections::HashSet;

use crate::{Entry, Precondition, Revision, StoreError, Write, check_key, check_put};

/// Most ops in one transaction. etcd refuses transactions of more than `--max-txn-ops` (default
/// 128) per branch; a transaction sends its ops in one branch and the read-back of its conditional
/// keys in the other, so half of that keeps every backend behaving the same with room to spare.
pub const MAX_TXN_OPS: usize = 64;

/// Most bytes in one transaction: every op's key plus every put's value. etcd refuses requests over
/// 1.5 MiB by default (`--max-request-bytes`); an etcd transaction carries each key up to three
/// times (compare, op, read-back), so 1 MiB leaves room for that and for framing, while still taking
/// a value of the largest size ([`crate::MAX_VALUE_BYTES`]) next to nearly as much again of smaller ones.
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

/// One write of a transaction: put or delete `key` if `precondition` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOp {
    /// The key, as for [`crate::Store::put`].
    pub key: String,
    /// What must hold for this key; checked together with every other op's.
    pub precondition: Precondition,
    /// What to do with the key.
    pub action: TxnAction,
}

impl TxnOp {
    /// Put `value` under `key` if `precondition` holds.
    pub fn put(key: impl Into<String>, value: Vec<u8>, precondition: Precondition) -> TxnOp {
        TxnOp {
            key: key.into(),
            precondition,
            action: TxnAction::Put(value),
        }
    }

    /// Delete `key` if `precondition` holds (an absent key with `Any`/`Absent` changes nothing).
    pub fn delete(key: impl Into<String>, precondition: Precondition) -> TxnOp {
        TxnOp {
            key: key.into(),
            precondition,
            action: TxnAction::Delete,
        }
    }

    /// The bytes this op counts against [`MAX_TXN_BYTES`].
    fn bytes(&self) -> usize {
        self.key.len()
            + match &self.action {
                TxnAction::Put(value) => value.len(),
                TxnAction::Delete => 0,
            }
    }
}

/// What a [`TxnOp`] does to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnAction {
    /// Store this value.
    Put(Vec<u8>),
    /// Remove the key.
    Delete,
}

/// The outcome of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every op was applied, and every key it changed has this revision (as in etcd: one
    /// transaction is one revision). If it changed nothing (only deletes of absent keys), the
    /// store's current revision, and no [`crate::Change`] is emitted.
    Done(Revision),
    /// The precondition of the first op (in order) that did not hold; nothing was written.
    Conflict {
        /// That op's key.
        key: String,
        /// Its entry as it is now (`None` = absent).
        current: Option<Entry>,
    },
}

impl TxnOutcome {
    /// The outcome of a one-op transaction as a single-key [`Write`].
    pub(crate) fn into_write(self) -> Write {
        match self {
            TxnOutcome::Done(revision) => Write::Done(revision),
            TxnOutcome::Conflict { current, .. } => Write::Conflict(current),
        }
    }
}

/// Why a transaction was refused before any backend saw it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxnProblem {
    /// No ops at all.
    #[error("it has no ops")]
    Empty,
    /// More ops than [`MAX_TXN_OPS`].
    #[error("it has {ops} ops, over the limit of {limit}")]
    TooManyOps {
        /// The transaction's ops.
        ops: usize,
        /// [`MAX_TXN_OPS`].
        limit: usize,
    },
    /// More key and value bytes than [`MAX_TXN_BYTES`].
    #[error("its keys and values are {bytes} bytes, over the limit of {limit}")]
    TooManyBytes {
        /// The transaction's key and value bytes.
        bytes: usize,
        /// [`MAX_TXN_BYTES`].
        limit: usize,
    },
    /// Two ops on one key (etcd refuses that too: the outcome would depend on their order).
    #[error("key \"{key}\" appears more than once")]
    DuplicateKey {
        /// The key (escaped, shortened).
        key: String,
    },
}

/// Checks a transaction before any backend sees it: not empty, within [`MAX_TXN_OPS`] and
/// [`MAX_TXN_BYTES`], every key and value as [`crate::Store::put`] checks them, no key twice.
pub(crate) fn check_txn(ops: &[TxnOp]) -> Result<(), StoreError> {
    let refuse = |problem| Err(StoreError::InvalidTransaction(problem));
    if ops.is_empty() {
        return refuse(TxnProblem::Empty);
    }
    if ops.len() > MAX_TXN_OPS {
        return refuse(TxnProblem::TooManyOps {
            ops: ops.len(),
            limit: MAX_TXN_OPS,
        });
    }
    let mut keys = HashSet::with_capacity(ops.len());
    for op in ops {
        match &op.action {
            TxnAction::Put(value) => check_put(&op.key, value)?,
            TxnAction::Delete => check_key(&op.key)?,
        }
        if !keys.insert(op.key.as_str()) {
            return refuse(TxnProblem::DuplicateKey {
                key: op.key.escape_debug().take(120).collect(),
            });
        }
    }
    let bytes: usize = ops.iter().map(TxnOp::bytes).sum();
    if bytes > MAX_TXN_BYTES {
        return refuse(TxnProblem::TooManyBytes {
            bytes,
            limit: MAX_TXN_BYTES,
        });
    }
    Ok(())
}

/// The first op (in order) whose precondition does not hold, given each key's current revision
/// (`None` = absent) from `revision_of`; `None` if they all hold. `Any` ops are not looked up.
pub(crate) fn first_conflict<E>(
    ops: &[TxnOp],
    mut revision_of: impl FnMut(&str) -> Result<Option<Revision>, E>,
) -> Result<Option<&TxnOp>, E> {
    for op in ops {
        if op.precondition != Precondition::Any
            && !crate::precondition_holds(op.precondition, revision_of(&op.key)?)
        {
            return Ok(Some(op));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_VALUE_BYTES;
    use std::collections::HashMap;
    use std::convert::Infallible;

    fn problem(ops: &[TxnOp]) -> TxnProblem {
        match check_txn(ops) {
            Err(StoreError::InvalidTransaction(problem)) => problem,
            other => panic!("expected an invalid transaction, got {other:?}"),
        }
    }

    #[test]
    fn bad_transactions_are_named() {
        assert_eq!(problem(&[]), TxnProblem::Empty);
        let many: Vec<TxnOp> = (0..=MAX_TXN_OPS)
            .map(|i| TxnOp::delete(format!("k{i}"), Precondition::Any))
            .collect();
        assert_eq!(
            problem(&many),
            TxnProblem::TooManyOps {
                ops: MAX_TXN_OPS + 1,
                limit: MAX_TXN_OPS
            }
        );
        assert!(check_txn(&many[..MAX_TXN_OPS]).is_ok());
        let twice = [
            TxnOp::put("a", vec![], Precondition::Any),
            TxnOp::delete("b", Precondition::Any),
            TxnOp::delete("a", Precondition::Absent),
        ];
        let err = StoreError::InvalidTransaction(problem(&twice)).to_string();
        assert!(
            err.contains("\"a\"") && err.contains("more than once"),
            "{err}"
        );
        // Keys count as well as values: two values of the largest size are just over.
        let big = |key: &str| TxnOp::put(key, vec![0; MAX_VALUE_BYTES], Precondition::Any);
        let small = TxnOp::put(
            "b",
            vec![0; MAX_TXN_BYTES - MAX_VALUE_BYTES - 2],
            Precondition::Any,
        );
        assert!(check_txn(&[big("a"), small]).is_ok());
        let err = problem(&[big("a"), big("b")]);
        assert_eq!(
            err,
            TxnProblem::TooManyBytes {
                bytes: MAX_TXN_BYTES + 2,
                limit: MAX_TXN_BYTES
            }
        );
        // Keys and values are checked as put checks them.
        let bad_key = [
            TxnOp::delete("ok", Precondition::Any),
            TxnOp::delete("a\nb", Precondition::Any),
        ];
        assert!(matches!(
            check_txn(&bad_key),
            Err(StoreError::InvalidKey { .. })
        ));
        let too_large = [TxnOp::put(
            "k",
            vec![0; MAX_VALUE_BYTES + 1],
            Precondition::Any,
        )];
        assert!(matches!(
            check_txn(&too_large),
            Err(StoreError::TooLarge { .. })
        ));
        assert!(!StoreError::InvalidTransaction(TxnProblem::Empty).is_retryable());
    }

    #[test]
    fn the_first_failing_precondition_is_the_conflict() {
        let stored = HashMap::from([("a", Revision(3)), ("b", Revision(5))]);
        let mut looked_up = Vec::new();
        let ops = [
            TxnOp::put("x", vec![], Precondition::Any),
            TxnOp::put("a", vec![], Precondition::Revision(Revision(3))),
            TxnOp::put("new", vec![], Precondition::Absent),
            TxnOp::delete("b", Precondition::Absent),
            TxnOp::delete("a2", Precondition::Revision(Revision(1))),
        ];
        let found = first_conflict(&ops, |key| {
            looked_up.push(key.to_owned());
            Ok::<_, Infallible>(stored.get(key).copied())
        });
        assert_eq!(found.unwrap().map(|op| op.key.as_str()), Some("b"));
        assert_eq!(
            looked_up,
            ["a", "new", "b"],
            "Any is not looked up, nothing after the conflict"
        );
        let fine = &ops[..3];
        let none = first_conflict(fine, |key| Ok::<_, Infallible>(stored.get(key).copied()));
        assert_eq!(none.unwrap(), None);
    }
}
