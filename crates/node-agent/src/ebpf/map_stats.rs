//! The eBPF maps' own figures, for every map of the loaded object (a
//! fixed set: the names in `agent_common::MAPS` and the object's global
//! sections, 23 today; aya-log's ring buffer, 29 kB, is held by the logger
//! and not among them): `node_ebpf_map_max_entries`,
//! `node_ebpf_map_memory_bytes` (the kernel's `memlock` figure from the
//! map's `/proc/self/fdinfo` entry: read at each scrape for the maps that
//! allocate entries as they come, whose figure follows them, and once for
//! the others, whose figure is fixed when they are made) and, for the small
//! hash maps, `node_ebpf_map_entries` and its high-water mark
//! `node_ebpf_map_entries_max`.
//!
//! Entries are counted by walking the keys (one bpf(2) call per entry), or
//! taken from the count the map's own collector made reading it whole since
//! the last scrape ([`MapStats::note_entries`]), and only for hash maps of
//! at most [`COUNTED_MAX_ENTRIES`] entries
//! (`POD_STATS`, `BIO_HIST`: about 2.5 µs a key measured on the 2-CPU test
//! machine, so 13 ms for both maps full and microseconds for the tens of
//! entries they usually hold; their probes read them whole at every scrape
//! anyway, with a lookup per key more). The maps of in-flight state (up to
//! 65,536 entries) are not walked: that would cost what reading them whole
//! at every scrape does. Their memory is sized for the node instead: the
//! hash maps are not preallocated (`memlock` follows their entries),
//! the LRU ones are sized at load ([`sized`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use aya::Ebpf;
use expo::{Kind, Sink};

/// `demand` within [`floor`, `cap`]: the entries of an LRU map of in-flight
/// state sized for this node (the floor leaves a small node room, and the
/// kernel's LRU lists, which each CPU fills in batches, enough entries; the
/// cap is the size the object declares).
pub fn sized(demand: u64, floor: u32, cap: u32) -> u32 {
    demand.clamp(u64::from(floor), u64::from(cap)) as u32
}

/// The CPUs the kernel may bring online (the per-CPU structures' count).
pub fn possible_cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.max(1) as u64
}

/// The threads on the node now: the fourth field of /proc/loadavg
/// (`running/total`; not namespaced).
pub fn parse_loadavg_threads(text: &str) -> Option<u64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

/// The threads on the node now, from `procfs`'s loadavg; 0 when unreadable.
pub fn node_threads(procfs: &std::path::Path) -> u64 {
    std::fs::read_to_string(procfs.join("loadavg")).ok().and_then(|t| parse_loadavg_threads(&t)).unwrap_or(0)
}

/// Requests the node's block devices can have in flight: each request
/// queue's `nr_requests` times its hardware queues (`mq/` entries; one
/// where there is no `mq/`), summed. Bio-based devices (no `nr_requests`)
/// issue no requests.
pub fn block_requests(sys_block: &std::path::Path) -> u64 {
    let Ok(devices) = std::fs::read_dir(sys_block) else { return 0 };
    devices
        .filter_map(Result::ok)
        .filter_map(|d| {
            let depth: u64 = std::fs::read_to_string(d.path().join("queue/nr_requests")).ok()?.trim().parse().ok()?;
            let queues = std::fs::read_dir(d.path().join("mq")).map(|q| q.count() as u64).unwrap_or(1).max(1);
            Some(depth * queues)
        })
        .sum()
}

/// Hash maps up to this size have their entries counted at each scrape.
pub const COUNTED_MAX_ENTRIES: u32 = 4096;

/// What a BPF map's fdinfo says of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdInfo {
    pub map_type: u32,
    pub key_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    /// Bytes the kernel charges for the map (`memlock`; since Linux 6.4
    /// what the map uses, before an estimate from its sizes).
    pub memlock: u64,
}

/// Parses `/proc/<pid>/fdinfo/<fd>` of a BPF map; None when it is not one.
pub fn parse_fdinfo(text: &str) -> Option<FdInfo> {
    let mut info = FdInfo::default();
    let mut seen = (false, false);
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        let num = |v: &str| -> Option<u64> {
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            }
        };
        match k {
            "map_type" => {
                info.map_type = num(v)? as u32;
                seen.0 = true;
            }
            "key_size" => info.key_size = num(v)? as u32,
            "max_entries" => info.max_entries = num(v)? as u32,
            "map_flags" => info.map_flags = num(v)? as u32,
            "memlock" => {
                info.memlock = num(v)?;
                seen.1 = true;
            }
            _ => {}
        }
    }
    (seen.0 && seen.1).then_some(info)
}

