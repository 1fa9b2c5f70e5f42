//! Helpers for node-agent's workspace-level integration tests.

#[cfg(feature = "agent")]
pub mod apiserver;
#[cfg(feature = "agent")]
pub mod cluster;
pub mod compare;
pub mod dbus;
pub mod disk;
pub mod fuse;
pub mod fuzz;
#[cfg(feature = "agent")]
pub mod gate;
pub mod host;
#[cfg(feature = "agent")]
pub mod inproc;
#[cfg(feature = "agent")]
pub mod kubelet;
pub mod memcg;
pub mod netns;
#[cfg(feature = "agent")]
pub mod pods;
#[cfg(feature = "agent")]
pub mod prometheus;
#[cfg(feature = "agent")]
pub mod sim;
pub mod web;

/// Bytes aligned for the ELF parser, as aya's `include_bytes_aligned!`.
#[repr(C, align(32))]
pub struct Aligned<B: ?Sized>(pub B);

#[cfg(feature = "agent")]
static TEST_OBJECT_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/agent-ebpf-test.o")));

/// The eBPF object with the test-only programs (`verifier_rejects`,
/// `empty`) beside every shipped one; built by this crate's build script.
#[cfg(feature = "agent")]
pub static TEST_OBJECT: &[u8] = &TEST_OBJECT_ALIGNED.0;

/// Starts an exporter binary on a free loopback port with `flags` and waits
/// until its /metrics answers; returns the guard, the URL and the pid.
pub fn start_exporter<S: AsRef<std::ffi::OsStr>>(bin: &Path, flags: &[S]) -> Result<(Kill, String, u32), String> {
    start_exporter_with_stderr(bin, flags, std::process::Stdio::null())
}

/// [`start_exporter`], with the exporter's stderr sent to `stderr` (say, a
/// file whose log lines the test reads afterwards).
pub fn start_exporter_with_stderr<S: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    flags: &[S],
    stderr: std::process::Stdio,
) -> Result<(Kill, String, u32), String> {
    start_exporter_prepared(bin, flags, stderr, |_| {})
}

/// [`start_exporter_with_stderr`], with `prepare` given the command before
/// it is spawned (say, to have the child join a cgroup between fork and
/// exec: [`memcg::MemCg::join_on_exec`]).
pub fn start_exporter_prepared<S: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    flags: &[S],
    stderr: std::process::Stdio,
    prepare: impl FnOnce(&mut std::process::Command),
) -> Result<(Kill, String, u32), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg(format!("--web.listen-address=127.0.0.1:{port}")).args(flags).stdout(std::process::Stdio::null()).stderr(stderr);
    prepare(&mut cmd);
    let child = cmd.spawn().map_err(|e| format!("starting {}: {e}", bin.display()))?;
    let pid = child.id();
    let guard = Kill(child);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let t = std::time::Instant::now();
    while compare::http_get(&url).is_err() {
        if t.elapsed() > std::time::Duration::from_secs(20) {
            return Err(format!("{} did not come up", bin.display()));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok((guard, url, pid))
}

/// A TCP connection to `addr` from the loopback address `from` (a client
/// of its own address: 127.0.0.0/8 is all local); with
/// `wait` false, connecting goes on in the background (the handshake is
/// the kernel's; a SYN dropped by a full accept queue is retried by it).
pub fn connect_from(from: std::net::Ipv4Addr, addr: std::net::SocketAddr, wait: bool) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(to) = addr else { return Err(std::io::Error::other("IPv4 only")) };
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let nonblock = if wait { 0 } else { libc::SOCK_NONBLOCK };
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | nonblock, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new socket this function owns; closed by the TcpStream.
    let stream = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // The port is picked at connect (by the 4-tuple), not at bind: binding
    // thousands of sockets to one address would search the port space.
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with an int option value of its size.
    unsafe {
        libc::setsockopt(fd, libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, (&one as *const libc::c_int).cast(), 4);
    }
    let (local, remote) = (sin(from, 0), sin(*to.ip(), to.port()));
    // SAFETY: valid sockaddr_in structures of the given length.
    if unsafe { libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) } != 0 {
        let e = std::io::Error::last_os_error();
        if wait || e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(stream)
}

/// The node-agent binary of this build (built first if need be), beside the
/// running test executable: target/<profile>/deps/<test> → target/<profile>/node-agent.
/// `GET path` on a fresh connection: (status, body), or `None` when there
/// is no whole answer within `timeout`.
pub fn http_get(addr: std::net::SocketAddr, path: &str, timeout: std::time::Duration) -> Option<(u16, String)> {
    http_get_on(std::net::TcpStream::connect_timeout(&addr, timeout).ok()?, path, timeout)
}

