//! `mdadm`: Linux software RAID (md) arrays, from /proc/mdstat (activity
//! state, required/active/failed/spare disks, blocks and blocks synced) and
//! from each array's /sys/block/md*/md/ directory (raid_disks and the
//! degraded count), exported as node_exporter 1.12's `node_md_*` gauges. No
//! /proc/mdstat is no data; a missing attribute of an array in sysfs is no
//! data too, and a malformed file an error, as procfs reports them.

use std::path::{Path, PathBuf};

use crate::io::read_file;
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    mdstat: PathBuf,
    block: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { mdstat: p.proc("mdstat"), block: p.sys("block"), buf: Vec::new() }
    }
}

/// One array of /proc/mdstat.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MdStat {
    pub name: String,
    /// The state word of the device line (`active`, `inactive`, ...), or
    /// `recovering`, `reshaping`, `checking` or `resyncing` while the array
    /// syncs.
    pub state: String,
    pub disks_active: i64,
    /// The disks the array requires.
    pub disks_total: i64,
    /// Components marked `(F)`.
    pub disks_failed: i64,
    /// Components marked `(S)`.
    pub disks_spare: i64,
    /// The `_` of the status line's `[UU_]`.
    pub disks_down: i64,
    pub blocks_total: i64,
    /// The blocks synced so far while syncing (0 while it is pending or
    /// delayed), else the size.
    pub blocks_synced: i64,
}

/// Go's `strconv.ParseInt(s, 10, 64)`: an optional sign, then digits.
fn int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Go's `strconv.ParseUint(s, 10, 64)`: digits only.
fn uint(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The length of the run of ASCII digits at the start of `b`.
fn digits(b: &[u8]) -> usize {
    b.iter().take_while(|c| c.is_ascii_digit()).count()
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?.windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

fn rfind(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let tail = hay.get(from..)?;
    tail.windows(needle.len()).rposition(|w| w == needle).map(|p| p + from)
}

/// `[<total>/<active>] [<U_>]` at the start of `b`: the three fields.
fn status_brackets(b: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let b = b.strip_prefix(b"[")?;
    let n = digits(b);
    let (total, b) = (b.get(..n).filter(|d| !d.is_empty())?, b.get(n..)?.strip_prefix(b"/")?);
    let n = digits(b);
    let (active, b) = (b.get(..n).filter(|d| !d.is_empty())?, b.get(n..)?.strip_prefix(b"] [")?);
    let n = b.iter().take_while(|&&c| c == b'U' || c == b'_').count();
    let (status, b) = (b.get(..n).filter(|d| !d.is_empty())?, b.get(n..)?);
    b.starts_with(b"]").then_some((total, active, status))
}

/// procfs's `(\d+) blocks .*\[(\d+)/(\d+)\] \[([U_]+)\]` on a status line:
/// the first `N blocks `, then the last `[total/active] [UU_]` after it.
fn status_counts(line: &str) -> Option<(&str, &str, &str)> {
    let b = line.as_bytes();
    let mut at = 0;
    let after = loop {
        let p = find(b, b" blocks ", at)?;
        if p > 0 && b[p - 1].is_ascii_digit() {
            break p + b" blocks ".len();
        }
        at = p + 1;
    };
    let (t, a, s) = (after..b.len()).rev().find_map(|q| status_brackets(&b[q..]))?;
    // ASCII digits, U and _ only: valid UTF-8.
    Some((std::str::from_utf8(t).ok()?, std::str::from_utf8(a).ok()?, std::str::from_utf8(s).ok()?))
}

/// Active, total and down disks and the size, from a device line and the
/// status line after it.
fn eval_status(device_line: &str, status_line: &str) -> Result<(i64, i64, i64, i64), String> {
    let first = status_line.split_whitespace().next().ok_or_else(|| format!("unexpected status line {status_line:?}"))?;
    let size = int(first).ok_or_else(|| format!("unexpected status line {status_line:?}"))?;
    if device_line.contains("raid0") || device_line.contains("linear") {
        // Only the components carry a [number] on the device line.
        let total = device_line.matches('[').count() as i64;
        return Ok((total, total, 0, size));
    }
    if device_line.contains("inactive") {
        return Ok((0, 0, 0, size));
    }
    let (total, active, status) =
        status_counts(status_line).ok_or_else(|| format!("could not find all substring matches in {status_line:?}"))?;
    let total = int(total).ok_or_else(|| format!("unexpected status line {status_line:?}"))?;
    let active = int(active).ok_or_else(|| format!("unexpected status line {status_line:?}"))?;
    Ok((active, total, status.matches('_').count() as i64, size))
}

/// `prefix(.+)<end>` as procfs's regular expressions match it: from the
/// first `prefix`, the longest text (at least one byte) before the last
/// `end` that follows it.
fn capture_until<'a>(line: &'a str, prefix: &str, end: impl Fn(&[u8], usize) -> Option<usize>) -> Option<&'a str> {
    let start = find(line.as_bytes(), prefix.as_bytes(), 0)? + prefix.len();
    let stop = end(line.as_bytes(), start + 1)?;
    // Both ends sit next to ASCII bytes: char boundaries.
    line.get(start..stop)
}

