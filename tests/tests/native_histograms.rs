//! Native histograms, end to end: node-agent's own server (negotiation,
//! scrape, protobuf encoder, gzip) serves a known latency distribution as a
//! native histogram of schema 3, a real Prometheus started with
//! `--enable-feature=native-histograms` scrapes it every second, and the
//! p50 and p99 Prometheus computes (`histogram_quantile`) are within 12.5 %
//! of the exact quantiles of the samples. Prometheus must have stored a
//! native histogram (a `histogram` in the query result), so the test cannot
//! pass on classic buckets.
//!
//! Needs `prometheus` (Debian's package, 2.42), which `cargo xtask test`
//! installs. Without it the test skips with a message, except in CI.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use expo::{Kind, Native, Sink};
use node_agent_tests::prometheus::{need, Prometheus, ACCEPT_PROTOBUF};

const FAMILY: &str = "test_request_duration_seconds";
const SCHEMA: i8 = 3;
const ZERO_THRESHOLD: f64 = 1e-9;

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// 10,000 latencies in seconds: 200 exact zeros (a cache hit), 8,800
/// log-normal around 4 ms (sigma 0.7), 1,000 uniform slow ones in 50-400 ms.
fn latencies() -> Vec<f64> {
    let mut rng = Rng(42);
    let mut v: Vec<f64> = Vec::with_capacity(10_000);
    v.extend(std::iter::repeat_n(0.0, 200));
    v.extend((0..8_800).map(|_| 0.004 * (0.7 * rng.normal()).exp()));
    v.extend((0..1_000).map(|_| 0.05 + 0.35 * rng.unit()));
    v
}

/// The bucket of `v` in `schema`: bucket `i` holds (2^((i-1)·2^-schema), 2^(i·2^-schema)].
fn bucket_index(v: f64, schema: i8) -> i32 {
    (v.log2() * f64::from(schema).exp2()).ceil() as i32
}

/// The native histogram of `values`: (zero count, ascending (index, count)).
fn bucketize(values: &[f64], schema: i8, zero_threshold: f64) -> (u64, Vec<(i32, u64)>) {
    let mut zero = 0;
    let mut buckets = std::collections::BTreeMap::new();
    for &v in values {
        if v <= zero_threshold {
            zero += 1;
        } else {
            *buckets.entry(bucket_index(v, schema)).or_insert(0u64) += 1;
        }
    }
    (zero, buckets.into_iter().collect())
}

/// The exact `q` quantile of `sorted` (nearest rank).
fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A collector writing the known distribution, counting its scrapes.
struct Latency {
    sum: f64,
    count: u64,
    zero: u64,
    buckets: Vec<(i32, u64)>,
    scrapes: Arc<AtomicUsize>,
}

