//! Agent API bodies: what an agent posts to /agent/v1/{poll,report,inventory} (decoded and validated by
//! the server) and the poll response the agent decodes and validates before running anything.
#![no_main]

use inplace_agent_api::{
    InventoryReport, PollRequest, PollResponse, StepReport, validate_plan, validate_report,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<PollRequest>(data);
    let _ = serde_json::from_slice::<InventoryReport>(data);
    if let Ok(report) = serde_json::from_slice::<StepReport>(data) {
        let _ = validate_report(&report);
    }
    if let Ok(PollResponse {
        plan: Some(plan), ..
    }) = serde_json::from_slice::<PollResponse>(data)
    {
        let _ = validate_plan(&plan);
    }
});
