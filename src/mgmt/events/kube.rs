//! The Events as the management cluster's API takes them: the events.k8s.io/v1 object of a new Event
//! ([`event_object`], pure) and the [`EventWriter`] over the [`Management`] client — create, then a JSON merge
//! patch of `series` alone (every other field of an Event is immutable). A 404 or 409 is the Event gone (its TTL
//! passed, or a name taken): the aggregation creates it again; any other error is logged and counted as the
//! client's other failures are, and never reaches a hook.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::aggregate::{NewEvent, Outcome, Series, Write};
use super::sender::EventWriter;
use crate::mgmt::{Management, ManagementError};

/// The `reportingController` of every Event the server writes.
pub const REPORTING_CONTROLLER: &str = "inplace-updater.dev/extension";
/// The API's bound on `reportingInstance`.
const REPORTING_INSTANCE_MAX: usize = 128;

/// The Machine's API version the Events' `regarding` names.
pub const MACHINE_API_VERSION: &str = "cluster.x-k8s.io/v1beta2";

/// This replica's `reportingInstance`: the Pod's name (`HOSTNAME` in a Pod), else `inplace-updater`.
pub fn reporting_instance(hostname: Option<String>) -> String {
    let name = hostname
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "inplace-updater".into());
    name.chars().take(REPORTING_INSTANCE_MAX).collect()
}

fn micro_time(unix_ms: u64) -> MicroTime {
    let micros = i64::try_from(unix_ms).unwrap_or(i64::MAX / 1000) * 1000;
    MicroTime(k8s_openapi::chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default())
}

fn series(series: Series) -> EventSeries {
    EventSeries {
        count: i32::try_from(series.count).unwrap_or(i32::MAX),
        last_observed_time: micro_time(series.last_observed_ms),
    }
}

/// The events.k8s.io/v1 object of `event`, reported by `instance`.
pub fn event_object(event: &NewEvent, instance: &str) -> Event {
    let machine = &event.key.machine;
    let reason = event.key.reason;
    Event {
        metadata: ObjectMeta {
            name: Some(event.name.clone()),
            namespace: Some(machine.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(micro_time(event.event_time_ms)),
        series: event.series.map(series),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(instance.to_owned()),
        action: Some(reason.action().into()),
        reason: Some(reason.as_str().into()),
        regarding: Some(ObjectReference {
            api_version: Some(MACHINE_API_VERSION.into()),
            kind: Some("Machine".into()),
            namespace: Some(machine.namespace.clone()),
            name: Some(machine.name.clone()),
            uid: event.uid.clone(),
            ..ObjectReference::default()
        }),
        note: Some(event.note.clone()),
        type_: Some(reason.event_type().as_str().into()),
        ..Event::default()
    }
}

/// Writes Events with the management cluster's client.
#[derive(Debug, Clone)]
pub struct KubeEvents {
    management: Management,
    instance: String,
}

impl KubeEvents {
    /// A writer over `management`, reporting as `instance`.
    pub fn new(management: Management, instance: String) -> KubeEvents {
        KubeEvents {
            management,
            instance,
        }
    }

    fn outcome<T>(&self, result: Result<T, ManagementError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Written,
            Err(err) if matches!(err.code(), Some(404 | 409)) => Outcome::Gone,
            Err(err) => {
                self.management.failed(&err);
                Outcome::Failed
            }
        }
    }
}

impl EventWriter for KubeEvents {
    async fn write(&self, write: &Write) -> Outcome {
        let client = self.management.client().clone();
        match write {
            Write::Create(event) => {
                let namespace = &event.key.machine.namespace;
                let api: Api<Event> = Api::namespaced(client, namespace);
                let object = event_object(event, &self.instance);
                let created = api.create(&PostParams::default(), &object).await;
                self.outcome(created.map_err(|e| {
                    ManagementError::of("event-create", format!("{namespace}/{}", event.name), e)
                }))
            }
            Write::Patch {
                key,
                name,
                series: count,
            } => {
                let namespace = &key.machine.namespace;
                let api: Api<Event> = Api::namespaced(client, namespace);
                let patch = json!({ "series": series(*count) });
                let patched = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                self.outcome(patched.map_err(|e| {
                    ManagementError::of("event-patch", format!("{namespace}/{name}"), e)
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use inplace_agent_api::MachineRef;

    use super::*;
    use crate::dispatch::floor::outbox::Reason;
    use crate::mgmt::events::aggregate::Key;

    #[test]
    fn an_event_names_its_machine_and_says_why_in_the_api_fields() {
        let event = NewEvent {
            key: Key {
                machine: MachineRef::new("prod", "edge-7"),
                reason: Reason::StepFailed,
            },
            name: "edge-7.18c2a".into(),
            uid: Some("0c3e".into()),
            note: "step 2/3: ntp failed".into(),
            event_time_ms: 1_700_000_000_123,
            series: Some(Series {
                count: 3,
                last_observed_ms: 1_700_000_060_000,
            }),
        };
        let object =
            serde_json::to_value(event_object(&event, "inplace-updater-0")).expect("serializes");
        assert_eq!(object["regarding"]["kind"], "Machine");
        assert_eq!(object["regarding"]["apiVersion"], MACHINE_API_VERSION);
        assert_eq!(object["regarding"]["uid"], "0c3e");
        assert_eq!(object["reason"], "StepFailed");
        assert_eq!(object["type"], "Warning");
        assert_eq!(object["action"], "UpdateInPlace");
        assert_eq!(object["reportingController"], REPORTING_CONTROLLER);
        assert_eq!(object["series"]["count"], 3);
        assert_eq!(object["eventTime"], "2023-11-14T22:13:20.123000Z");
        assert_eq!(object["metadata"]["namespace"], "prod");
        assert_eq!(reporting_instance(Some(" ".into())), "inplace-updater");
        assert_eq!(reporting_instance(Some("x".repeat(300))).len(), 128);
    }
}