/// Go's `strconv.ParseFloat(s, 64)`, near enough (decimal, exponent,
/// infinities and NaN).
fn float(s: &str) -> Option<f64> {
    s.parse().ok()
}

/// The blocks synced of a progress line such as
/// `[=>....]  recovery =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec`;
/// the percentage, finish time and speed must parse too.
fn eval_recovery(line: &str) -> Result<i64, String> {
    let b = line.as_bytes();
    // `\((\d+/\d+)\)`: the first such parenthesis.
    let synced = (0..b.len())
        .filter(|&i| b[i] == b'(')
        .find_map(|i| {
            let rest = &b[i + 1..];
            let n = digits(rest);
            let m = digits(rest.get(n + 1..)?);
            (n > 0 && m > 0 && rest[n] == b'/' && rest.get(n + 1 + m) == Some(&b')'))
                .then(|| (&line[i + 1..i + 1 + n], &line[i + 2 + n..i + 2 + n + m]))
        })
        .ok_or_else(|| format!("unexpected recovery line blocks {line:?}"))?;
    let done = int(synced.0).ok_or_else(|| format!("unable to parse recovery blocks synced in {line:?}"))?;
    int(synced.1).ok_or_else(|| format!("unable to parse recovery blocks to be synced in {line:?}"))?;

    let pct =
        capture_until(line, "= ", |b, from| rfind(b, b"%", from)).ok_or_else(|| format!("unexpected recovery line percentage {line:?}"))?;
    float(pct.trim()).ok_or_else(|| format!("unable to parse the percentage of {line:?}"))?;
    let finish = capture_until(line, "finish=", |b, from| rfind(b, b"min", from))
        .ok_or_else(|| format!("unexpected recovery line finish time {line:?}"))?;
    float(finish).ok_or_else(|| format!("unable to parse the finish time of {line:?}"))?;
    let speed = capture_until(line, "speed=", |b, from| b.get(from..)?.iter().rposition(u8::is_ascii_uppercase).map(|p| p + from))
        .ok_or_else(|| format!("unexpected recovery line speed {line:?}"))?;
    float(speed).ok_or_else(|| format!("unable to parse the speed of {line:?}"))?;
    Ok(done)
}

/// A component such as `sda1[3](S)`: its descriptor index (the last
/// `[number]`) must be a 32-bit integer. Fields without one are skipped.
fn check_component(field: &str) -> Result<(), String> {
    let b = field.as_bytes();
    let last = (0..b.len()).rev().filter(|&i| b[i] == b'[').find_map(|i| {
        let n = digits(&b[i + 1..]);
        (n > 0 && b.get(i + 1 + n) == Some(&b']')).then(|| &field[i + 1..i + 1 + n])
    });
    match last {
        Some(index) if index.parse::<i32>().is_err() => Err(format!("error parsing int from device {index:?}")),
        _ => Ok(()),
    }
}

const PERSONALITIES: &str = "Personalities : ";

