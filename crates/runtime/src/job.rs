//! One scrape's state: which collectors it has left, what each did, who
//! runs which; and the runner's loop over them ([`run`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use expo::{Format, Sink};

use crate::{lock, panic_message, Inner};
use host::Error;

/// What one collector did in one scrape.
// The sink is moved in and out of its collector's slot by value (it keeps
// its allocations from scrape to scrape); boxing it would not save a copy
// worth having, a few per collector per scrape.
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
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
pub(super) struct Running {
    pub(super) runner: u64,
    pub(super) item: usize,
    pub(super) started: Instant,
    /// Another runner was started beside it (it is slow).
    pub(super) helped: bool,
}

pub(super) type Done = Box<dyn FnOnce(Vec<u8>) + Send>;

pub(super) struct JobState {
    pub(super) outcomes: Vec<Option<Outcome>>,
    pub(super) left: usize,
    pub(super) running: Vec<Running>,
    pub(super) done: Option<Done>,
}

pub(super) struct Job {
    /// Entry indices, in scrape order.
    pub(super) items: Vec<usize>,
    pub(super) next: AtomicUsize,
    pub(super) format: Format,
    pub(super) deadline: Duration,
    pub(super) state: Mutex<JobState>,
    pub(super) finished: AtomicBool,
    /// Per item: cut off at the deadline (a runner waiting for that
    /// collector gives up rather than run it for a scrape already gone).
    pub(super) cut: Vec<AtomicBool>,
}

/// Runs the job's collectors one after another, until none is left or this
/// runner was cut off inside one. True when this runner answered the last
/// one (the job is to be finished).
pub(super) fn run(inner: &Arc<Inner>, job: &Arc<Job>, runner: u64) -> bool {
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
