//! `processes`: the processes and threads of the host, from every
//! /proc/<pid>/stat and /proc/<pid>/task/<tid>/stat and the limits in
//! /proc/sys/kernel/{threads-max,pid_max}: the number of processes
//! (`node_processes_pids`) and threads (`node_processes_threads`), the
//! processes and threads per state (`node_processes_state{state}`,
//! `node_processes_threads_state{thread_state}`) and the two limits, as
//! node_exporter does. A process or thread that vanishes while it is read
//! is skipped; any other failure fails the collector.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::parse::{parse_go_int, parse_go_uint};
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// procfs reads stat files through `ReadFileNoStat`, which stops at 1 MiB.
const READ_LIMIT: usize = 1024 * 1024;

/// How each of the 42 fields after the command of /proc/<pid>/stat is
/// scanned by prometheus/procfs (`fmt.Fscan` into Go types of 64 bits).
#[derive(Clone, Copy)]
enum Field {
    Str,
    Int,
    Uint,
}

const STAT_FIELDS: [Field; 42] = {
    use Field::{Int as I, Str as S, Uint as U};
    [
        S, I, I, I, I, I, // state, ppid, pgrp, session, tty, tpgid
        U, U, U, U, U, U, U, // flags, minflt, cminflt, majflt, cmajflt, utime, stime
        I, I, I, I, I, // cutime, cstime, priority, nice, num_threads
        I, U, U, I, U, U, U, U, // itrealvalue, starttime, vsize, rss, rsslimit, startcode, endcode, startstack
        U, U, U, U, U, U, U, U, U, // kstkesp, kstkeip, signal, blocked, sigignore, sigcatch, wchan, nswap, cnswap
        I, U, U, U, U, I, I, // exit_signal, processor, rt_priority, policy, delayacct_blkio_ticks, guest_time, cguest_time
    ]
};

/// The two fields of /proc/<pid>/stat the collector uses.
#[derive(Debug, PartialEq)]
pub struct ProcStat<'a> {
    pub state: &'a str,
    pub num_threads: i64,
}

/// Parses /proc/<pid>/stat as prometheus/procfs's `Proc.Stat` does: the
/// command is what lies between the first `(` and the last `)`; scanning
/// starts two bytes after that `)`, and the 42 fields that follow must be
/// there and scan as their Go types (integers as `fmt.Fscan` reads them:
/// with a sign and a base prefix).
pub fn parse_stat(text: &str) -> Result<ProcStat<'_>, String> {
    let (Some(l), Some(r)) = (text.find('('), text.rfind(')')) else {
        return Err(format!("unexpected format, couldn't extract comm {text:?}"));
    };
    if r < l {
        return Err(format!("unexpected format, couldn't extract comm {text:?}"));
    }
    let rest = text.get(r + 2..).ok_or_else(|| format!("unexpected format, nothing after comm {text:?}"))?;
    let mut fields = rest.split_whitespace();
    let mut state = "";
    let mut num_threads = 0;
    for (i, kind) in STAT_FIELDS.iter().enumerate() {
        let f = fields.next().ok_or("unexpected EOF")?;
        let ok = match kind {
            Field::Str => true,
            Field::Int => parse_go_int(f).is_some(),
            Field::Uint => parse_go_uint(f).is_some(),
        };
        if !ok {
            return Err(format!("field {i}: expected integer, found {f:?}"));
        }
        match i {
            0 => state = f,
            17 => num_threads = parse_go_int(f).unwrap_or(0),
            _ => {}
        }
    }
    Ok(ProcStat { state, num_threads })
}

/// Go's `strconv.ParseUint(strings.TrimSpace(s), 10, 64)`, as
/// node_exporter's `readUintFromFile` reads a limit: digits only.
pub fn parse_limit(text: &str) -> Option<u64> {
    crate::parse::parse_go_dec_uint(text.trim()).ok()
}

