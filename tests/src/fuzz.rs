//! Mutation fuzzing of every collector's parser, on stable Rust
//! (cargo-fuzz/libFuzzer need a nightly compiler, which these machines do
//! not have): the node_exporter fixture tree and the textfile seeds
//! ([`textfile_seeds_dir`]) are the seed corpus; each round
//! mutates one file (bit flips, truncation, huge and negative numbers,
//! NaN, non-UTF-8 bytes, NULs, lines repeated thousands of times, fields
//! dropped), runs a full scrape of every host collector, and restores it.
//! A panic anywhere (the scraper catches collector panics; a panic hook
//! records them), a scrape slower than the bound (a quadratic blow-up), or
//! peak memory growth beyond the bound is a finding, reported with the file
//! and the mutated bytes so it can become a regression test.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use expo::Format;
use runtime::{Scraper, Selection};

/// A scrape of a mutated tree must finish within this.
pub const SCRAPE_BOUND: Duration = Duration::from_secs(5);
/// Peak RSS may not grow by more than this over a run.
pub const MEMORY_BOUND_KB: u64 = 512 * 1024;

#[derive(Debug, Default)]
pub struct Report {
    pub rounds: u64,
    pub files: usize,
    pub findings: Vec<String>,
    pub slowest: Duration,
    pub hwm_growth_kb: u64,
}

/// xorshift64*: reproducible from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// The fixture files the collectors read (proc, sys, textfile), sorted.
pub fn corpus_files(root: &Path) -> Vec<PathBuf> {
    let mut corpus = Vec::new();
    for d in ["proc", "sys", "textfile"] {
        files(&root.join(d), &mut corpus);
    }
    corpus.sort();
    corpus
}

/// The textfile collector's checked-in seeds (`tests/fixtures/textfile`):
/// `accepted/`, files the collector takes whole, all together, and a real
/// Prometheus ingests in every format (`tests/tests/textfile_prometheus.rs`);
/// `refused/`, each a file (or a directory of files read together) that the
/// collector refuses, or drops a family from, flagging
/// `node_textfile_scrape_error`.
pub fn textfile_seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/textfile")
}

/// Where a fixture tree's copy holds the textfile seeds: a textfile
/// directory of its own, which [`scraper`] reads beside node_exporter's.
pub const SEEDS_UNDER: &str = "textfile/seeds";

/// Every `*.prom` seed, sorted, with the name its copy gets in
/// [`SEEDS_UNDER`]: the path below the seeds directory, `/` made `-`
/// (`accepted-escapes.prom`, `refused-type_across_files-a.prom`).
pub fn textfile_seeds() -> Vec<(String, PathBuf)> {
    let dir = textfile_seeds_dir();
    let mut all = Vec::new();
    files(&dir, &mut all);
    let mut seeds: Vec<(String, PathBuf)> = all
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "prom"))
        .filter_map(|p| {
            let rel = p.strip_prefix(&dir).ok()?.to_str()?.replace('/', "-");
            Some((rel, p))
        })
        .collect();
    seeds.sort();
    seeds
}

/// Copies every textfile seed into `root`'s [`SEEDS_UNDER`] (a fixture
/// tree's copy), where [`corpus_files`] finds them; returns the copies.
pub fn add_textfile_seeds(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let to = root.join(SEEDS_UNDER);
    std::fs::create_dir_all(&to)?;
    let mut written = Vec::new();
    for (name, from) in textfile_seeds() {
        std::fs::copy(&from, to.join(&name))?;
        written.push(to.join(name));
    }
    Ok(written)
}

/// AFL++'s starting corpus over `files` (the corpus of a tree, as
/// [`corpus_files`] lists it) with their contents `originals`: each input is
/// the file's index (two bytes, little-endian) then its content; about 48
/// small fixture files spread over the tree, and every textfile seed.
pub fn afl_seeds(files: &[PathBuf], originals: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let small: Vec<usize> = (0..files.len()).filter(|i| !originals[*i].is_empty() && originals[*i].len() <= 4096).collect();
    let step = (small.len() / 48).max(1);
    let mut chosen: Vec<usize> = small.iter().step_by(step).copied().collect();
    let seeds = Path::new(SEEDS_UNDER);
    for (i, f) in files.iter().enumerate() {
        if f.parent().is_some_and(|d| d.ends_with(seeds)) && !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    chosen
        .into_iter()
        .map(|i| {
            let mut seed = (i as u16).to_le_bytes().to_vec();
            seed.extend_from_slice(&originals[i]);
            seed
        })
        .collect()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            files(&p, out);
        } else if ft.is_file() && e.metadata().is_ok_and(|m| m.len() < (1 << 20)) {
            out.push(p);
        }
    }
}

