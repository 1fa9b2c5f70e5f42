//! `edac`: memory error counters of the EDAC subsystem, from
//! /sys/devices/system/edac/mc. Per memory controller `mcN` it exports the
//! correctable and uncorrectable error totals, the errors without row
//! information (as csrow `unknown`), per chip-select row `csrowN` its totals,
//! and per channel (`chN_ce_count`, `chN_ue_count`) its totals labelled with
//! the DIMM label, as node_exporter does. No controllers is success without
//! samples, as in node_exporter.

use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

const CE: &str = "node_edac_correctable_errors_total";
const UE: &str = "node_edac_uncorrectable_errors_total";
const CSROW_CE: &str = "node_edac_csrow_correctable_errors_total";
const CSROW_UE: &str = "node_edac_csrow_uncorrectable_errors_total";
const CHANNEL_CE: &str = "node_edac_channel_correctable_errors_total";
const CHANNEL_UE: &str = "node_edac_channel_uncorrectable_errors_total";

/// The number of a `mc<digit>…` or `csrow<digit>…` entry: the digits after
/// `prefix` (node_exporter's glob `prefix[0-9]*`, then its regexp's
/// `prefix([0-9]*)`); `None` when the name does not match the glob.
pub fn entry_number<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The channel of a `ch<N>_ce_count` file: node_exporter's glob
/// `ch*_ce_count`, then the leftmost match of `ch([0-9]+)_ce_count`.
pub fn channel_number(name: &str) -> Option<&str> {
    if !name.starts_with("ch") || !name.ends_with("_ce_count") || name.len() < "ch_ce_count".len() {
        return None;
    }
    name.match_indices("ch").find_map(|(i, _)| {
        let rest = &name[i + 2..];
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        (end > 0 && rest[end..].starts_with("_ce_count")).then(|| &rest[..end])
    })
}

/// A DIMM label as node_exporter shows it: trimmed, `#` removed, `csrow`
/// and `channel` preceded by `_`.
pub fn dimm_label(raw: &str) -> String {
    raw.trim().replace('#', "").replace("csrow", "_csrow").replace("channel", "_channel")
}

/// A counter file (Go's `ParseUint(TrimSpace(s), 10, 64)`).
pub fn parse_count(text: &str) -> Option<u64> {
    crate::parse::parse_u64(text.trim().as_bytes())
}

pub struct Collector {
    dir: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("devices/system/edac/mc"), buf: Vec::with_capacity(64) }
    }

    /// Reads a required counter: any failure fails the scrape, as in node_exporter.
    fn count(&mut self, path: &Path) -> Result<u64, Error> {
        crate::io::read_required(path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        parse_count(&text).ok_or_else(|| Error::parse(path, format!("invalid count {:?}", text.trim())))
    }

    /// Reads an optional counter or label.
    fn text(&mut self, path: &Path) -> Option<String> {
        crate::io::read_into(path, &mut self.buf).ok()?;
        Some(String::from_utf8_lossy(&self.buf).into_owned())
    }
}

