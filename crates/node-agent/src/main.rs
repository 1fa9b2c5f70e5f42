use std::process::ExitCode;

fn main() -> ExitCode {
    // Before any other thread exists.
    if let Err(e) = runtime::memory::init() {
        eprintln!("node-agent: {e}");
        return ExitCode::from(2);
    }
    let m = match node_agent::cmd::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match node_agent::cmd::run(m) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("node-agent: {e}");
            e.exit_code()
        }
    }
}
