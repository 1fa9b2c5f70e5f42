//! The runtime layer: how collectors run. One scrape runs the selected
//! collectors, times them, and encodes their families with the exporter's
//! own metrics in the requested format; [`memory`] is the process's memory
//! policy (glibc arenas and trims) and its hooks. `host` holds only the
//! collectors; the HTTP server asks [`Scraper::start`] for a scrape and
//! awaits its body.
//!
//! Collectors run on the scraper's own runner threads, one after another
//! while they are quick. A collector that runs longer than `slow` lets the
//! rest of the scrape go on beside it on another runner, so one slow
//! collector delays no other (node_exporter runs every collector at once;
//! this costs a thread only when one is slow). A collector that overruns
//! its deadline (`--collector.timeout`, or the scrape's own, shorter one) is
//! cut off: it reports `node_scrape_collector_success 0` and the scrape
//! returns with everything else. A collector that has run longer than
//! `--collector.timeout` itself is *stuck* until it returns: later scrapes
//! skip it at once (success 0) instead of waiting, so a stuck collector
//! holds exactly one thread, however many scrapes follow. A client's
//! shorter deadline (`X-Prometheus-Scrape-Timeout-Seconds`) cuts off its
//! own scrape only; later scrapes wait for the collector as usual. The
//! runner left inside it goes back to work when it returns.
//!
//! The scraper supervises every scrape in flight itself, on one thread of
//! its own (started with the first scrape, gone with the scraper or after a
//! minute without scrapes): it lets a slow collector's scrape go on beside
//! it and cuts off collectors at their deadlines, whether or not the caller
//! still waits. The caller of [`Scraper::start`] only gets the body through
//! its callback, once every collector answered or timed out.
//!
//! Here: the scraper, its collectors' slots and its builder. `job`: one
//! scrape's state and a runner's loop over its collectors; `pool`: the
//! runner threads and the supervisor; `report`: the scrape encoded and
//! handed over, with the memory policy's hook; [`memory`]: that policy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use expo::{Format, Sink};

use host::{Collector, Named};

/// The default deadline of one collector, below Prometheus' default scrape
/// timeout (10 s) so that a scrape with a stuck collector still answers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(8);

/// How long a collector may run before the rest of its scrape goes on beside it.
pub const DEFAULT_SLOW: Duration = Duration::from_millis(200);

/// Which collectors a request asked for (`collect[]` / `exclude[]`).
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A collector with its reusable sink, and whether a runner holds it.
struct Slot {
    /// `None` while a runner is running it.
    collector: Option<(Box<dyn Collector>, Sink)>,
    /// Set when it overran `--collector.timeout`, until it returns.
    stuck_since: Option<Instant>,
    /// When the runner now in it took it.
    running_since: Option<Instant>,
    /// Runners waiting on `changed` for it (another scrape holds it): a
    /// collector handed back with none waiting wakes nobody, with no
    /// futex call (std's `Condvar` makes one on every notify).
    waiters: usize,
}

struct Entry {
    name: &'static str,
    slot: Mutex<Slot>,
    /// Notified when the collector is put back or declared stuck.
    changed: Condvar,
}

struct Inner {
    entries: Vec<Entry>,
    /// The exporter's own metrics (process_*, build info): written after the
    /// collectors' families, not reported as collectors.
    own: Vec<Mutex<Box<dyn Collector>>>,
    /// Size of the last response, to size the next buffer at once.
    last_len: AtomicUsize,
    timeout: Duration,
    slow: Duration,
    pool: Arc<Pool>,
    /// Scrapes in flight, for the memory policy.
    overlap: Arc<crate::memory::Overlap>,
    /// Calls of [`supervise`] for this scraper's scrapes.
    #[cfg(test)]
    looks: AtomicUsize,
    /// Trims for scrapes that overlapped.
    #[cfg(test)]
    overlap_trims: AtomicUsize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        lock(&self.pool.state).closed = true;
        self.pool.ready.notify_all();
        drop(lock(&self.pool.supervised));
        self.pool.tick.notify_all();
    }
}

