//! Events (events.k8s.io/v1) about NodeAgents, one per distinct note.
//!
//! kube-runtime's `Recorder` keys its series on the event's type, reason,
//! action and objects but not its note, so within its six-minute window a
//! second halt shows as `RolloutHalted (x2)` with the first halt's pod and
//! reason, and every revision as `RevisionRecorded (x8) revision 1 ...`.
//! Here the note is part of the key: the same note again within the
//! window becomes a series on its event (count and lastObservedTime, as the
//! kubelet's recorder does), a different note is a new event.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::Mutex;

/// A repeat within this window joins its event's series (kube-runtime's and
/// client-go's window).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Events remembered for series: the oldest go first beyond this.
pub const MAX_REMEMBERED: usize = 256;
/// Notes are cut to this many characters (the API allows 1 kB).
pub const MAX_NOTE: usize = 1000;

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventType {
    Normal,
    Warning,
}

/// One event to publish about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// Why (UpperCamelCase, from a fixed set).
    pub reason: String,
    /// What the controller did (UpperCamelCase, from a fixed set).
    pub action: String,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>, Option<String>),
    type_: EventType,
    reason: String,
    action: String,
    note: String,
}

struct Seen {
    name: String,
    namespace: String,
    count: i32,
    last: Instant,
}

/// Publishes events for one controller instance.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    seen: Mutex<BTreeMap<Key, Seen>>,
}

impl Recorder {
    pub fn new(client: Client, controller: String, instance: Option<String>) -> Recorder {
        let instance = instance.unwrap_or_else(|| controller.clone());
        Recorder { client, controller, instance, seen: Mutex::new(BTreeMap::new()) }
    }

    /// Creates the event, or counts it into the series of the same note.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let note: String = ev.note.chars().take(MAX_NOTE).collect();
        let key = Key {
            regarding: (regarding.kind.clone(), regarding.namespace.clone(), regarding.name.clone(), regarding.uid.clone()),
            type_: ev.type_,
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            note: note.clone(),
        };
        let mut seen = self.seen.lock().await;
        seen.retain(|_, s| s.last.elapsed() < SERIES_WINDOW);
        let now = Timestamp::now();
        if let Some(s) = seen.get_mut(&key) {
            let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &s.namespace);
            let series = EventSeries { count: s.count + 1, last_observed_time: MicroTime(now) };
            match api.patch(&s.name, &PatchParams::default(), &Patch::Merge(json!({ "series": series }))).await {
                Ok(_) => {
                    s.count += 1;
                    s.last = Instant::now();
                    return Ok(());
                }
                // Expired on the server (its event TTL): start again.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let name = format!("{}.{:x}", regarding.name.as_deref().unwrap_or(&self.controller), now.as_nanosecond());
        let event = K8sEvent {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(match ev.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..Default::default()
        };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        if seen.len() >= MAX_REMEMBERED {
            if let Some(oldest) = seen.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone()) {
                seen.remove(&oldest);
            }
        }
        seen.insert(key, Seen { name, namespace, count: 1, last: Instant::now() });
        Ok(())
    }
}