/// Parses /proc/mdstat as procfs 0.21 does: a device line (`md0 : active
/// raid1 sda1[0] sdb1[1]`), a status line (`1234 blocks ... [2/2] [UU]`),
/// maybe a bitmap line, then a sync line when the array syncs; lines
/// starting with a space, blank lines and `unused devices` are skipped.
pub fn parse_mdstat(text: &str) -> Result<Vec<MdStat>, String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut known_types: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (i, &line) in lines.iter().enumerate() {
        if line.trim().is_empty() || line.starts_with(' ') || line.starts_with("unused") {
            continue;
        }
        if known_types.is_empty() {
            if let Some(list) = line.strip_prefix(PERSONALITIES) {
                for word in list.split_whitespace() {
                    // `[raid1]`: procfs strips the first and last byte.
                    let inner = word.len().checked_sub(1).filter(|&e| e >= 1).ok_or_else(|| format!("invalid personality {word:?}"))?;
                    known_types.push(word.get(1..inner).unwrap_or(""));
                }
                continue;
            }
        }

        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 {
            return Err(format!("expected 3+ fields, got {line:?}"));
        }
        let name = fields[0];
        let mut state = fields[2];
        let is_type = |f: &str| known_types.contains(&f) && !f.contains(['(', '[']);
        let first_component = match fields.get(3..) {
            Some([t, ..]) if is_type(t) => 4,
            Some([_, t, ..]) if is_type(t) => 5,
            _ => 0,
        };
        if lines.len() <= i + 3 {
            return Err(format!("too few lines for md device {name:?}"));
        }

        let failed = line.matches("(F)").count() as i64;
        let spare = line.matches("(S)").count() as i64;
        let (active, total, down, size) = eval_status(line, lines[i + 1]).map_err(|e| format!("cannot parse md device lines: {e}"))?;

        let sync_line = if lines[i + 2].contains("bitmap") { lines[i + 3] } else { lines[i + 2] };
        let recovering = sync_line.contains("recovery");
        let reshaping = sync_line.contains("reshape");
        let resyncing = sync_line.contains("resync");
        let checking = sync_line.contains("check");
        let mut synced = size;
        if recovering || resyncing || checking || reshaping {
            state = if recovering {
                "recovering"
            } else if reshaping {
                "reshaping"
            } else if checking {
                "checking"
            } else {
                "resyncing"
            };
            synced = if sync_line.contains("PENDING") || sync_line.contains("DELAYED") {
                0
            } else {
                eval_recovery(sync_line).map_err(|e| format!("cannot parse sync line in md device {name:?}: {e}"))?
            };
        }

        for f in &fields[first_component..] {
            check_component(f).map_err(|e| format!("error parsing components in md device {name:?}: {e}"))?;
        }

        out.push(MdStat {
            name: name.to_string(),
            state: state.to_string(),
            disks_active: active,
            disks_total: total,
            disks_failed: failed,
            disks_spare: spare,
            disks_down: down,
            blocks_total: size,
            blocks_synced: synced,
        });
    }
    Ok(out)
}

/// One array's sysfs directory, as node_exporter exports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mdraid {
    pub device: String,
    /// `raid_disks`; `None` for containers, an unknown level, or an empty
    /// or unreadable count.
    pub disks: Option<u64>,
    /// `degraded`, read for raid1, 4, 5, 6 and 10 (else 0).
    pub degraded: u64,
}

/// `raid_disks`: a number, or `current (previous)` during a reshape.
pub fn parse_raid_disks(content: &str) -> Option<u64> {
    let content = content.trim();
    if let Some(v) = uint(content) {
        return Some(v);
    }
    let space = content.find(' ').filter(|&i| i > 0)?;
    uint(&content[..space])
}

/// `sync_completed` other than `none`: `done / total`, as Go's
/// `fmt.Sscanf(s, "%d / %d")` reads it (the spaces around the slash are
/// required, trailing text is ignored).
pub fn parse_sync_completed(s: &str) -> Option<(u64, u64)> {
    let space = |c: char| c.is_whitespace() && c != '\n';
    let number = |s: &str| -> Option<(u64, usize)> {
        let n = digits(s.as_bytes());
        Some((s[..n].parse().ok()?, n))
    };
    let s = s.trim_start_matches(space);
    let (done, n) = number(s)?;
    let rest = &s[n..];
    let after = rest.trim_start_matches(space);
    if after.len() == rest.len() {
        return None;
    }
    let rest = after.strip_prefix('/')?;
    let after = rest.trim_start_matches(space);
    if after.len() == rest.len() {
        return None;
    }
    let (total, _) = number(after)?;
    Some((done, total))
}