/// The collectors of a running agent.
#[derive(Clone)]
pub struct Scraper {
    inner: Arc<Inner>,
}

/// A scrape in progress (supervised by the scraper).
pub struct Scrape {
    job: Arc<Job>,
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

/// Builds a [`Scraper`].
pub struct Builder {
    collectors: Vec<Named>,
    own: Vec<Box<dyn Collector>>,
    timeout: Duration,
    slow: Duration,
}

impl Builder {
    /// Adds the exporter's own metrics to every scrape.
    pub fn own(mut self, c: Box<dyn Collector>) -> Self {
        self.own.push(c);
        self
    }

    /// Sets the deadline of one collector, and how long one may run before
    /// the rest of its scrape goes on beside it.
    pub fn timeouts(mut self, timeout: Duration, slow: Duration) -> Self {
        self.timeout = timeout;
        self.slow = slow.min(timeout);
        self
    }

    pub fn build(self) -> Scraper {
        let entries = self
            .collectors
            .into_iter()
            .map(|(name, c)| Entry {
                name,
                slot: Mutex::new(Slot { collector: Some((c, Sink::new())), stuck_since: None, running_since: None, waiters: 0 }),
                changed: Condvar::new(),
            })
            .collect();
        Scraper {
            inner: Arc::new(Inner {
                entries,
                own: self.own.into_iter().map(Mutex::new).collect(),
                last_len: AtomicUsize::new(64 * 1024),
                timeout: self.timeout,
                slow: self.slow,
                pool: Arc::new(Pool {
                    state: Mutex::default(),
                    ready: Condvar::new(),
                    ids: Default::default(),
                    supervised: Mutex::default(),
                    tick: Condvar::new(),
                    #[cfg(test)]
                    surplus_trims: Default::default(),
                }),
                overlap: Default::default(),
                #[cfg(test)]
                looks: AtomicUsize::new(0),
                #[cfg(test)]
                overlap_trims: AtomicUsize::new(0),
            }),
        }
    }
}

impl Scraper {
    /// A scraper of `collectors` with the default deadlines.
    pub fn new(collectors: Vec<Named>) -> Self {
        Self::builder(collectors).build()
    }

    pub fn builder(collectors: Vec<Named>) -> Builder {
        Builder { collectors, own: Vec::new(), timeout: DEFAULT_TIMEOUT, slow: DEFAULT_SLOW }
    }

    /// The deadline of one collector.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The names of the enabled collectors.
    pub fn names(&self) -> Vec<&'static str> {
        self.inner.entries.iter().map(|e| e.name).collect()
    }

    /// The runner threads alive (busy, idle, or stuck in a collector).
    pub fn runner_threads(&self) -> usize {
        lock(&self.inner.pool.state).threads
    }

    /// Collectors stuck for longer than `for_at_least`, with how long.
    pub fn stuck(&self, for_at_least: Duration) -> Vec<(&'static str, Duration)> {
        let now = Instant::now();
        self.inner
            .entries
            .iter()
            .filter_map(|e| {
                let since = lock(&e.slot).stuck_since?;
                let d = now.saturating_duration_since(since);
                (d >= for_at_least).then_some((e.name, d))
            })
            .collect()
    }

    /// Checks a selection against the enabled collectors.
    pub fn validate(&self, sel: &Selection) -> Result<(), String> {
        if !sel.include.is_empty() && !sel.exclude.is_empty() {
            return Err("cannot use both collect[] and exclude[]".into());
        }
        for n in sel.include.iter().chain(&sel.exclude) {
            if !self.inner.entries.iter().any(|e| e.name == n) {
                return Err(format!("missing collector: {n}"));
            }
        }
        Ok(())
    }

    fn selected(sel: &Selection, name: &str) -> bool {
        if !sel.include.is_empty() {
            return sel.include.iter().any(|n| n == name);
        }
        !sel.exclude.iter().any(|n| n == name)
    }

