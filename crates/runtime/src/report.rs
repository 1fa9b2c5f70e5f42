//! A scrape's report: the collectors' sinks, the scrape's own families
//! and the exporter's, encoded in the requested format and handed to the
//! caller; the sinks go back to their collectors for reuse.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use expo::{Kind, Sink};

use crate::job::{Job, Outcome};
use crate::{lock, Inner};

/// A collector's sink larger than this is not kept for reuse after a scrape.
const KEEP_SINK_BYTES: usize = 8 << 20;

/// Encodes the scrape once every collector answered or timed out, and
/// hands the body to the caller.
pub(super) fn finish(inner: &Arc<Inner>, job: &Arc<Job>) {
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
    inner.overlap_trims.fetch_add(usize::from(overlapped == crate::memory::Trim::Now), Ordering::Relaxed);
    if let Some(done) = done {
        done(out);
    }
    if let crate::memory::Trim::Later(delay) = overlapped {
        inner.overlap.later(delay);
    }
    if overlapped == crate::memory::Trim::Now || freed || large {
        crate::memory::trim();
    }
}
