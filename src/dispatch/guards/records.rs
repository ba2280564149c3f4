//! The guard records as status and retention read them, with or without a management client: the guards held,
//! `status`'s line for them, and the sweep of records lifted long ago.

use crate::dispatch::floor::guard::{GuardRecord, GuardWant};
use crate::dispatch::floor::keys::GUARDS_PREFIX;
use crate::dispatch::floor::{DispatchError, Floor};

/// The guards the updater holds now, as the store records them (with or without a management client).
pub async fn held(floor: &Floor) -> Result<Vec<GuardRecord>, DispatchError> {
    Ok(floor
        .db
        .per_machine::<GuardRecord>(GUARDS_PREFIX)
        .await?
        .into_iter()
        .map(|(_, g)| g)
        .filter(GuardRecord::held)
        .collect())
}

/// `status`'s line for the guards `held`.
pub fn status_line(held: &[GuardRecord]) -> String {
    if held.is_empty() {
        return "remediation guards: none held".to_owned();
    }
    let each: Vec<String> = held
        .iter()
        .map(|g| {
            let step = g
                .step
                .map_or(String::new(), |s| format!(", step {}", s + 1));
            format!("{} ({}{step})", g.machine, g.value)
        })
        .collect();
    format!(
        "remediation guards: {} held (cluster.x-k8s.io/skip-remediation): {}",
        held.len(),
        each.join(", ")
    )
}

/// Retention: guard records lifted and seen lifted `--retention` ago (with or without a management client:
/// records of a server that ran with one are swept by one that runs without).
pub async fn sweep(floor: &Floor) -> Result<usize, DispatchError> {
    let horizon = floor
        .now_ms()
        .saturating_sub(floor.config.retention.as_millis() as u64);
    let mut deleted = 0;
    for entry in floor.db.store().list(GUARDS_PREFIX).await? {
        let done = serde_json::from_slice::<GuardRecord>(&entry.value).map_or(true, |g| {
            g.want == GuardWant::Off && g.applied && g.updated_ms < horizon
        });
        if done && floor.db.delete_as_listed(&entry).await? {
            deleted += 1;
        }
    }
    Ok(deleted)
}
