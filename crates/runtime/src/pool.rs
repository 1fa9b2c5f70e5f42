//! The runner threads (started on demand, idle ones leaving after a
//! while) and the supervisor thread that times every scrape in flight.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::job::{run, Job, Outcome};
use crate::report::finish;
use crate::{lock, Inner};

pub(super) enum Task {
    Run(Arc<Job>),
    Finish(Arc<Job>),
}

/// The runner threads: started on demand, so that a task never waits for a
/// busy runner; idle ones wait for work and leave after a while (one stays).
pub(super) struct Pool {
    pub(super) state: Mutex<PoolState>,
    pub(super) ready: Condvar,
    pub(super) ids: std::sync::atomic::AtomicU64,
    /// The scrapes in flight, for the supervisor thread.
    pub(super) supervised: Mutex<Supervised>,
    /// Wakes the supervisor: a scrape started, or the scraper is gone.
    pub(super) tick: Condvar,
    /// Trims by the last surplus runner to leave.
    #[cfg(test)]
    pub(super) surplus_trims: std::sync::atomic::AtomicUsize,
}

/// The scrapes the supervisor watches (each with its scraper, held weakly:
/// the supervisor keeps no scraper alive), and whether it runs.
#[derive(Default)]
pub(super) struct Supervised {
    pub(super) jobs: Vec<(Weak<Inner>, Arc<Job>)>,
    pub(super) running: bool,
}

/// How often a scrape with nothing to time yet (no collector started) is
/// looked at again.
pub(super) const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
pub(super) struct PoolState {
    /// Tasks with the scraper they belong to (held only while queued and
    /// run: an idle runner keeps no scraper, and its collectors, alive).
    pub(super) tasks: VecDeque<(Arc<Inner>, Task)>,
    pub(super) idle: usize,
    pub(super) threads: usize,
    /// The scraper is gone: idle runners leave.
    pub(super) closed: bool,
}

pub(super) const IDLE_EXIT: Duration = Duration::from_secs(60);

/// Runners that wait [`IDLE_EXIT`] before leaving: enough for scrapes one
/// after another and one slow collector's helper (or two Prometheus
/// replicas). Runners beyond these were started by a burst of overlapping
/// scrapes (up to `--web.max-requests`, most of them waiting for a
/// collector another scrape holds) and leave after [`SURPLUS_IDLE_EXIT`].
pub(super) const KEPT_RUNNERS: usize = 2;

/// How long a runner beyond [`KEPT_RUNNERS`] waits for work before leaving.
/// The last of them to leave trims the heap. Kept for a minute instead,
/// the runners of a burst (`fail_closed`'s: 256 connections admitted, up
/// to 40 scrapes at once, 50 to 100 runners) held 3.6 to 8.3 MB of stacks
/// and freed heap resident, which the kubelet counts in the working set.
#[cfg(not(test))]
pub(super) const SURPLUS_IDLE_EXIT: Duration = Duration::from_secs(5);
#[cfg(test)]
pub(super) const SURPLUS_IDLE_EXIT: Duration = Duration::from_millis(200);

impl Pool {
    /// Hands `job` to the supervisor thread, started if none runs.
    pub(super) fn supervise(inner: &Arc<Inner>, job: &Arc<Job>) {
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

    pub(super) fn submit(inner: &Arc<Inner>, task: Task) {
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

/// A runner thread: takes tasks until idle for long ([`IDLE_EXIT`], or
/// [`SURPLUS_IDLE_EXIT`] beyond [`KEPT_RUNNERS`]; the last one stays), or
/// until the scraper is gone. It counts as idle from the moment it hands
/// a body over (see [`deliver`]) until it takes its next task, so that the
/// scrape a caller submits right after its body arrives finds it idle
/// instead of starting another thread.
fn runner(pool: Arc<Pool>, id: u64) {
    let mut counted_idle = false;
    let mut trim = false;
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
                let surplus = st.threads > KEPT_RUNNERS;
                let wait = if surplus { SURPLUS_IDLE_EXIT } else { IDLE_EXIT };
                let (g, res) = pool.ready.wait_timeout(st, wait).unwrap_or_else(|e| e.into_inner());
                st = g;
                if res.timed_out() && st.tasks.is_empty() && st.threads > 1 {
                    st.idle -= 1;
                    st.threads -= 1;
                    // The last surplus runner to go gives back what the
                    // burst left: the others' freed heap (their exits have
                    // returned their thread caches to it).
                    trim = surplus && st.threads <= KEPT_RUNNERS;
                    break None;
                }
            }
        };
        let Some((inner, task)) = next else {
            if trim {
                #[cfg(test)]
                pool.surplus_trims.fetch_add(1, Ordering::Relaxed);
                crate::memory::trim();
            }
            return;
        };
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
