//! Network namespaces of a test's own (`ip netns add`), configured with
//! iproute2, entered by one thread; and a sysfs of such a namespace.

use std::os::fd::AsRawFd;
use std::process::Command;

use host::Paths;

/// A named network namespace, deleted when dropped.
pub struct Netns(pub String);

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("na-{tag}-{}", std::process::id());
        // A leftover of an earlier run with this pid; usually absent.
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(std::process::Stdio::null()).status();
        ip(&["netns", "add", &name]);
        Netns(name)
    }

    /// Runs `ip -n <ns> args`.
    pub fn ip(&self, args: &[&str]) {
        let mut v = vec!["-n", &self.0];
        v.extend_from_slice(args);
        ip(&v);
    }

    /// Runs `ip -n <ns> -batch -` over `lines`, one command each.
    pub fn batch(&self, lines: &str) {
        use std::io::Write;
        let mut child =
            Command::new("ip").args(["-n", &self.0, "-batch", "-"]).stdin(std::process::Stdio::piped()).spawn().expect("run ip (iproute2)");
        child.stdin.take().expect("stdin").write_all(lines.as_bytes()).expect("write batch");
        assert!(child.wait().expect("ip -batch").success(), "ip -batch failed");
    }

    /// Waits (up to 10 s) until `dev`'s operational state is up: the
    /// kernel sets it from the carrier in its link-watch work, which runs
    /// after `ip link set up` returns (up to a second later, later still on
    /// a loaded machine). Panics, naming the state seen, when it never is.
    pub fn wait_until_up(&self, dev: &str) {
        let mut seen = String::new();
        for _ in 0..200 {
            let out = Command::new("ip").args(["-n", &self.0, "-o", "link", "show", "dev", dev]).output().expect("run ip (iproute2)");
            seen = String::from_utf8_lossy(&out.stdout).into_owned();
            if seen.contains(" state UP ") {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("{dev} in {} never came up: {seen}", self.0);
    }

    /// Runs `f` on a thread that has joined the namespace, with /proc paths
    /// of that thread (so /proc/net is the namespace's).
    pub fn run<T: Send>(&self, f: impl FnOnce(&Paths) -> T + Send) -> T {
        let file = std::fs::File::open(format!("/run/netns/{}", self.0)).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: setns on a valid namespace fd; it changes the
                // namespace of this thread only (CLONE_NEWNET), which the
                // scope joins before returning.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                let paths = Paths {
                    procfs: "/proc/thread-self".into(),
                    sysfs: "/sys".into(),
                    rootfs: "/".into(),
                    udev_data: "/run/udev/data".into(),
                };
                f(&paths)
            })
            .join()
            .expect("netns thread")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `ip args`; panics when it fails (test support).
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Mounts a sysfs of the calling thread's network namespace at `dir`
/// (sysfs shows the devices of its mounter's namespace); unmounted when
/// dropped.
pub struct SysfsMount(std::path::PathBuf);

impl SysfsMount {
    pub fn new(dir: &std::path::Path) -> SysfsMount {
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (src, target, fstype) = (c("sysfs"), c(dir.to_str().expect("utf-8 path")), c("sysfs"));
        // SAFETY: valid NUL-terminated strings that outlive the call; no data.
        let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
        assert_eq!(rc, 0, "mount sysfs: {}", std::io::Error::last_os_error());
        SysfsMount(dir.to_path_buf())
    }
}

