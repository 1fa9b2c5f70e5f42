//! `interrupts`: the interrupt counts per CPU from /proc/interrupts,
//! exported as `node_interrupts_total{cpu,devices,info,type}` (`type` is the
//! row's name: an IRQ number or a name such as `NMI`; `info` is a numbered
//! IRQ's chip and trigger, or a named row's description; `devices` the
//! numbered IRQ's devices), as node_exporter does. Rows are filtered by
//! `--collector.interrupts.name-include`/`-exclude` on `type;info;devices`,
//! and zero counts dropped with `--no-collector.interrupts.include-zeros`; a
//! missing, empty or malformed file fails the collector.

use std::path::PathBuf;

use clap::Arg;

use crate::filter::DeviceFilter;
use crate::flags::{self, BoolFlag, Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

const INTERRUPTS: &str = "node_interrupts_total";
const INTERRUPTS_HELP: &str = "Interrupt details.";

pub const INCLUDE_ZEROS: BoolFlag =
    BoolFlag { name: "collector.interrupts.include-zeros", default: true, help: "Include interrupts that have a zero value" };
pub const NAME_EXCLUDE: StringFlag = StringFlag {
    name: "collector.interrupts.name-exclude",
    default: "",
    help: "Regexp of interrupts name to exclude (mutually exclusive to --collector.interrupts.name-include).",
};
pub const NAME_INCLUDE: StringFlag = StringFlag {
    name: "collector.interrupts.name-include",
    default: "",
    help: "Regexp of interrupts name to include (mutually exclusive to --collector.interrupts.name-exclude).",
};

/// One row of /proc/interrupts, borrowed from the file's text: its counts
/// per CPU, unparsed (node_exporter parses them after filtering).
#[derive(Debug, PartialEq)]
pub struct Interrupt<'a> {
    pub name: &'a str,
    pub info: String,
    pub devices: String,
    pub values: Vec<&'a str>,
}

/// Parses /proc/interrupts as node_exporter's `parseInterrupts` does: the
/// header's field count is the number of CPUs; a row is `name:` then the
/// fields (aarch64 may put no space after the colon), and needs more fields
/// than CPUs (so `ERR` and `MIS` are skipped). A numbered IRQ's first extra
/// field is its `info` and the rest its `devices`; a named row's extra
/// fields are all its `info`. A repeated name keeps its last row. Sorted by
/// name.
pub fn parse_interrupts(text: &str) -> Result<Vec<Interrupt<'_>>, String> {
    let mut lines = crate::parse::go_scan_lines(text);
    let cpus = match lines.next() {
        None => return Err("interrupts empty".to_string()),
        Some(header) => header?.split_whitespace().count(),
    };
    let mut rows = Vec::new();
    for line in lines {
        let Some((name, rest)) = line?.split_once(':') else { continue };
        let parts: Vec<&str> = rest.split_whitespace().collect();
        if parts.len() < cpus + 1 {
            continue;
        }
        let name = name.trim_start_matches(' ');
        let (info, devices) = if name.parse::<i64>().is_ok() {
            (parts[cpus].to_string(), parts[cpus + 1..].join(" "))
        } else {
            (parts[cpus..].join(" "), String::new())
        };
        rows.push(Interrupt { name, info, devices, values: parts[..cpus].to_vec() });
    }
    // Stable: of rows with the same name, the last one wins, as in Go's map.
    rows.sort_by(|a, b| a.name.cmp(b.name));
    let mut out: Vec<Interrupt<'_>> = Vec::with_capacity(rows.len());
    for row in rows {
        match out.last_mut() {
            Some(last) if last.name == row.name => *last = row,
            _ => out.push(row),
        }
    }
    Ok(out)
}

/// The collector's flags, parsed once.
pub struct Options {
    pub include_zeros: bool,
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&INCLUDE_ZEROS, &NAME_EXCLUDE, &NAME_INCLUDE])
    }

    /// node_exporter applies both patterns when both are given.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { include_zeros: INCLUDE_ZEROS.get(f), filter: DeviceFilter::new(NAME_EXCLUDE.regex(f)?, NAME_INCLUDE.regex(f)?) })
    }
}

