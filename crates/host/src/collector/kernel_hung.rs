//! `kernel_hung`: the number of tasks the kernel's hung-task detector has
//! reported since boot, read from /proc/sys/kernel/hung_task_detect_count
//! (present with `CONFIG_DETECT_HUNG_TASK`), exported as the counter
//! `node_kernel_hung_tasks_total`. Without the file the collector has no data.

use std::path::PathBuf;

use crate::io::read_file;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// Parses the file's one unsigned decimal number, surrounding whitespace
/// allowed (Go's `strconv.ParseUint(strings.TrimSpace(s), 10, 64)`).
pub fn parse_count(buf: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(buf).map_err(|_| "invalid UTF-8".to_string())?.trim();
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!("invalid count {text:?}"));
    }
    text.parse().map_err(|e| format!("invalid count {text:?}: {e}"))
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("sys/kernel/hung_task_detect_count"), buf: Vec::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let n = parse_count(&self.buf).map_err(|m| Error::parse(&self.path, m))?;
        sink.single(
            "node_kernel_hung_tasks_total",
            "Total number of tasks that have been detected as hung since the system booted.",
            Kind::Counter,
            n as f64,
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn parses_the_count() {
        assert_eq!(parse_count(b"42\n"), Ok(42));
        assert_eq!(parse_count(b"  0  "), Ok(0));
        assert_eq!(parse_count(b"18446744073709551615\n"), Ok(u64::MAX));
    }

    #[test]
    fn malformed_counts_are_errors() {
        for bad in [&b""[..], b"\n", b"-1", b"+1", b"1.5", b"abc", b"18446744073709551616", b"1 2", b"\xff"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }

    fn paths(root: &std::path::Path) -> Paths {
        Paths { procfs: root.join("proc"), sysfs: root.join("sys"), rootfs: root.to_path_buf(), udev_data: root.join("udev") }
    }

    #[test]
    fn missing_file_is_no_data_and_bad_file_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(&paths(dir.path()));
        let mut sink = Sink::new();
        assert!(c.update(&mut sink).unwrap_err().is_no_data());

        let k = dir.path().join("proc/sys/kernel");
        std::fs::create_dir_all(&k).unwrap();
        std::fs::write(k.join("hung_task_detect_count"), "forty-two\n").unwrap();
        assert!(matches!(c.update(&mut sink), Err(Error::Parse { .. })));

        std::fs::write(k.join("hung_task_detect_count"), "42\n").unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 1);
        assert_eq!(fams[0].name(), "node_kernel_hung_tasks_total");
        assert_eq!(fams[0].kind(), Kind::Counter);
        assert_eq!(fams[0].samples().collect::<Vec<_>>(), vec![(vec![], 42.0)]);
    }
}
