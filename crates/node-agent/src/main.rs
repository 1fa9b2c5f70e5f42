use std::process::ExitCode;

fn main() -> ExitCode {
    // One malloc arena: the scrape path runs on a few threads, and every
    // further arena keeps its own freed, fragmented memory resident (after
    // concurrent scrapes, a second arena held 1.3 MB with 0.6 MB in use);
    // the threads' tcaches take most small allocations without its lock.
    // SAFETY: mallopt only tunes the allocator; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let m = match node_agent::cmd::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match node_agent::cmd::run(&m) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("node-agent: {e}");
            e.exit_code()
        }
    }
}
