//! The agent's memory policy, in one place: one malloc arena, and freed
//! heap given back to the system at the moments it pays, through the hooks
//! below: after a scrape grew a sink past what is kept for reuse, once
//! scrapes that overlapped are all over (both the scraper's), and after a
//! burst of connections (the HTTP server's). A lone scraper (Prometheus,
//! one scrape at a time) never pays for a trim: its scrapes reuse the same
//! freed memory. What each of these does to the working set the kubelet
//! sees is measured in BENCHMARKS.md ("Each memory trick, as the kubelet
//! sees it"), with each turned off in turn through [`OFF_ENV`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The least time between two trims for overlapping scrapes: clients that
/// keep overlapping pay for one trim per interval at most.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(5);

static TRIMS: AtomicUsize = AtomicUsize::new(0);
static TRIM_OFF: AtomicBool = AtomicBool::new(false);

/// The environment variable that turns tricks of this policy off, a comma
/// list of `arena` (keep glibc's default arenas) and `trim` (never trim):
/// for measuring what each does to the working set (`cargo xtask bench`'s
/// table of them), never needed to run the agent.
pub const OFF_ENV: &str = "NODE_AGENT_MEMORY_OFF";

/// The tricks of this policy that are off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Off {
    pub arena: bool,
    pub trim: bool,
}

/// A word of [`OFF_ENV`] that names no trick.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{OFF_ENV}: unknown trick {0:?} (arena, trim)")]
pub struct UnknownTrick(pub String);

/// Parses [`OFF_ENV`]'s value.
pub fn parse_off(s: &str) -> Result<Off, UnknownTrick> {
    let mut off = Off::default();
    for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match word {
            "arena" => off.arena = true,
            "trim" => off.trim = true,
            w => return Err(UnknownTrick(w.to_string())),
        }
    }
    Ok(off)
}

/// Sets the policy up: one malloc arena for the whole process, unless
/// [`OFF_ENV`] says otherwise (a word it does not know is an error). Call it
/// first thing in `main`, before other threads.
///
/// Why one arena: the scrape path runs on a few threads, and every further
/// arena keeps its own freed, fragmented memory resident (after concurrent
/// scrapes, a second arena held 1.3 MB with 0.6 MB in use); the threads'
/// tcaches take most small allocations without the arena's lock.
pub fn init() -> Result<Off, UnknownTrick> {
    let off = parse_off(&std::env::var(OFF_ENV).unwrap_or_default())?;
    TRIM_OFF.store(off.trim, Ordering::Relaxed);
    if !off.arena {
        // SAFETY: mallopt only tunes the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
    Ok(off)
}

/// Gives freed heap memory back to the system now (unless trims are off).
pub fn trim() {
    if TRIM_OFF.load(Ordering::Relaxed) {
        return;
    }
    TRIMS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: malloc_trim only releases free memory back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How many trims this process made.
pub fn trims() -> usize {
    TRIMS.load(Ordering::Relaxed)
}

fn millis_since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    // 1 at the earliest: 0 is "never trimmed".
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Scrapes in flight and the most at once since the last trim: scrapes
/// that overlap each hold a body, its encoding and its gzip stream at the
/// same time, and the allocator keeps the pages they freed.
#[derive(Debug, Default)]
pub struct Overlap {
    now: AtomicUsize,
    peak: AtomicUsize,
    /// Scrapes overlapped and no trim has followed yet.
    pending: AtomicBool,
    /// When the last trim for overlapping scrapes was (0: never).
    last_ms: AtomicU64,
}

impl Overlap {
    /// A scrape starts.
    pub fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(n, Ordering::AcqRel);
    }

    /// A scrape ended: whether to trim now (it was the last of scrapes
    /// that overlapped, and the last such trim is [`TRIM_INTERVAL`] ago; an
    /// overlap within the interval is trimmed at the end of the first scrape
    /// after it).
    pub fn leave(&self) -> bool {
        self.leave_at(millis_since_start())
    }

    fn leave_at(&self, now_ms: u64) -> bool {
        if self.now.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        if self.peak.swap(0, Ordering::AcqRel) >= 2 {
            self.pending.store(true, Ordering::Release);
        }
        if !self.pending.load(Ordering::Acquire) {
            return false;
        }
        let last = self.last_ms.load(Ordering::Acquire);
        if last != 0 && now_ms.saturating_sub(last) < TRIM_INTERVAL.as_millis() as u64 {
            return false;
        }
        self.last_ms.store(now_ms, Ordering::Release);
        self.pending.store(false, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tricks_turned_off_by_name() {
        assert_eq!(parse_off(""), Ok(Off::default()));
        assert_eq!(parse_off("arena"), Ok(Off { arena: true, trim: false }));
        assert_eq!(parse_off(" trim , arena,"), Ok(Off { arena: true, trim: true }));
        let e = parse_off("arena,madvise").unwrap_err();
        assert_eq!(e.to_string(), "NODE_AGENT_MEMORY_OFF: unknown trick \"madvise\" (arena, trim)");
    }

    #[test]
    fn a_lone_scraper_never_trims() {
        let o = Overlap::default();
        for t in 0..100 {
            o.enter();
            assert!(!o.leave_at(1 + t * 10_000));
        }
    }

    #[test]
    fn overlapping_scrapes_trim_once_all_are_over_and_at_most_every_interval() {
        let o = Overlap::default();
        o.enter();
        o.enter();
        assert!(!o.leave_at(1_000), "one still runs");
        assert!(o.leave_at(1_001), "the last of the overlap");
        // Another overlap 2 s later: within the interval, held over.
        o.enter();
        o.enter();
        assert!(!o.leave_at(3_000));
        assert!(!o.leave_at(3_001), "within the interval");
        // A lone scrape after the interval trims what was held over, once.
        o.enter();
        assert!(o.leave_at(7_000));
        o.enter();
        assert!(!o.leave_at(20_000), "nothing held over any more");
    }
}
