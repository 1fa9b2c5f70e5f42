//! Every textfile the textfile collector accepts is ingested by a real
//! Prometheus (Debian's 2.42), in each exposition format (issue #33, item
//! 3): the seeds of `tests/fixtures/textfile` (also the fuzzers' seeds),
//! `accepted/` as one textfile directory, and every case of `refused/` in a
//! directory of its own beside a good file, each served by a node-agent of
//! its own (the textfile collector alone). One Prometheus scrapes every
//! agent three times over, through a small proxy in this test that pins the
//! format by the Accept header it sends (Prometheus 2.42 cannot be told to
//! ask for plain text: it has no `scrape_protocols`): text 0.0.4,
//! OpenMetrics 1.0.0, protobuf (Prometheus runs with
//! `--enable-feature=native-histograms`, so its protobuf parser is on);
//! and a fourth job scrapes the accepted agent directly, with the format
//! Prometheus negotiates itself.
//!
//! For every target: it is up (Prometheus's parser took the whole scrape),
//! `scrape_samples_scraped` is the number of samples the proxy served,
//! Prometheus counted no duplicate or out-of-order sample, and for the
//! accepted files chosen series (escaped, unicode and 64 KiB label values,
//! labels differing in case, merged and padded families, histograms,
//! summaries, suffixes, NaN and infinities) come back with the values and
//! labels written. A refused case leaves its target up with
//! `node_textfile_scrape_error 1` and the good file's series served.
//!
//! The inputs (one file per theme in accepted/): escapes.prom (`\\`, `\"`,
//! `\n`, a raw tab, unicode in label values; escapes in HELP),
//! long_and_case.prom (a 64 KiB label value, 60 labels, names differing
//! only in case, colons, leading underscores), merge_a/merge_b.prom (a
//! family and a histogram split over two files with different label sets:
//! merged and padded), histogram.prom, summary.prom, suffixes.prom
//! (`_total`, `_created`, `_info`, `_count`, `_sum`, `_bucket` against the
//! TYPE lines, a counter without `_total`, `le` and `quantile` outside
//! histograms and summaries), collisions.prom (a counter and a gauge of
//! one base name, `_info`/`_created_total` counters), values.prom (NaN,
//! ±Inf, -0, extremes, Go's other spellings), controls.prom (NUL, CR, ESC
//! in values, a 10,000-character name), comments.prom (comments, blank and
//! indented lines, `# EOF` mid-file, an empty HELP), typed_later.prom,
//! crlf.prom, empty.prom, only_comments.prom, and not_prom.txt (never
//! read). In OpenMetrics a bucket's `le` is written `1.0` where text writes
//! `1`, and Prometheus 2.42 stores it as given; the queries allow both.
//!
//! Needs `prometheus`, which `cargo xtask test` installs. Without it the
//! test skips with a message, except in CI.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use expo::Format;
use node_agent_tests::prometheus::{self, Prometheus};
use node_agent_tests::Kill;

/// The formats, as the proxy's `format` parameter names them, with the
/// Accept header it sends for each.
const FORMATS: [(&str, Format, &str); 3] = [
    ("text", Format::Text, prometheus::ACCEPT_TEXT),
    ("openmetrics", Format::OpenMetrics, prometheus::ACCEPT_OPENMETRICS),
    ("protobuf", Format::Protobuf, prometheus::ACCEPT_PROTOBUF),
];

/// The seed directory's cases: `accepted` (every file of accepted/), and
/// `refused-<name>` for each entry of refused/ (a file, or a directory of
/// files read together), each with `zz_good.prom` beside it.
fn cases(seeds: &Path, into: &Path) -> Vec<(String, PathBuf)> {
    let copy_files = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).expect("create case directory");
        for e in std::fs::read_dir(from).expect("read seed directory").flatten() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy seed");
        }
    };
    let mut out = Vec::new();
    let accepted = into.join("accepted");
    copy_files(&seeds.join("accepted"), &accepted);
    out.push(("accepted".to_string(), accepted));
    let mut refused: Vec<PathBuf> = std::fs::read_dir(seeds.join("refused")).expect("read refused/").flatten().map(|e| e.path()).collect();
    refused.sort();
    for p in refused {
        let stem = p.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 name").to_string();
        let dir = into.join(format!("refused-{stem}"));
        if p.is_dir() {
            copy_files(&p, &dir);
        } else {
            std::fs::create_dir_all(&dir).expect("create case directory");
            std::fs::copy(&p, dir.join(p.file_name().expect("a file name"))).expect("copy seed");
        }
        std::fs::write(dir.join("zz_good.prom"), "# TYPE textfile_good gauge\ntextfile_good 1\n").expect("write good file");
        out.push((format!("refused-{stem}"), dir));
    }
    out
}