/// [`http_get`] on the connection `s`.
pub fn http_get_on(mut s: std::net::TcpStream, path: &str, timeout: std::time::Duration) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n").map(|x| x.1.to_string()).unwrap_or_default()))
}

/// The agent's debug build, built first unless `NODE_AGENT_TEST_BINARY` names
/// one (the kernel matrix's guests, which see the tree read-only and have
/// no cargo to run, are given the one the host built).
pub fn agent_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("NODE_AGENT_TEST_BINARY") {
        return PathBuf::from(bin);
    }
    let status = std::process::Command::new(env!("CARGO")).args(["build", "-q", "-p", "node-agent", "--bin", "node-agent"]).status();
    assert!(status.is_ok_and(|s| s.success()), "cargo build -p node-agent failed");
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().and_then(|d| d.parent()).map(|d| d.join("node-agent")).unwrap_or_default()
}

/// The flags pointing node-agent at a node_exporter fixture tree in `root`
/// (procfs, sysfs, rootfs, udev data, the textfile directory) with CPU
/// info on, as the conformance test and the fuzzers run it.
pub fn fixture_flags(root: &Path, textfile: &Path) -> Vec<String> {
    let p = |s: &str| root.join(s).display().to_string();
    vec![
        "node-agent".to_string(),
        format!("--path.procfs={}", p("proc")),
        format!("--path.sysfs={}", p("sys")),
        format!("--path.rootfs={}", root.display()),
        format!("--path.udev.data={}", p("udev/data")),
        format!("--collector.textfile.directory={}", textfile.display()),
        "--collector.cpu.info".into(),
    ]
}

/// A `kB` field of /proc/PID/status (`pid` "self" for this process), e.g.
/// VmRSS or VmHWM; 0 when unreadable.
pub fn status_kb(pid: &str, field: &str) -> u64 {
    let key = format!("{field}:");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key.as_str()).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0)
}

/// A child process killed and reaped when dropped.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The node_exporter conformance fixtures, from `../shared` beside the
/// repository (or `NODE_AGENT_CONFORMANCE_DIR`). Outside CI their absence is a
/// skip with a message; in CI (`CI` set) it is a failure.
pub fn conformance_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("NODE_AGENT_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/node_exporter"));
    if dir.join("e2e-output.txt").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!("conformance fixtures missing at {} (they must be present in CI)", dir.display());
    }
    eprintln!("SKIP: node_exporter conformance fixtures not found at {}", dir.display());
    None
}

/// The empty directories of node_exporter's fixture archives
/// (`collector/fixtures/sys.ttar`, 1.12.1), which the copy in `../shared`
/// lost (an empty directory does not survive it): dmmultipath's `slaves/`
/// entries, a watchdog without attributes, nvme's `holders/`, ….
const EMPTY_DIRS: &[&str] = &[
    "sys/block/dm-5/slaves/sdi",
    "sys/block/dm-5/slaves/sdj",
    "sys/block/dm-5/slaves/sdk",
    "sys/block/dm-5/slaves/sdl",
    "sys/block/dm-6/slaves/sdm",
    "sys/block/dm-6/slaves/sdn",
    "sys/class/nvme-subsystem/nvme-subsys0/nvme0n1",
    "sys/class/watchdog/watchdog1",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/link",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/holders",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/0/cpu0",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/0/cpu1",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/1/cpu2",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/1/cpu3",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/2/cpu4",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/2/cpu5",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/3/cpu6",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/3/cpu7",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/4/cpu8",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/4/cpu9",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/5/cpu10",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/5/cpu11",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/6/cpu12",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/6/cpu13",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/7/cpu14",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/mq/7/cpu15",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/nvme0n1p1/holders",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/nvme0n1p2/holders",
    "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0/nvme/nvme0/nvme0n1/slaves",
    "sys/devices/pci0000:00/0000:00:02.1/link",
    "sys/devices/pci0000:40/0000:40:01.3/0000:45:00.0/link",
];

/// The symbolic links of a fixture tree [`materialize`] made: those that
/// arrived as links (copied as they were), and those that the text-archive
/// extraction had flattened into small files holding their target path
/// (restored). Fixtures come either way, or mixed; the collectors need the
/// links whichever way they came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Materialized {
    pub copied: usize,
    pub restored: usize,
}

