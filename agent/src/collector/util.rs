//! Shared helpers: reading files into reused buffers, byte-level number
//! parsing, and node_exporter's include/exclude flags.

use std::fs::File;
use std::io;
use std::path::Path;

use clap::{Arg, ArgAction, ArgMatches};
use regex::Regex;

use super::{ConfigError, Error};

/// Reads `path` into `buf` (cleared first), keeping its capacity: open,
/// read until end, close — no size probing (`fs::read` would add a statx
/// and an lseek per file, which procfs cannot answer usefully anyway).
pub fn read_into(path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    let mut f = File::open(path)?;
    read_all(&mut f, buf)
}

/// Appends everything `f` yields to `buf`, reading straight into its spare
/// capacity (no zero-filling of reused buffers).
fn read_all(f: &mut File, buf: &mut Vec<u8>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(4096.max(buf.capacity()));
        }
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory of the given length owned by
        // `buf`; read(2) initializes the first `n` bytes it reports.
        let n = unsafe { libc::read(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: read(2) initialized `n` more bytes after the current length.
        unsafe { buf.set_len(buf.len() + n as usize) };
    }
}

/// A sysfs directory held open, whose attributes are read relative to it
/// (openat): no path walk or symlink resolution per attribute, and one
/// read per attribute (sysfs returns a whole attribute in one read).
pub struct SysDir {
    fd: std::os::fd::OwnedFd,
    buf: Vec<u8>,
}

impl SysDir {
    pub fn open(path: &Path) -> io::Result<SysDir> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid NUL-terminated path; the returned fd is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(SysDir { fd, buf: Vec::with_capacity(4096) })
    }

    /// The attribute `name`, trimmed; `None` when it can't be read.
    pub fn read(&mut self, name: &str) -> Option<&str> {
        use std::os::fd::AsRawFd;
        let mut cname = [0u8; 256];
        if name.len() >= cname.len() || name.as_bytes().contains(&0) {
            return None;
        }
        cname[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: `cname` is NUL-terminated; the fd is valid.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), cname.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a fresh descriptor we own; closed on drop.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        self.buf.clear();
        let spare = self.buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory owned by the buffer; read(2)
        // initializes the first `n` bytes it reports.
        let n = unsafe { libc::read(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len()) };
        if n < 0 {
            return None;
        }
        // SAFETY: read(2) initialized `n` bytes.
        unsafe { self.buf.set_len(n as usize) };
        std::str::from_utf8(&self.buf).ok().map(str::trim)
    }

    pub fn read_i64(&mut self, name: &str) -> Option<i64> {
        self.read(name)?.parse().ok()
    }

    pub fn read_u64(&mut self, name: &str) -> Option<u64> {
        self.read(name)?.parse().ok()
    }
}

/// Reads `path` into `buf`; a missing file is [`Error::NoData`].
pub fn read_file(path: &Path, buf: &mut Vec<u8>) -> Result<(), Error> {
    read_into(path, buf).map_err(|e| Error::from_read(path, e))
}

/// Reads a small sysfs attribute, trimmed. `None` when it can't be read.
pub fn read_trimmed(path: &Path) -> Option<String> {
    let mut buf = Vec::with_capacity(256);
    read_into(path, &mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).trim().to_string())
}

/// Reads a sysfs attribute as an unsigned integer.
pub fn read_u64(path: &Path) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

/// Reads a sysfs attribute as a signed integer.
pub fn read_i64(path: &Path) -> Option<i64> {
    read_trimmed(path)?.parse().ok()
}

/// Parses an unsigned decimal integer from ASCII bytes.
pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(v)
}

