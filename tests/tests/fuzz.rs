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
