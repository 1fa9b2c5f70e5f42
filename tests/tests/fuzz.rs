//! A bounded run of the mutation fuzzer (`cargo xtask fuzz` runs it longer):
//! no collector panics, no scrape beyond the bound, no runaway memory, on
//! mutations of node_exporter's fixture tree. Two fixed seeds, so a finding
//! reproduces.

use std::time::Duration;

#[test]
fn mutated_host_trees_never_panic_hang_or_blow_up() {
    let Some(fixtures) = node_agent_tests::conformance_dir() else { return };
    for seed in [1u64, 0x5eed] {
        let tmp = tempfile::tempdir().expect("tempdir");
        node_agent_tests::materialize(&fixtures, tmp.path()).expect("corpus");
        let r = node_agent_tests::fuzz::run(tmp.path(), Duration::from_secs(10), seed);
        eprintln!("seed {seed}: {} rounds over {} files, slowest {:?}, memory +{} kB", r.rounds, r.files, r.slowest, r.hwm_growth_kb);
        assert!(r.files > 100, "the corpus is the fixture tree");
        assert!(r.rounds > 50, "too few rounds: {}", r.rounds);
        assert!(r.findings.is_empty(), "findings:\n{}", r.findings.join("\n"));
    }
}

/// The textfile seeds (`tests/fixtures/textfile`: what the collector
/// accepts and Prometheus ingests, what it refuses) are in the corpus of
/// both fuzzers, under a textfile directory the fuzzed scraper reads.
#[test]
fn the_textfile_seeds_are_in_both_fuzzers_corpus() {
    use node_agent_tests::fuzz;
    let seeds = fuzz::textfile_seeds();
    let names: Vec<&str> = seeds.iter().map(|(n, _)| n.as_str()).collect();
    for must in [
        "accepted-escapes.prom",
        "accepted-merge_a.prom",
        "accepted-merge_b.prom",
        "accepted-histogram.prom",
        "accepted-summary.prom",
        "accepted-suffixes.prom",
        "accepted-values.prom",
        "accepted-empty.prom",
        "refused-reserved_name.prom",
        "refused-reserved_other.prom",
        "refused-empty_total.prom",
        "refused-timestamp.prom",
        "refused-type_across_files-b.prom",
    ] {
        assert!(names.contains(&must), "seed {must} missing from {}: {names:?}", fuzz::textfile_seeds_dir().display());
    }
    let Some(fixtures) = node_agent_tests::conformance_dir() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    node_agent_tests::materialize(&fixtures, tmp.path()).expect("corpus");
    let copies = fuzz::add_textfile_seeds(tmp.path()).expect("copy the seeds");
    assert_eq!(copies.len(), seeds.len());
    let corpus = fuzz::corpus_files(tmp.path());
    let originals: Vec<Vec<u8>> = corpus.iter().map(|f| std::fs::read(f).expect("read corpus file")).collect();
    let afl = fuzz::afl_seeds(&corpus, &originals);
    for (name, from) in &seeds {
        let copy = tmp.path().join(fuzz::SEEDS_UNDER).join(name);
        let i = corpus.iter().position(|f| *f == copy).unwrap_or_else(|| panic!("{name} is not in the mutation fuzzer's corpus"));
        let mut input = (i as u16).to_le_bytes().to_vec();
        input.extend_from_slice(&std::fs::read(from).expect("read seed"));
        assert!(afl.contains(&input), "{name} is not among AFL++'s seeds (index {i})");
    }
    // The fuzzed scraper reads them: an accepted seed's series is served.
    let out = fuzz::scraper(tmp.path()).scrape(&runtime::Selection::default(), expo::Format::Text);
    let text = String::from_utf8(out).expect("text exposition");
    assert!(text.contains("esc_label_values{"), "the fuzzed scrape does not read the seeds' textfile directory");
}
