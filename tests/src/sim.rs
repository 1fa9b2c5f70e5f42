//! What the controller simulations (`controller_sim.rs`, `takeover_sim.rs`)
//! share: a seeded generator, pod conditions as a fake kubelet sets them,
//! and a decision's pod writes applied to the simulated API's pods under
//! write faults, as the reconciler makes them.

use std::collections::BTreeMap;

use controller::crd::GATE_CONDITION;
use controller::rollout::{Create, Decision};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A xorshift generator: the same seed, the same run.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % 1_000_000) as f64 / 1_000_000.0 < p
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.chance(0.0);
        self.0 % n
    }
}

/// The pod's condition `t` is True.
pub fn cond(p: &Pod, t: &str) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == t && c.status == "True"))
}

/// Sets condition `t`, its transition time moving only when it changes.
pub fn set_cond(p: &mut Pod, t: &str, on: bool, now: Timestamp) {
    let conds = p.status.get_or_insert_with(PodStatus::default).conditions.get_or_insert_with(Vec::new);
    let status = if on { "True" } else { "False" };
    match conds.iter_mut().find(|c| c.type_ == t) {
        Some(c) if c.status == status => {}
        Some(c) => {
            c.status = status.into();
            c.last_transition_time = Some(Time(now));
        }
        None => {
            conds.push(PodCondition { type_: t.into(), status: status.into(), last_transition_time: Some(Time(now)), ..Default::default() })
        }
    }
}

/// One write's outcome under the faults: Ok, or Err(applied anyway: the
/// response was lost).
pub type Write<'a> = &'a mut dyn FnMut() -> Result<(), bool>;

/// A write failed and the sync stopped there, as the reconciler's does.
#[derive(Debug)]
pub struct Stopped;

fn applied(r: Result<(), bool>) -> bool {
    r.is_ok() || r == Err(true)
}

/// The gate conditions a decision sets; stops at the first failed write.
pub fn gate_writes(pods: &mut BTreeMap<String, Pod>, d: &Decision, now: Timestamp, write: Write) -> Result<(), Stopped> {
    for p in &d.gate_passed {
        let r = write();
        if applied(r) {
            if let Some(pod) = pods.get_mut(p) {
                set_cond(pod, GATE_CONDITION, true, now);
            }
        }
        r.map_err(|_| Stopped)?;
    }
    Ok(())
}

/// A decision's creates (`place` finishes a new pod: its creation time,
/// a binding) and deletes, recording in `created` and `deleted` those whose
/// answer arrived (what the reconciler's expectations hold); stops at the
/// first failed write.
pub fn pod_writes(
    pods: &mut BTreeMap<String, Pod>,
    d: &Decision,
    now: Timestamp,
    write: Write,
    place: &mut dyn FnMut(&mut Pod, &Create),
    created: &mut Vec<String>,
    deleted: &mut Vec<String>,
) -> Result<(), Stopped> {
    for c in &d.creates {
        let r = write();
        if applied(r) {
            let name = c.pod.metadata.name.clone().unwrap_or_default();
            if !pods.contains_key(&name) {
                let mut pod = c.pod.clone();
                pod.metadata.creation_timestamp = Some(Time(now));
                place(&mut pod, c);
                pods.insert(name.clone(), pod);
            }
            if r.is_ok() {
                created.push(name);
            }
        }
        r.map_err(|_| Stopped)?;
    }
    for del in &d.deletes {
        let r = write();
        if applied(r) {
            if let Some(p) = pods.get_mut(&del.pod) {
                p.metadata.deletion_timestamp.get_or_insert(Time(now));
            }
            if r.is_ok() {
                deleted.push(del.pod.clone());
            }
        }
        r.map_err(|_| Stopped)?;
    }
    Ok(())
}
