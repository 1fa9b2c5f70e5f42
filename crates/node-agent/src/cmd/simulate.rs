//! `node-agent simulate`: roll a DaemonSet out over a simulated cluster and
//! check every invariant on the way.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Command};
use k8s_openapi::api::core::v1::Node;
use planner::{builders, simulate};

use super::{one_daemonset, Error, Output, OutputArg};

// The flags of `simulate` (the file as a string: clap's PathBuf parser
// would refuse an empty one itself).
#[derive(clap::Args)]
struct SimulateArgs {
    #[arg(long = "daemonset", value_name = "FILE")]
    daemonset: String,
    #[arg(long = "nodes", value_name = "N")]
    nodes: usize,
    #[arg(long = "seed", value_name = "S", default_value = "1")]
    seed: u64,
    #[arg(long = "faults", value_name = "pod-failure=RATE", help = "Fail this fraction of new pods, e.g. pod-failure=0.05.")]
    faults: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

pub fn command() -> Command {
    let cmd = Command::new("simulate").about("Roll a DaemonSet out over a simulated cluster and check every invariant on the way.");
    <SimulateArgs as clap::Args>::augment_args(cmd)
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let a: SimulateArgs = super::args(m)?;
    let res = (|| -> Result<simulate::Outcome, Error> {
        let path = PathBuf::from(&a.daemonset);
        let ds = one_daemonset(&path)?;
        let mut cfg = simulate::Config { seed: a.seed, ..Default::default() };
        if let Some(f) = &a.faults {
            let rate = f
                .strip_prefix("pod-failure=")
                .and_then(|r| r.parse::<f64>().ok())
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| Error::Usage(format!("--faults {f:?}: expected pod-failure=RATE with RATE in [0, 1]")))?;
            cfg.fail_rate = rate;
        }
        // The previous revision: the same DaemonSet with another template.
        let mut old = ds.clone();
        if let Some(t) = old.spec.as_mut().map(|s| &mut s.template) {
            t.metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert("node-agent.io/simulated-revision".into(), "previous".into());
        }
        let nodes: Vec<Node> = (0..a.nodes).map(|i| builders::node(&format!("node-{i:05}"), &[], &[])).collect();
        let mut c = simulate::Cluster::new(ds, &old, nodes, cfg).map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?;
        let out = c.run().map_err(|e| Error::Usage(e.to_string()))?;
        if let Err(e) = simulate::final_state_ok(&c) {
            let mut out = out;
            out.violations.push(format!("final state: {e}"));
            return Ok(out);
        }
        Ok(out)
    })();
    match res {
        Ok(out) => {
            if a.output.output == Output::Table {
                println!(
                    "{:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>9}",
                    "T", "CREATED", "DELETED", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"
                );
                for t in &out.ticks {
                    if t.created + t.deleted == 0 {
                        continue;
                    }
                    let s = &t.status;
                    println!(
                        "{:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>9}",
                        t.t,
                        t.created,
                        t.deleted,
                        s.desired_number_scheduled,
                        s.current_number_scheduled,
                        s.number_ready,
                        s.updated_number_scheduled,
                        s.number_available
                    );
                }
                println!(
                    "converged: {}; ticks: {}; max unavailable: {}; max extra pods: {}",
                    out.converged,
                    out.ticks.len(),
                    out.max_unavailable_seen,
                    out.max_extra_pods_seen
                );
                for v in &out.violations {
                    println!("VIOLATION: {v}");
                }
                println!("invariants held: {}", out.violations.is_empty());
            } else {
                println!("{}", serde_json::to_string_pretty(&out).map_err(|e| Error::Usage(e.to_string()))?);
            }
            Ok(if out.violations.is_empty() && out.converged { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Err(e) => Err(e),
    }
}
