//! One scrape: run the selected collectors, time them, and encode their
//! families with the exporter's own metrics in the requested format.
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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use expo::{Format, Kind, Sink};

use crate::{Collector, Error, Named};

/// The default deadline of one collector, below Prometheus' default scrape
/// timeout (10 s) so that a scrape with a stuck collector still answers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(8);

/// A collector's sink larger than this is not kept for reuse after a scrape.
const KEEP_SINK_BYTES: usize = 8 << 20;

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

/// What one collector did in one scrape.
// The sink is moved in and out of its collector's slot by value (it keeps
// its allocations from scrape to scrape); boxing it would not save a copy
// worth having, a few per collector per scrape.
#[allow(clippy::large_enum_variant)]
enum Outcome {
    Done {
        sink: Sink,
        result: Result<(), Error>,
        secs: f64,
    },
    /// Cut off at its deadline (it runs on, stuck).
    TimedOut {
        secs: f64,
    },
    /// Stuck since an earlier scrape: not run.
    Skipped,
}

/// A runner at work on one collector of a scrape.
struct Running {
    runner: u64,
    item: usize,
    started: Instant,
    /// Another runner was started beside it (it is slow).
    helped: bool,
}

type Done = Box<dyn FnOnce(Vec<u8>) + Send>;

struct JobState {
    outcomes: Vec<Option<Outcome>>,
    left: usize,
    running: Vec<Running>,
    done: Option<Done>,
}

struct Job {
    /// Entry indices, in scrape order.
    items: Vec<usize>,
    next: AtomicUsize,
    format: Format,
    deadline: Duration,
    state: Mutex<JobState>,
    finished: AtomicBool,
    /// Per item: cut off at the deadline (a runner waiting for that
    /// collector gives up rather than run it for a scrape already gone).
    cut: Vec<AtomicBool>,
}

enum Task {
    Run(Arc<Job>),
    Finish(Arc<Job>),
}

/// The runner threads: started on demand, so that a task never waits for a
/// busy runner; idle ones wait for work and leave after a while (one stays).
struct Pool {
    state: Mutex<PoolState>,
    ready: Condvar,
    ids: std::sync::atomic::AtomicU64,
    /// The scrapes in flight, for the supervisor thread.
    supervised: Mutex<Supervised>,
    /// Wakes the supervisor: a scrape started, or the scraper is gone.
    tick: Condvar,
}

/// The scrapes the supervisor watches (each with its scraper, held weakly:
/// the supervisor keeps no scraper alive), and whether it runs.
#[derive(Default)]
struct Supervised {
    jobs: Vec<(Weak<Inner>, Arc<Job>)>,
    running: bool,
}

/// How often a scrape with nothing to time yet (no collector started) is
/// looked at again.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct PoolState {
    /// Tasks with the scraper they belong to (held only while queued and
    /// run: an idle runner keeps no scraper, and its collectors, alive).
    tasks: VecDeque<(Arc<Inner>, Task)>,
    idle: usize,
    threads: usize,
    /// The scraper is gone: idle runners leave.
    closed: bool,
}

const IDLE_EXIT: Duration = Duration::from_secs(60);

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
    overlap: crate::memory::Overlap,
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

