//! `node-agent serve` (the default): serve node metrics until SIGTERM.

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use super::Error;

/// The command, with every serve flag.
pub fn command() -> Command {
    with_args(Command::new("serve").about("Serve metrics (the default)."))
}

/// Adds the serve flags to a command (the root takes them too).
pub fn with_args(cmd: Command) -> Command {
    cmd.args(crate::config::serve_args())
}

/// Serves until SIGTERM or SIGINT; with `--help-man`, prints the man page
/// instead (kingpin's built-in, which node_exporter has).
pub fn run(m: ArgMatches) -> Result<ExitCode, Error> {
    if m.try_get_one::<bool>("help-man").ok().flatten().copied().unwrap_or(false) {
        use std::io::Write;
        let page = man_page().map_err(|e| Error::Failed(format!("rendering the man page: {e}")))?;
        let mut out = std::io::stdout().lock();
        out.write_all(&page).and_then(|()| out.flush()).map_err(|e| Error::Failed(format!("writing the man page: {e}")))?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::agent::serve(m)?;
    Ok(ExitCode::SUCCESS)
}

/// node-agent's man page (roff, section 1), rendered by clap_mangen from
/// the command line itself ([`super::command`]): every visible flag with its
/// default and help, and the subcommands.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(super::command()).render(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_man_page_is_roff_naming_the_flags() {
        let man = String::from_utf8(man_page().unwrap()).unwrap();
        // After roff's definition of the apostrophe string (`.ie`/`.el`), the title.
        let first = man.lines().find(|l| !l.starts_with(".ie ") && !l.starts_with(".el ")).unwrap_or_default();
        assert!(first.starts_with(".TH node-agent 1 "), "{}", &man[..man.len().min(200)]);
        for flag in ["web.listen-address", "collector.textfile.directory", "collector.timeout", "collector.ebpf_pods.node-name"] {
            assert!(man.contains(&format!("\\-\\-{}", flag.replace('-', "\\-"))), "--{flag} is in the man page");
        }
        assert!(!man.contains("help\\-man"), "hidden flags stay hidden");
    }
}