/// The numeric names of a directory, as procfs's `AllProcs` lists them
/// (Go's `strconv.ParseInt(name, 10, 64)`: a sign is allowed).
fn pids(dir: &Path) -> io::Result<Vec<i64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i64>().ok()) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// node_exporter's `isIgnoredError`: the process went away.
fn vanished(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// What one scrape counted.
#[derive(Default)]
struct Counts {
    pids: u64,
    threads: i64,
    states: BTreeMap<String, u64>,
    thread_states: BTreeMap<String, u64>,
}

pub struct Collector {
    procfs: PathBuf,
    threads_max: PathBuf,
    pid_max: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector {
            procfs: p.procfs.clone(),
            threads_max: p.proc("sys/kernel/threads-max"),
            pid_max: p.proc("sys/kernel/pid_max"),
            buf: Vec::with_capacity(1024),
        }
    }

    /// Reads a stat file; `Ok(None)` when the process went away. Opened
    /// afresh each time: a process's files are not worth keeping open.
    fn read_stat(&mut self, path: &Path) -> Result<Option<(String, i64)>, Error> {
        self.buf.clear();
        let read =
            crate::io::open_nonblocking(path).and_then(|f| io::Read::read_to_end(&mut io::Read::take(f, READ_LIMIT as u64), &mut self.buf));
        match read {
            Ok(_) => {}
            Err(e) if vanished(&e) => {
                tracing::debug!(path = %path.display(), err = %e, "file not found when retrieving stats");
                return Ok(None);
            }
            Err(e) => return Err(Error::io(path, e)),
        }
        let text = String::from_utf8_lossy(&self.buf);
        let s = parse_stat(&text).map_err(|m| Error::parse(path, m))?;
        Ok(Some((s.state.to_string(), s.num_threads)))
    }

    /// The states of a process's threads (its own state for the thread of
    /// its own id), as node_exporter's `getThreadStates`.
    fn thread_states(&mut self, pid: i64, state: &str, counts: &mut Counts) -> Result<(), Error> {
        let task = self.procfs.join(pid.to_string()).join("task");
        match std::fs::metadata(&task) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::parse(&task, "error reading task: not a directory")),
            Err(e) if vanished(&e) => return Ok(()),
            Err(e) => return Err(Error::io(&task, e)),
        }
        let tids = match pids(&task) {
            Ok(t) => t,
            Err(e) if vanished(&e) => return Ok(()),
            Err(e) => return Err(Error::io(&task, e)),
        };
        for tid in tids {
            if tid == pid {
                *counts.thread_states.entry(state.to_string()).or_default() += 1;
                continue;
            }
            let path = task.join(tid.to_string()).join("stat");
            if let Some((s, _)) = self.read_stat(&path)? {
                *counts.thread_states.entry(s).or_default() += 1;
            }
        }
        Ok(())
    }

    fn count(&mut self) -> Result<Counts, Error> {
        let mut counts = Counts::default();
        let all = pids(&self.procfs).map_err(|e| Error::io(&self.procfs, e))?;
        for pid in all {
            let path = self.procfs.join(pid.to_string()).join("stat");
            let Some((state, threads)) = self.read_stat(&path)? else { continue };
            counts.pids += 1;
            counts.threads += threads;
            self.thread_states(pid, &state, &mut counts)?;
            *counts.states.entry(state).or_default() += 1;
        }
        Ok(counts)
    }
}

