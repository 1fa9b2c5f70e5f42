use std::process::ExitCode;

fn main() -> ExitCode {
    // Fewer malloc arenas: the scrape path runs on a few blocking threads and
    // per-thread arenas would each keep their freed memory resident.
    // SAFETY: mallopt only tunes the allocator; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
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
