//! What `node-agent status` and `node-agent rollout` print: pure renderings
//! of NodeAgents and their revisions (the API calls are the binary's).

use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use planner::plan::REVISION_LABEL;

use crate::crd::NodeAgent;
use crate::rollout::revision_template;

fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    let Some(c) = created else { return "<unknown>".into() };
    let s = (now.as_second() - c.as_second()).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The `kubectl get ds`-style table.
pub fn status_table(agents: &[NodeAgent], now: Timestamp, with_namespace: bool) -> String {
    let mut rows: Vec<Vec<String>> = vec![["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "WAVE", "STATE", "AGE"]
        .iter()
        .map(|s| s.to_string())
        .collect()];
    if with_namespace {
        rows[0].insert(0, "NAMESPACE".into());
    }
    for a in agents {
        let s = a.status.clone().unwrap_or_default();
        let rolled_back =
            s.conditions.iter().any(|c| c.type_ == "RolloutHalted" && c.status == "True" && c.reason == crate::rollout::REASON_ROLLED_BACK);
        let state = if rolled_back {
            "RolledBack"
        } else if s.halted_revision.is_some() {
            "Halted"
        } else if a.spec.rollout.paused {
            "Paused"
        } else if s.current_revision.is_some() && s.current_revision == s.update_revision {
            "Complete"
        } else {
            "Rolling"
        };
        let mut row = vec![
            a.name_any(),
            s.desired_number_scheduled.to_string(),
            s.current_number_scheduled.to_string(),
            s.number_ready.to_string(),
            s.updated_number_scheduled.to_string(),
            s.number_available.to_string(),
            s.current_wave.clone().unwrap_or_else(|| "-".into()),
            state.into(),
            age(a.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
        ];
        if with_namespace {
            row.insert(0, a.namespace().unwrap_or_default());
        }
        rows.push(row);
    }
    let mut out = table(&rows);
    for a in agents {
        if let Some(line) = migration_line(a) {
            let _ = writeln!(out, "{}: {line}", a.name_any());
        }
    }
    out
}

/// Where a takeover stands, in one line (and why it waits, on a second):
/// `taking over monitoring/node-exporter: 3 node(s) on node-agent, 1 moving (n4), 6 on the old exporter; next n5`.
pub fn migration_line(a: &NodeAgent) -> Option<String> {
    let m = a.status.as_ref()?.migration.as_ref()?;
    let verb = match m.phase.as_str() {
        "Complete" => "took over",
        "GivenBack" => "gave back",
        "GivingBack" => "giving back",
        "Replaced" => "replaced",
        _ => "taking over",
    };
    let mut line = format!("{verb} {} ({}): {} node(s) on node-agent, {} moving", m.replaced, m.phase, m.node_agent_nodes, m.moving_nodes);
    if !m.moving.is_empty() {
        let _ = write!(line, " ({})", m.moving.join(", "));
    }
    let _ = write!(line, ", {} on the old exporter", m.old_exporter_nodes);
    if let Some(n) = &m.next {
        let _ = write!(line, "; next {n}");
    }
    if let Some(w) = &m.waiting {
        let _ = write!(line, "\n  {w}");
    }
    Some(line)
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols).map(|c| rows.iter().map(|r| r.get(c).map_or(0, |s| s.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, s)| format!("{s:<w$}", w = widths[i])).collect();
        let _ = writeln!(out, "{}", line.join("   ").trim_end());
    }
    out
}

/// Where a rollout stands, for `rollout status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    Halted,
    Waiting,
}

/// One progress line, e.g. `[##########----------] 12/24 updated, 11 available, wave canary`.
pub fn progress(a: &NodeAgent) -> (String, Outcome) {
    let s = a.status.clone().unwrap_or_default();
    let observed = s.observed_generation.is_some() && s.observed_generation == a.metadata.generation;
    let desired = s.desired_number_scheduled.max(0) as usize;
    let updated = (s.updated_number_scheduled.max(0) as usize).min(desired);
    const WIDTH: usize = 30;
    let filled = (updated * WIDTH).checked_div(desired).unwrap_or(WIDTH);
    let bar = format!("[{}{}]", "#".repeat(filled), "-".repeat(WIDTH - filled));
    let mut line = format!("{bar} {updated}/{desired} updated, {} available", s.number_available);
    if let Some(w) = &s.current_wave {
        let _ = write!(line, ", wave {w}");
    }
    let halted = s.conditions.iter().find(|c| c.type_ == "RolloutHalted" && c.status == "True");
    let migrating = s.migration.as_ref().is_some_and(|m| !matches!(m.phase.as_str(), "Complete" | "GivenBack" | "Replaced"));
    if let Some(m) = migration_line(a) {
        let _ = write!(line, "\n{m}");
    }
    let outcome = if !observed {
        line.push_str(" (waiting for the controller to observe the change)");
        Outcome::Waiting
    } else if let Some(h) = halted {
        if h.reason == crate::migration::REASON_HALTED {
            let _ = write!(line, "\ntakeover halted: {}", h.message);
        } else {
            let what = if h.reason == crate::rollout::REASON_ROLLED_BACK { "halted and rolled back" } else { "halted" };
            let _ = write!(line, "\nrollout {what}: revision {}: {}", s.halted_revision.as_deref().unwrap_or("?"), h.message);
        }
        Outcome::Halted
    } else if !migrating && s.update_revision.is_some() && s.current_revision == s.update_revision && s.number_available as usize >= desired
    {
        line.push_str("\nrollout complete");
        Outcome::Complete
    } else {
        if a.spec.rollout.paused {
            line.push_str(" (paused)");
        }
        Outcome::Waiting
    };
    (line, outcome)
}