impl host::Collector for Latency {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let native = Native { schema: SCHEMA, zero_threshold: ZERO_THRESHOLD, zero_count: self.zero, buckets: &self.buckets };
        // Coarse classic buckets: quantiles from these would be far off.
        sink.family(FAMILY, "Request latency (a known distribution).", Kind::Histogram).native_histogram(
            &[("path", "/api")],
            self.sum,
            self.count,
            &native,
            &[0.001, 0.016, 0.25],
        );
        self.scrapes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// node-agent's HTTP server (`node_agent::server::serve`) on a free port of
/// 127.0.0.1, serving `collector` alone; stopped when dropped.
struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(collector: Box<dyn host::Collector>) -> Server {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("tokio runtime");
        let listeners = rt.block_on(node_agent::server::bind(&["127.0.0.1:0".to_string()])).expect("bind 127.0.0.1:0");
        let addr = listeners[0].local_addr().expect("local address");
        let state = Arc::new(node_agent::server::State {
            scraper: Arc::new(runtime::Scraper::new(vec![("latency", collector)])),
            telemetry_path: "/metrics".into(),
            limit: None,
            web: node_agent::webconfig::Handle::none(),
            admission: node_agent::admission::Admission::new(16),
            handler: Default::default(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(node_agent::server::serve(
                listeners,
                state,
                async move {
                    let _ = rx.await;
                },
                Duration::from_secs(1),
            ))
        });
        Server { addr, stop: Some(tx), thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A Prometheus with native histograms on, scraping `target` every second.
fn prometheus(bin: &std::path::Path, dir: &std::path::Path, target: std::net::SocketAddr) -> Prometheus {
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: native\n    static_configs:\n      - targets: ['{target}']\n"
    );
    Prometheus::start(bin, dir, &config, &["--enable-feature=native-histograms"])
}

#[test]
fn the_example_histogram_is_bucketed_as_prometheus_says() {
    // Bucket i of schema 3 is (2^((i-1)/8), 2^(i/8)].
    assert_eq!(bucket_index(1.0, 3), 0);
    assert_eq!(bucket_index(2.0, 3), 8);
    assert_eq!(bucket_index(2.0f64.powf(1.0 / 8.0) * 1.0001, 3), 2);
    assert_eq!(bucket_index(0.5, 3), -8);
    assert_eq!(bucket_index(0.4, 3), -10, "2^(-11/8) = 0.385 < 0.4 <= 2^(-10/8) = 0.420");
    let (zero, b) = bucketize(&[0.0, 1.0, 1.0, 3.0], 3, ZERO_THRESHOLD);
    assert_eq!((zero, b), (1, vec![(0, 2), (13, 1)]));
}

#[test]
fn prometheus_quantiles_of_a_native_histogram_match_the_samples() {
    let Some(bin) = need("prometheus") else { return };
    let values = latencies();
    let (zero, buckets) = bucketize(&values, SCHEMA, ZERO_THRESHOLD);
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let (p50, p99) = (exact_quantile(&sorted, 0.5), exact_quantile(&sorted, 0.99));
    let scrapes = Arc::new(AtomicUsize::new(0));
    let server = Server::start(Box::new(Latency {
        sum: values.iter().sum(),
        count: values.len() as u64,
        zero,
        buckets: buckets.clone(),
        scrapes: Arc::clone(&scrapes),
    }));

    // What Prometheus will be answered: protobuf, gzipped, the native buckets.
    let resp = ureq::get(&format!("http://{}/metrics", server.addr))
        .set("Accept", ACCEPT_PROTOBUF)
        .set("Accept-Encoding", "gzip")
        .timeout(Duration::from_secs(10))
        .call()
        .expect("scrape our server");
    assert_eq!(resp.header("Content-Type"), Some(expo::Format::Protobuf.content_type()));
    assert_eq!(resp.header("Content-Encoding"), Some("gzip"));
    let mut gz = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut gz).expect("read body");
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut body).expect("gunzip");
    let fams = expo::proto::read_delimited(&body).expect("delimited MetricFamily messages");
    let fam = fams.iter().find(|f| f.name.as_deref() == Some(FAMILY)).expect("the family is served");
    let h = fam.metric[0].histogram.as_ref().expect("a histogram");
    assert_eq!((h.schema, h.zero_count, h.sample_count), (Some(i32::from(SCHEMA)), Some(zero), Some(values.len() as u64)));
    let served: i64 = h
        .positive_delta
        .iter()
        .scan(0i64, |c, d| {
            *c += d;
            Some(*c)
        })
        .sum();
    assert_eq!(served as u64 + zero, values.len() as u64, "the deltas add up to every sample");

    let dir = tempfile::tempdir().expect("tempdir");
    let prom = prometheus(&bin, dir.path(), server.addr);
    let before = scrapes.load(Ordering::SeqCst);
    // Two scrapes by Prometheus, and the series queryable.
    prom.wait_for("two scrapes", Duration::from_secs(60), || (scrapes.load(Ordering::SeqCst) >= before + 2).then_some(()));
    let stored =
        prom.wait_for("native histogram of the family", Duration::from_secs(30), || prom.query(FAMILY).ok().filter(|r| !r.is_empty()));
    assert_eq!(prom.scalar("up{job=\"native\"}"), 1.0, "the target is up");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let hist = stored[0].get("histogram").unwrap_or_else(|| panic!("Prometheus stored a float, not a native histogram: {stored:?}"));
    assert!(stored[0].get("value").is_none(), "{stored:?}");
    assert_eq!(hist[1]["count"].as_str(), Some("10000"), "{hist}");
    assert!(hist[1]["buckets"].as_array().is_some_and(|b| b.len() > 20), "the native buckets, not three classic ones: {hist}");
    assert_eq!(stored[0]["metric"]["path"], "/api", "{stored:?}");

    for (q, exact) in [(0.5, p50), (0.99, p99)] {
        let got = prom.scalar(&format!("histogram_quantile({q}, {FAMILY})"));
        let err = (got - exact).abs() / exact;
        eprintln!("p{}: Prometheus {got:.6} s, exact {exact:.6} s, error {:.2} %", q * 100.0, err * 100.0);
        assert!(err <= 0.125, "p{}: Prometheus says {got}, the samples {exact}: {:.1} % off", q * 100.0, err * 100.0);
    }
    // The classic buckets were not ingested as such (Prometheus 2.42 keeps
    // the native histogram alone), so the quantiles above came from it.
    let classic = prom.query(&format!("{FAMILY}_bucket")).unwrap_or_default();
    eprintln!("classic bucket series stored beside it: {}", classic.len());
}
