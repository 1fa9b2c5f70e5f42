//! `cargo xtask fuzz [--seconds N] [--seed S]`: mutation fuzzing of every
//! collector's parser (see node_agent_tests::fuzz). Exits 1 on a finding.

use std::time::Duration;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<u64>().ok());
    let seconds = get("--seconds").unwrap_or(60);
    let seed = get("--seed")
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(1));
    let Some(fixtures) = node_agent_tests::conformance_dir() else {
        eprintln!("fuzz: the seed corpus (../shared/conformance/node_exporter) is missing");
        return std::process::ExitCode::FAILURE;
    };
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fuzz: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Err(e) = node_agent_tests::materialize(&fixtures, tmp.path()) {
        eprintln!("fuzz: copying the corpus: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let r = node_agent_tests::fuzz::run(tmp.path(), Duration::from_secs(seconds), seed);
    println!(
        "fuzz: seed {seed}: {} rounds over {} files in {seconds} s; slowest scrape {:?}; peak memory growth {} kB; {} finding(s)",
        r.rounds,
        r.files,
        r.slowest,
        r.hwm_growth_kb,
        r.findings.len()
    );
    for f in &r.findings {
        println!("  {f}");
    }
    if r.findings.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
