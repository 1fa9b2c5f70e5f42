//! Builders of DaemonSets, nodes and pods for tests, the simulator and
//! benchmarks.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{Container, Node, NodeSpec, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use super::plan::REVISION_LABEL;

pub const DS_NAME: &str = "node-agent";
pub const DS_UID: &str = "uid-node-agent";

/// A DaemonSet with image `image` and the given strategy.
pub fn daemonset(image: &str, max_unavailable: Option<IntOrString>, max_surge: Option<IntOrString>, on_delete: bool) -> DaemonSet {
    let labels: std::collections::BTreeMap<String, String> = [("app".to_string(), "node-agent".to_string())].into();
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(DS_NAME.into()),
            namespace: Some("monitoring".into()),
            uid: Some(DS_UID.into()),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector { match_labels: Some(labels.clone()), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container { name: "agent".into(), image: Some(image.into()), ..Default::default() }],
                    ..Default::default()
                }),
            },
            update_strategy: Some(if on_delete {
                DaemonSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None }
            } else {
                DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDaemonSet { max_unavailable, max_surge }),
                }
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node with labels and taints `(key, value, effect)`.
pub fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, Option<&str>, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then(|| {
                taints
                    .iter()
                    .map(|(k, v, e)| Taint {
                        key: k.to_string(),
                        value: v.map(str::to_string),
                        effect: e.to_string(),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A daemon pod of the DaemonSet on `node`, at revision `hash`, created at
/// `created`, in `phase`, Ready since `ready` if given.
pub fn pod(name: &str, node: &str, hash: &str, created: Timestamp, phase: &str, ready: Option<Timestamp>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("monitoring".into()),
            labels: Some([("app".to_string(), "node-agent".to_string()), (REVISION_LABEL.to_string(), hash.to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: DS_NAME.into(),
                uid: DS_UID.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            creation_timestamp: Some(Time(created)),
            ..Default::default()
        },
        spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            conditions: ready.map(|t| {
                vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(t)),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
    }
}

/// Seconds after the epoch, as a timestamp.
pub fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH)
}