pub struct Collector {
    path: PathBuf,
    include_zeros: bool,
    filter: DeviceFilter,
    buf: Vec<u8>,
    /// The `cpu` label values "0", "1", ..., kept from scrape to scrape.
    cpus: Vec<String>,
    filter_name: String,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            path: p.proc("interrupts"),
            include_zeros: o.include_zeros,
            filter: o.filter,
            buf: Vec::with_capacity(16 * 1024),
            cpus: Vec::new(),
            filter_name: String::new(),
        })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (not "no data") when the file is missing.
        crate::io::read_required(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        let rows = parse_interrupts(&text).map_err(|m| Error::parse(&self.path, m))?;
        let widest = rows.iter().map(|r| r.values.len()).max().unwrap_or(0);
        while self.cpus.len() < widest {
            self.cpus.push(self.cpus.len().to_string());
        }
        let mut family = sink.family(INTERRUPTS, INTERRUPTS_HELP, Kind::Counter);
        for row in &rows {
            self.filter_name.clear();
            for part in [row.name, ";", &row.info, ";", &row.devices] {
                self.filter_name.push_str(part);
            }
            if self.filter.ignored(&self.filter_name) {
                tracing::debug!(filter_name = %self.filter_name, "ignoring interrupt name");
                continue;
            }
            for (value, cpu) in row.values.iter().zip(&self.cpus) {
                let v = crate::parse::parse_go_float(value)
                    .ok_or_else(|| Error::parse(&self.path, format!("invalid value {value} in interrupts")))?;
                if !self.include_zeros && v == 0.0 {
                    continue;
                }
                family.sample(&[("cpu", cpu), ("devices", &row.devices), ("info", &row.info), ("type", row.name)], v);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;
    use regex::Regex;

    const FIXTURE: &str = "           CPU0       CPU1       CPU2       CPU3       
  0:         18          0          0          0  IR-IO-APIC-edge      timer
  1:      17960        105         28         28  IR-IO-APIC-edge      i8042
 16:     328511     322879     293782     351412  IR-IO-APIC-fasteoi   ehci_hcd:usb1, mmc0
 40:          0          0          0          0  DMAR_MSI-edge      dmar0
NMI:         47          5        031        132   Non-maskable interrupts
LOC:  174326351  135776678  168393257  130980079   Local timer interrupts
MCE:          0          0          0          0   Machine check exceptions
ERR:          0
MIS:          0
";

    const AARCH64: &str = "           CPU0       CPU1
  1:          0          0     GICv3  25 Level     vgic
IPI0:     13      17       Rescheduling interrupts
";

    #[test]
    fn parses_the_fixture() {
        let rows = parse_interrupts(FIXTURE).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.name).collect();
        assert_eq!(names, ["0", "1", "16", "40", "LOC", "MCE", "NMI"]);
        let usb = &rows[2];
        assert_eq!((usb.info.as_str(), usb.devices.as_str()), ("IR-IO-APIC-fasteoi", "ehci_hcd:usb1, mmc0"));
        assert_eq!(usb.values, ["328511", "322879", "293782", "351412"]);
        let nmi = &rows[6];
        assert_eq!((nmi.info.as_str(), nmi.devices.as_str(), nmi.values[2]), ("Non-maskable interrupts", "", "031"));
        let arm = parse_interrupts(AARCH64).unwrap();
        assert_eq!((arm[0].info.as_str(), arm[0].devices.as_str()), ("GICv3", "25 Level vgic"));
        assert_eq!((arm[1].name, arm[1].values.as_slice()), ("IPI0", ["13", "17"].as_slice()));
    }

    #[test]
    fn edge_cases_follow_node_exporter() {
        assert!(parse_interrupts("").unwrap_err().contains("empty"));
        assert!(parse_interrupts(&format!("CPU0\n{}\n", "x".repeat(crate::parse::GO_MAX_LINE + 1))).unwrap_err().contains("too long"));
        // No colon, too few fields: skipped. A repeated name keeps its last row.
        let rows = parse_interrupts("CPU0 CPU1\nfoo 1 2 3\nX: 1 2\nA: 1 2 a\nA: 3 4 b c\n").unwrap();
        assert_eq!(rows, vec![Interrupt { name: "A", info: "b c".into(), devices: String::new(), values: vec!["3", "4"] }]);
        // No space after the colon, spaces only trimmed on the left.
        let rows = parse_interrupts("CPU0\n 7:5 edge dev\n").unwrap();
        assert_eq!((rows[0].name, rows[0].values[0], rows[0].devices.as_str()), ("7", "5", "dev"));
    }

    fn scrape(o: Options, text: &str) -> Result<Vec<crate::testutil::Row>, Error> {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/interrupts", text);
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    fn labels(l: &[(&str, &str)]) -> Vec<(String, String)> {
        l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn update_filters_and_writes_counts() {
        let all = Options { include_zeros: true, filter: DeviceFilter::default() };
        let rows = scrape(all, FIXTURE).unwrap();
        assert_eq!(rows.len(), 28);
        let want = labels(&[("cpu", "3"), ("devices", "ehci_hcd:usb1, mmc0"), ("info", "IR-IO-APIC-fasteoi"), ("type", "16")]);
        assert!(rows.iter().any(|(n, l, v)| n == INTERRUPTS && *l == want && *v == 351412.0));

        let no_zeros = Options { include_zeros: false, filter: DeviceFilter::default() };
        assert_eq!(scrape(no_zeros, FIXTURE).unwrap().len(), 17);

        let filter = DeviceFilter::new(Some(Regex::new("^LOC;").unwrap()), Some(Regex::new("interrupts").unwrap()));
        let rows = scrape(Options { include_zeros: true, filter }, FIXTURE).unwrap();
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|(_, l, _)| l[3].1 == "NMI"));
    }

    #[test]
    fn update_fails_on_a_bad_value_or_a_missing_file() {
        let all = || Options { include_zeros: true, filter: DeviceFilter::default() };
        assert!(matches!(scrape(all(), "CPU0\nNMI: x y\n"), Err(Error::Parse { .. })));
        // A bad value of an ignored row is never parsed.
        let filter = DeviceFilter::new(Some(Regex::new("NMI").unwrap()), None);
        assert_eq!(scrape(Options { include_zeros: true, filter }, "CPU0\nNMI: x y\n").unwrap(), vec![]);
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(all(), &crate::testutil::paths(dir.path())).unwrap();
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Io { .. })));
    }
}