/// The kernel's map types whose entries may be walked here (hash, per-CPU hash).
const HASH: u32 = 1;
const PERCPU_HASH: u32 = 5;

/// The number of keys of the map `fd` (key size `key_size`), walking them
/// with BPF_MAP_GET_NEXT_KEY; None on an error. Stops after `limit`.
fn count_keys(fd: i32, key_size: u32, limit: u32) -> Option<u64> {
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
    }
    let size = key_size as usize;
    if size == 0 || size > 64 {
        return None;
    }
    let mut bufs = [[0u8; 64]; 2];
    let mut n = 0u64;
    let mut have_key = false;
    while n <= u64::from(limit) {
        let (cur, next) = bufs.split_at_mut(1);
        let mut attr = Attr {
            map_fd: fd as u32,
            _pad: 0,
            key: if have_key { cur[0].as_ptr() as u64 } else { 0 },
            next_key: next[0].as_mut_ptr() as u64,
        };
        // SAFETY: BPF_MAP_GET_NEXT_KEY (4) reads key_size bytes at `key`
        // (or none when it is NULL) and writes key_size bytes at
        // `next_key`; both buffers are 64 bytes and outlive the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, 4, &mut attr as *mut Attr, std::mem::size_of::<Attr>()) };
        if rc != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            return (errno == Some(libc::ENOENT)).then_some(n);
        }
        n += 1;
        have_key = true;
        bufs.swap(0, 1);
    }
    Some(n)
}

/// `BPF_F_NO_PREALLOC`: the map allocates its entries as they come, and its
/// `memlock` follows them.
const NO_PREALLOC: u32 = 1;

/// Whether the map's fdinfo figures stay as they were at load: everything
/// but `memlock` always does, and `memlock` too unless the map allocates
/// its entries as they come (hash maps, tries and local storage with
/// `BPF_F_NO_PREALLOC`). Preallocated maps, arrays and ring buffers are
/// charged their whole size when they are made.
pub fn fixed(info: &FdInfo) -> bool {
    info.map_flags & NO_PREALLOC == 0
}

/// What the scrapes keep of the maps: the high-water marks of the counted
/// maps, and the fdinfo of the maps whose figures never change (read once,
/// so a scrape reads the fdinfo of the maps that grow only).
#[derive(Default)]
pub struct MapStats {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    entries_max: BTreeMap<String, u64>,
    fixed: BTreeMap<String, FdInfo>,
    /// The maps whose figures change: their fdinfo is kept open.
    growing: std::collections::BTreeSet<String>,
    /// Entries a collector counted reading a map whole since the last
    /// write ([`MapStats::note_entries`]), taken by the next write.
    noted: BTreeMap<&'static str, u64>,
}

/// The fdinfo of the map `fd`, read now. A map whose figures change
/// (`keep`: one without preallocation, found so at its first read) has its
/// fdinfo kept open across scrapes (`host::io`'s kept procfs files, within
/// their one descriptor budget): one pread where an open, a size probe,
/// reads and a close were. procfs looks the descriptor up at each read, so
/// a kept file always shows the map that has it now.
fn read_fdinfo(fd: i32, buf: &mut Vec<u8>, keep: bool) -> Option<FdInfo> {
    let path = format!("/proc/self/fdinfo/{fd}");
    if keep {
        host::io::read_into(std::path::Path::new(&path), buf).ok()?;
    } else {
        buf.clear();
        std::io::Read::read_to_end(&mut host::io::open_nonblocking(std::path::Path::new(&path)).ok()?, buf).ok()?;
    }
    parse_fdinfo(std::str::from_utf8(buf).ok()?)
}

