//! node_exporter's include/exclude filters, and a cache of pattern matches.

use regex::Regex;

/// node_exporter's device filter: a name is ignored when it matches the
/// exclude pattern or fails the include pattern.
#[derive(Debug, Default, Clone)]
pub struct DeviceFilter {
    exclude: Option<Regex>,
    include: Option<Regex>,
}

impl DeviceFilter {
    pub fn new(exclude: Option<Regex>, include: Option<Regex>) -> Self {
        DeviceFilter { exclude, include }
    }

    pub fn ignored(&self, name: &str) -> bool {
        self.exclude.as_ref().is_some_and(|r| r.is_match(name)) || self.include.as_ref().is_some_and(|r| !r.is_match(name))
    }
}

/// Remembers whether a field name matched a pattern, so a collector runs
/// its regex once per distinct name instead of once per scrape.
#[derive(Debug, Default)]
pub struct MatchCache {
    seen: rustc_hash::FxHashMap<String, bool>,
}

impl MatchCache {
    /// With no pattern everything matches.
    pub fn matches(&mut self, re: Option<&Regex>, key: &str) -> bool {
        let Some(re) = re else { return true };
        if let Some(&m) = self.seen.get(key) {
            return m;
        }
        let m = re.is_match(key);
        // Bounded: a hostile file with endless new names can't grow it forever.
        if self.seen.len() < 65536 {
            self.seen.insert(key.to_string(), m);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_filter() {
        let f = DeviceFilter::new(Some(Regex::new("^lo$").unwrap()), None);
        assert!(f.ignored("lo"));
        assert!(!f.ignored("eth0"));
        let f = DeviceFilter::new(None, Some(Regex::new("^eth").unwrap()));
        assert!(f.ignored("lo"));
        assert!(!f.ignored("eth0"));
    }
}
