//! A minimal FUSE server for tests: it answers INIT and holds what it is
//! told to (every STATFS, or every request) until released, standing in
//! for a dead NFS server or a hung device file.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What the server holds until released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Every STATFS is read and held (the caller waits uninterruptibly, as
    /// on a FUSE or NFS server that took the request and went quiet).
    Statfs,
    /// Every request is read and held (likewise).
    Everything,
    /// Nothing is read after INIT: requests stay queued in the kernel, and
    /// a caller waiting on one can still be killed.
    Unread,
}

const FUSE_INIT: u32 = 26;
const FUSE_STATFS: u32 = 17;
const FUSE_FORGET: u32 = 2;
const FUSE_BATCH_FORGET: u32 = 42;
const FUSE_DESTROY: u32 = 38;
/// Sent when a thread waiting on a request gets a signal; a server may
/// ignore it, and this one does: it is no request of its own to hold.
const FUSE_INTERRUPT: u32 = 36;

pub fn reply(dev: &mut std::fs::File, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&error.to_le_bytes());
    out.extend_from_slice(&unique.to_le_bytes());
    out.extend_from_slice(body);
    let _ = dev.write_all(&out);
}

pub fn statfs_body() -> Vec<u8> {
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

/// A FUSE filesystem served on a thread that holds requests until released.
pub struct Fuse {
    mountpoint: std::path::PathBuf,
    answer: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<(u64, u32)>>>,
    dev: std::fs::File,
}

impl Fuse {
    /// Mounts a FUSE filesystem at `mountpoint`, served on a thread, that
    /// holds every STATFS until released.
    pub fn mount(mountpoint: &std::path::Path) -> Option<Fuse> {
        Self::mount_holding(mountpoint, Hold::Statfs)
    }

    /// Mounts one that holds `what` until released (then answers STATFS and
    /// fails everything else with ENOENT).
    pub fn mount_holding(mountpoint: &std::path::Path, what: Hold) -> Option<Fuse> {
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
        // Close-on-exec, as the original: a process this test spawns (the
        // agent) must not hold the FUSE device, or a request it waits on
        // could never be aborted by this server's exit.
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) of an fd we own; the new fd is owned by the File.
        let mut reader = unsafe { std::fs::File::from_raw_fd(libc::fcntl(dev.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0)) };
        let (a, h) = (Arc::clone(&answer), Arc::clone(&held));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut initialised = false;
            loop {
                if initialised && what == Hold::Unread {
                    while !a.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
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
                        initialised = true;
                    }
                    FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_DESTROY | FUSE_INTERRUPT => {}
                    FUSE_STATFS if a.load(Ordering::SeqCst) => reply(&mut reader, unique, 0, &statfs_body()),
                    _ if a.load(Ordering::SeqCst) => reply(&mut reader, unique, -libc::ENOENT, &[]),
                    FUSE_STATFS => h.lock().map(|mut v| v.push((unique, opcode))).unwrap_or(()),
                    _ if what == Hold::Everything => h.lock().map(|mut v| v.push((unique, opcode))).unwrap_or(()),
                    _ => reply(&mut reader, unique, -libc::ENOSYS, &[]),
                }
            }
        });
        Some(Fuse { mountpoint: mountpoint.to_path_buf(), answer, held, dev })
    }

    /// Answers the held calls and every later one.
    pub fn release(&mut self) {
        self.answer.store(true, Ordering::SeqCst);
        let held: Vec<(u64, u32)> = self.held.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
        for (unique, opcode) in held {
            if opcode == FUSE_STATFS {
                reply(&mut self.dev, unique, 0, &statfs_body());
            } else {
                reply(&mut self.dev, unique, -libc::ENOENT, &[]);
            }
        }
    }

    /// How many requests are held now.
    pub fn held(&self) -> usize {
        self.held.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// The opcodes of the requests held now, in arrival order.
    pub fn held_opcodes(&self) -> Vec<u32> {
        self.held.lock().map(|v| v.iter().map(|r| r.1).collect()).unwrap_or_default()
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