/// The samples Prometheus 2.42 reads from a body: in text and OpenMetrics
/// every line that is neither empty nor a comment; in protobuf one per
/// counter, gauge or untyped metric, and per classic histogram its `_sum`,
/// `_count` and buckets up to the first `+Inf` (one added when there is
/// none), as its protobufparse.go expands them.
fn samples_in(format: Format, body: &[u8]) -> usize {
    if format != Format::Protobuf {
        let text = String::from_utf8_lossy(body);
        return text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count();
    }
    let fams = expo::proto::read_delimited(body).expect("delimited MetricFamily messages");
    fams.iter()
        .flat_map(|f| &f.metric)
        .map(|m| match &m.histogram {
            Some(h) => {
                let upto = h.bucket.iter().position(|b| b.upper_bound == Some(f64::INFINITY));
                2 + upto.map_or(h.bucket.len() + 1, |i| i + 1)
            }
            None => 1,
        })
        .sum()
}

/// What the proxy served last, by (case, format): the body's sample count.
type Served = Arc<Mutex<HashMap<(String, String), usize>>>;

/// A proxy Prometheus scrapes: `GET /<case>?format=<format>` is the case's
/// agent's `/metrics`, fetched with that format's Accept header and checked
/// to come back in that format. Its threads end with the test.
struct Proxy {
    addr: SocketAddr,
    served: Served,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    fn start(agents: HashMap<String, String>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let served: Served = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let agents = Arc::new(agents);
        let (s, e) = (Arc::clone(&served), Arc::clone(&errors));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (agents, s, e) = (Arc::clone(&agents), Arc::clone(&s), Arc::clone(&e));
                std::thread::spawn(move || {
                    if let Err(err) = Self::serve(conn, &agents, &s) {
                        e.lock().expect("errors").push(err);
                    }
                });
            }
        });
        Proxy { addr, served, errors }
    }

    fn serve(mut conn: TcpStream, agents: &HashMap<String, String>, served: &Served) -> Result<(), String> {
        conn.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).map_err(|e| format!("proxy: reading a request: {e}"))?;
            if n == 0 || head.len() > 65536 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let target = head.split_whitespace().nth(1).unwrap_or("/");
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let case = path.trim_start_matches('/');
        let fmt = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "format").map(|(_, v)| v.into_owned()).unwrap_or_default();
        let (Some(agent), Some(&(_, format, accept))) = (agents.get(case), FORMATS.iter().find(|f| f.0 == fmt)) else {
            return Err(format!("proxy: unknown target {target}"));
        };
        let resp = ureq::get(&format!("http://{agent}/metrics"))
            .set("Accept", accept)
            .timeout(Duration::from_secs(20))
            .call()
            .map_err(|e| format!("proxy: {case} {fmt}: {e}"))?;
        let content_type = resp.header("Content-Type").unwrap_or("").to_string();
        let mut body = Vec::new();
        resp.into_reader().read_to_end(&mut body).map_err(|e| format!("proxy: {case} {fmt}: {e}"))?;
        if content_type != format.content_type() {
            return Err(format!("proxy: {case}: asked for {fmt} with {accept:?}, got {content_type:?}"));
        }
        served.lock().expect("served").insert((case.to_string(), fmt.clone()), samples_in(format, &body));
        let mut out =
            format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                .into_bytes();
        out.extend_from_slice(&body);
        conn.write_all(&out).map_err(|e| format!("proxy: writing {case} {fmt}: {e}"))
    }
}

/// prometheus.yml: a job per format scraping every case through the proxy
/// (the case in the target's `seed` label), and `negotiated`, the accepted
/// agent scraped directly.
fn config(proxy: SocketAddr, cases: &[String], accepted: &str) -> String {
    let mut c = String::from("global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\nscrape_configs:\n");
    for (job, _, _) in FORMATS {
        c.push_str(&format!("  - job_name: {job}\n    params:\n      format: [{job}]\n    static_configs:\n"));
        for case in cases {
            c.push_str(&format!(
                "      - targets: ['{proxy}']\n        labels:\n          seed: '{case}'\n          __metrics_path__: '/{case}'\n"
            ));
        }
    }
    c.push_str(&format!(
        "  - job_name: negotiated\n    static_configs:\n      - targets: ['{accepted}']\n        labels:\n          seed: accepted\n"
    ));
    c
}