impl Drop for SysfsMount {
    fn drop(&mut self) {
        if let Ok(t) = std::ffi::CString::new(self.0.to_string_lossy().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Two network namespaces joined by a path with a known delay, made
/// without netem (this kernel has none): each has a TUN device, `tun0`
/// (10.77.0.1/24 in `a`, 10.77.0.2/24 in `b`), and threads of the test
/// relay every packet from one device to the other, holding those from `a`
/// to `b` for `a_to_b` and those back for `b_to_a`. A round trip between
/// the two therefore takes the two delays plus the relay's own few
/// microseconds.
pub struct DelayLink {
    pub a: Netns,
    pub b: Netns,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `/dev/net/tun` as `tun0` of the namespace the calling thread is in.
fn open_tun() -> std::fs::File {
    let f = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").expect("open /dev/net/tun");
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short, _pad: [0; 22] };
    req.name[..4].copy_from_slice(b"tun0");
    // SAFETY: TUNSETIFF reads a `struct ifreq`, which `req` is laid out as,
    // from a valid pointer on an open tun fd.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    f
}

/// Relays packets from `from` to `to`, each `delay` after it was read,
/// until `stop`.
fn relay(
    from: std::fs::File,
    to: std::fs::File,
    delay: std::time::Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> [std::thread::JoinHandle<()>; 2] {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let stop2 = std::sync::Arc::clone(&stop);
    let reader = std::thread::spawn(move || {
        let mut from = from;
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 20) } <= 0 {
                continue;
            }
            match from.read(&mut buf) {
                Ok(n) if n > 0 => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let writer = std::thread::spawn(move || {
        let mut to = to;
        while !stop2.load(Ordering::Relaxed) {
            let Ok((due, pkt)) = rx.recv_timeout(std::time::Duration::from_millis(20)) else { continue };
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let _ = to.write(&pkt);
        }
    });
    [reader, writer]
}

impl DelayLink {
    pub fn new(tag: &str, a_to_b: std::time::Duration, b_to_a: std::time::Duration) -> DelayLink {
        let (a, b) = (Netns::new(&format!("{tag}a")), Netns::new(&format!("{tag}b")));
        let (ta, tb) = (a.run(|_| open_tun()), b.run(|_| open_tun()));
        a.batch("link set lo up\naddr add 10.77.0.1/24 dev tun0\nlink set tun0 up\n");
        b.batch("link set lo up\naddr add 10.77.0.2/24 dev tun0\nlink set tun0 up\n");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ta2, tb2) = (ta.try_clone().expect("dup tun"), tb.try_clone().expect("dup tun"));
        let mut threads = Vec::new();
        threads.extend(relay(ta, tb2, a_to_b, std::sync::Arc::clone(&stop)));
        threads.extend(relay(tb, ta2, b_to_a, std::sync::Arc::clone(&stop)));
        DelayLink { a, b, stop, threads }
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The inode of a network namespace behind an `ns/net` link (`net:[N]`).
fn link_inode(link: &std::path::Path) -> Option<u64> {
    let t = std::fs::read_link(link).ok()?;
    t.to_str()?.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The inode of the calling thread's network namespace.
pub fn current_inode() -> u64 {
    link_inode(std::path::Path::new("/proc/thread-self/ns/net")).expect("the thread's network namespace")
}

impl Netns {
    /// The namespace's inode, as [`AllNetns`] keys it.
    pub fn inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/run/netns/{}", self.0)).expect("the namespace's mount").ino()
    }
}

/// What a truth test reads of one network namespace: its counters
/// (/proc/net/snmp and /proc/net/netstat as `Tcp:ActiveOpens`,
/// `TcpExt:TCPRetransFail`; /proc/net/snmp6 under its own names,
/// `Ip6InDelivers`) and, read after them when asked for, its TCP sockets by
/// state (the tcp and tcp6 tables: 1 ESTABLISHED, 2 SYN_SENT, 3 SYN_RECV,
/// …) and the drops each of its raw sockets counted, by socket inode (the
/// raw and raw6 tables).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub counters: std::collections::BTreeMap<String, u64>,
    pub tcp_states: [u64; 16],
    pub raw_drops: std::collections::BTreeMap<u64, u64>,
}

impl NetStats {
    /// The namespace whose procfs `net` directory is `net`
    /// (`/proc/PID/task/TID/net`, `/proc/thread-self/net`); None when it
    /// cannot be read (the task is gone).
    pub fn read(net: &std::path::Path, sockets: bool) -> Option<NetStats> {
        let mut s = NetStats::default();
        for file in ["snmp", "netstat"] {
            let text = std::fs::read_to_string(net.join(file)).ok()?;
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let (Some((table, names)), Some((_, values))) = (names.split_once(':'), values.split_once(':')) else { continue };
                for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                    if let Ok(v) = v.parse() {
                        s.counters.insert(format!("{table}:{n}"), v);
                    }
                }
            }
        }
        // No IPv6 in the kernel: no snmp6, nothing counted there.
        for line in std::fs::read_to_string(net.join("snmp6")).unwrap_or_default().lines() {
            if let Some((n, v)) = line.split_once(char::is_whitespace) {
                if let Ok(v) = v.trim().parse() {
                    s.counters.insert(n.to_string(), v);
                }
            }
        }
        if sockets {
            for table in ["tcp", "tcp6"] {
                for line in std::fs::read_to_string(net.join(table)).unwrap_or_default().lines().skip(1) {
                    if let Some(st) = line.split_whitespace().nth(3).and_then(|h| usize::from_str_radix(h, 16).ok()) {
                        s.tcp_states[st.min(15)] += 1;
                    }
                }
            }
            for table in ["raw", "raw6"] {
                for line in std::fs::read_to_string(net.join(table)).unwrap_or_default().lines().skip(1) {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if let (Some(Ok(inode)), Some(Ok(drops))) = (f.get(9).map(|v| v.parse()), f.last().map(|v| v.parse())) {
                        s.raw_drops.insert(inode, drops);
                    }
                }
            }
        }
        Some(s)
    }

    /// A counter (`Tcp:ActiveOpens`, `Ip6InDelivers`); 0 when absent.
    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// How much `name` rose since `before`: all of it when it went down
    /// (another namespace has the inode now; this one counted from 0).
    pub fn since(&self, before: &NetStats, name: &str) -> u64 {
        rise(before.get(name), self.get(name))
    }

    /// The drops of the raw sockets open now since `before` (all of a
    /// socket's that opened since). A raw socket that closed in between
    /// took what it counted with it.
    pub fn raw_drops_since(&self, before: &NetStats) -> u64 {
        self.raw_drops.iter().map(|(inode, d)| rise(before.raw_drops.get(inode).copied().unwrap_or(0), *d)).sum()
    }
}

/// A counter's rise from `b` to `a`, all of `a` when it went down (it
/// started again from 0).
fn rise(b: u64, a: u64) -> u64 {
    if a >= b {
        a - b
    } else {
        a
    }
}

/// Every network namespace of the machine that can be reached now, by
/// inode: those some task is in (each task's `ns/net`, read through
/// /proc/PID/task/TID/net), and those only mounted (`ip netns add`'s, a
/// container runtime's: nsfs mounts in /proc/self/mountinfo), read by a
/// thread that joins them. A namespace neither a task nor a mount holds has
/// no process to send or receive in it.
pub struct AllNetns(pub std::collections::BTreeMap<u64, NetStats>);

impl AllNetns {
    pub fn read(sockets: bool) -> AllNetns {
        let mut all = std::collections::BTreeMap::new();
        for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else { continue };
            for t in tasks.flatten() {
                let Some(ino) = link_inode(&t.path().join("ns/net")) else { continue };
                if let std::collections::btree_map::Entry::Vacant(e) = all.entry(ino) {
                    // A task that exits meanwhile: another of the namespace's may serve.
                    if let Some(s) = NetStats::read(&t.path().join("net"), sockets) {
                        e.insert(s);
                    }
                }
            }
        }
        for (ino, mount) in netns_mounts() {
            if all.contains_key(&ino) {
                continue;
            }
            let Ok(file) = std::fs::File::open(&mount) else { continue };
            let read = std::thread::spawn(move || {
                // SAFETY: setns on a valid namespace fd; it changes the
                // namespace of this thread only, which ends right after.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return None;
                }
                NetStats::read(std::path::Path::new("/proc/thread-self/net"), sockets)
            });
            if let Ok(Some(s)) = read.join() {
                all.insert(ino, s);
            }
        }
        AllNetns(all)
    }

    /// Σ over the namespaces of `after` (read later) but those in
    /// `exclude` of `f(before, after)`, `before` being the same namespace
    /// in `self`, or all zeros for one that appeared since (everything it
    /// counted is then since); and how many of `self`'s namespaces (but
    /// `exclude`) are gone: what they counted in between is unknown.
    pub fn others(&self, after: &AllNetns, exclude: &[u64], f: impl Fn(&NetStats, &NetStats) -> u64) -> (u64, usize) {
        let zero = NetStats::default();
        let sum = after.0.iter().filter(|(ino, _)| !exclude.contains(ino)).map(|(ino, a)| f(self.0.get(ino).unwrap_or(&zero), a)).sum();
        let gone = self.0.keys().filter(|ino| !exclude.contains(ino) && !after.0.contains_key(ino)).count();
        (sum, gone)
    }
}

/// The network namespaces mounted in this mount namespace: (inode, path).
fn netns_mounts() -> Vec<(u64, std::path::PathBuf)> {
    let unescape = |s: &str| {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let oct = b.get(i + 1..i + 4).and_then(|d| std::str::from_utf8(d).ok()).and_then(|d| u8::from_str_radix(d, 8).ok());
            match (b[i], oct) {
                (b'\\', Some(c)) => {
                    out.push(c);
                    i += 4;
                }
                (c, _) => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        std::path::PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            if f.get(sep + 1) != Some(&"nsfs") {
                return None;
            }
            let ino = f.get(3)?.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()?;
            Some((ino, unescape(f.get(4)?)))
        })
        .collect()
}