/// Lets a slow collector's scrape go on beside it, and cuts off a collector
/// past its deadline. Returns when to look again (`None`: nothing running
/// yet, or finished).
fn supervise(inner: &Arc<Inner>, job: &Arc<Job>) -> Option<Instant> {
    #[cfg(test)]
    inner.looks.fetch_add(1, Ordering::Relaxed);
    if job.finished.load(Ordering::Acquire) {
        return None;
    }
    let now = Instant::now();
    let mut next: Option<Instant> = None;
    let mut help = 0;
    let (mut complete, mut finish_here) = (false, false);
    {
        let mut st = lock(&job.state);
        let was_left = st.left;
        let mut timed_out = Vec::new();
        for r in st.running.iter_mut() {
            let ran = now.saturating_duration_since(r.started);
            if ran >= job.deadline {
                timed_out.push((r.item, ran));
                continue;
            }
            if !r.helped && ran >= inner.slow && job.next.load(Ordering::Relaxed) < job.items.len() {
                r.helped = true;
                help += 1;
            }
            // Past `slow` (helped, or nothing left to help with), the
            // next event is the deadline.
            let at = if r.helped || ran >= inner.slow { r.started + job.deadline } else { r.started + inner.slow };
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        for (item, ran) in timed_out {
            st.running.retain(|r| r.item != item);
            if st.outcomes[item].is_none() {
                st.outcomes[item] = Some(Outcome::TimedOut { secs: ran.as_secs_f64() });
                st.left -= 1;
                job.cut[item].store(true, Ordering::Release);
                let e = &inner.entries[job.items[item]];
                let mut slot = lock(&e.slot);
                // Stuck only past --collector.timeout itself: a
                // client's shorter deadline cuts off its own scrape
                // (a full-deadline scrape's cut-off is the overrun).
                let overran =
                    job.deadline >= inner.timeout || slot.running_since.is_some_and(|t| now.saturating_duration_since(t) >= inner.timeout);
                if slot.collector.is_none() && slot.stuck_since.is_none() && overran {
                    slot.stuck_since = Some(slot.running_since.unwrap_or(now - ran));
                    tracing::error!(
                        collector = e.name,
                        deadline_seconds = inner.timeout.as_secs_f64(),
                        "collector timed out: skipped by later scrapes until it returns"
                    );
                }
                let waiting = slot.waiters > 0;
                drop(slot);
                if waiting {
                    e.changed.notify_all();
                }
            }
            // What the runner left behind it must go on elsewhere.
            if job.next.load(Ordering::Relaxed) < job.items.len() {
                help += 1;
            }
        }
        // Every collector answered or was cut off. Only a scrape that
        // this call's cut-offs completed needs a runner to hand its body
        // over: otherwise the runner that answered last does, or the
        // task `start` queued for a scrape with no collector.
        if st.left == 0 {
            complete = true;
            finish_here = was_left > 0;
        }
    }
    for _ in 0..help {
        Pool::submit(inner, Task::Run(Arc::clone(job)));
    }
    if finish_here {
        Pool::submit(inner, Task::Finish(Arc::clone(job)));
    }
    if complete {
        return None;
    }
    next
}

impl Pool {
    /// Hands `job` to the supervisor thread, started if none runs.
    fn supervise(inner: &Arc<Inner>, job: &Arc<Job>) {
        let pool = &inner.pool;
        let start = {
            let mut sup = lock(&pool.supervised);
            sup.jobs.push((Arc::downgrade(inner), Arc::clone(job)));
            !std::mem::replace(&mut sup.running, true)
        };
        pool.tick.notify_one();
        if !start {
            return;
        }
        let p = Arc::clone(pool);
        let spawned = std::thread::Builder::new().name("scrape-supervisor".into()).stack_size(64 << 10).spawn(move || supervisor(p));
        if let Err(e) = spawned {
            tracing::error!(err = %e, "cannot start the scrape supervisor thread: slow collectors hold their scrapes until they return");
            lock(&pool.supervised).running = false;
        }
    }

    fn submit(inner: &Arc<Inner>, task: Task) {
        let pool = &inner.pool;
        let mut st = lock(&pool.state);
        st.tasks.push_back((Arc::clone(inner), task));
        // Each idle runner takes one task: start one more if they are too few.
        let spawn = st.tasks.len() > st.idle;
        if spawn {
            st.threads += 1;
        }
        drop(st);
        pool.ready.notify_one();
        if !spawn {
            return;
        }
        let id = pool.ids.fetch_add(1, Ordering::Relaxed);
        let p = Arc::clone(pool);
        if let Err(e) = std::thread::Builder::new().name("scrape-runner".into()).spawn(move || runner(p, id)) {
            tracing::error!(err = %e, "cannot start a scrape runner thread");
            lock(&pool.state).threads -= 1;
        }
    }
}

/// The supervisor thread: looks at every scrape in flight when one of
/// them has something to time (a collector turning slow, a deadline), and
/// every [`POLL`] while one has no collector started yet; leaves when the
/// scraper is gone or after [`IDLE_EXIT`] without scrapes.
fn supervisor(pool: Arc<Pool>) {
    let mut sup = lock(&pool.supervised);
    loop {
        if lock(&pool.state).closed {
            sup.jobs.clear();
            sup.running = false;
            return;
        }
        sup.jobs.retain(|(inner, job)| inner.strong_count() > 0 && !job.finished.load(Ordering::Acquire));
        if sup.jobs.is_empty() {
            let (g, res) = pool.tick.wait_timeout(sup, IDLE_EXIT).unwrap_or_else(|e| e.into_inner());
            sup = g;
            if res.timed_out() && sup.jobs.is_empty() {
                sup.running = false;
                return;
            }
            continue;
        }
        let jobs = sup.jobs.clone();
        drop(sup);
        // The first event any scrape in flight has to time; one with no
        // collector started yet is looked at again after POLL.
        let mut wake: Option<Instant> = None;
        for (inner, job) in &jobs {
            let Some(inner) = inner.upgrade() else { continue };
            let at = match supervise(&inner, job) {
                Some(t) => t,
                None if job.finished.load(Ordering::Acquire) => continue,
                None => Instant::now() + POLL,
            };
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        drop(jobs);
        sup = lock(&pool.supervised);
        let wait = wake.map_or(Duration::ZERO, |w| w.saturating_duration_since(Instant::now()));
        if !wait.is_zero() {
            sup = pool.tick.wait_timeout(sup, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A runner thread: takes tasks until idle for long (the last one stays),
/// or until the scraper is gone. It counts as idle from the moment it hands
/// a body over (see [`deliver`]) until it takes its next task, so that the
/// scrape a caller submits right after its body arrives finds it idle
/// instead of starting another thread.
fn runner(pool: Arc<Pool>, id: u64) {
    let mut counted_idle = false;
    loop {
        let next = {
            let mut st = lock(&pool.state);
            if !counted_idle {
                st.idle += 1;
            }
            loop {
                if let Some(t) = st.tasks.pop_front() {
                    st.idle -= 1;
                    break Some(t);
                }
                if st.closed {
                    st.idle -= 1;
                    st.threads -= 1;
                    break None;
                }
                let (g, res) = pool.ready.wait_timeout(st, IDLE_EXIT).unwrap_or_else(|e| e.into_inner());
                st = g;
                if res.timed_out() && st.tasks.is_empty() && st.threads > 1 {
                    st.idle -= 1;
                    st.threads -= 1;
                    break None;
                }
            }
        };
        let Some((inner, task)) = next else { return };
        counted_idle = match task {
            Task::Run(job) => {
                run(&inner, &job, id) && {
                    deliver(&inner, &job);
                    true
                }
            }
            Task::Finish(job) => {
                deliver(&inner, &job);
                true
            }
        };
    }
}

/// Encodes the job and hands the body over, counted idle from before the
/// hand-over on: the caller may start its next scrape the moment it has the
/// body, and this runner takes it as soon as it is done here (no other
/// thread is started for it; the runner's loop ends the idle count).
fn deliver(inner: &Arc<Inner>, job: &Arc<Job>) {
    lock(&inner.pool.state).idle += 1;
    finish(inner, job);
}

/// Runs the job's collectors one after another, until none is left or this
/// runner was cut off inside one. True when this runner answered the last
/// one (the job is to be finished).
fn run(inner: &Arc<Inner>, job: &Arc<Job>, runner: u64) -> bool {
    loop {
        let item = job.next.fetch_add(1, Ordering::Relaxed);
        if item >= job.items.len() {
            return false;
        }
        let entry = &inner.entries[job.items[item]];
        let started = Instant::now();
        lock(&job.state).running.push(Running { runner, item, started, helped: false });
        // Take the collector, unless it is stuck; wait while another
        // scrape runs it (the supervisor cuts the wait off at the deadline).
        let taken = {
            let mut slot = lock(&entry.slot);
            loop {
                if slot.stuck_since.is_some() || job.cut[item].load(Ordering::Acquire) {
                    break None;
                }
                if let Some(c) = slot.collector.take() {
                    slot.running_since = Some(Instant::now());
                    break Some(c);
                }
                slot.waiters += 1;
                slot = entry.changed.wait(slot).unwrap_or_else(|e| e.into_inner());
                slot.waiters -= 1;
            }
        };
        let outcome = match taken {
            None => Outcome::Skipped,
            Some((mut collector, mut sink)) => {
                sink.clear();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.update(&mut sink)))
                    .unwrap_or_else(|p| Err(Error::Panicked(panic_message(p.as_ref()))));
                let secs = started.elapsed().as_secs_f64();
                let mut slot = lock(&entry.slot);
                if slot.stuck_since.take().is_some() {
                    tracing::warn!(
                        collector = entry.name,
                        seconds = secs,
                        "a timed-out collector returned; it runs again from the next scrape"
                    );
                }
                // A failed collector's partial output is dropped: all or nothing.
                if result.is_err() {
                    sink.clear();
                }
                // The sink goes back with the collector once encoded; hand
                // the collector back now, with a fresh sink if this one is
                // still in use.
                slot.collector = Some((collector, Sink::new()));
                slot.running_since = None;
                let waiting = slot.waiters > 0;
                drop(slot);
                if waiting {
                    entry.changed.notify_all();
                }
                Outcome::Done { sink, result, secs }
            }
        };
        let mut st = lock(&job.state);
        st.running.retain(|r| !(r.runner == runner && r.item == item));
        // Cut off at the deadline (its outcome already written, or the
        // scrape already encoded and its outcomes taken): the scrape went
        // on without this runner, which returns to the pool.
        match st.outcomes.get_mut(item) {
            Some(slot @ None) => *slot = Some(outcome),
            _ => return false,
        }
        st.left -= 1;
        if st.left == 0 {
            return true;
        }
    }
}

/// Encodes the scrape once every collector answered or timed out, and
/// hands the body to the caller.
fn finish(inner: &Arc<Inner>, job: &Arc<Job>) {
    if job.finished.swap(true, Ordering::AcqRel) {
        return;
    }
    let (outcomes, done) = {
        let mut st = lock(&job.state);
        (std::mem::take(&mut st.outcomes), st.done.take())
    };
    let mut sinks: Vec<Sink> = Vec::with_capacity(outcomes.len() + 1 + inner.own.len());
    let mut meta = Sink::new();
    let mut owners: Vec<usize> = Vec::with_capacity(outcomes.len());
    for (item, outcome) in outcomes.into_iter().enumerate() {
        let e = &inner.entries[job.items[item]];
        let (ok, secs) = match outcome {
            Some(Outcome::Done { sink, result, secs }) => {
                match &result {
                    Ok(()) => {}
                    Err(err) if err.is_no_data() => tracing::debug!(collector = e.name, err = %err, "collector returned no data"),
                    Err(err) => tracing::error!(collector = e.name, duration_seconds = secs, err = %err, "collector failed"),
                }
                sinks.push(sink);
                owners.push(job.items[item]);
                (result.is_ok(), secs)
            }
            Some(Outcome::TimedOut { secs }) => (false, secs),
            Some(Outcome::Skipped) | None => {
                tracing::debug!(collector = e.name, "collector skipped: still stuck in an earlier scrape");
                (false, 0.0)
            }
        };
        meta.family("node_scrape_collector_duration_seconds", "node_exporter: Duration of a collector scrape.", Kind::Gauge)
            .sample(&[("collector", e.name)], secs);
        meta.family("node_scrape_collector_success", "node_exporter: Whether a collector succeeded.", Kind::Gauge)
            .sample(&[("collector", e.name)], if ok { 1.0 } else { 0.0 });
    }
    sinks.push(meta);
    for c in &inner.own {
        let mut own = Sink::new();
        if let Err(e) = lock(c).update(&mut own) {
            tracing::debug!(err = %e, "exporter metrics incomplete");
        }
        sinks.push(own);
    }
    for c in expo::reconcile(&mut sinks) {
        let name = |i: usize| owners.get(i).map_or("node-agent", |&e| inner.entries[e].name);
        tracing::error!(family = %c.family, collector = name(c.dropped_from), kept_by = name(c.kept_by), "family dropped: another collector produces it");
    }
    let mut out = Vec::with_capacity(inner.last_len.load(Ordering::Relaxed) + 4096);
    let returned = expo::encode_to(sinks, job.format, &mut out);
    inner.last_len.store(out.len(), Ordering::Relaxed);
    // Hand the sinks back so their buffers are reused next time; a sink
    // grown by an outsized scrape (a huge textfile) is freed instead, and
    // the memory given back to the system.
    let mut freed = false;
    for (i, sink) in owners.into_iter().zip(returned) {
        if sink.retained_bytes() > KEEP_SINK_BYTES {
            freed = true;
            continue;
        }
        if let Some((_, s)) = lock(&inner.entries[i].slot).collector.as_mut() {
            *s = sink;
        }
    }
    let large = out.capacity() > KEEP_SINK_BYTES;
    // Out of the count before the body is handed over (the caller may start
    // its next scrape at once: that is no overlap); trimmed after it, so the
    // trim never delays an answer.
    let overlapped = inner.overlap.leave();
    #[cfg(test)]
    inner.overlap_trims.fetch_add(usize::from(overlapped), Ordering::Relaxed);
    if let Some(done) = done {
        done(out);
    }
    if overlapped | freed | large {
        crate::memory::trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let both: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || text(&s, &Selection::default()))
            })
            .collect();
        for h in both {
            assert!(h.join().unwrap().contains("slow_value 1"));
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
}