    /// Starts a scrape: the collectors run on the scraper's runners; `done`
    /// gets the encoded body (on a runner thread). Each collector gets
    /// `deadline` (at most the scraper's timeout).
    pub fn start(&self, sel: &Selection, format: Format, deadline: Option<Duration>, done: Done) -> Scrape {
        let items: Vec<usize> = (0..self.inner.entries.len()).filter(|&i| Self::selected(sel, self.inner.entries[i].name)).collect();
        let n = items.len();
        let deadline = deadline.map_or(self.inner.timeout, |d| d.min(self.inner.timeout));
        let job = Arc::new(Job {
            items,
            next: AtomicUsize::new(0),
            format,
            deadline,
            state: Mutex::new(JobState { outcomes: (0..n).map(|_| None).collect(), left: n, running: Vec::new(), done: Some(done) }),
            finished: AtomicBool::new(false),
            cut: (0..n).map(|_| AtomicBool::new(false)).collect(),
        });
        let task = if n == 0 { Task::Finish(Arc::clone(&job)) } else { Task::Run(Arc::clone(&job)) };
        self.inner.overlap.enter();
        Pool::submit(&self.inner, task);
        if n > 0 {
            Pool::supervise(&self.inner, &job);
        }
        Scrape { job }
    }

    /// Runs one scrape and returns the encoded body (blocking).
    pub fn scrape(&self, sel: &Selection, format: Format) -> Vec<u8> {
        self.scrape_within(sel, format, None)
    }

    /// Runs one scrape within `deadline` (a client's), blocking.
    pub fn scrape_within(&self, sel: &Selection, format: Format, deadline: Option<Duration>) -> Vec<u8> {
        let (tx, rx) = std::sync::mpsc::channel();
        let _scrape = self.start(
            sel,
            format,
            deadline,
            Box::new(move |body| {
                let _ = tx.send(body);
            }),
        );
        // The callback dropped without a body: no runner could start.
        rx.recv().unwrap_or_default()
    }
}

impl Scrape {
    /// Whether every collector has answered or timed out.
    pub fn finished(&self) -> bool {
        self.job.finished.load(Ordering::Acquire)
    }
}

mod job;
pub mod memory;
mod pool;
mod report;

use job::{Done, Job, JobState};
use pool::{Pool, Task};

#[cfg(test)]
mod tests {
    use super::*;
    use expo::Kind;
    use host::Error;

    struct Panics;
    impl Collector for Panics {
        fn update(&mut self, _: &mut Sink) -> Result<(), Error> {
            panic!("boom")
        }
    }

    struct Fine(&'static str);
    impl Collector for Fine {
        fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
            sink.single(self.0, "h", Kind::Gauge, 1.0);
            Ok(())
        }
    }

