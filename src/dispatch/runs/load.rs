//! What UpdateMachine reads before deciding: the Machine record, the apply claim it competes for, its current
//! run, and — only when the call is not a repeat of the recorded input — the verdict covering it and its
//! provider-id index entry. Reads only.

use inplace_store::Revision;

use super::decide::{Snapshot, claim_key, is_repeat};
use super::request::UpdateRequest;
use crate::dispatch::floor::keys::{machine_key, provider_key, update_key};
use crate::dispatch::floor::records::{ApplyClaim, MachineRecord, ProviderIndex};
use crate::dispatch::floor::run::RunView;
use crate::dispatch::floor::{DispatchError, Floor};
use crate::dispatch::licence::Licences;

/// Loads the snapshot `decide` judges `request` on.
pub async fn load(
    floor: &Floor,
    licences: &Licences,
    request: &UpdateRequest,
) -> Result<Snapshot, DispatchError> {
    let machine = &request.desired.facts.machine;
    let db = &floor.db;
    let record: Option<(MachineRecord, Revision)> = db
        .read::<MachineRecord>(&machine_key(machine))
        .await?
        .map(|(record, entry)| (record, entry.revision));
    let claim = match claim_key(request) {
        Some(key) => Some(db.value::<ApplyClaim>(&key).await?),
        None => None,
    };
    let run = match &record {
        Some((record, _)) => {
            db.value::<RunView>(&update_key(machine, &record.run_id))
                .await?
        }
        None => None,
    };
    let mut snapshot = Snapshot {
        record,
        claim,
        verdict: None,
        provider: None,
        run,
    };
    if !is_repeat(request, &snapshot) {
        snapshot.verdict = licences.verdict_for(&request.desired).await?;
        if let Some(id) = &request.desired.facts.provider_id {
            snapshot.provider = db.value::<ProviderIndex>(&provider_key(id)).await?;
        }
    }
    Ok(snapshot)
}
