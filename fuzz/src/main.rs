//! AFL++ harness: one input replaces one file of node_exporter's fixture
//! tree (the first two bytes pick the file, the rest is its new content),
//! every host collector scrapes the tree, and the file is put back. A
//! panic in any collector aborts, which AFL++ records as a crash; a hang
//! past AFL++'s timeout is recorded as a hang.

use expo::Format;
use host::scrape::Selection;

fn main() {
    let Some(src) = node_agent_tests::conformance_dir() else {
        eprintln!("node-agent-afl: the conformance fixtures (../shared) are missing");
        std::process::exit(2);
    };
    let dir = std::env::var_os("NODE_AGENT_AFL_TREE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("node-agent-afl-{}", std::process::id())));
    if !dir.join("proc").exists() {
        if let Err(e) = node_agent_tests::materialize(&src, &dir) {
            eprintln!("node-agent-afl: copying the fixtures: {e}");
            std::process::exit(2);
        }
    }
    let files = node_agent_tests::fuzz::corpus_files(&dir);
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap_or_default()).collect();
    // `--seeds DIR`: the starting corpus, small fixture files each with its
    // index, spread over the tree.
    let args: Vec<String> = std::env::args().collect();
    if let (Some("--seeds"), Some(out)) = (args.get(1).map(String::as_str), args.get(2)) {
        let small: Vec<usize> = (0..files.len()).filter(|i| !originals[*i].is_empty() && originals[*i].len() <= 4096).collect();
        let step = (small.len() / 48).max(1);
        let _ = std::fs::create_dir_all(out);
        for (n, i) in small.iter().step_by(step).enumerate() {
            let mut seed = (*i as u16).to_le_bytes().to_vec();
            seed.extend_from_slice(&originals[*i]);
            let _ = std::fs::write(std::path::Path::new(out).join(format!("seed-{n:03}")), seed);
        }
        return;
    }
    let scraper = node_agent_tests::fuzz::scraper(&dir);
    // The scraper turns a collector's panic into success 0: abort instead,
    // so that AFL++ sees it.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{info}");
        std::process::abort();
    }));
    afl::fuzz!(|data: &[u8]| {
        if data.len() < 2 || files.is_empty() {
            return;
        }
        let i = u16::from_le_bytes([data[0], data[1]]) as usize % files.len();
        if std::fs::write(&files[i], &data[2..]).is_ok() {
            let _ = scraper.scrape(&Selection::default(), Format::Text);
            let _ = std::fs::write(&files[i], &originals[i]);
        }
    });
}
