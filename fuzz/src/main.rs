//! AFL++ harness: one input replaces one file of node_exporter's fixture
//! tree (the first two bytes pick the file, the rest is its new content),
//! every host collector scrapes the tree, and the file is put back. A
//! panic in any collector aborts, which AFL++ records as a crash; a hang
//! past AFL++'s timeout is recorded as a hang.

use expo::Format;
use runtime::Selection;

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
    if let Err(e) = node_agent_tests::fuzz::add_textfile_seeds(&dir) {
        eprintln!("node-agent-afl: copying the textfile seeds: {e}");
        std::process::exit(2);
    }
    let files = node_agent_tests::fuzz::corpus_files(&dir);
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap_or_default()).collect();
    // `--seeds DIR`: the starting corpus, small fixture files each with its
    // index, spread over the tree, and every textfile seed.
    let args: Vec<String> = std::env::args().collect();
    if let (Some("--seeds"), Some(out)) = (args.get(1).map(String::as_str), args.get(2)) {
        let _ = std::fs::create_dir_all(out);
        for (n, seed) in node_agent_tests::fuzz::afl_seeds(&files, &originals).iter().enumerate() {
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