/// One mutation of `b`.
pub fn mutate(b: &[u8], rng: &mut Rng2) -> Vec<u8> {
    let r = &mut rng.0;
    let mut v = b.to_vec();
    let at = |r: &mut Rng, len: usize| r.below(len + 1);
    match r.below(11) {
        0 if !v.is_empty() => {
            let i = r.below(v.len());
            v[i] ^= 1 << r.below(8);
        }
        1 => {
            let i = at(r, v.len());
            v.truncate(i);
        }
        2 => {
            let i = at(r, v.len());
            v.splice(i..i, b"184467440737095516160000".iter().copied());
        }
        3 => {
            let i = at(r, v.len());
            v.splice(i..i, b" -1 ".iter().copied());
        }
        4 => {
            let i = at(r, v.len());
            v.splice(i..i, b"NaN".iter().copied());
        }
        5 => {
            let i = at(r, v.len());
            v.splice(i..i, [0xff, 0xfe, 0x00]);
        }
        6 => {
            // Repeat one line thousands of times.
            let lines: Vec<&[u8]> = b.split(|c| *c == b'\n').collect();
            let line = lines[r.below(lines.len())].to_vec();
            let n = 1000 + r.below(4000);
            for _ in 0..n {
                v.extend_from_slice(&line);
                v.push(b'\n');
            }
        }
        7 if !v.is_empty() => {
            // Drop a run of bytes.
            let i = r.below(v.len());
            let j = (i + 1 + r.below(64)).min(v.len());
            v.drain(i..j);
        }
        8 => {
            // Separators removed: fields run together.
            v.retain(|c| *c != b' ' || r.below(4) != 0);
        }
        9 => {
            // Empty.
            v.clear();
        }
        _ => {
            for _ in 0..1 + r.below(16) {
                if v.is_empty() {
                    break;
                }
                let i = r.below(v.len());
                v[i] = (r.next() & 0xff) as u8;
            }
        }
    }
    v
}

/// The fuzzer's random source (public so a regression test can replay a seed).
pub struct Rng2(Rng);
impl Rng2 {
    pub fn new(seed: u64) -> Rng2 {
        Rng2(Rng(seed | 1))
    }
}

fn hwm_kb() -> u64 {
    crate::status_kb("self", "VmHWM")
}

/// A scraper of every host collector over `root` (a fixture copy): the
/// host crate alone, so the AFL++ harness instruments only what it fuzzes.
pub fn scraper(root: &Path) -> Scraper {
    let mut args = crate::fixture_flags(root, &root.join("textfile/two_metric_files"));
    args.extend(["--collector.stat.softirq".into(), "--no-collector.filesystem".into()]);
    args.push(format!("--collector.textfile.directory={}", root.join(SEEDS_UNDER).display()));
    let m = host::registry::command().try_get_matches_from(args).expect("flags");
    let (_, collectors) = host::registry::resolve(&m).expect("config");
    Scraper::new(collectors)
}

/// Fuzzes for `budget` from `seed` over a copy of the fixture tree in `root`
/// (the textfile seeds added to it first, if they are not yet).
pub fn run(root: &Path, budget: Duration, seed: u64) -> Report {
    if !root.join(SEEDS_UNDER).is_dir() {
        if let Err(e) = add_textfile_seeds(root) {
            return Report { findings: vec![format!("copying the textfile seeds: {e}")], ..Default::default() };
        }
    }
    let panics: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&panics);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Ok(mut p) = sink.lock() {
            p.push(info.to_string());
        }
    }));
    let corpus = corpus_files(root);
    let originals: Vec<Vec<u8>> = corpus.iter().map(|f| std::fs::read(f).unwrap_or_default()).collect();
    let s = scraper(root);
    let _ = s.scrape(&Selection::default(), Format::Text);
    let hwm0 = hwm_kb();
    let mut rng = Rng2::new(seed);
    let mut report = Report { files: corpus.len(), ..Default::default() };
    let start = Instant::now();
    while start.elapsed() < budget && !corpus.is_empty() {
        let i = rng.0.below(corpus.len());
        let mutated = mutate(&originals[i], &mut rng);
        if std::fs::write(&corpus[i], &mutated).is_err() {
            continue;
        }
        let before = panics.lock().map(|p| p.len()).unwrap_or(0);
        let t = Instant::now();
        let _ = s.scrape(&Selection::default(), [Format::Text, Format::OpenMetrics, Format::Protobuf][rng.0.below(3)]);
        let took = t.elapsed();
        report.slowest = report.slowest.max(took);
        let shown = String::from_utf8_lossy(&mutated[..mutated.len().min(200)]).into_owned();
        let file = corpus[i].strip_prefix(root).unwrap_or(&corpus[i]).display().to_string();
        if let Ok(p) = panics.lock() {
            for msg in &p[before..] {
                report.findings.push(format!("panic on {file} (round {}): {msg}; input starts {shown:?}", report.rounds));
            }
        }
        if took > SCRAPE_BOUND {
            report.findings.push(format!("scrape took {took:?} on {file} (round {}); input starts {shown:?}", report.rounds));
        }
        let _ = std::fs::write(&corpus[i], &originals[i]);
        report.rounds += 1;
    }
    report.hwm_growth_kb = hwm_kb().saturating_sub(hwm0);
    if report.hwm_growth_kb > MEMORY_BOUND_KB {
        report.findings.push(format!("peak memory grew by {} kB", report.hwm_growth_kb));
    }
    std::panic::set_hook(previous);
    report
}
