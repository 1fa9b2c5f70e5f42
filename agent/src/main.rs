use std::process::ExitCode;

fn main() -> ExitCode {
    // Fewer malloc arenas: the scrape path runs on a few blocking threads and
    // per-thread arenas would each keep their freed memory resident.
    // SAFETY: mallopt only tunes the allocator; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let m = match node_agent::cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let res = match m.subcommand() {
        Some(("serve", sub)) => node_agent::cli::serve(sub),
        Some(("plan", sub)) => return node_agent::plan_cli::plan(sub),
        Some(("explain", sub)) => return node_agent::plan_cli::explain(sub),
        Some(("simulate", sub)) => return node_agent::plan_cli::simulate(sub),
        Some(("controller", sub)) => return node_agent::controller::ctl::controller(sub),
        Some(("crd", sub)) => return node_agent::controller::ctl::crd(sub),
        Some(("manifests", sub)) => return node_agent::controller::ctl::manifests(sub),
        Some(("status", sub)) => return node_agent::controller::ctl::status(sub),
        Some(("rollout", sub)) => return node_agent::controller::ctl::rollout(sub),
        _ => node_agent::cli::serve(&m),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