/// The status merge patch `rollout resume` sends: the halt cleared
/// (haltedRevision gone, RolloutHalted False with reason Resumed),
/// `resumedAt` now, on the condition of the version read.
pub fn resume_patch(a: &NodeAgent, now: Timestamp) -> serde_json::Value {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let s = a.status.clone().unwrap_or_default();
    let mut conditions = s.conditions.clone();
    for c in conditions.iter_mut().filter(|c| c.type_ == "RolloutHalted" && c.status == "True") {
        c.status = "False".into();
        c.reason = "Resumed".into();
        c.message = "cleared by rollout resume".into();
        c.last_transition_time = Time(now);
    }
    serde_json::json!({
        "metadata": { "resourceVersion": a.metadata.resource_version },
        "status": { "haltedRevision": null, "resumedAt": Time(now), "conditions": conditions },
    })
}

/// The revision history table, oldest first.
pub fn history_table(revs: &[ControllerRevision], current: Option<&str>) -> String {
    let mut v: Vec<&ControllerRevision> = revs.iter().collect();
    v.sort_by_key(|r| r.revision);
    let mut rows = vec![vec!["REVISION".to_string(), "HASH".into(), "IMAGES".into(), "".into()]];
    for r in v {
        let hash = r.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
        let images = revision_template(r)
            .and_then(|t| t.spec)
            .map(|s| s.containers.iter().filter_map(|c| c.image.clone()).collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        let mark = if Some(hash.as_str()) == current { "(current)" } else { "" };
        rows.push(vec![r.revision.to_string(), hash, images, mark.into()]);
    }
    table(&rows)
}

/// The revision `undo` goes back to: `to` if given, else the newest one
/// older than the template's own.
pub fn undo_target<'a>(revs: &'a [ControllerRevision], update_hash: &str, to: Option<i64>) -> Result<&'a ControllerRevision, String> {
    if let Some(n) = to {
        return revs.iter().find(|r| r.revision == n).ok_or_else(|| format!("no revision {n} (see `node-agent rollout history`)"));
    }
    let hash = |r: &ControllerRevision| r.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
    revs.iter().filter(|r| hash(r) != update_hash).max_by_key(|r| r.revision).ok_or_else(|| "no earlier revision to undo to".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NodeAgentSpec, NodeAgentStatus};
    use crate::rollout::revision_object;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn agent(status: NodeAgentStatus) -> NodeAgent {
        let mut a = NodeAgent::new("node-agent", NodeAgentSpec::default());
        a.metadata.namespace = Some("monitoring".into());
        a.metadata.generation = Some(2);
        a.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000).unwrap()));
        a.status = Some(status);
        a
    }

    fn status(updated: i32, desired: i32, current: &str, update: &str) -> NodeAgentStatus {
        NodeAgentStatus {
            observed_generation: Some(2),
            desired_number_scheduled: desired,
            current_number_scheduled: desired,
            number_ready: desired,
            updated_number_scheduled: updated,
            number_available: desired,
            current_revision: Some(current.into()),
            update_revision: Some(update.into()),
            ..Default::default()
        }
    }

    #[test]
    fn progress_reports_bar_wave_and_outcome() {
        let mut s = status(5, 20, "old", "new");
        s.current_wave = Some("canary".into());
        let (line, o) = progress(&agent(s));
        assert_eq!(o, Outcome::Waiting);
        assert_eq!(line, format!("[{}{}] 5/20 updated, 20 available, wave canary", "#".repeat(7), "-".repeat(23)));
        let (line, o) = progress(&agent(status(20, 20, "new", "new")));
        assert_eq!(o, Outcome::Complete, "{line}");
        let mut s = status(1, 20, "old", "new");
        s.conditions = vec![Condition {
            type_: "RolloutHalted".into(),
            status: "True".into(),
            message: "pod x on node a failed the health gate".into(),
            reason: "HealthGateFailed".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }];
        s.halted_revision = Some("new".into());
        let (line, o) = progress(&agent(s.clone()));
        assert_eq!(o, Outcome::Halted);
        assert!(line.ends_with("rollout halted: revision new: pod x on node a failed the health gate"), "{line}");
        // Rolled back: the template is the old one again, and the halt is still what it says.
        let mut rolled = status(20, 20, "old", "old");
        rolled.halted_revision = Some("new".into());
        rolled.conditions = s.conditions.clone();
        rolled.conditions[0].reason = crate::rollout::REASON_ROLLED_BACK.into();
        rolled.conditions[0].message.push_str("; template rolled back to revision 1 (old)");
        let (line, o) = progress(&agent(rolled.clone()));
        assert_eq!(o, Outcome::Halted, "a rolled-back halt is not a completed rollout");
        assert!(
            line.ends_with("rollout halted and rolled back: revision new: pod x on node a failed the health gate; template rolled back to revision 1 (old)"),
            "{line}"
        );
        let t = status_table(&[agent(rolled)], Timestamp::from_second(1_000).unwrap(), false);
        assert!(t.lines().nth(1).is_some_and(|l| l.contains("RolledBack")), "{t}");
        // Resume clears the halt in the same write, conditional on the version read.
        let mut halted = agent(s);
        halted.metadata.resource_version = Some("42".into());
        let p = resume_patch(&halted, Timestamp::from_second(5_000).unwrap());
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert!(p["status"]["haltedRevision"].is_null());
        assert_eq!(p["status"]["resumedAt"], "1970-01-01T01:23:20Z");
        assert_eq!(p["status"]["conditions"][0]["status"], "False");
        assert_eq!(p["status"]["conditions"][0]["reason"], "Resumed");
        let mut resumed = halted.clone();
        let st = resumed.status.as_mut().unwrap();
        st.conditions = serde_json::from_value(p["status"]["conditions"].clone()).unwrap();
        st.halted_revision = None;
        assert_eq!(progress(&resumed).1, Outcome::Waiting, "right after resume the old halt is not reported");
        // A spec change the controller has not seen yet is not "complete".
        let mut s = status(20, 20, "new", "new");
        s.observed_generation = Some(1);
        assert_eq!(progress(&agent(s)).1, Outcome::Waiting);
    }

    #[test]
    fn a_takeover_is_complete_only_when_every_node_moved_and_its_halt_exits_1() {
        use crate::crd::MigrationStatus;
        let mut s = status(2, 2, "new", "new");
        s.migration = Some(MigrationStatus {
            replaced: "monitoring/node-exporter".into(),
            phase: "Migrating".into(),
            old_exporter_nodes: 3,
            moving_nodes: 1,
            node_agent_nodes: 1,
            moving: vec!["n1".into()],
            next: Some("n2".into()),
            waiting: None,
            halted_node: None,
        });
        let (line, o) = progress(&agent(s.clone()));
        assert_eq!(o, Outcome::Waiting, "every agent pod is up, but three nodes are still on the old exporter: {line}");
        assert!(
            line.ends_with(
                "taking over monitoring/node-exporter (Migrating): 1 node(s) on node-agent, 1 moving (n1), 3 on the old exporter; next n2"
            ),
            "{line}"
        );
        let mut done = s.clone();
        done.migration.as_mut().unwrap().phase = "Complete".into();
        assert_eq!(progress(&agent(done)).1, Outcome::Complete);
        s.conditions = vec![Condition {
            type_: "RolloutHalted".into(),
            status: "True".into(),
            message: "node n1: node_uname_info is not served; the node went back to monitoring/node-exporter".into(),
            reason: crate::migration::REASON_HALTED.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }];
        let (line, o) = progress(&agent(s.clone()));
        assert_eq!(o, Outcome::Halted);
        assert!(line.ends_with("takeover halted: node n1: node_uname_info is not served; the node went back to monitoring/node-exporter"));
        let t = status_table(&[agent(s)], Timestamp::from_second(1_000).unwrap(), false);
        assert!(t.contains("\nnode-agent: taking over monitoring/node-exporter (Migrating)"), "{t}");
    }

    #[test]
    fn status_table_is_kubectl_shaped() {
        let t = status_table(&[agent(status(3, 5, "old", "new"))], Timestamp::from_second(1_000 + 3 * 3600).unwrap(), false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "WAVE", "STATE", "AGE"]
        );
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["node-agent", "5", "5", "5", "3", "5", "-", "Rolling", "3h"]);
    }

    #[test]
    fn history_and_undo_pick_revisions() {
        let mut a = agent(NodeAgentStatus::default());
        let t = |img: &str| PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![Container { name: "a".into(), image: Some(img.into()), ..Default::default() }],
                ..Default::default()
            }),
        };
        a.spec.template = t("agent:3");
        let revs = vec![
            revision_object(&a, "h1", 1, &t("agent:1")),
            revision_object(&a, "h3", 3, &t("agent:3")),
            revision_object(&a, "h2", 2, &t("agent:2")),
        ];
        let h = history_table(&revs, Some("h3"));
        let rows: Vec<Vec<&str>> = h.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[1], ["1", "h1", "agent:1"]);
        assert_eq!(rows[3], ["3", "h3", "agent:3", "(current)"]);
        assert_eq!(undo_target(&revs, "h3", None).map(|r| r.revision), Ok(2));
        assert_eq!(undo_target(&revs, "h3", Some(1)).map(|r| r.revision), Ok(1));
        assert!(undo_target(&revs, "h3", Some(9)).unwrap_err().contains("no revision 9"));
        assert!(undo_target(&revs[1..2], "h3", None).is_err());
    }
}