/// Parses a float from ASCII bytes (integers take the fast path).
pub fn parse_f64(b: &[u8]) -> Option<f64> {
    if let Some(v) = parse_u64(b) {
        return Some(v as f64);
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Splits on ASCII whitespace, skipping empty fields.
pub fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|c| c.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
}

/// Lines of a byte buffer, without the trailing newline.
pub fn lines(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    buf.split(|&c| c == b'\n').filter(|l| !l.is_empty())
}

/// A string-valued flag.
pub fn string_arg(name: &'static str, default: &'static str, help: &'static str) -> Arg {
    Arg::new(name)
        .long(name)
        .value_name("VALUE")
        .default_value(default)
        .help(help)
        .action(ArgAction::Set)
}

/// A kingpin-style boolean flag: `--name` and `--no-name`, the last wins.
pub fn bool_args(name: &'static str, default: bool, help: &'static str) -> [Arg; 2] {
    let no: &'static str = Box::leak(format!("no-{name}").into_boxed_str());
    let help_text = if default {
        format!("{help} [default: enabled]")
    } else {
        format!("{help} [default: disabled]")
    };
    [
        Arg::new(name)
            .long(name)
            .help(help_text)
            .action(ArgAction::SetTrue)
            .overrides_with(no),
        Arg::new(no)
            .long(no)
            .hide(true)
            .action(ArgAction::SetTrue)
            .overrides_with(name),
    ]
}

/// Resolves a kingpin-style boolean flag pair.
pub fn bool_flag(m: &ArgMatches, name: &str, default: bool) -> bool {
    let no = format!("no-{name}");
    if m.try_get_one::<bool>(name).ok().flatten().copied().unwrap_or(false)
        && m.value_source(name) == Some(clap::parser::ValueSource::CommandLine)
    {
        return true;
    }
    if m.try_get_one::<bool>(&no).ok().flatten().copied().unwrap_or(false)
        && m.value_source(&no) == Some(clap::parser::ValueSource::CommandLine)
    {
        return false;
    }
    default
}

/// The value of a string flag.
pub fn string_flag(m: &ArgMatches, name: &str) -> String {
    m.try_get_one::<String>(name)
        .ok()
        .flatten()
        .cloned()
        .unwrap_or_default()
}

/// Compiles a regex flag; an empty value means "not set".
pub fn regex_flag(m: &ArgMatches, name: &str) -> Result<Option<Regex>, ConfigError> {
    let value = string_flag(m, name);
    if value.is_empty() {
        return Ok(None);
    }
    Regex::new(&value)
        .map(Some)
        .map_err(|e| ConfigError::Regex {
            flag: name.to_string(),
            value,
            source: Box::new(e),
        })
}

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

    /// Builds the filter from an include and an exclude flag, which may not
    /// both be set.
    pub fn from_flags(m: &ArgMatches, exclude: &str, include: &str) -> Result<Self, ConfigError> {
        let ex = regex_flag(m, exclude)?;
        let inc = regex_flag(m, include)?;
        if ex.is_some()
            && inc.is_some()
            && m.value_source(exclude) == Some(clap::parser::ValueSource::CommandLine)
        {
            return Err(ConfigError::Invalid {
                flag: include.to_string(),
                msg: format!("cannot be used together with --{exclude}"),
            });
        }
        // A given include pattern replaces a default exclude pattern.
        if inc.is_some() {
            return Ok(DeviceFilter::new(None, inc));
        }
        Ok(DeviceFilter::new(ex, None))
    }

    pub fn ignored(&self, name: &str) -> bool {
        self.exclude.as_ref().is_some_and(|r| r.is_match(name))
            || self.include.as_ref().is_some_and(|r| !r.is_match(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_numbers() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"12a"), None);
        assert_eq!(parse_f64(b"0.25"), Some(0.25));
        assert_eq!(parse_f64(b"7"), Some(7.0));
        assert_eq!(parse_f64(b"x"), None);
    }

    #[test]
    fn splits_fields() {
        let f: Vec<&[u8]> = fields(b"  a \t bb  c\n").collect();
        assert_eq!(f, vec![&b"a"[..], b"bb", b"c"]);
    }

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