impl MapStats {
    /// Notes the entries of `map` that a collector just read whole (its
    /// probe's own read of the map, at its scrape), so that the next
    /// [`MapStats::write`] takes this count instead of walking the map's
    /// keys again: the same figure, at half the bpf(2) calls. The count is
    /// at most one scrape older than a walk would be (the collectors of one
    /// scrape run side by side); a map nobody noted is walked.
    pub fn note_entries(&self, map: &'static str, entries: u64) {
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).noted.insert(map, entries);
    }

    /// Writes the families for every map of `ebpf`.
    pub fn write(&self, ebpf: &Ebpf, sink: &mut Sink) {
        let mut maps: Vec<(&str, i32)> = ebpf.maps().filter_map(|(name, m)| Some((name, crate::ebpf::maps::raw_fd(m)?))).collect();
        maps.sort_unstable();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut text = Vec::new();
        for (name, fd) in maps {
            let info = match kept.fixed.get(name) {
                Some(info) => *info,
                None => {
                    let Some(info) = read_fdinfo(fd, &mut text, kept.growing.contains(name)) else { continue };
                    if fixed(&info) {
                        kept.fixed.insert(name.to_string(), info);
                    } else if !kept.growing.contains(name) {
                        kept.growing.insert(name.to_string());
                    }
                    info
                }
            };
            let labels = [("map", name)];
            sink.family(
                "node_ebpf_map_max_entries",
                "The eBPF map's capacity in entries (label map: the object's map names, at most 48).",
                Kind::Gauge,
            )
            .sample(&labels, f64::from(info.max_entries));
            sink.family(
                "node_ebpf_map_memory_bytes",
                "Memory the kernel charges for the eBPF map (memlock in its fdinfo; label map: the object's map names, at most 48).",
                Kind::Gauge,
            )
            .sample(&labels, info.memlock as f64);
            if !matches!(info.map_type, HASH | PERCPU_HASH) || info.max_entries > COUNTED_MAX_ENTRIES {
                continue;
            }
            let noted = kept.noted.remove(name);
            let Some(n) = noted.or_else(|| count_keys(fd, info.key_size, info.max_entries)) else { continue };
            let max = kept.entries_max.entry(name.to_string()).or_default();
            *max = (*max).max(n);
            sink.family(
                "node_ebpf_map_entries",
                "Entries in the eBPF hash map, counted at the scrape (only maps of at most 4096 entries; label map: the object's map names, at most 48).",
                Kind::Gauge,
            )
            .sample(&labels, n as f64);
            sink.family(
                "node_ebpf_map_entries_max",
                "The most entries node_ebpf_map_entries has seen in the eBPF hash map since the agent started.",
                Kind::Gauge,
            )
            .sample(&labels, *max as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_of_a_map_parses() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2061\nmap_type:\t1\nkey_size:\t8\nvalue_size:\t16\n\
                    max_entries:\t65536\nmap_flags:\t0x1\nmap_extra:\t0x0\nmemlock:\t1050368\nmap_id:\t42\nfrozen:\t0\n";
        assert_eq!(parse_fdinfo(text), Some(FdInfo { map_type: 1, key_size: 8, max_entries: 65536, map_flags: 1, memlock: 1050368 }));
    }

    #[test]
    fn only_maps_allocating_as_they_go_are_read_again() {
        let info = |map_type, map_flags| FdInfo { map_type, key_size: 8, max_entries: 1024, map_flags, memlock: 4096 };
        assert!(!fixed(&info(HASH, NO_PREALLOC)), "a hash map without preallocation grows");
        assert!(!fixed(&info(PERCPU_HASH, NO_PREALLOC | 0x80)), "whatever other flags it has");
        assert!(fixed(&info(HASH, 0)), "a preallocated hash map is charged whole at once");
        assert!(fixed(&info(9, 0)), "so is an LRU map");
        assert!(fixed(&info(6, 0)) && fixed(&info(2, 0x80)), "and arrays, read-only or not");
    }

    #[test]
    fn sizes_are_bounded() {
        assert_eq!(sized(10, 4096, 32768), 4096, "a small node gets the floor");
        assert_eq!(sized(20_000, 4096, 32768), 20_000);
        assert_eq!(sized(1 << 40, 4096, 32768), 32768, "never above the object's size");
    }

    #[test]
    fn loadavg_threads() {
        assert_eq!(parse_loadavg_threads("0.52 0.58 0.59 3/291 29535\n"), Some(291));
        assert_eq!(parse_loadavg_threads("0.52 0.58"), None);
    }

    #[test]
    fn block_requests_are_depth_times_queues() {
        let tmp = std::env::temp_dir().join(format!("node-agent-block-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        for (dev, depth, queues) in [("vda", Some("256\n"), 2), ("loop0", Some("128\n"), 0), ("zram0", None, 0)] {
            std::fs::create_dir_all(tmp.join(dev).join("queue")).expect("mkdir");
            if let Some(d) = depth {
                std::fs::write(tmp.join(dev).join("queue/nr_requests"), d).expect("write");
            }
            for q in 0..queues {
                std::fs::create_dir_all(tmp.join(dev).join(format!("mq/{q}"))).expect("mkdir");
            }
        }
        assert_eq!(block_requests(&tmp), 256 * 2 + 128);
        assert_eq!(block_requests(&tmp.join("none")), 0);
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn fdinfo_of_something_else_is_none() {
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1\n"), None);
        assert_eq!(parse_fdinfo("prog_type:\t17\nmemlock:\t4096\n"), None, "a program, not a map");
        assert_eq!(parse_fdinfo("map_type:\tx\nmemlock:\t4096\n"), None);
    }
}
