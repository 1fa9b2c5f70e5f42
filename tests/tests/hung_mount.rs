//! A mount whose statfs never returns: a real FUSE filesystem, served by a
//! minimal FUSE server in this test (it answers INIT and holds every STATFS
//! until told to answer). The scrape returns within the mount timeout with
//! `node_filesystem_device_error{device_error="mountpoint timeout"} 1`, later
//! scrapes skip the mount without waiting, the mount is reported again once
//! its statfs answers, and 1,000 scrapes leak no thread and no fd.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use expo::Format;
use host::scrape::Selection;

const FUSE_INIT: u32 = 26;
const FUSE_STATFS: u32 = 17;
const FUSE_FORGET: u32 = 2;
const FUSE_BATCH_FORGET: u32 = 42;
const FUSE_DESTROY: u32 = 38;

fn reply(dev: &mut std::fs::File, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&error.to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out.extend_from_slice(body);
    let _ = dev.write_all(&out);
}

fn statfs_body() -> Vec<u8> {
    let mut b = Vec::new();
    for v in [1000u64, 500, 400, 100, 50] {
        b.extend_from_slice(&v.to_le_bytes()); // blocks, bfree, bavail, files, ffree
    }
    for v in [4096u32, 255, 4096, 0] {
        b.extend_from_slice(&v.to_le_bytes()); // bsize, namelen, frsize, padding
    }
    b.extend_from_slice(&[0u8; 24]); // spare
    b
}

struct Fuse {
    mountpoint: std::path::PathBuf,
    answer: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<u64>>>,
    dev: std::fs::File,
}

impl Fuse {
    /// Mounts a FUSE filesystem at `mountpoint`, served on a thread.
    fn mount(mountpoint: &std::path::Path) -> Option<Fuse> {
        let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").ok()?;
        let src = CString::new("node-agent-test").ok()?;
        let target = CString::new(mountpoint.as_os_str().as_encoded_bytes()).ok()?;
        let fstype = CString::new("fuse.hang").ok()?;
        let data = CString::new(format!("fd={},rootmode=40000,user_id=0,group_id=0", dev.as_raw_fd())).ok()?;
        // SAFETY: valid NUL-terminated strings; mount(2) copies them.
        let rc =
            unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), libc::MS_NOSUID | libc::MS_NODEV, data.as_ptr().cast()) };
        if rc != 0 {
            eprintln!("mount fuse: {}", std::io::Error::last_os_error());
            return None;
        }
        let answer = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        // SAFETY: dup(2) of an fd we own; the new fd is owned by the File.
        let mut reader = unsafe { std::fs::File::from_raw_fd(libc::dup(dev.as_raw_fd())) };
        let (a, h) = (Arc::clone(&answer), Arc::clone(&held));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match reader.read(&mut buf) {
                    Ok(n) if n >= 40 => {}
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return, // unmounted
                };
                let opcode = u32::from_le_bytes(buf[4..8].try_into().unwrap_or_default());
                let unique = u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
                match opcode {
                    FUSE_INIT => {
                        let mut init = Vec::new();
                        init.extend_from_slice(&7u32.to_le_bytes()); // major
                        init.extend_from_slice(&31u32.to_le_bytes()); // minor
                        init.extend_from_slice(&0u32.to_le_bytes()); // max_readahead
                        init.extend_from_slice(&0u32.to_le_bytes()); // flags
                        init.extend_from_slice(&16u16.to_le_bytes()); // max_background
                        init.extend_from_slice(&16u16.to_le_bytes()); // congestion_threshold
                        init.extend_from_slice(&4096u32.to_le_bytes()); // max_write
                        init.extend_from_slice(&1u32.to_le_bytes()); // time_gran
                        init.extend_from_slice(&[0u8; 32]); // max_pages, map_alignment, flags2, unused
                        reply(&mut reader, unique, 0, &init);
                    }
                    FUSE_STATFS if a.load(Ordering::SeqCst) => reply(&mut reader, unique, 0, &statfs_body()),
                    FUSE_STATFS => h.lock().map(|mut v| v.push(unique)).unwrap_or(()),
                    FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_DESTROY => {}
                    _ => reply(&mut reader, unique, -libc::ENOSYS, &[]),
                }
            }
        });
        Some(Fuse { mountpoint: mountpoint.to_path_buf(), answer, held, dev })
    }

    /// Answers the held statfs calls and every later one.
    fn release(&mut self) {
        self.answer.store(true, Ordering::SeqCst);
        let held: Vec<u64> = self.held.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
        for unique in held {
            reply(&mut self.dev, unique, 0, &statfs_body());
        }
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        self.release();
        if let Ok(t) = CString::new(self.mountpoint.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid path; a lazy unmount of our own mount.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_hung_fuse_mount_is_reported_skipped_and_recovered_without_leaks() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with /dev/fuse");
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("hang");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut fuse = Fuse::mount(&mnt).expect("a FUSE mount (root, /dev/fuse)");
    let label = mnt.display().to_string();
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent".to_string(),
            "--collector.disable-defaults".into(),
            "--collector.filesystem".into(),
            "--collector.filesystem.mount-timeout=1s".into(),
            format!("--collector.filesystem.mount-points-include=^{}$", regex::escape(&label)),
        ])
        .expect("flags");
    let cfg = node_agent::config::resolve(&m).expect("config");
    let scraper = node_agent::agent::scraper(cfg.collectors, false);
    let scrape = || String::from_utf8(scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8");
    let timeout_line = format!("node_filesystem_device_error{{device=\"node-agent-test\",device_error=\"mountpoint timeout\",fstype=\"fuse.hang\",mountpoint=\"{label}\"}} 1");

    // 1. The statfs hangs: the scrape comes back at the deadline, the mount marked.
    let t = Instant::now();
    let text = scrape();
    let first = t.elapsed();
    assert!(first >= Duration::from_millis(900) && first < Duration::from_secs(3), "first scrape took {first:?}");
    assert!(text.contains(&timeout_line), "{text}");
    assert!(text.contains("node_scrape_collector_success{collector=\"filesystem\"} 1") || !text.contains("collector=\"filesystem\"} 0"));
    assert!(!fuse.held.lock().expect("held").is_empty(), "the kernel is waiting on our statfs");

    // 2. Skipped while it does not answer: no waiting, still reported.
    let t = Instant::now();
    let text = scrape();
    assert!(t.elapsed() < Duration::from_millis(500), "a stuck mount is not waited for again: {:?}", t.elapsed());
    assert!(text.contains(&timeout_line), "{text}");

    // 3. 1,000 scrapes: no thread, no fd grows.
    let (t0, f0) = (threads(), fds());
    for _ in 0..1000 {
        let _ = scrape();
    }
    assert!(threads() <= t0, "threads {t0} -> {}", threads());
    assert!(fds() <= f0, "fds {f0} -> {}", fds());

    // 4. It answers again: the pending statfs returns and the mount is back.
    fuse.release();
    let t = Instant::now();
    let text = loop {
        let text = scrape();
        if text.contains(&format!(
            "node_filesystem_size_bytes{{device=\"node-agent-test\",device_error=\"\",fstype=\"fuse.hang\",mountpoint=\"{label}\"}}"
        )) || t.elapsed() > Duration::from_secs(10)
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("node_filesystem_size_bytes{") && text.contains(&label), "the mount is reported again once it answers:\n{text}");
    assert!(!text.contains(&timeout_line));
    drop(fuse);
}