    /// Blocks in `update` until the gate opens (a hung file read).
    struct Blocks(Arc<(Mutex<bool>, Condvar)>);
    impl Collector for Blocks {
        fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
            let (m, c) = &*self.0;
            let mut open = lock(m);
            while !*open {
                open = c.wait(open).unwrap_or_else(|e| e.into_inner());
            }
            sink.single("blocked_value", "h", Kind::Gauge, 1.0);
            Ok(())
        }
    }

    /// Sleeps, then answers.
    struct Slow(Duration);
    impl Collector for Slow {
        fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
            std::thread::sleep(self.0);
            sink.single("slow_value", "h", Kind::Gauge, 1.0);
            Ok(())
        }
    }

    fn text(s: &Scraper, sel: &Selection) -> String {
        String::from_utf8(s.scrape(sel, Format::Text)).unwrap()
    }

    /// `n` scrapes of `s` started at once, each on a thread of its own:
    /// their bodies.
    fn at_once(s: &Scraper, n: usize) -> Vec<String> {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || text(&s, &Selection::default()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn a_panic_fails_its_collector_only_every_time() {
        let s = Scraper::new(vec![("panics", Box::new(Panics)), ("fine", Box::new(Fine("fine_value")))]);
        for _ in 0..2 {
            let text = text(&s, &Selection::default());
            assert!(text.contains("node_scrape_collector_success{collector=\"panics\"} 0"), "{text}");
            assert!(text.contains("node_scrape_collector_success{collector=\"fine\"} 1"), "{text}");
            assert!(text.contains("fine_value 1"), "{text}");
        }
        let e = Error::Panicked(panic_message(&"boom"));
        assert_eq!(e.to_string(), "collector panicked: boom");
        assert!(!e.is_no_data(), "a panic is a fault, not a missing feature");
    }

    /// A client's short deadline cuts off its own scrape, and never makes
    /// the collector stuck for other scrapers: a looping 0.1 s client does
    /// not cost a 10 s scraper a 0.4 s collector.
    #[test]
    fn a_clients_short_deadline_never_marks_a_collector_stuck() {
        let s = Scraper::builder(vec![("slow", Box::new(Slow(Duration::from_millis(400)))), ("fine", Box::new(Fine("fine_value")))])
            .timeouts(Duration::from_secs(8), Duration::from_millis(50))
            .build();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::new(s);
        let hostile = {
            let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut cut = 0;
                while !stop.load(Ordering::Relaxed) {
                    let b =
                        String::from_utf8(s.scrape_within(&Selection::default(), Format::Text, Some(Duration::from_millis(100)))).unwrap();
                    cut += usize::from(b.contains("node_scrape_collector_success{collector=\"slow\"} 0"));
                }
                cut
            })
        };
        for i in 0..8 {
            let b = text(&s, &Selection::default());
            assert!(b.contains("node_scrape_collector_success{collector=\"slow\"} 1") && b.contains("slow_value 1"), "scrape {i}: {b}");
        }
        stop.store(true, Ordering::Relaxed);
        assert!(hostile.join().unwrap() > 0, "the short scrapes were cut off");
        assert!(s.stuck(Duration::ZERO).is_empty());
    }

    #[test]
    fn a_stuck_collector_is_cut_off_skipped_and_holds_one_thread() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let s = Scraper::builder(vec![
            ("a", Box::new(Fine("a_value"))),
            ("stuck", Box::new(Blocks(Arc::clone(&gate)))),
            ("z", Box::new(Fine("z_value"))),
        ])
        .timeouts(Duration::from_millis(300), Duration::from_millis(50))
        .build();
        let t = Instant::now();
        let first = text(&s, &Selection::default());
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "cut off at the deadline: {took:?}");
        assert!(first.contains("node_scrape_collector_success{collector=\"stuck\"} 0"), "{first}");
        assert!(first.contains("a_value 1") && first.contains("z_value 1"), "the others answer: {first}");
        for _ in 0..20 {
            let t = Instant::now();
            let later = text(&s, &Selection::default());
            assert!(t.elapsed() < Duration::from_millis(250), "later scrapes skip it at once: {:?}", t.elapsed());
            assert!(later.contains("node_scrape_collector_success{collector=\"stuck\"} 0") && later.contains("z_value 1"), "{later}");
        }
        // One runner stuck in the collector, one (or a spare) doing the work.
        assert!(s.runner_threads() <= 3, "no thread piles up: {} runner threads", s.runner_threads());
        let only = Selection { include: vec!["a".into()], exclude: vec![] };
        assert!(text(&s, &only).contains("a_value 1"));
        assert_eq!(s.stuck(Duration::ZERO).iter().map(|x| x.0).collect::<Vec<_>>(), ["stuck"]);
        // It answers: it runs again from the next scrape.
        *lock(&gate.0) = true;
        gate.1.notify_all();
        let t = Instant::now();
        while !s.stuck(Duration::ZERO).is_empty() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let back = text(&s, &Selection::default());
        assert!(back.contains("node_scrape_collector_success{collector=\"stuck\"} 1") && back.contains("blocked_value 1"), "{back}");
        // The runner it held came back to the pool (it found its scrape long
        // encoded): every runner idles again, none died.
        let t = Instant::now();
        loop {
            let (idle, threads) = {
                let st = lock(&s.inner.pool.state);
                (st.idle, st.threads)
            };
            if idle == threads {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{idle} of {threads} runners idle: one never came back");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sets its flag when dropped.
    struct Dropped(Arc<std::sync::atomic::AtomicBool>);
    impl Collector for Dropped {
        fn update(&mut self, _: &mut Sink) -> Result<(), Error> {
            Ok(())
        }
    }
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn dropping_the_scraper_drops_its_collectors_and_idle_runners_leave() {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = Scraper::new(vec![("d", Box::new(Dropped(Arc::clone(&flag))))]);
        for _ in 0..3 {
            text(&s, &Selection::default());
        }
        let pool = Arc::clone(&s.inner.pool);
        drop(s);
        let t = Instant::now();
        while !(flag.load(Ordering::SeqCst) && lock(&pool.state).threads == 0) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(flag.load(Ordering::SeqCst), "the collectors (and their eBPF programs) go with the scraper");
        assert_eq!(lock(&pool.state).threads, 0, "idle runners leave");
        while lock(&pool.supervised).running && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!lock(&pool.supervised).running, "the supervisor leaves too");
    }

    /// Supervision is the scraper's own: a scrape whose caller went away
    /// (an HTTP client that hung up) is still cut off at its deadline, its
    /// body handed to the callback.
    #[test]
    fn a_scrape_nobody_waits_for_is_still_cut_off_at_its_deadline() {
        let s = Scraper::builder(vec![("slow", Box::new(Slow(Duration::from_secs(2)))), ("fine", Box::new(Fine("fine_value")))])
            .timeouts(Duration::from_secs(8), Duration::from_millis(50))
            .build();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Instant::now();
        drop(s.start(
            &Selection::default(),
            Format::Text,
            Some(Duration::from_millis(200)),
            Box::new(move |body| {
                let _ = tx.send((t.elapsed(), String::from_utf8(body).unwrap()));
            }),
        ));
        let (took, body) = rx.recv_timeout(Duration::from_secs(5)).expect("the body, without anyone supervising");
        assert!(took < Duration::from_millis(1500), "cut off at the 200 ms deadline, not when the collector returned: {took:?}");
        assert!(body.contains("node_scrape_collector_success{collector=\"slow\"} 0"), "{body}");
        assert!(body.contains("fine_value 1"), "{body}");
    }

    /// The heap is trimmed once scrapes that overlapped are all over (the
    /// memory policy's hook in the scraper), never for one scrape at a time.
    #[test]
    fn overlapping_scrapes_end_in_a_trim_and_lone_ones_never_do() {
        let s = Scraper::builder(vec![("slow", Box::new(Slow(Duration::from_millis(100))))])
            .timeouts(Duration::from_secs(5), Duration::from_secs(5))
            .build();
        for _ in 0..3 {
            text(&s, &Selection::default());
        }
        assert_eq!(s.inner.overlap_trims.load(Ordering::Relaxed), 0, "one scrape at a time");
        for body in at_once(&s, 2) {
            assert!(body.contains("slow_value 1"));
        }
        assert_eq!(s.inner.overlap_trims.load(Ordering::Relaxed), 1, "one trim once both are over");
    }

    /// A slow collector with nothing left to run beside it is looked at
    /// again at its deadline, not polled in a loop until it returns.
    #[test]
    fn a_slow_last_collector_is_not_polled_in_a_loop() {
        let s = Scraper::builder(vec![("fine", Box::new(Fine("fine_value"))), ("slow", Box::new(Slow(Duration::from_millis(600))))])
            .timeouts(Duration::from_secs(5), Duration::from_millis(50))
            .build();
        let body = text(&s, &Selection::default());
        let looks = s.inner.looks.load(Ordering::Relaxed);
        assert!(body.contains("node_scrape_collector_success{collector=\"slow\"} 1"), "{body}");
        assert!(looks < 40, "the supervisor looked {looks} times at a 600 ms scrape");
    }

    #[test]
    fn a_slow_collector_lets_the_others_go_on_beside_it() {
        let s = Scraper::builder(vec![
            ("slow1", Box::new(Slow(Duration::from_millis(400)))),
            ("slow2", Box::new(Slow(Duration::from_millis(400)))),
            ("fine", Box::new(Fine("fine_value"))),
        ])
        .timeouts(Duration::from_secs(5), Duration::from_millis(50))
        .build();
        let t = Instant::now();
        let body = text(&s, &Selection::default());
        let took = t.elapsed();
        assert!(took < Duration::from_millis(750), "the two slow ones ran side by side: {took:?}");
        assert!(body.contains("node_scrape_collector_success{collector=\"slow1\"} 1"), "{body}");
        assert!(body.contains("node_scrape_collector_success{collector=\"slow2\"} 1"), "{body}");
        assert!(body.contains("fine_value 1"), "{body}");
    }

    #[test]
    fn concurrent_scrapes_share_collectors_safely() {
        let s =
            Scraper::new((0..8).map(|i| -> Named { (["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"][i], Box::new(Fine("v"))) }).collect());
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let t = text(&s, &Selection::default());
                        assert_eq!(t.matches("node_scrape_collector_success{").count(), 8, "{t}");
                        assert!(!t.contains("} 0\n"), "{t}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_scrape_with_no_collector_is_handed_over_once_by_one_runner() {
        // Its body is handed over by the task `start` queues; supervising it
        // queues no second one (which woke or started another runner per
        // scrape).
        let s = Scraper::new(Vec::new());
        let first = text(&s, &Selection::default());
        for _ in 0..20 {
            assert_eq!(text(&s, &Selection::default()), first);
        }
        assert_eq!(s.runner_threads(), 1, "one runner serves scrapes one after another");
    }

    #[test]
    fn a_scrape_waiting_for_a_collector_another_holds_is_woken() {
        // Four scrapes at once on collectors that take a while: each scrape
        // in turn waits for the collector another scrape is running, and is
        // woken when it is handed back. A missed wake-up leaves the waiter
        // asleep until its deadline: `success 0` here.
        let s = Scraper::builder(vec![("a", Box::new(Slow(Duration::from_millis(2)))), ("b", Box::new(Slow(Duration::from_millis(1))))])
            .timeouts(Duration::from_secs(5), Duration::from_secs(5))
            .build();
        let started = Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        let t = text(&s, &Selection::default());
                        assert_eq!(t.matches("node_scrape_collector_success{").count(), 2, "{t}");
                        assert!(!t.contains("} 0\n"), "{t}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // 100 scrapes of 3 ms each, serialized on the collectors: far below
        // one deadline.
        assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    }

    #[test]
    fn runners_a_burst_started_leave_soon_and_the_last_trims() {
        // Eight scrapes at once on a collector that takes a while: most of
        // them wait, each on a runner of its own, for the one running it.
        let s = Scraper::builder(vec![("a", Box::new(Slow(Duration::from_millis(30))))])
            .timeouts(Duration::from_secs(5), Duration::from_secs(5))
            .build();
        for body in at_once(&s, 8) {
            assert!(body.contains("node_scrape_collector_success{collector=\"a\"} 1"));
        }
        let burst = s.runner_threads();
        assert!(burst > pool::KEPT_RUNNERS, "the burst started runners beyond the kept ones: {burst}");
        assert_eq!(s.inner.pool.surplus_trims.load(Ordering::Relaxed), 0);
        let t = Instant::now();
        while s.runner_threads() > pool::KEPT_RUNNERS && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(s.runner_threads() <= pool::KEPT_RUNNERS, "{burst} runners -> {} after {:?}", s.runner_threads(), t.elapsed());
        let t = Instant::now();
        while s.inner.pool.surplus_trims.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(s.inner.pool.surplus_trims.load(Ordering::Relaxed) >= 1, "the last surplus runner to leave trims");
        // The kept runners stay for the next scrapes.
        std::thread::sleep(pool::SURPLUS_IDLE_EXIT * 2);
        assert!(s.runner_threads() >= 1);
        assert!(text(&s, &Selection::default()).contains("node_scrape_collector_success{collector=\"a\"} 1"));
    }
}