/// How an array's level decides which attributes procfs reads.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    /// `container`, `imsm`, `ddf` or empty: no raid_disks.
    NoDisks,
    /// raid0: chunk_size.
    Striped,
    /// raid1: degraded and sync state.
    Mirrored,
    /// raid4, 5, 6, 10: both.
    Both,
    Other,
}

impl Level {
    fn of(level: &[u8]) -> Level {
        match level {
            b"container" | b"imsm" | b"ddf" | b"" => Level::NoDisks,
            b"raid0" => Level::Striped,
            b"raid1" => Level::Mirrored,
            b"raid4" | b"raid5" | b"raid6" | b"raid10" => Level::Both,
            _ => Level::Other,
        }
    }
}

/// Go's `strings.TrimSpace` on ASCII: also drops `\v`, unlike `trim_ascii`.
fn trim(b: &[u8]) -> &[u8] {
    let space = |c: &u8| matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ');
    let start = b.iter().position(|c| !space(c)).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !space(c)).map_or(start, |e| e + 1);
    &b[start..end]
}

/// Reads a sysfs attribute into `buf`, trimmed; a missing one is no data.
fn attr<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Result<&'b [u8], Error> {
    read_file(path, buf)?;
    Ok(trim(buf))
}

/// An attribute holding an unsigned integer (a malformed one is an error).
fn uint_attr(path: &Path, buf: &mut Vec<u8>) -> Result<u64, Error> {
    let text = String::from_utf8_lossy(attr(path, buf)?);
    uint(&text).ok_or_else(|| Error::parse(path, format!("not an unsigned integer: {text:?}")))
}

