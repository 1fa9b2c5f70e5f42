//! `buddyinfo`: the free blocks of the buddy allocator from /proc/buddyinfo.
//! Per node and zone, each order's count of free blocks becomes a sample of
//! `node_buddyinfo_blocks{node,size,zone}` (`size` is the order: blocks of
//! 2^size pages), as node_exporter does; a missing or malformed file is an
//! error, as in node_exporter.

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

const BLOCKS: &str = "node_buddyinfo_blocks";
const BLOCKS_HELP: &str = "Count of free blocks according to size.";

/// One line of /proc/buddyinfo: a zone of a node and its free blocks per
/// order.
#[derive(Debug, PartialEq)]
pub struct Zone<'a> {
    pub node: &'a str,
    pub zone: &'a str,
    pub sizes: Vec<f64>,
}

/// Parses /proc/buddyinfo as prometheus/procfs does: each line is
/// `Node <n>, zone <name> <count>...`; every line needs at least four
/// fields and all lines the same number of counts.
pub fn parse_buddyinfo(text: &str) -> Result<Vec<Zone<'_>>, String> {
    let mut zones = Vec::new();
    let mut buckets: Option<usize> = None;
    for line in crate::parse::go_lines(text) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 4 {
            return Err(format!("invalid number of fields, found: {parts:?}"));
        }
        let node = parts[1].strip_suffix(',').unwrap_or(parts[1]);
        let zone = parts[3].strip_suffix(',').unwrap_or(parts[3]);
        let counts = &parts[4..];
        match buckets {
            None => buckets = Some(counts.len()),
            Some(n) if n != counts.len() => {
                return Err(format!("mismatch in number of buddyinfo buckets, previous count {n}, new count {}", counts.len()))
            }
            Some(_) => {}
        }
        let sizes = counts
            .iter()
            .map(|c| crate::parse::parse_go_float(c).ok_or_else(|| format!("invalid value in buddyinfo: {c:?}")))
            .collect::<Result<_, _>>()?;
        zones.push(Zone { node, zone, sizes });
    }
    Ok(zones)
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
    /// The `size` label values "0", "1", ..., kept from scrape to scrape.
    sizes: Vec<String>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("buddyinfo"), buf: Vec::with_capacity(1024), sizes: Vec::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (not "no data") when the file is missing.
        crate::io::read_required(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        let zones = parse_buddyinfo(&text).map_err(|m| Error::parse(&self.path, m))?;
        let longest = zones.iter().map(|z| z.sizes.len()).max().unwrap_or(0);
        while self.sizes.len() < longest {
            self.sizes.push(self.sizes.len().to_string());
        }
        let mut family = sink.family(BLOCKS, BLOCKS_HELP, Kind::Gauge);
        for z in &zones {
            for (v, size) in z.sizes.iter().zip(&self.sizes) {
                family.sample(&[("node", z.node), ("size", size), ("zone", z.zone)], *v);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    const FIXTURE: &str = "\
Node 0, zone      DMA      1      0      1      0      2      1      1      0      1      1      3 
Node 0, zone    DMA32    759    572    791    475    194     45     12      0      0      0      0 
Node 0, zone   Normal   4381   1093    185   1530    567    102      4      0      0      0      0 
";

    #[test]
    fn parses_the_fixture() {
        let zones = parse_buddyinfo(FIXTURE).unwrap();
        assert_eq!(zones.len(), 3);
        assert_eq!(zones[0], Zone { node: "0", zone: "DMA", sizes: vec![1., 0., 1., 0., 2., 1., 1., 0., 1., 1., 3.] });
        assert_eq!((zones[2].node, zones[2].zone, zones[2].sizes[3]), ("0", "Normal", 1530.));
    }

    #[test]
    fn rejects_malformed_input() {
        assert!(parse_buddyinfo("Node 0, zone\n").unwrap_err().contains("number of fields"));
        assert!(parse_buddyinfo("Node 0, zone DMA 1 2\nNode 0, zone DMA32 1\n").unwrap_err().contains("mismatch"));
        assert!(parse_buddyinfo("Node 0, zone DMA 1 x\n").unwrap_err().contains("invalid value"));
        // A blank line in the middle has no fields, as in procfs.
        assert!(parse_buddyinfo("Node 0, zone DMA 1\n\nNode 0, zone DMA32 2\n").is_err());
        assert!(parse_buddyinfo("Node 0, zone DMA 1e999\n").is_err(), "out of range is an error");
    }

    #[test]
    fn edge_cases_follow_procfs() {
        assert_eq!(parse_buddyinfo("").unwrap(), vec![]);
        assert_eq!(parse_buddyinfo("Node 1, zone Normal").unwrap(), vec![Zone { node: "1", zone: "Normal", sizes: vec![] }]);
        let z = parse_buddyinfo("Node 0, zone DMA 1_000 +2 nan\r\n").unwrap();
        assert_eq!(z[0].sizes[..2], [1000., 2.]);
        assert!(z[0].sizes[2].is_nan());
    }

    #[test]
    fn update_writes_blocks_and_fails_without_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        assert!(matches!(c.update(&mut sink), Err(Error::Io { .. })));
        crate::testutil::write(dir.path(), "proc/buddyinfo", FIXTURE);
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        assert_eq!(rows.len(), 33);
        let want: Vec<(String, String)> =
            [("node", "0"), ("size", "10"), ("zone", "DMA")].iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        assert!(rows.iter().any(|(n, l, v)| n == BLOCKS && *l == want && *v == 3.0));
    }
}