impl Materialized {
    /// Every symbolic link of the materialized tree.
    pub fn links(&self) -> usize {
        self.copied + self.restored
    }
}

/// Copies a fixture tree, with its symbolic links: those it has are copied
/// as links, those the text-archive extraction flattened into small files
/// holding their target path are restored, and the empty directories it
/// lost ([`EMPTY_DIRS`]) are made again.
pub fn materialize(src: &Path, dst: &Path) -> io::Result<Materialized> {
    let mut made = Materialized::default();
    copy_tree(src, dst, &mut made.copied)?;
    for d in EMPTY_DIRS {
        // Fixtures with their links and empty directories have them already.
        if fs::symlink_metadata(dst.join(d)).is_err() {
            fs::create_dir_all(dst.join(d))?;
        }
    }
    restore_links(dst, &mut made.restored)?;
    Ok(made)
}

fn copy_tree(src: &Path, dst: &Path, links: &mut usize) -> io::Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_tree(&e.path(), &to, links)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(e.path())?, &to)?;
            *links += 1;
        } else {
            fs::copy(e.path(), &to)?;
            let mut perm = fs::metadata(&to)?.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perm.set_readonly(false);
            fs::set_permissions(&to, perm)?;
        }
    }
    Ok(())
}

/// A flattened link: a small file whose whole content is a relative path to
/// an existing entry (containing a `/`, or naming a sibling directory).
fn link_target(file: &Path) -> Option<String> {
    let meta = fs::metadata(file).ok()?;
    if meta.len() == 0 || meta.len() > 512 {
        return None;
    }
    let content = fs::read_to_string(file).ok()?;
    let t = content.trim_end_matches('\n');
    if t.is_empty() || t.contains(char::is_whitespace) || t.starts_with('/') {
        return None;
    }
    let target = file.parent()?.join(t.trim_end_matches('/'));
    let exists = if t.contains('/') { target.exists() } else { target.is_dir() };
    exists.then(|| t.trim_end_matches('/').to_string())
}

fn restore_links(dir: &Path, restored: &mut usize) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            restore_links(&e.path(), restored)?;
        } else if ft.is_file() {
            if let Some(t) = link_target(&e.path()) {
                fs::remove_file(e.path())?;
                std::os::unix::fs::symlink(t, e.path())?;
                *restored += 1;
            }
        }
    }
    Ok(())
}

/// The samples of `name` in a text exposition, as (labels, value).
pub fn samples(text: &str, name: &str) -> Vec<(std::collections::BTreeMap<String, String>, f64)> {
    expo::text::parse(text)
        .expect("exposition parses")
        .into_iter()
        .flat_map(|f| f.samples)
        .filter(|s| s.name == name)
        .map(|s| (s.labels.into_iter().collect(), s.value))
        .collect()
}

/// The series an exposition in `format` holds more than once (a name and
/// label set, labels in any order), each as `name{labels}`; for the
/// protobuf format also the family names sent more than once. An
/// exposition with any is invalid: Prometheus counts or drops them.
pub fn duplicate_series(format: expo::Format, body: &[u8]) -> Vec<String> {
    use std::collections::BTreeSet;
    let mut seen = BTreeSet::new();
    let mut dups = Vec::new();
    let mut note = |name: &str, mut labels: Vec<(String, String)>| {
        labels.sort();
        let key = format!("{name}{{{}}}", labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(","));
        if !seen.insert(key.clone()) {
            dups.push(key);
        }
    };
    match format {
        expo::Format::Protobuf => {
            let families = expo::proto::read_delimited(body).expect("a protobuf exposition");
            let mut names = BTreeSet::new();
            let mut twice = Vec::new();
            for f in families {
                let name = f.name.clone().unwrap_or_default();
                if !names.insert(name.clone()) {
                    twice.push(format!("family {name}"));
                }
                for m in &f.metric {
                    note(
                        &name,
                        m.label.iter().map(|l| (l.name.clone().unwrap_or_default(), l.value.clone().unwrap_or_default())).collect(),
                    );
                }
            }
            dups.extend(twice);
        }
        _ => {
            let text = std::str::from_utf8(body).expect("utf-8");
            for (i, line) in text.lines().enumerate() {
                if line.starts_with('#') {
                    continue;
                }
                if let Ok(expo::text::Line::Sample(s)) = expo::text::parse_line(line, i + 1) {
                    note(s.name, s.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
                }
            }
        }
    }
    dups
}