impl Collector {
    /// The arrays of /sys/block/md*/md, in name order, read as procfs's
    /// `Mdraids` reads them: every attribute it reads must be there.
    fn mdraids(&mut self) -> Result<Vec<Mdraid>, Error> {
        let mut names: Vec<String> = match std::fs::read_dir(&self.block) {
            Ok(dir) => {
                dir.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("md")).collect()
            }
            Err(_) => Vec::new(),
        };
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for device in names {
            let dev_dir = self.block.join(&device);
            if !std::fs::metadata(&dev_dir).is_ok_and(|m| m.is_dir()) || std::fs::symlink_metadata(dev_dir.join("md")).is_err() {
                continue;
            }
            let md = dev_dir.join("md");
            let buf = &mut self.buf;
            let level = Level::of(attr(&md.join("level"), buf)?);
            attr(&md.join("array_state"), buf)?;
            attr(&md.join("metadata_version"), buf)?;
            let disks =
                if level == Level::NoDisks { None } else { parse_raid_disks(&String::from_utf8_lossy(attr(&md.join("raid_disks"), buf)?)) };
            attr(&md.join("uuid"), buf)?;
            let mut components: Vec<PathBuf> = match std::fs::read_dir(&md) {
                Ok(dir) => {
                    dir.filter_map(|e| e.ok()).filter(|e| e.file_name().as_encoded_bytes().starts_with(b"dev-")).map(|e| e.path()).collect()
                }
                Err(_) => Vec::new(),
            };
            components.sort();
            for c in &components {
                attr(&c.join("state"), buf)?;
            }
            if matches!(level, Level::Striped | Level::Both) {
                uint_attr(&md.join("chunk_size"), buf)?;
            }
            let mut degraded = 0;
            if matches!(level, Level::Mirrored | Level::Both) {
                degraded = uint_attr(&md.join("degraded"), buf)?;
                attr(&md.join("sync_action"), buf)?;
                let path = md.join("sync_completed");
                let completed = String::from_utf8_lossy(attr(&path, buf)?);
                if completed != "none" && parse_sync_completed(&completed).is_none() {
                    return Err(Error::parse(&path, format!("expected \"done / total\", got {completed:?}")));
                }
            }
            out.push(Mdraid { device, disks, degraded });
        }
        Ok(out)
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.mdstat, &mut self.buf)?;
        let arrays = parse_mdstat(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.mdstat, m))?;
        let raids = self.mdraids()?;

        let mut f = sink.new_family("node_md_disks_required", "Total number of disks of device.", Kind::Gauge);
        for a in &arrays {
            f.sample(&[("device", &a.name)], a.disks_total as f64);
        }
        let mut f = sink.new_family("node_md_disks", "Number of active/failed/spare disks of device.", Kind::Gauge);
        for a in &arrays {
            f.sample(&[("device", &a.name), ("state", "active")], a.disks_active as f64);
            f.sample(&[("device", &a.name), ("state", "failed")], a.disks_failed as f64);
            f.sample(&[("device", &a.name), ("state", "spare")], a.disks_spare as f64);
        }
        let mut f = sink.new_family("node_md_state", "Indicates the state of md-device.", Kind::Gauge);
        for a in &arrays {
            for (label, state) in [
                ("active", "active"),
                ("inactive", "inactive"),
                ("recovering", "recovering"),
                ("resync", "resyncing"),
                ("check", "checking"),
            ] {
                f.sample(&[("device", &a.name), ("state", label)], if a.state == state { 1.0 } else { 0.0 });
            }
        }
        let mut f = sink.new_family("node_md_blocks", "Total number of blocks on device.", Kind::Gauge);
        for a in &arrays {
            f.sample(&[("device", &a.name)], a.blocks_total as f64);
        }
        let mut f = sink.new_family("node_md_blocks_synced", "Number of blocks synced on device.", Kind::Gauge);
        for a in &arrays {
            f.sample(&[("device", &a.name)], a.blocks_synced as f64);
        }

        let mut f = sink.new_family("node_md_raid_disks", "Number of raid disks on device.", Kind::Gauge);
        for r in &raids {
            if let Some(d) = r.disks {
                f.sample(&[("device", &r.device)], d as f64);
            }
        }
        let mut f = sink.new_family("node_md_degraded", "Number of degraded disks on device.", Kind::Gauge);
        for r in &raids {
            f.sample(&[("device", &r.device)], r.degraded as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter's fixture (collector/fixtures/proc/mdstat).
    const MDSTAT: &str = "Personalities : [linear] [multipath] [raid0] [raid1] [raid6] [raid5] [raid4] [raid10]

md3 : active raid6 sda1[8] sdh1[7] sdg1[6] sdf1[5] sde1[11] sdd1[3] sdc1[10] sdb1[9] sdd1[10](S) sdd2[11](S)
      5853468288 blocks super 1.2 level 6, 64k chunk, algorithm 2 [8/8] [UUUUUUUU]

md127 : active raid1 sdi2[0] sdj2[1]
      312319552 blocks [2/2] [UU]

md0 : active raid1 sdi1[0] sdj1[1]
      248896 blocks [2/2] [UU]

md4 : inactive raid1 sda3[0](F) sdb3[1](S)
      4883648 blocks [2/2] [UU]

md6 : active raid1 sdb2[2](F) sdc[1](S) sda2[0]
      195310144 blocks [2/1] [U_]
      [=>...................]  recovery =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md8 : active raid1 sdb1[1] sda1[0] sdc[2](S) sde[3](S)
      195310144 blocks [2/2] [UU]
      [=>...................]  resync =  8.5% (16775552/195310144) finish=17.0min speed=259783K/sec

md201 : active raid1 sda3[0] sdb3[1]
      1993728 blocks super 1.2 [2/2] [UU]
      [=>...................]  check =  5.7% (114176/1993728) finish=0.2min speed=114176K/sec

md7 : active raid6 sdb1[0] sde1[3] sdd1[2] sdc1[1](F)
      7813735424 blocks super 1.2 level 6, 512k chunk, algorithm 2 [4/3] [U_UU]
      bitmap: 0/30 pages [0KB], 65536KB chunk

md9 : active raid1 sdc2[2] sdd2[3] sdb2[1] sda2[0] sde[4](F) sdf[5](F) sdg[6](S)
      523968 blocks super 1.2 [4/4] [UUUU]
      resync=DELAYED

md10 : active raid0 sda1[0] sdb1[1]
       314159265 blocks 64k chunks

md11 : active (auto-read-only) raid1 sdb2[0] sdc2[1] sdc3[2](F) hda[4](S) ssdc2[3](S)
      4190208 blocks super 1.2 [2/2] [UU]
      resync=PENDING

md12 : active raid0 sdc2[0] sdd2[1]
      3886394368 blocks super 1.2 512k chunks

md126 : active raid0 sdb[1] sdc[0]
      1855870976 blocks super external:/md127/0 128k chunks

md219 : inactive sdb[2](S) sdc[1](S) sda[0](S)
        7932 blocks super external:imsm

md00 : active raid0 xvdb[0]
      4186624 blocks super 1.2 256k chunks

md120 : active linear sda1[1] sdb1[0]
        2095104 blocks super 1.2 0k rounding

md101 : active (read-only) raid0 sdb[2] sdd[1] sdc[0]
      322560 blocks super 1.2 512k chunks

unused devices: <none>
";

    /// An array of mdstat: state, then active, total, failed, spare and down
    /// disks, blocks and blocks synced.
    fn md(state: &str, [active, total, failed, spare, down, blocks, synced]: [i64; 7]) -> MdStat {
        MdStat {
            name: String::new(),
            state: state.into(),
            disks_active: active,
            disks_total: total,
            disks_failed: failed,
            disks_spare: spare,
            disks_down: down,
            blocks_total: blocks,
            blocks_synced: synced,
        }
    }

    #[test]
    fn parses_the_fixture_as_node_exporter_reports_it() {
        let all = parse_mdstat(MDSTAT).unwrap();
        assert_eq!(all.len(), 17);
        let get = |name: &str| {
            let mut m = all.iter().find(|m| m.name == name).unwrap().clone();
            m.name.clear();
            m
        };
        assert_eq!(get("md3"), md("active", [8, 8, 0, 2, 0, 5853468288, 5853468288]));
        assert_eq!(get("md4"), md("inactive", [0, 0, 1, 1, 0, 4883648, 4883648]));
        assert_eq!(get("md6"), md("recovering", [1, 2, 1, 1, 1, 195310144, 16775552]));
        assert_eq!(get("md8"), md("resyncing", [2, 2, 0, 2, 0, 195310144, 16775552]));
        assert_eq!(get("md201"), md("checking", [2, 2, 0, 0, 0, 1993728, 114176]));
        // The bitmap line is skipped; the status line gives 4 required, 3 active.
        assert_eq!(get("md7"), md("active", [3, 4, 1, 0, 1, 7813735424, 7813735424]));
        // resync=DELAYED / PENDING: nothing synced yet.
        assert_eq!(get("md9"), md("resyncing", [4, 4, 2, 1, 0, 523968, 0]));
        assert_eq!(get("md11"), md("resyncing", [2, 2, 1, 2, 0, 4190208, 0]));
        // raid0 and linear: the components on the device line.
        assert_eq!(get("md10"), md("active", [2, 2, 0, 0, 0, 314159265, 314159265]));
        assert_eq!(get("md120"), md("active", [2, 2, 0, 0, 0, 2095104, 2095104]));
        assert_eq!(get("md101"), md("active", [3, 3, 0, 0, 0, 322560, 322560]));
        assert_eq!(get("md219"), md("inactive", [0, 0, 0, 3, 0, 7932, 7932]));
    }

    #[test]
    fn reshape_and_no_personalities() {
        let text = "Personalities : [raid5]\nmd0 : active raid5 sda[0] sdb[1] sdc[2]\n      100 blocks super 1.2 level 5, 512k chunk [3/3] [UUU]\n      [>....]  reshape =  1.5% (10/100) finish=1.0min speed=5K/sec\n\n";
        let m = &parse_mdstat(text).unwrap()[0];
        assert_eq!((m.state.as_str(), m.blocks_synced), ("reshaping", 10));
        // No personalities line at all, and none loaded.
        let text = "Personalities : \nmd1 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n\n\n";
        assert_eq!(parse_mdstat(text).unwrap()[0].disks_total, 2);
        assert_eq!(parse_mdstat("").unwrap(), vec![]);
        assert_eq!(parse_mdstat("Personalities : [raid1]\nunused devices: <none>\n").unwrap(), vec![]);
    }

    #[test]
    fn the_last_status_brackets_after_blocks_count() {
        assert_eq!(status_counts("12 blocks [1/1] [U] x [3/2] [UU_]"), Some(("3", "2", "UU_")));
        assert_eq!(status_counts("[9/9] [UU] 12 blocks [2/1] [U_]"), Some(("2", "1", "U_")));
        assert_eq!(status_counts("blocks [2/2] [UU]"), None);
        assert_eq!(status_counts("12 blocks [2/2] [UX]"), None);
        assert_eq!(status_counts("12 blocks [2/] [UU]"), None);
        assert_eq!(status_counts("x12 blocks  [2/2] [UU]"), Some(("2", "2", "UU")));
    }

    #[test]
    fn malformed_mdstat_is_an_error() {
        let ok_tail = "      100 blocks [2/2] [UU]\n\n\n";
        for bad in [
            "md0 : \n\n\n\n".to_string(),                                       // fewer than 3 fields
            "md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]".to_string(), // too few lines
            "md0 : active raid1 sda[0]\n      x blocks [2/2] [UU]\n\n\n".to_string(), // size not a number
            "md0 : active raid1 sda[0]\n\n\n\n".to_string(),                   // no status line
            "md0 : active raid1 sda[0]\n      100 blocks [2/2]\n\n\n".to_string(), // no [UU]
            "md0 : active raid1 sda[0]\n      100 blocks [99999999999999999999/2] [UU]\n\n\n".to_string(),
            "md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n      [=>..]  recovery =  8.5% finish=1min speed=1K/sec\n\n".to_string(),
            "md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n      [=>..]  recovery = x% (1/100) finish=1min speed=1K/sec\n\n".to_string(),
            "md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n      [=>..]  check = 1% (1/100) speed=1K/sec\n\n".to_string(),
            "md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n      [=>..]  resync = 1% (1/100) finish=1min\n\n".to_string(),
            format!("md0 : active raid1 sda[0] sdb[3000000000]\n{ok_tail}"), // descriptor index overflows i32
            format!("Personalities : [raid1] x\nmd0 : active raid1 sda[0]\n{ok_tail}"), // a one-byte personality
        ] {
            assert!(parse_mdstat(&bad).is_err(), "{bad:?} must not parse");
        }
        // An index on a field procfs skips (before the raid type) is not checked.
        assert!(parse_mdstat(&format!("Personalities : [raid1]\nmd0[3000000000] : active raid1 sda[0]\n{ok_tail}")).is_ok());
        assert!(parse_mdstat(&format!("md0[3000000000] : active raid1 sda[0]\n{ok_tail}")).is_err());
    }

    #[test]
    fn sysfs_counts() {
        assert_eq!(parse_raid_disks("4"), Some(4));
        assert_eq!(parse_raid_disks("11 (10)"), Some(11));
        assert_eq!(parse_raid_disks(""), None);
        assert_eq!(parse_raid_disks("x (10)"), None);
        assert_eq!(parse_sync_completed("1569888 / 2093056"), Some((1569888, 2093056)));
        assert_eq!(parse_sync_completed("1 \t/  2 trailing"), Some((1, 2)));
        assert_eq!(parse_sync_completed("1/2"), None);
        assert_eq!(parse_sync_completed("1 /2"), None);
        assert_eq!(parse_sync_completed("delayed"), None);
        assert_eq!(parse_sync_completed("1 / "), None);
        assert_eq!(parse_sync_completed("18446744073709551616 / 1"), None);
        assert_eq!(trim(b"\x0b raid1\n"), b"raid1");
        assert_eq!(trim(b" \n"), b"");
    }

    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new(mdstat: &str) -> Tree {
            let t = Tree(tempfile::tempdir().unwrap());
            std::fs::create_dir_all(t.0.path().join("proc")).unwrap();
            std::fs::create_dir_all(t.0.path().join("sys/block")).unwrap();
            std::fs::write(t.0.path().join("proc/mdstat"), mdstat).unwrap();
            t
        }

        fn array(&self, name: &str, attrs: &[(&str, &str)]) {
            let md = self.0.path().join("sys/block").join(name).join("md");
            std::fs::create_dir_all(md.join("dev-sda")).unwrap();
            std::fs::write(md.join("dev-sda/state"), "in_sync\n").unwrap();
            for (k, v) in attrs {
                std::fs::write(md.join(k), format!("{v}\n")).unwrap();
            }
        }

        fn scrape(&self) -> Result<Sink, Error> {
            let p = self.0.path();
            let paths = Paths { procfs: p.join("proc"), sysfs: p.join("sys"), rootfs: p.into(), udev_data: p.into() };
            let mut c = Collector::new(&paths);
            let mut sink = Sink::new();
            crate::Collector::update(&mut c, &mut sink).map(|()| sink)
        }
    }

    const RAID1: &[(&str, &str)] = &[
        ("level", "raid1"),
        ("array_state", "clean"),
        ("metadata_version", "1.2"),
        ("raid_disks", "2"),
        ("uuid", "0fbf5f2c-add2-43c2-bd78-a4be3ab709ef"),
        ("degraded", "1"),
        ("sync_action", "idle"),
        ("sync_completed", "none"),
    ];

    fn samples(sink: &Sink, family: &str) -> Vec<(String, f64)> {
        let fams = sink.families();
        let Some(f) = fams.iter().find(|f| f.name() == family) else { return vec![] };
        f.samples().map(|(l, v)| (l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), v)).collect()
    }

    #[test]
    fn exports_mdstat_and_sysfs() {
        let t = Tree::new("md0 : active raid1 sda[0] sdb[1]\n      100 blocks [2/2] [UU]\n\n\n");
        t.array("md0", RAID1);
        t.array("md9", &[("level", "container"), ("array_state", "inactive"), ("metadata_version", "external:imsm"), ("uuid", "x")]);
        std::fs::create_dir_all(t.0.path().join("sys/block/sda")).unwrap();
        let sink = t.scrape().unwrap();
        assert_eq!(samples(&sink, "node_md_disks_required"), vec![("device=md0".into(), 2.0)]);
        assert_eq!(samples(&sink, "node_md_state").iter().filter(|s| s.1 == 1.0).count(), 1);
        assert_eq!(samples(&sink, "node_md_state")[0], ("device=md0,state=active".into(), 1.0));
        assert_eq!(samples(&sink, "node_md_raid_disks"), vec![("device=md0".into(), 2.0)]);
        assert_eq!(samples(&sink, "node_md_degraded"), vec![("device=md0".into(), 1.0), ("device=md9".into(), 0.0)]);
    }

    #[test]
    fn no_mdstat_is_no_data_and_no_arrays_is_success() {
        let t = Tree::new("Personalities : \nunused devices: <none>\n");
        assert!(t.scrape().unwrap().families().iter().all(|f| f.is_empty()));
        std::fs::remove_file(t.0.path().join("proc/mdstat")).unwrap();
        assert!(t.scrape().unwrap_err().is_no_data());
    }

    #[test]
    fn sysfs_attributes_missing_or_malformed() {
        let mdstat = "Personalities : \n";
        // A missing attribute procfs reads: no data, as node_exporter.
        for missing in ["level", "array_state", "metadata_version", "raid_disks", "uuid", "degraded", "sync_action", "sync_completed"] {
            let t = Tree::new(mdstat);
            let attrs: Vec<_> = RAID1.iter().copied().filter(|(k, _)| *k != missing).collect();
            t.array("md0", &attrs);
            let err = t.scrape().unwrap_err();
            assert!(err.is_no_data(), "{missing}: {err}");
        }
        let t = Tree::new(mdstat);
        t.array("md0", RAID1);
        std::fs::remove_file(t.0.path().join("sys/block/md0/md/dev-sda/state")).unwrap();
        assert!(t.scrape().unwrap_err().is_no_data());
        // Malformed values: errors.
        for (k, v) in [("degraded", "x"), ("sync_completed", "delayed"), ("degraded", "-1")] {
            let t = Tree::new(mdstat);
            t.array("md0", RAID1);
            std::fs::write(t.0.path().join("sys/block/md0/md").join(k), v).unwrap();
            let err = t.scrape().unwrap_err();
            assert!(matches!(err, Error::Parse { .. }), "{k}={v}: {err}");
        }
        // raid0 reads chunk_size (and not degraded); an odd raid_disks is no count.
        let t = Tree::new(mdstat);
        let attrs = [("level", "raid0"), ("array_state", "clean"), ("metadata_version", "1.2"), ("raid_disks", "two"), ("uuid", "u")];
        t.array("md0", &attrs);
        assert!(t.scrape().unwrap_err().is_no_data(), "chunk_size is required for raid0");
        std::fs::write(t.0.path().join("sys/block/md0/md/chunk_size"), "524288\n").unwrap();
        let sink = t.scrape().unwrap();
        assert_eq!(samples(&sink, "node_md_raid_disks"), vec![]);
        assert_eq!(samples(&sink, "node_md_degraded"), vec![("device=md0".into(), 0.0)]);
    }
}