fn labels(sample: &serde_json::Value) -> BTreeMap<String, String> {
    sample["metric"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
        .unwrap_or_default()
}

/// Prometheus's own counter `name` (summed over its labels), from its /metrics.
fn own_counter(prom: &Prometheus, name: &str) -> f64 {
    let resp = ureq::get(&format!("{}/metrics", prom.base)).set("Accept", prometheus::ACCEPT_TEXT).call().expect("Prometheus's /metrics");
    let text = resp.into_string().expect("Prometheus's /metrics");
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next().and_then(expo::text::parse_value))
        .collect();
    assert!(!values.is_empty(), "Prometheus does not export {name}");
    values.iter().sum()
}

#[test]
fn prometheus_ingests_every_accepted_textfile_in_every_format() {
    let Some(bin) = prometheus::need("prometheus") else { return };
    let agent_bin = node_agent_tests::agent_binary();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cases = cases(&node_agent_tests::fuzz::textfile_seeds_dir(), &tmp.path().join("cases"));
    assert!(cases.len() > 20, "the seeds: {cases:?}");
    let mut guards: Vec<Kill> = Vec::new();
    let mut agents: HashMap<String, String> = HashMap::new();
    for (name, dir) in &cases {
        let flags = [
            "--collector.disable-defaults".to_string(),
            "--collector.textfile".into(),
            format!("--collector.textfile.directory={}", dir.display()),
        ];
        let (guard, url, _) = node_agent_tests::start_exporter(&agent_bin, &flags).expect("start node-agent");
        guards.push(guard);
        let addr = url.trim_start_matches("http://").trim_end_matches("/metrics").to_string();
        agents.insert(name.clone(), addr);
    }
    let accepted_addr = agents["accepted"].clone();
    let proxy = Proxy::start(agents);
    let names: Vec<String> = cases.iter().map(|(n, _)| n.clone()).collect();
    let prom_dir = tmp.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus directory");
    let prom = Prometheus::start(&bin, &prom_dir, &config(proxy.addr, &names, &accepted_addr), &["--enable-feature=native-histograms"]);

    // Every target scraped once.
    let total = names.len() * FORMATS.len() + 1;
    let targets = prom.wait_for("scrape of every target", Duration::from_secs(90), || {
        let t = prom.targets();
        (t.len() == total && t.iter().all(|t| t["health"] != "unknown" && t["lastScrape"].as_str().is_some_and(|s| !s.starts_with("0001"))))
            .then_some(t)
    });
    let proxy_errors = proxy.errors.lock().expect("errors").clone();
    assert!(proxy_errors.is_empty(), "the proxy:\n{}", proxy_errors.join("\n"));
    // Up: Prometheus's parser took the whole of every scrape.
    let down: Vec<String> = targets
        .iter()
        .filter(|t| t["health"] != "up")
        .map(|t| format!("{} {}: {}", t["labels"]["job"], t["labels"]["seed"], t["lastError"]))
        .collect();
    assert!(down.is_empty(), "Prometheus refused what node-agent served:\n{}", down.join("\n"));
    for t in &targets {
        let url = t["scrapeUrl"].as_str().unwrap_or_default();
        assert!(t["lastError"].as_str().is_some_and(str::is_empty), "{url}: {}", t["lastError"]);
    }

    // Samples: what Prometheus read is what was served. The counts do not
    // change between scrapes (only values do), so the last served is the
    // last scraped.
    let served = proxy.served.lock().expect("served").clone();
    let mut scraped: HashMap<(String, String), f64> = HashMap::new();
    for s in prom.query("scrape_samples_scraped").expect("scrape_samples_scraped") {
        let l = labels(&s);
        scraped.insert((l["seed"].clone(), l["job"].clone()), prometheus::value(&s).unwrap_or(f64::NAN));
    }
    for name in &names {
        for (fmt, _, _) in FORMATS {
            let key = (name.clone(), fmt.to_string());
            let n = served.get(&key).unwrap_or_else(|| panic!("{name} was never served as {fmt}"));
            assert_eq!(
                scraped.get(&key).copied(),
                Some(*n as f64),
                "{name} in {fmt}: Prometheus read a different number of samples than were served"
            );
        }
    }
    let negotiated = scraped.get(&("accepted".to_string(), "negotiated".to_string())).copied();
    assert_eq!(
        negotiated,
        served.get(&("accepted".to_string(), "protobuf".to_string())).map(|n| *n as f64),
        "negotiated: protobuf expected"
    );
    for c in [
        "prometheus_target_scrapes_sample_duplicate_timestamp_total",
        "prometheus_target_scrapes_sample_out_of_order_total",
        "prometheus_target_scrapes_sample_out_of_bounds_total",
        "prometheus_target_scrapes_exceeded_sample_limit_total",
    ] {
        assert_eq!(own_counter(&prom, c), 0.0, "{c}: Prometheus dropped samples node-agent served");
    }

    // The accepted files, as written, in every format.
    let jobs = ["text", "openmetrics", "protobuf", "negotiated"];
    let one = |q: &str, job: &str| -> (BTreeMap<String, String>, f64) {
        let full = format!("{q}{}", if q.contains('{') { "" } else { "{}" })
            .replacen('{', &format!("{{job=\"{job}\",seed=\"accepted\","), 1)
            .replace(",}", "}");
        let r = prom.query(&full).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 1, "{full}: one series expected, got {r:?}");
        (labels(&r[0]), prometheus::value(&r[0]).unwrap_or_else(|| panic!("{full}: no value: {r:?}")))
    };
    let long = "x".repeat(65536);
    for job in jobs {
        let value = |q: &str| one(q, job).1;
        let label = |q: &str, l: &str| one(q, job).0.get(l).cloned().unwrap_or_else(|| panic!("{job}: {q}: no label {l}"));
        assert_eq!(value("node_textfile_scrape_error"), 0.0, "{job}: the accepted files are accepted whole");
        assert_eq!(label("esc_label_values{case=\"backslash\"}", "v"), "C:\\Windows\\System32\\", "{job}");
        assert_eq!(label("esc_label_values{case=\"quote\"}", "v"), "say \"hi\"", "{job}");
        assert_eq!(label("esc_label_values{case=\"newline\"}", "v"), "line1\nline2\n", "{job}");
        assert_eq!(label("esc_label_values{case=\"unicode\"}", "v"), "héllo wörld ✓ 日本語 🚀", "{job}");
        assert_eq!(label("esc_label_values{case=\"tab\"}", "v"), "a\tb", "{job}");
        assert_eq!(label("esc_label_values{case=\"braces\"}", "v"), "{a=\"b\"} 1 # x", "{job}");
        assert_eq!(value("esc_label_values{case=\"empty\"}"), 7.0, "{job}");
        assert_eq!(label("long_label_value", "v"), long, "{job}: the 64 KiB label value");
        assert_eq!(one("many_labels", job).0.len(), 60 + 4, "{job}: 60 labels, and __name__, job, instance, seed");
        let case = one("case_labels", job).0;
        assert_eq!((case["a"].as_str(), case["A"].as_str(), case["aA"].as_str()), ("lower", "upper", "mixed"), "{job}");
        assert_eq!(value("job:rule_like:rate5m{_l=\"leading underscore\"}"), 2.0, "{job}");
        assert_eq!(value("_underscore_metric"), 3.0, "{job}");
        assert_eq!(value("merged_metric{x=\"1\"}"), 1.0, "{job}: merged across files");
        assert_eq!(value("merged_metric{y=\"2\"}"), 2.0, "{job}: merged across files");
        assert_eq!(value("padded{b=\"2\",c=\"3\"}"), 2.0, "{job}");
        assert_eq!(value("padded{a=\"\",b=\"\",c=\"\"}"), 3.0, "{job}: padded with empty labels");
        assert_eq!(value("latency_seconds_bucket{op=\"read\",le=~\"1|1\\\\.0\"}"), 3.0, "{job}: OpenMetrics writes le=\"1.0\"");
        assert_eq!(value("latency_seconds_bucket{op=\"read\",le=\"+Inf\"}"), 4.0, "{job}");
        assert_eq!(value("latency_seconds_count{op=\"write\"}"), 0.0, "{job}");
        assert!(value("latency_seconds_sum{op=\"write\"}").is_nan(), "{job}");
        assert_eq!(value("latency_seconds_bucket{op=\"scan\",disk=\"sda\",le=\"0.5\"}"), 1.0, "{job}: from the other file");
        assert_eq!(value("sizes_bytes_bucket{le=\"+Inf\"}"), 2.0, "{job}: a histogram without buckets");
        assert_eq!(value("rpc_duration_seconds{service=\"a\",quantile=\"0.5\"}"), 0.01, "{job}");
        assert!(value("rpc_duration_seconds{service=\"a\",quantile=\"0.99\"}").is_nan(), "{job}");
        assert_eq!(value("rpc_duration_seconds_count{service=\"a\"}"), 100.0, "{job}");
        assert_eq!(value("quantile_free_count"), 0.0, "{job}");
        assert_eq!(value("requests_total{code=\"200\"}"), 1027.0, "{job}");
        assert_eq!(value("bare_counter"), 5.0, "{job}: a counter without _total");
        assert_eq!(value("created_thing_total"), 3.0, "{job}");
        assert_eq!(value("created_thing_created"), 1.7e9, "{job}");
        assert_eq!(value("odd_total"), 8.0, "{job}");
        assert_eq!(value("total_total"), 1.0, "{job}");
        assert_eq!(value("x_total"), 1.0, "{job}");
        assert_eq!(value("build_info{version=\"1.2.3\"}"), 1.0, "{job}");
        assert_eq!(value("queue_count"), 4.0, "{job}");
        assert_eq!(value("queue_sum"), 9.0, "{job}");
        assert_eq!(value("gauge_total"), 7.0, "{job}");
        assert_eq!(value("lonely_bucket{le=\"0.5\"}"), 3.0, "{job}: le kept outside histograms");
        assert_eq!(value("gauge_with_le{le=\"0.5\"}"), 1.0, "{job}: le kept outside histograms");
        assert_eq!(value("untyped_with_quantile{quantile=\"0.9\"}"), 2.0, "{job}: quantile kept outside summaries");
        assert!(value("untyped_values{v=\"nan\"}").is_nan(), "{job}");
        assert!(value("gauge_nan").is_nan(), "{job}");
        assert_eq!(value("untyped_values{v=\"pos_inf\"}"), f64::INFINITY, "{job}");
        assert_eq!(value("untyped_values{v=\"inf_lower\"}"), f64::INFINITY, "{job}");
        assert_eq!(value("untyped_values{v=\"neg_inf\"}"), f64::NEG_INFINITY, "{job}");
        assert_eq!(value("counter_inf_total"), f64::INFINITY, "{job}");
        assert_eq!(value("untyped_values{v=\"tiny\"}"), 1e-300, "{job}");
        assert_eq!(value("untyped_values{v=\"huge\"}"), f64::MAX, "{job}");
        assert_eq!(value("untyped_values{v=\"dot\"}"), 0.5, "{job}");
        assert_eq!(value("untyped_values{v=\"plus\"}"), 42.0, "{job}");
        assert_eq!(value("untyped_values{v=\"big_int\"}"), 18446744073709551616.0, "{job}");
        assert_eq!(label("control_chars{v=~\"a.b\"} == 1", "v"), "a\0b", "{job}: a NUL in a label value");
        assert_eq!(label("control_chars{v=~\"a.b\"} == 2", "v"), "a\rb", "{job}: a CR in a label value");
        assert_eq!(value("bucket_untyped{le=\"abc\"}"), 1.0, "{job}");
        assert_eq!(value(&format!("long_name_{}", "n".repeat(10000))), 1.0, "{job}: a 10,000-character name");
        assert_eq!((value("coll_total"), value("coll"), value("coll_sum")), (1.0, 2.0, 3.0), "{job}: a counter, a gauge of its base name");
        assert_eq!((value("hh_bucket{le=\"+Inf\"}"), value("sm_count")), (2.0, 1.0), "{job}");
        assert_eq!((value("info_like_info"), value("c_created_total")), (1.0, 1.0), "{job}: counters named _info, _created_total");
        assert_eq!(value("empty_help"), 1.0, "{job}");
        assert_eq!(value("indented_metric"), 2.0, "{job}");
        assert_eq!(value("after_eof"), 4.0, "{job}: a # EOF in a textfile is a comment");
        assert_eq!(value("typed_late"), 1.0, "{job}");
        assert_eq!(value("crlf_metric{a=\"1\"}"), 1.0, "{job}");
        let files = std::fs::read_dir(&cases[0].1)
            .expect("accepted/")
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "prom"))
            .count();
        let read = prom.scalar(&format!("count(node_textfile_mtime_seconds{{job=\"{job}\",seed=\"accepted\"}})"));
        assert_eq!(read, files as f64, "{job}: every accepted file read");
    }

    // Every refused case: up (checked above), flagged, the good file served.
    for name in names.iter().filter(|n| n.starts_with("refused-")) {
        for (job, _, _) in FORMATS {
            let q = |m: &str| format!("{m}{{job=\"{job}\",seed=\"{name}\"}}");
            assert_eq!(prom.scalar(&q("node_textfile_scrape_error")), 1.0, "{name} in {job}: flagged");
            assert_eq!(prom.scalar(&q("textfile_good")), 1.0, "{name} in {job}: the good file beside it is served");
        }
    }
}