/// Reads a limit as node_exporter's `readUintFromFile`: a missing file is
/// an error.
fn read_limit(path: &Path, buf: &mut Vec<u8>) -> Result<f64, Error> {
    crate::io::read_required(path, buf)?;
    let text = String::from_utf8_lossy(buf);
    parse_limit(&text).map(|v| v as f64).ok_or_else(|| Error::parse(path, format!("not a number: {:?}", text.trim())))
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let counts = self.count()?;
        let threads_max = read_limit(&self.threads_max, &mut self.buf)?;
        let pid_max = read_limit(&self.pid_max, &mut self.buf)?;
        sink.single("node_processes_threads", "Allocated threads in system", Kind::Gauge, counts.threads as f64);
        sink.single("node_processes_max_threads", "Limit of threads in the system", Kind::Gauge, threads_max);
        if !counts.states.is_empty() {
            let mut f = sink.new_family("node_processes_state", "Number of processes in each state.", Kind::Gauge);
            for (state, n) in &counts.states {
                f.sample(&[("state", state)], *n as f64);
            }
        }
        if !counts.thread_states.is_empty() {
            let mut f = sink.new_family("node_processes_threads_state", "Number of threads in each state.", Kind::Gauge);
            for (state, n) in &counts.thread_states {
                f.sample(&[("thread_state", state)], *n as f64);
            }
        }
        sink.single("node_processes_pids", "Number of PIDs", Kind::Gauge, counts.pids as f64);
        sink.single("node_processes_max_processes", "Number of max PIDs limit", Kind::Gauge, pid_max);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    const SYSTEMD: &str = "1 (systemd) S 0 1 1 0 -1 4194560 9061 9416027 94 2620 36 98 54406 13885 20 0 1 0 29 109604864 2507 18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 0 0 0 19 0 0 0 0 0 0 0 0 0 0\n";
    const KHUNGTASKD: &str = "17 (khungtaskd) S 2 0 0 0 -1 2129984 0 0 0 0 14 0 0 0 20 0 1 0 24 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0";
    const RCU: &str = "11 (rcu_preempt) I 2 0 0 0 -1 2129984 0 0 0 0 0 346 0 0 -2 0 1 0 32 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 2 1 1 0 0 0 0 0 0 0 0 0 0 0\n";

    fn stat(pid: u32, comm: &str, state: &str, threads: u32) -> String {
        format!("{pid} ({comm}) {state} 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 {threads} 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n")
    }

    #[test]
    fn parses_stat_lines() {
        assert_eq!(parse_stat(SYSTEMD).unwrap(), ProcStat { state: "S", num_threads: 1 });
        assert_eq!(parse_stat(KHUNGTASKD).unwrap(), ProcStat { state: "S", num_threads: 1 });
        assert_eq!(parse_stat(RCU).unwrap(), ProcStat { state: "I", num_threads: 1 });
        // The command may hold spaces and parentheses: the last `)` ends it.
        assert_eq!(parse_stat(&stat(5, "a) (b", "R", 7)).unwrap(), ProcStat { state: "R", num_threads: 7 });
        // Integers scan with a base prefix, as fmt.Fscan reads them.
        assert_eq!(parse_stat(&stat(5, "x", "D", 7).replace(" 20 0 7 ", " 20 0 0x10 ")).unwrap().num_threads, 16);
    }

    #[test]
    fn rejects_malformed_stat_lines() {
        assert!(parse_stat("1 systemd S 0").unwrap_err().contains("comm"));
        assert!(parse_stat("1 )x( S").is_err());
        assert!(parse_stat("1 (x)").is_err(), "nothing after the command");
        assert!(parse_stat("1 (x) S 0 1 1").unwrap_err().contains("EOF"), "too few fields");
        assert!(parse_stat(&stat(1, "x", "S", 1).replace(" 20 0 1 ", " 20 0 x ")).is_err());
        assert!(parse_stat(&stat(1, "x", "S", 1).replace(" -1 ", " 18446744073709551616 ")).is_err(), "int overflow");
        assert!(parse_stat(&stat(1, "x", "S", 1).replace(" -1 0 0 ", " -1 -5 0 ")).is_err(), "unsigned flags");
    }

    #[test]
    fn parses_limits_as_parse_uint() {
        assert_eq!(parse_limit("7801\n"), Some(7801));
        assert_eq!(parse_limit(" 00123 "), Some(123));
        for bad in ["", "+1", "-1", "0x10", "1 2", "18446744073709551616"] {
            assert_eq!(parse_limit(bad), None, "{bad}");
        }
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| crate::testutil::write(dir.path(), rel, text);
        w("proc/1/stat", SYSTEMD);
        w("proc/10/stat", KHUNGTASKD);
        w("proc/11/stat", RCU);
        w("proc/self", "10");
        w("proc/sys/kernel/threads-max", "7801\n");
        w("proc/sys/kernel/pid_max", "123\n");
        dir
    }

    fn scrape(dir: &Path) -> Result<Vec<crate::testutil::Row>, Error> {
        let mut c = Collector::new(&crate::testutil::paths(dir));
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    fn value(rows: &[crate::testutil::Row], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let want: Vec<(String, String)> = label.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        rows.iter().find(|(n, l, _)| n == name && *l == want).map(|r| r.2)
    }

    #[test]
    fn update_counts_the_fixture() {
        let dir = tree();
        let rows = scrape(dir.path()).unwrap();
        assert_eq!(rows.len(), 6, "{rows:?}");
        assert_eq!(value(&rows, "node_processes_pids", None), Some(3.0));
        assert_eq!(value(&rows, "node_processes_threads", None), Some(3.0));
        assert_eq!(value(&rows, "node_processes_max_threads", None), Some(7801.0));
        assert_eq!(value(&rows, "node_processes_max_processes", None), Some(123.0));
        assert_eq!(value(&rows, "node_processes_state", Some(("state", "S"))), Some(2.0));
        assert_eq!(value(&rows, "node_processes_state", Some(("state", "I"))), Some(1.0));
    }

    #[test]
    fn update_counts_thread_states() {
        let dir = tree();
        let w = |rel: &str, text: &str| crate::testutil::write(dir.path(), rel, text);
        w("proc/1/task/1/stat", "ignored: the process's own state counts");
        w("proc/1/task/2/stat", &stat(2, "worker", "R", 3));
        w("proc/1/task/3/stat", &stat(3, "worker", "S", 3));
        std::fs::create_dir_all(dir.path().join("proc/1/task/4")).unwrap();
        let rows = scrape(dir.path()).unwrap();
        assert_eq!(value(&rows, "node_processes_threads_state", Some(("thread_state", "S"))), Some(2.0));
        assert_eq!(value(&rows, "node_processes_threads_state", Some(("thread_state", "R"))), Some(1.0));
        assert_eq!(value(&rows, "node_processes_pids", None), Some(3.0), "a thread without stat is skipped");
    }

    #[test]
    fn update_fails_as_node_exporter() {
        let dir = tree();
        std::fs::create_dir_all(dir.path().join("proc/12")).unwrap();
        assert_eq!(value(&scrape(dir.path()).unwrap(), "node_processes_pids", None), Some(3.0), "a vanished pid is skipped");
        crate::testutil::write(dir.path(), "proc/12/stat", "12 (x) S\n");
        assert!(matches!(scrape(dir.path()), Err(Error::Parse { .. })));
        std::fs::remove_dir_all(dir.path().join("proc/12")).unwrap();
        crate::testutil::write(dir.path(), "proc/sys/kernel/pid_max", "x\n");
        assert!(matches!(scrape(dir.path()), Err(Error::Parse { .. })));
        std::fs::remove_file(dir.path().join("proc/sys/kernel/pid_max")).unwrap();
        assert!(matches!(scrape(dir.path()), Err(Error::Io { .. })));
        crate::testutil::write(dir.path(), "proc/1/task", "not a directory");
        assert!(scrape(dir.path()).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(scrape(empty.path()), Err(Error::Io { .. })), "no procfs");
    }
}
