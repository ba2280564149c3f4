//! Which hold of a change a waiting run's Event names (issue 40): the brake or a halt, a failing health gate,
//! the soak, the canaries, or the change's pace — the first of them [`super::decide::admit`] found, read back
//! from the change record it decided. Pure.

use inplace_core::pacing::Pacing;

use super::decide::soaking;
use super::record::ChangeRecord;
use crate::dispatch::floor::outbox::Reason;

/// Why a run of the change `record` (as decided at `now_ms`) waits.
pub fn reason(record: &ChangeRecord, pacing: &Pacing, now_ms: u64, skip_soak: bool) -> Reason {
    if record.halted.is_some() {
        Reason::HeldByBrake
    } else if record
        .gate_failed
        .as_ref()
        .is_some_and(|(at, _)| *at == now_ms)
    {
        Reason::HeldByGate
    } else if !skip_soak && soaking(record, pacing, now_ms).is_some() {
        Reason::HeldBySoak
    } else if record.in_canary() {
        Reason::HeldByCanary
    } else {
        Reason::HeldByChangePace
    }
}
