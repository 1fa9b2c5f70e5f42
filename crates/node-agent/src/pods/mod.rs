//! Pod attribution: which pod on this node the kernel's events belong to.
//!
//! The eBPF programs count events per cgroup v2 id (`POD_STATS`); this
//! module names the cgroups: the hierarchy's paths give pod UIDs and
//! container ids (`cgroup`), a watch on the node's pods gives namespaces,
//! names and container names (`index`, `watch`), and `attrib` turns the
//! per-cgroup counts into bounded per-pod counters.

pub mod attrib;
pub mod cgroup;
pub mod index;
pub mod watch;
