//! `os`: the operating system release from os-release under `--path.rootfs`.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    candidates: [PathBuf; 2],
    /// The file read last, its identity then, and what it said: kept while
    /// the file is the same (one stat per scrape instead of a read and a
    /// parse); a package upgrade replaces it (a new inode) or rewrites it
    /// (new times). Only a rewrite to the same size within the clock tick
    /// of the previous read would go unseen, until the next change.
    cached: Option<(PathBuf, Stamp, HashMap<String, String>)>,
}

/// A file's identity and version: (device, inode, size, mtime, ctime).
type Stamp = (u64, u64, u64, (i64, i64), (i64, i64));

fn stamp(m: &std::fs::Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino(), m.size(), (m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec()))
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { candidates: [p.rootfs.join("etc/os-release"), p.rootfs.join("usr/lib/os-release")], cached: None }
    }

    /// The first candidate that reads: the cached parse when it is that
    /// file, unchanged.
    fn release(&mut self) -> Result<&HashMap<String, String>, Error> {
        let mut last = None;
        let mut found = false;
        for c in &self.candidates {
            let st = match std::fs::metadata(c) {
                Ok(m) => stamp(&m),
                Err(e) => {
                    last = Some((c.clone(), e));
                    continue;
                }
            };
            if matches!(&self.cached, Some((p, s, _)) if p == c && *s == st) {
                found = true;
                break;
            }
            match crate::io::read_text(c) {
                Ok(t) => {
                    self.cached = Some((c.clone(), st, parse(&t)));
                    found = true;
                    break;
                }
                Err(e) => last = Some((c.clone(), e)),
            }
        }
        if !found {
            self.cached = None;
        }
        match (&self.cached, last) {
            (Some((_, _, m)), _) => Ok(m),
            (None, Some((p, e))) => Err(Error::from_read(&p, e)),
            (None, None) => Err(Error::NoData("no os-release".into())),
        }
    }
}

/// Parses os-release: KEY=value lines, values optionally quoted.
pub fn parse(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        let v = v.trim();
        let v = if v.len() >= 2 && ((v.starts_with('"') && v.ends_with('"')) || (v.starts_with('\'') && v.ends_with('\''))) {
            v[1..v.len() - 1].replace("\\\"", "\"").replace("\\$", "$").replace("\\\\", "\\")
        } else {
            v.to_string()
        };
        out.insert(k.to_string(), v);
    }
    out
}

/// `VERSION_ID` as a number: its leading `major.minor` digits, as node_exporter does.
pub fn version_number(v: &str) -> Option<f64> {
    let mut parts = v.split('.');
    let major = parts.next()?.trim();
    let num: String = match parts.next() {
        Some(minor) => format!("{major}.{}", minor.chars().take_while(|c| c.is_ascii_digit()).collect::<String>()),
        None => major.to_string(),
    };
    num.trim_end_matches('.').parse().ok()
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let m = self.release()?;
        let g = |k: &str| m.get(k).map(String::as_str).unwrap_or("");
        sink.family("node_os_info", "A metric with a constant '1' value labeled by build_id, id, id_like, image_id, image_version, name, pretty_name, variant, variant_id, version, version_codename, version_id.", Kind::Gauge).sample(
            &[
                ("build_id", g("BUILD_ID")),
                ("id", g("ID")),
                ("id_like", g("ID_LIKE")),
                ("image_id", g("IMAGE_ID")),
                ("image_version", g("IMAGE_VERSION")),
                ("name", g("NAME")),
                ("pretty_name", g("PRETTY_NAME")),
                ("variant", g("VARIANT")),
                ("variant_id", g("VARIANT_ID")),
                ("version", g("VERSION")),
                ("version_codename", g("VERSION_CODENAME")),
                ("version_id", g("VERSION_ID")),
            ],
            1.0,
        );
        if let Some(v) = version_number(g("VERSION_ID")) {
            sink.family("node_os_version", "Metric containing the major.minor part of the OS version.", Kind::Gauge)
                .sample(&[("id", g("ID")), ("id_like", g("ID_LIKE")), ("name", g("NAME"))], v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    fn names(c: &mut super::Collector) -> Result<Vec<String>, crate::Error> {
        let mut sink = expo::Sink::new();
        crate::Collector::update(c, &mut sink)?;
        Ok(crate::testutil::rows(&sink)
            .into_iter()
            .filter(|(f, _, _)| f == "node_os_info")
            .flat_map(|(_, l, _)| l.into_iter().filter(|(k, _)| k == "name").map(|(_, v)| v))
            .collect())
    }

    /// Kept while the file is unchanged; an edit, a replacement by rename
    /// and a removal (falling back to usr/lib) all show in the next scrape.
    #[test]
    fn a_changed_os_release_shows_in_the_next_scrape() {
        let d = tempfile::tempdir().unwrap();
        crate::testutil::write(d.path(), "etc/os-release", "NAME=One\n");
        crate::testutil::write(d.path(), "usr/lib/os-release", "NAME=Lib\n");
        let mut c = super::Collector::new(&crate::testutil::paths(d.path()));
        assert_eq!(names(&mut c).unwrap(), ["One"]);
        assert_eq!(names(&mut c).unwrap(), ["One"]);
        // Rewritten in place, same size (a clock tick later: file times
        // have the kernel's coarse clock, a tick of up to 10 ms).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.path().join("etc/os-release"), "NAME=Two\n").unwrap();
        assert_eq!(names(&mut c).unwrap(), ["Two"]);
        // Replaced by rename, as package managers do.
        std::fs::write(d.path().join("etc/new"), "NAME=Three\n").unwrap();
        std::fs::rename(d.path().join("etc/new"), d.path().join("etc/os-release")).unwrap();
        assert_eq!(names(&mut c).unwrap(), ["Three"]);
        std::fs::remove_file(d.path().join("etc/os-release")).unwrap();
        assert_eq!(names(&mut c).unwrap(), ["Lib"]);
        std::fs::remove_file(d.path().join("usr/lib/os-release")).unwrap();
        assert!(names(&mut c).is_err(), "no os-release left: the collector fails");
    }

    #[test]
    fn parses() {
        let m = super::parse("NAME=\"Ubuntu\"\nVERSION=\"20.04.2 LTS (Focal Fossa)\"\nID=ubuntu\n# c\nVERSION_ID=\"20.04\"\n");
        assert_eq!(m["NAME"], "Ubuntu");
        assert_eq!(m["ID"], "ubuntu");
        assert_eq!(super::version_number(&m["VERSION_ID"]), Some(20.04));
        assert_eq!(super::version_number("12"), Some(12.0));
        assert_eq!(super::version_number("rolling"), None);
    }
}
