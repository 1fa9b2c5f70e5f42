//! node-agent and Debian's node_exporter on this machine's real /proc and
//! /sys, side by side: no unexplained family and no differing stable value;
//! and `promtool check metrics` finds nothing in node-agent's output that it
//! does not find in node_exporter's (bar the compatibility camelCase names).
//!
//! Needs `prometheus-node-exporter` and `promtool` (Debian packages
//! `prometheus-node-exporter` and `prometheus`), which `cargo xtask test`
//! installs. Without them the test skips with a message, except in CI.

use node_agent_tests::compare;

use compare::COMMON_FLAGS;

use node_agent_tests::Kill;

fn need(prog: &str) -> Option<std::path::PathBuf> {
    let p = compare::which(prog);
    if p.is_none() {
        assert!(std::env::var_os("CI").is_none(), "{prog} is required in CI (cargo xtask test installs it)");
        eprintln!("SKIP: {prog} not installed (cargo xtask test installs it)");
    }
    p
}

fn start_agent() -> node_agent::agent::Agent {
    let m = node_agent::cmd::command()
        .try_get_matches_from(["node-agent", "--web.listen-address=127.0.0.1:0"].into_iter().chain(COMMON_FLAGS.iter().copied()))
        .expect("flags");
    node_agent::agent::Agent::start(&m).expect("agent starts")
}

fn start_node_exporter(bin: &std::path::Path) -> (Kill, String) {
    let (guard, url, _) = node_agent_tests::start_exporter(bin, COMMON_FLAGS).expect("node_exporter comes up");
    (guard, url)
}

#[test]
fn no_unexplained_difference_from_node_exporter() {
    let Some(ne) = need("prometheus-node-exporter") else { return };
    let (_ne, ne_url) = start_node_exporter(&ne);
    let agent = start_agent();
    let url = format!("http://{}/metrics", agent.addrs[0]);
    let ours = compare::http_get(&url).expect("scrape node-agent");
    let theirs = compare::http_get(&ne_url).expect("scrape node_exporter");
    let report = compare::compare(&ours, &theirs).expect("both parse");
    eprintln!("{}", report.render());
    assert!(report.compared_values > 10, "too few stable values compared");
    assert!(report.ok(), "{}", report.render());

    if let Some(promtool) = need("promtool") {
        let a = compare::promtool_check(&promtool, &ours).expect("promtool runs");
        let b = compare::promtool_check(&promtool, &theirs).expect("promtool runs");
        let extra = compare::promtool_extra(&a, &b);
        assert!(extra.is_empty(), "promtool complaints about node-agent only:\n{}", extra.join("\n"));
    }
}
