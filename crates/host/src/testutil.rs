//! Helpers the collectors' unit tests share: a fixture tree and the
//! samples a scrape wrote.

use std::path::Path;

use crate::{Paths, Sink};

/// A sample as owned strings: family, labels, value.
pub type Row = (String, Vec<(String, String)>, f64);

/// Writes `text` to `root/rel`, creating the directories on the way.
pub fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// The host paths of a fixture tree: `proc`, `sys` and `udev` under `root`.
pub fn paths(root: &Path) -> Paths {
    Paths { procfs: root.join("proc"), sysfs: root.join("sys"), rootfs: root.to_path_buf(), udev_data: root.join("udev") }
}

/// Every sample of `sink`, family by family.
pub fn rows(sink: &Sink) -> Vec<Row> {
    let mut out = Vec::new();
    for f in sink.families() {
        for (l, v) in f.samples() {
            out.push((f.name().to_string(), l.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v));
        }
    }
    out
}
