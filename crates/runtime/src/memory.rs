//! The agent's memory policy, in one place: one malloc arena, and freed
//! heap given back to the system at the moments it pays, through the hooks
//! below: after a scrape grew a sink past what is kept for reuse, once
//! scrapes that overlapped are all over (both the scraper's; at most every
//! [`TRIM_INTERVAL`], an overlap within it trimmed when it is over, whether
//! or not another scrape comes), when the last runner thread a burst of
//! scrapes started leaves (the runner pool's), and after a burst of
//! connections (the HTTP server's). A lone scraper (Prometheus, one scrape
//! at a time) never pays for a trim: its scrapes reuse the same freed
//! memory. What each of these does to the working set the kubelet sees is
//! measured in BENCHMARKS.md ("Each memory trick, as the kubelet sees
//! it"), with each turned off in turn through [`OFF_ENV`].

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

/// What the end of a scrape asks of the memory policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// Nothing: one scrape at a time, or still others in flight.
    No,
    /// Trim now: the last of scrapes that overlapped.
    Now,
    /// Scrapes overlapped, but the last trim was less than
    /// [`TRIM_INTERVAL`] ago: trim once it is that old ([`Overlap::later`]),
    /// unless a scrape ending first does.
    Later(Duration),
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
    /// A deferred trim is waiting ([`Overlap::later`]).
    deferred: AtomicBool,
}

impl Overlap {
    /// A scrape starts.
    pub fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(n, Ordering::AcqRel);
    }

    /// A scrape ended: whether to trim, now (it was the last of scrapes
    /// that overlapped, and the last such trim is [`TRIM_INTERVAL`] ago) or
    /// later (the same within the interval: trimmed when the interval is
    /// over, by [`Overlap::later`] or by a scrape ending first).
    pub fn leave(&self) -> Trim {
        self.leave_at(millis_since_start())
    }

    fn leave_at(&self, now_ms: u64) -> Trim {
        if self.now.fetch_sub(1, Ordering::AcqRel) != 1 {
            return Trim::No;
        }
        if self.peak.swap(0, Ordering::AcqRel) >= 2 {
            self.pending.store(true, Ordering::Release);
        }
        self.due_at(now_ms)
    }

    /// Whether a held-over trim is due at `now_ms` (and taken if so).
    fn due_at(&self, now_ms: u64) -> Trim {
        if !self.pending.load(Ordering::Acquire) {
            return Trim::No;
        }
        let last = self.last_ms.load(Ordering::Acquire);
        let interval = TRIM_INTERVAL.as_millis() as u64;
        if last != 0 && now_ms.saturating_sub(last) < interval {
            return Trim::Later(Duration::from_millis(last + interval - now_ms));
        }
        self.last_ms.store(now_ms, Ordering::Release);
        self.pending.store(false, Ordering::Release);
        Trim::Now
    }

    /// A trim held over by [`Trim::Later`]: a short-lived thread (one at a
    /// time) waits `delay` and trims then, unless a scrape is in flight
    /// (whose end trims instead) or one ending meanwhile already did. An
    /// agent scraped by two Prometheus replicas at once would otherwise
    /// keep the heap of their last overlap until its next scrape, up to a
    /// scrape interval of working set the kubelet counts.
    pub fn later(self: &std::sync::Arc<Self>, delay: Duration) {
        if TRIM_OFF.load(Ordering::Relaxed) || self.deferred.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = std::sync::Arc::clone(self);
        let spawned = std::thread::Builder::new().name("memory-trim".into()).stack_size(64 << 10).spawn(move || {
            std::thread::sleep(delay);
            me.deferred.store(false, Ordering::Release);
            if me.now.load(Ordering::Acquire) == 0 && me.due_at(millis_since_start()) == Trim::Now {
                trim();
            }
        });
        if spawned.is_err() {
            // The next scrape's end trims instead.
            self.deferred.store(false, Ordering::Release);
        }
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
            assert_eq!(o.leave_at(1 + t * 10_000), Trim::No);
        }
    }

    #[test]
    fn overlapping_scrapes_trim_once_all_are_over_and_at_most_every_interval() {
        let o = Overlap::default();
        o.enter();
        o.enter();
        assert_eq!(o.leave_at(1_000), Trim::No, "one still runs");
        assert_eq!(o.leave_at(1_001), Trim::Now, "the last of the overlap");
        // Another overlap 2 s later: within the interval, held over until
        // the interval is over (5 s after the trim at 1_001).
        o.enter();
        o.enter();
        assert_eq!(o.leave_at(3_000), Trim::No);
        assert_eq!(o.leave_at(3_001), Trim::Later(Duration::from_millis(3_000)), "within the interval");
        // A lone scrape after the interval trims what was held over, once.
        o.enter();
        assert_eq!(o.leave_at(7_000), Trim::Now);
        o.enter();
        assert_eq!(o.leave_at(20_000), Trim::No, "nothing held over any more");
    }

    #[test]
    fn a_held_over_trim_is_due_once_when_the_interval_is_over() {
        let o = Overlap::default();
        for _ in 0..2 {
            o.enter();
        }
        o.leave_at(1_000);
        assert_eq!(o.leave_at(1_000), Trim::Now);
        for _ in 0..2 {
            o.enter();
        }
        o.leave_at(2_000);
        assert_eq!(o.leave_at(2_000), Trim::Later(Duration::from_millis(4_000)));
        assert_eq!(o.due_at(5_999), Trim::Later(Duration::from_millis(1)), "not yet");
        assert_eq!(o.due_at(6_000), Trim::Now, "the deferred trim");
        assert_eq!(o.due_at(9_000), Trim::No, "taken once");
    }

    #[test]
    fn a_deferred_trim_happens_without_another_scrape() {
        let o = std::sync::Arc::new(Overlap::default());
        o.pending.store(true, Ordering::Release);
        let before = trims();
        o.later(Duration::from_millis(10));
        o.later(Duration::from_millis(10));
        let t = Instant::now();
        while (o.pending.load(Ordering::Acquire) || trims() == before) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!o.pending.load(Ordering::Acquire), "the held-over trim was taken");
        assert!(trims() > before, "and made");
    }
}
