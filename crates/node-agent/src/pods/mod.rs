//! Pod attribution: which pod on this node the kernel's events belong to.
//!
//! The eBPF programs count events per cgroup v2 id (`POD_STATS`); this
//! module names the cgroups: the hierarchy's paths give pod UIDs and
//! container ids (`cgroup`), followed as cgroups are made and removed
//! (`hierarchy`), a watch on the node's pods gives namespaces, names and
//! container names (`index`, `watch`, with the bounds on what the API
//! server may send in `bound`), and `attrib` turns the per-cgroup counts
//! into bounded per-pod counters (`peers` and `resolve` do the same per pod
//! and peer).

pub mod attrib;
pub mod bound;
pub mod cgroup;
pub mod hierarchy;
pub mod index;
pub mod peers;
pub mod resolve;
pub mod services;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use index::PodIndex;

/// The running watch on this node's pods and the index it fills, shared by
/// the collectors that name pods.
pub struct Watched {
    pub index: Arc<Mutex<PodIndex>>,
    /// The cluster's Services, when watched (for `ebpf_tcp_peers`).
    pub services: Option<Arc<Mutex<services::ServiceIndex>>>,
    pub node: String,
    _watch: watch::Watch,
}

impl Watched {
    /// Starts watching the pods of `node`, and the cluster's Services when
    /// `services`.
    pub fn start(source: watch::Source, node: String, settings: watch::Settings, services: bool) -> std::io::Result<Watched> {
        let index = Arc::new(Mutex::new(PodIndex::default()));
        let services = services.then(|| Arc::new(Mutex::new(services::ServiceIndex::default())));
        let w = watch::spawn(source, node.clone(), Arc::clone(&index), services.clone(), settings)?;
        Ok(Watched { index, services, node, _watch: w })
    }

    /// The index, locked (a poisoned lock still holds a usable index).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, PodIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Parses `30s`, `5m`, `1h` (or plain seconds): whole numbers only.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("45"), Some(Duration::from_secs(45)));
        for bad in ["", "m", "5x", "-1s", "1.5m", "99999999999999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }
}
