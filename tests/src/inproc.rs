//! node-agent's scraper in the test's own process, built from command-line
//! flags as the binary builds it: the truth tests read its families by
//! name, and each scrape checks that the collectors under test succeeded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use expo::Format;
use runtime::{Scraper, Selection};

pub struct InProcess {
    scraper: Scraper,
    /// Collectors whose success every scrape checks.
    checked: Vec<&'static str>,
}

impl InProcess {
    /// The agent of `flags` (without the program name), checking
    /// `checked` at each scrape.
    pub fn start(flags: &[String], checked: &[&'static str]) -> InProcess {
        let args = std::iter::once("node-agent".to_string()).chain(flags.iter().cloned());
        let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
        let cfg = node_agent::config::resolve(&m).expect("config");
        InProcess { scraper: node_agent::agent::scraper(cfg.collectors, false), checked: checked.to_vec() }
    }

    /// The samples of `name` in one scrape.
    pub fn samples(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let text = String::from_utf8(self.scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8");
        for c in &self.checked {
            assert!(text.contains(&format!("node_scrape_collector_success{{collector=\"{c}\"}} 1")), "{c} failed:\n{text}");
        }
        crate::samples(&text, name)
    }

    /// Asserts that every one of `programs` is up.
    pub fn assert_up(&self, programs: &[&str], why: &str) {
        let up = self.samples("node_ebpf_program_up");
        for p in programs {
            let down = || self.samples("node_ebpf_program_down_reason");
            assert!(
                up.iter().any(|(l, v)| l.get("program").map(String::as_str) == Some(*p) && *v == 1.0),
                "{p} is not up ({why}): {up:?}; why: {:?}",
                down()
            );
        }
    }

    /// Waits up to 20 s for pod attribution to have listed the node's pods
    /// and for `family{what="services"}` to be `services`.
    pub fn wait_for_pods_and_services(&self, family: &str, services: f64) {
        let t = Instant::now();
        let known = || self.samples(family).into_iter().find(|(l, _)| l.get("what").map(String::as_str) == Some("services")).map(|s| s.1);
        while self.samples("node_ebpf_pod_attribution_synced").first().map(|s| s.1) != Some(1.0) || known() != Some(services) {
            assert!(t.elapsed() < Duration::from_secs(20), "the pods and the Services were never listed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
