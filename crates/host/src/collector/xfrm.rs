//! `xfrm`: the IPsec transformation error counters of /proc/net/xfrm_stat
//! (one `Name value` pair a line, as procfs's `NewXfrmStat` reads it),
//! exported as the unlabelled counters `node_xfrm_*_packets_total`; every
//! one of the 28 counters is written, 0 when the kernel does not list it.

use std::path::PathBuf;

use crate::io::read_file;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The kernel's counter name, the family node_exporter exports it as, and
/// its help, in node_exporter's order.
const COUNTERS: [(&str, &str, &str); 28] = [
    ("XfrmInError", "node_xfrm_in_error_packets_total", "All errors not matched by other"),
    ("XfrmInBufferError", "node_xfrm_in_buffer_error_packets_total", "No buffer is left"),
    ("XfrmInHdrError", "node_xfrm_in_hdr_error_packets_total", "Header error"),
    (
        "XfrmInNoStates",
        "node_xfrm_in_no_states_packets_total",
        "No state is found i.e. Either inbound SPI, address, or IPsec protocol at SA is wrong",
    ),
    (
        "XfrmInStateProtoError",
        "node_xfrm_in_state_proto_error_packets_total",
        "Transformation protocol specific error e.g. SA key is wrong",
    ),
    ("XfrmInStateModeError", "node_xfrm_in_state_mode_error_packets_total", "Transformation mode specific error"),
    ("XfrmInStateSeqError", "node_xfrm_in_state_seq_error_packets_total", "Sequence error i.e. Sequence number is out of window"),
    ("XfrmInStateExpired", "node_xfrm_in_state_expired_packets_total", "State is expired"),
    (
        "XfrmInStateMismatch",
        "node_xfrm_in_state_mismatch_packets_total",
        "State has mismatch option e.g. UDP encapsulation type is mismatch",
    ),
    ("XfrmInStateInvalid", "node_xfrm_in_state_invalid_packets_total", "State is invalid"),
    (
        "XfrmInTmplMismatch",
        "node_xfrm_in_tmpl_mismatch_packets_total",
        "No matching template for states e.g. Inbound SAs are correct but SP rule is wrong",
    ),
    ("XfrmInNoPols", "node_xfrm_in_no_pols_packets_total", "No policy is found for states e.g. Inbound SAs are correct but no SP is found"),
    ("XfrmInPolBlock", "node_xfrm_in_pol_block_packets_total", "Policy discards"),
    ("XfrmInPolError", "node_xfrm_in_pol_error_packets_total", "Policy error"),
    ("XfrmOutError", "node_xfrm_out_error_packets_total", "All errors which is not matched others"),
    ("XfrmOutBundleGenError", "node_xfrm_out_bundle_gen_error_packets_total", "Bundle generation error"),
    ("XfrmOutBundleCheckError", "node_xfrm_out_bundle_check_error_packets_total", "Bundle check error"),
    ("XfrmOutNoStates", "node_xfrm_out_no_states_packets_total", "No state is found"),
    ("XfrmOutStateProtoError", "node_xfrm_out_state_proto_error_packets_total", "Transformation protocol specific error"),
    ("XfrmOutStateModeError", "node_xfrm_out_state_mode_error_packets_total", "Transformation mode specific error"),
    ("XfrmOutStateSeqError", "node_xfrm_out_state_seq_error_packets_total", "Sequence error i.e. Sequence number overflow"),
    ("XfrmOutStateExpired", "node_xfrm_out_state_expired_packets_total", "State is expired"),
    ("XfrmOutPolBlock", "node_xfrm_out_pol_block_packets_total", "Policy discards"),
    ("XfrmOutPolDead", "node_xfrm_out_pol_dead_packets_total", "Policy is dead"),
    ("XfrmOutPolError", "node_xfrm_out_pol_error_packets_total", "Policy error"),
    ("XfrmFwdHdrError", "node_xfrm_fwd_hdr_error_packets_total", "Forward routing of a packet is not allowed"),
    ("XfrmOutStateInvalid", "node_xfrm_out_state_invalid_packets_total", "State is invalid, perhaps expired"),
    ("XfrmAcquireError", "node_xfrm_acquire_error_packets_total", "State hasn’t been fully acquired before use"),
];

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("net/xfrm_stat"), buf: Vec::new() }
    }
}

/// Parses xfrm_stat into the values of [`COUNTERS`], in that order. Every
/// line, an empty one too, must be a name and a decimal integer (Go's
/// `strconv.Atoi`: an optional sign); unknown names are skipped.
pub fn parse(text: &str) -> Result<[i64; 28], String> {
    let mut values = [0i64; 28];
    if text.is_empty() {
        return Ok(values);
    }
    // bufio.Scanner's lines: a final newline ends the last line.
    for line in text.strip_suffix('\n').unwrap_or(text).split('\n') {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value), None) = (it.next(), it.next(), it.next()) else {
            return Err(format!("line {line:?} is not a name and a value"));
        };
        let v: i64 = value.parse().map_err(|_| format!("value {value:?} of {name} is not an integer"))?;
        if let Some(i) = COUNTERS.iter().position(|c| c.0 == name) {
            values[i] = v;
        }
    }
    Ok(values)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let values = parse(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.path, m))?;
        for ((_, name, help), v) in COUNTERS.iter().zip(values) {
            sink.single(name, help, Kind::Counter, v as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    const FIXTURE: &str = "XfrmInError                     1\nXfrmInBufferError               2\n\
XfrmOutError                    1000000\nXfrmAcquireError                24532";

    #[test]
    fn parses_the_fixture() {
        let v = parse(FIXTURE).unwrap();
        assert_eq!(v[0], 1);
        assert_eq!(v[1], 2);
        assert_eq!(v[14], 1_000_000);
        assert_eq!(v[27], 24532);
        assert_eq!(v[2], 0, "a counter the file lacks is 0");
    }

    #[test]
    fn every_counter_has_its_own_family() {
        let names: std::collections::HashSet<_> = COUNTERS.iter().map(|c| c.1).collect();
        assert_eq!(names.len(), COUNTERS.len());
        let kernel: std::collections::HashSet<_> = COUNTERS.iter().map(|c| c.0).collect();
        assert_eq!(kernel.len(), COUNTERS.len());
    }

    #[test]
    fn accepts_signs_and_unknown_names_and_an_empty_file() {
        let v = parse("XfrmInError -3\nXfrmNewThing 9\nXfrmInHdrError +4\n").unwrap();
        assert_eq!((v[0], v[2]), (-3, 4));
        assert_eq!(parse("").unwrap(), [0; 28]);
    }

    #[test]
    fn rejects_malformed_lines() {
        assert!(parse("XfrmInError\n").is_err());
        assert!(parse("XfrmInError 1 2\n").is_err());
        assert!(parse("XfrmInError x\n").is_err());
        assert!(parse("XfrmInError 0x1\n").is_err());
        assert!(parse("XfrmInError 1\n\nXfrmInHdrError 2\n").is_err(), "an empty line is not a pair");
        assert!(parse("\n").is_err());
    }

    #[test]
    fn writes_all_families_and_no_data_without_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        assert!(c.update(&mut sink).unwrap_err().is_no_data());
        crate::testutil::write(dir.path(), "proc/net/xfrm_stat", FIXTURE);
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        assert_eq!(rows.len(), 28);
        assert!(rows.iter().any(|r| r.0 == "node_xfrm_out_error_packets_total" && r.1.is_empty() && r.2 == 1e6));
    }
}