/// The entries of `dir` whose names match `f`, sorted by name; none when
/// the directory can't be read (Go's glob ignores errors).
fn entries<'n>(dir: &Path, names: &'n mut Vec<String>, f: impl Fn(&str) -> bool) -> Vec<&'n str> {
    names.clear();
    if let Ok(rd) = std::fs::read_dir(dir) {
        names.extend(rd.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| f(n)));
    }
    names.sort();
    names.iter().map(String::as_str).collect()
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let (mut mcs, mut rows, mut chans) = (Vec::new(), Vec::new(), Vec::new());
        let dir = self.dir.clone();
        for mc_name in entries(&dir, &mut mcs, |n| entry_number(n, "mc").is_some()) {
            let Some(mc) = entry_number(mc_name, "mc") else { continue };
            let mc_dir = dir.join(mc_name);
            let v = self.count(&mc_dir.join("ce_count"))?;
            sink.family(CE, "Total correctable memory errors.", Kind::Counter).sample(&[("controller", mc)], v as f64);
            let v = self.count(&mc_dir.join("ce_noinfo_count"))?;
            sink.family(CSROW_CE, "Total correctable memory errors for this csrow.", Kind::Counter)
                .sample(&[("controller", mc), ("csrow", "unknown")], v as f64);
            let v = self.count(&mc_dir.join("ue_count"))?;
            sink.family(UE, "Total uncorrectable memory errors.", Kind::Counter).sample(&[("controller", mc)], v as f64);
            let v = self.count(&mc_dir.join("ue_noinfo_count"))?;
            sink.family(CSROW_UE, "Total uncorrectable memory errors for this csrow.", Kind::Counter)
                .sample(&[("controller", mc), ("csrow", "unknown")], v as f64);

            for row_name in entries(&mc_dir, &mut rows, |n| entry_number(n, "csrow").is_some()) {
                // node_exporter's csrow regexp wants the controller's name to be `mc` and digits only.
                if mc.len() + 2 != mc_name.len() {
                    return Err(Error::parse(&mc_dir.join(row_name), "csrow path does not match .../mc/mc[0-9]*/csrow([0-9]*)"));
                }
                let Some(row) = entry_number(row_name, "csrow") else { continue };
                let row_dir = mc_dir.join(row_name);
                let v = self.count(&row_dir.join("ce_count"))?;
                sink.family(CSROW_CE, "Total correctable memory errors for this csrow.", Kind::Counter)
                    .sample(&[("controller", mc), ("csrow", row)], v as f64);
                let v = self.count(&row_dir.join("ue_count"))?;
                sink.family(CSROW_UE, "Total uncorrectable memory errors for this csrow.", Kind::Counter)
                    .sample(&[("controller", mc), ("csrow", row)], v as f64);

                for ch_file in entries(&row_dir, &mut chans, |n| n.starts_with("ch") && n.ends_with("_ce_count")) {
                    let Some(ch) = channel_number(ch_file) else { continue };
                    let label = match self.text(&row_dir.join(format!("ch{ch}_dimm_label"))) {
                        Some(raw) => dimm_label(&raw),
                        None => "unknown".to_string(),
                    };
                    let l = [("channel", ch), ("controller", mc), ("csrow", row), ("dimm_label", label.as_str())];
                    let v = self.count(&row_dir.join(ch_file))?;
                    sink.family(CHANNEL_CE, "Total correctable memory errors for this channel.", Kind::Counter).sample(&l, v as f64);
                    // A channel without an uncorrectable counter just lacks that sample.
                    if let Some(v) = self.text(&row_dir.join(format!("ch{ch}_ue_count"))).as_deref().and_then(parse_count) {
                        sink.family(CHANNEL_UE, "Total uncorrectable memory errors for this channel.", Kind::Counter).sample(&l, v as f64);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::Row;

    #[test]
    fn names() {
        assert_eq!(entry_number("mc0", "mc"), Some("0"));
        assert_eq!(entry_number("mc12x", "mc"), Some("12"));
        assert_eq!(entry_number("mcx", "mc"), None);
        assert_eq!(entry_number("mc", "mc"), None);
        assert_eq!(entry_number("csrow3", "csrow"), Some("3"));
        assert_eq!(channel_number("ch0_ce_count"), Some("0"));
        assert_eq!(channel_number("ch12_ce_count"), Some("12"));
        assert_eq!(channel_number("ch_ce_count"), None);
        assert_eq!(channel_number("chx_ch3_ce_count"), Some("3"));
        assert_eq!(channel_number("ch0_ue_count"), None);
        assert_eq!(dimm_label("mc#0csrow#1channel#0\n"), "mc0_csrow1_channel0");
        assert_eq!(parse_count("5\n"), Some(5));
        assert_eq!(parse_count("-5"), None);
    }

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (f, v) in files {
            let p = root.join("devices/system/edac/mc").join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
    }

    fn scrape(root: &Path) -> Result<Vec<Row>, Error> {
        let p = Paths { procfs: root.into(), sysfs: root.into(), rootfs: root.into(), udev_data: root.into() };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn scrapes_controllers_rows_and_channels() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            &[
                ("mc0/ce_count", "1\n"),
                ("mc0/ce_noinfo_count", "2\n"),
                ("mc0/ue_count", "5\n"),
                ("mc0/ue_noinfo_count", "6\n"),
                ("mc0/csrow0/ce_count", "3\n"),
                ("mc0/csrow0/ue_count", "4\n"),
                ("mc0/csrow0/ch0_ce_count", "0\n"),
                ("mc0/csrow0/ch0_dimm_label", "mc#0csrow#0channel#0\n"),
                ("mc0/csrow0/ch0_ue_count", "2\n"),
                ("mc0/csrow0/ch1_ce_count", "7\n"),
                ("power/x", "1\n"),
            ],
        );
        let got = scrape(root).unwrap();
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        let find = |name: &str| got.iter().filter(|g| g.0 == name).map(|g| (g.1.clone(), g.2)).collect::<Vec<_>>();
        assert_eq!(find(CE), vec![(vec![s("controller", "0")], 1.0)]);
        assert_eq!(
            find(CSROW_UE),
            vec![(vec![s("controller", "0"), s("csrow", "unknown")], 6.0), (vec![s("controller", "0"), s("csrow", "0")], 4.0)]
        );
        assert_eq!(
            find(CHANNEL_CE),
            vec![
                (vec![s("channel", "0"), s("controller", "0"), s("csrow", "0"), s("dimm_label", "mc0_csrow0_channel0")], 0.0),
                (vec![s("channel", "1"), s("controller", "0"), s("csrow", "0"), s("dimm_label", "unknown")], 7.0),
            ]
        );
        assert_eq!(find(CHANNEL_UE).len(), 1, "channel 1 has no uncorrectable counter");

        write(root, &[("mc0/csrow0/ue_count", "many\n")]);
        assert!(matches!(scrape(root), Err(Error::Parse { .. })));
        std::fs::remove_file(root.join("devices/system/edac/mc/mc0/csrow0/ue_count")).unwrap();
        let e = scrape(root).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "a missing counter fails the scrape: {e}");
    }

    #[test]
    fn no_controllers_is_success_without_samples() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap().is_empty());
    }
}
