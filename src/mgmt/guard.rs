//! The remediation guard's calls: [`GuardTarget`] over the Machines API. Read the Machine, compare its
//! skip-remediation annotation with the guard record ([`machine_change`]: only the record's own value is ever
//! removed, an operator's is never touched), and patch with the resourceVersion read; a 409 (the Machine changed
//! meanwhile) reads and compares again, at most [`GUARD_PATCH_ATTEMPTS`] times.

use inplace_agent_api::MachineRef;
use inplace_store::BoxFuture;

use super::{Management, ManagementError, SKIP_REMEDIATION_ANNOTATION};
use crate::dispatch::floor::guard::GuardRecord;
use crate::dispatch::guards::{Applied, GuardTarget, MachineChange, machine_change};

/// Reads and patches of one guard call when the Machine keeps changing under it (409 Conflict each time).
pub const GUARD_PATCH_ATTEMPTS: u32 = 3;

impl Management {
    async fn apply_guard(
        &self,
        machine: &MachineRef,
        record: &GuardRecord,
    ) -> Result<Applied, ManagementError> {
        let (namespace, name) = (&machine.namespace, &machine.name);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let meta = self.machine(namespace, name).await?;
            let current = meta.annotations.get(SKIP_REMEDIATION_ANNOTATION);
            let value = match machine_change(current.map(String::as_str), record) {
                MachineChange::Nothing { operator } => {
                    return Ok(Applied {
                        operator_value: operator,
                    });
                }
                MachineChange::Set(value) => Some(value),
                MachineChange::Remove => None,
            };
            let patched = self
                .annotate_machine(
                    namespace,
                    name,
                    &meta.resource_version,
                    SKIP_REMEDIATION_ANNOTATION,
                    value.as_deref(),
                )
                .await;
            match patched {
                Ok(_) => {
                    return Ok(Applied {
                        operator_value: false,
                    });
                }
                Err(err) if err.code() == Some(409) && attempt < GUARD_PATCH_ATTEMPTS => continue,
                Err(err) => return Err(err),
            }
        }
    }
}

impl GuardTarget for Management {
    fn apply<'a>(
        &'a self,
        machine: &'a MachineRef,
        record: &'a GuardRecord,
    ) -> BoxFuture<'a, Result<Applied, String>> {
        Box::pin(async move {
            self.apply_guard(machine, record).await.map_err(|err| {
                self.failed(&err);
                err.to_string()
            })
        })
    }
}
