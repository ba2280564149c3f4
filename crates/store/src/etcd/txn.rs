//! Preconditions as etcd compares ([`guarded`] for single-key writes), and [`crate::Store::commit`]
//! as ONE etcd `Txn`: its compares are every op's precondition, its success branch every put and
//! delete, its failure branch a read of every conditional key, so a conflict names the first failing
//! op and its current entry in the same round trip (the read is of the revision the compares failed
//! on).

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, Txn, TxnOp as EtcdOp, TxnOpResponse};

use super::{EtcdStore, header_revision, to_u64};
use crate::txn::first_conflict;
use crate::{Entry, Precondition, Revision, StoreError, TxnAction, TxnOp, TxnOutcome};

/// How one precondition is checked by etcd.
enum Guard {
    /// `Precondition::Any`: no compare.
    Always,
    /// This compare must hold.
    When(Compare),
    /// A revision etcd never hands out (0, or over `i64::MAX`): can never hold.
    Never,
}

/// The check of `precondition` on the (prefixed) key `full`.
fn guard(full: &[u8], precondition: Precondition) -> Guard {
    match precondition {
        Precondition::Any => Guard::Always,
        Precondition::Absent => {
            Guard::When(Compare::create_revision(full.to_vec(), CompareOp::Equal, 0))
        }
        Precondition::Revision(Revision(r)) => match i64::try_from(r) {
            Ok(r) if r > 0 => {
                Guard::When(Compare::mod_revision(full.to_vec(), CompareOp::Equal, r))
            }
            _ => Guard::Never,
        },
    }
}

/// The transaction for `op` under `precondition`; `None` if the precondition can never hold.
pub(super) fn guarded(full: &[u8], op: EtcdOp, precondition: Precondition) -> Option<Txn> {
    Some(match guard(full, precondition) {
        Guard::Always => Txn::new().and_then([op]),
        Guard::When(compare) => Txn::new()
            .when([compare])
            .and_then([op])
            .or_else([EtcdOp::get(full.to_vec(), None)]),
        Guard::Never => return None,
    })
}

impl EtcdStore {
    /// Runs an already checked transaction as one etcd `Txn`.
    pub(super) async fn commit_ops(&self, mut ops: Vec<TxnOp>) -> Result<TxnOutcome, StoreError> {
        let mut compares = Vec::new();
        let mut reads = Vec::new();
        let mut never = false;
        for op in &ops {
            let full = self.full_key(&op.key);
            match guard(&full, op.precondition) {
                Guard::Always => continue,
                Guard::When(compare) => compares.push(compare),
                Guard::Never => never = true,
            }
            reads.push(EtcdOp::get(full, None));
        }
        let txn = if never {
            // It cannot succeed: only read, to name the first failing op.
            Txn::new().and_then(reads)
        } else {
            // The values move into the request; `ops` keeps the keys and preconditions that name
            // a conflict.
            let writes: Vec<EtcdOp> = ops
                .iter_mut()
                .map(|op| {
                    let full = self.full_key(&op.key);
                    match &mut op.action {
                        TxnAction::Put(value) => EtcdOp::put(full, std::mem::take(value), None),
                        TxnAction::Delete => EtcdOp::delete(full, None),
                    }
                })
                .collect();
            Txn::new().when(compares).and_then(writes).or_else(reads)
        };
        let resp = self.call(self.kv.clone().txn(txn)).await?;
        if resp.succeeded() && !never {
            let revision = header_revision(&self.target, resp.header())?;
            return Ok(TxnOutcome::Done(Revision(to_u64(&self.target, revision)?)));
        }
        let mut current = HashMap::new();
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                for kv in get.kvs() {
                    let entry = self.entry(kv)?;
                    current.insert(entry.key.clone(), entry);
                }
            }
        }
        let failed = first_conflict(&ops, |key| {
            Ok::<_, StoreError>(current.get(key).map(|e: &Entry| e.revision))
        })?;
        let Some(op) = failed else {
            return Err(StoreError::Backend(format!(
                "{}: etcd refused a transaction whose preconditions all hold in its read-back",
                self.target
            )));
        };
        Ok(TxnOutcome::Conflict {
            key: op.key.clone(),
            current: current.remove(&op.key),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_revisions_never_reach_etcd() {
        let op = || EtcdOp::get("k", None);
        assert!(guarded(b"k", op(), Precondition::Revision(Revision(0))).is_none());
        assert!(guarded(b"k", op(), Precondition::Revision(Revision(u64::MAX))).is_none());
        assert!(guarded(b"k", op(), Precondition::Revision(Revision(5))).is_some());
    }
}
