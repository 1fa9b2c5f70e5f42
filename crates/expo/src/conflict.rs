//! Which family wins when two sinks produce the same name: a collector's
//! always, user data (textfiles) never displacing one.

use crate::model::Sink;

/// A family of user data dropped because another sink has that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub family: String,
    /// Indices of the sink that keeps the name and of the one that lost it.
    pub kept_by: usize,
    pub dropped_from: usize,
}

/// Before encoding: user-data sinks ([`Sink::set_untrusted`]) lose every
/// family whose name another sink produces (a collector's, or an earlier
/// user-data sink's), and their error gauge is set to 1. Returns what was
/// dropped, for the caller to log.
pub fn reconcile(sinks: &mut [Sink]) -> Vec<Conflict> {
    // First decide, borrowing the names (no copy of each family's name per
    // scrape); then drop, in the sinks that lose something (rare).
    let conflicts = {
        let order =
            (0..sinks.len()).filter(|&i| sinks[i].untrusted.is_none()).chain((0..sinks.len()).filter(|&i| sinks[i].untrusted.is_some()));
        let families = sinks.iter().map(|s| s.live).sum();
        let mut owner: rustc_hash::FxHashMap<&str, usize> = rustc_hash::FxHashMap::with_capacity_and_hasher(families, Default::default());
        let mut conflicts = Vec::new();
        for i in order {
            let own_error = sinks[i].untrusted;
            let first = conflicts.len();
            if own_error.is_some() {
                for f in sinks[i].live_families() {
                    match owner.get(f.name.as_str()) {
                        Some(&o) if o != i && Some(f.name.as_str()) != own_error => {
                            conflicts.push(Conflict { family: f.name.clone(), kept_by: o, dropped_from: i })
                        }
                        _ => {}
                    }
                }
            }
            let dropped = &conflicts[first..];
            for f in sinks[i].live_families() {
                if !dropped.iter().any(|c| c.family == f.name) {
                    owner.entry(f.name.as_str()).or_insert(i);
                }
            }
        }
        conflicts
    };
    let mut from = 0;
    while from < conflicts.len() {
        let i = conflicts[from].dropped_from;
        let to = from + conflicts[from..].iter().take_while(|c| c.dropped_from == i).count();
        let dropped = &conflicts[from..to];
        sinks[i].retain(|f| !dropped.iter().any(|c| c.family == f.name));
        if let Some(err) = sinks[i].untrusted {
            let live = sinks[i].live;
            for f in sinks[i].families[..live].iter_mut().filter(|f| f.name == err) {
                for s in &mut f.samples {
                    s.value = 1.0;
                }
            }
        }
        from = to;
    }
    conflicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;

    #[test]
    fn user_data_never_displaces_a_collector_family() {
        let mut collector = Sink::new();
        collector.family("node_cpu_seconds_total", "h", Kind::Counter).sample(&[("cpu", "0")], 1.0);
        let mut textfile = Sink::new();
        textfile.set_untrusted("node_textfile_scrape_error");
        textfile.family("node_cpu_seconds_total", "mine", Kind::Counter).sample(&[("cpu", "9")], 5.0);
        textfile.single("my_metric", "h", Kind::Gauge, 3.0);
        textfile.single("node_textfile_scrape_error", "h", Kind::Gauge, 0.0);
        let mut sinks = vec![textfile, collector];
        let c = reconcile(&mut sinks);
        assert_eq!(c, vec![Conflict { family: "node_cpu_seconds_total".into(), kept_by: 1, dropped_from: 0 }]);
        let names: Vec<&str> = sinks[0].families().iter().map(|f| f.name()).collect();
        assert_eq!(names, ["my_metric", "node_textfile_scrape_error"]);
        assert_eq!(sinks[0].families()[1].samples().next().map(|s| s.1), Some(1.0), "the error gauge says so");
        assert_eq!(sinks[1].families()[0].samples().next().map(|s| s.1), Some(1.0), "the collector's family is untouched");
        assert!(reconcile(&mut sinks).is_empty(), "nothing left to drop");
    }
}
