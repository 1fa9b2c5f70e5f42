//! Leader election through a coordination.k8s.io/v1 Lease, as client-go's
//! leaderelection does: acquire when free or expired, renew while held,
//! optimistic concurrency (resourceVersion) so two replicas never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaseLock {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> LeaseLock {
        LeaseLock { api, name: name.into(), identity: identity.into(), duration }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Acquires the lease, or renews it if held; Ok(false) when another
    /// holder's lease is still valid or another replica won the race.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> Result<bool, kube::Error> {
        let pp = PostParams::default();
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let l =
                Lease { metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() }, spec: Some(self.spec(now, None, 0)) };
            return match self.api.create(&pp, &l).await {
                Ok(_) => Ok(true),
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let dur = spec.lease_duration_seconds.unwrap_or(self.duration.as_secs() as i32) as i64;
        let expired = spec.renew_time.as_ref().is_none_or(|t| t.0.as_second() + dur < now.as_second());
        let held_by_other = spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty()) && !mine;
        if held_by_other && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine { spec.acquire_time.clone() } else { None };
        let updated = Lease { metadata: lease.metadata.clone(), spec: Some(self.spec(now, acquired, transitions)) };
        match self.api.replace(&self.name, &pp, &updated).await {
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        let updated = Lease { metadata: lease.metadata, spec: Some(spec) };
        match self.api.replace(&self.name, &PostParams::default(), &updated).await {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
