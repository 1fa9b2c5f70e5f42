//! Byte-level parsing shared by the collectors' pure parsers.

/// Parses an unsigned decimal integer from ASCII bytes.
pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in b {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(v)
}

/// Parses a float from ASCII bytes (integers take the fast path).
pub fn parse_f64(b: &[u8]) -> Option<f64> {
    if let Some(v) = parse_u64(b) {
        return Some(v as f64);
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Splits on ASCII whitespace, skipping empty fields.
pub fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|c| c.is_ascii_whitespace()).filter(|f| !f.is_empty())
}

/// Lines of a byte buffer, without the trailing newline.
pub fn lines(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    buf.split(|&c| c == b'\n').filter(|l| !l.is_empty())
}

/// Parses an unsigned integer as Go's `strconv.ParseUint(s, 0, 64)`
/// (procfs's value parser): decimal, `0x` hex, `0o`/leading-`0` octal, `0b`
/// binary, `_` between digits.
pub fn parse_go_uint(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let (base, digits): (u32, &[u8]) = match b {
        [] => return None,
        [b'0', p, _, ..] if matches!(p.to_ascii_lowercase(), b'x' | b'o' | b'b') => (
            match p.to_ascii_lowercase() {
                b'x' => 16,
                b'o' => 8,
                _ => 2,
            },
            &b[2..],
        ),
        [b'0', rest @ ..] => (8, rest),
        _ => (10, b),
    };
    let mut v: u64 = 0;
    let mut underscores = false;
    for &ch in digits {
        if ch == b'_' {
            underscores = true;
            continue;
        }
        let d = (ch as char).to_digit(base)?;
        v = v.checked_mul(base as u64)?.checked_add(d as u64)?;
    }
    if underscores && !underscores_ok(b) {
        return None;
    }
    Some(v)
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then what
/// [`parse_go_uint`] reads, within the range of an `i64`.
pub fn parse_go_int(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let n = parse_go_uint(body)?;
    if neg {
        if n > 1 << 63 {
            return None;
        }
        Some((n as i64).wrapping_neg())
    } else {
        i64::try_from(n).ok()
    }
}

/// Go's rule for `_` in a number literal: only between digits (a base
/// prefix counts as a digit), never at either end.
fn underscores_ok(s: &[u8]) -> bool {
    let (mut i, mut saw, mut hex) = (0, b'^', false);
    if s.len() >= 2 && s[0] == b'0' && matches!(s[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = s[1].eq_ignore_ascii_case(&b'x');
    }
    for &ch in &s[i..] {
        if ch.is_ascii_digit() || (hex && ch.is_ascii_hexdigit()) {
            saw = b'0';
        } else if ch == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else if saw == b'_' {
            return false;
        } else {
            saw = b'!';
        }
    }
    saw != b'_'
}

/// The longest line Go's `bufio.Scanner` accepts with its default buffer
/// (`bufio.MaxScanTokenSize`, 64 KiB, less one byte); a longer one is its
/// `ErrTooLong`.
pub const GO_MAX_LINE: usize = 64 * 1024 - 1;

/// A line longer than [`GO_MAX_LINE`] (Go's `bufio.ErrTooLong`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("line too long")]
pub struct LineTooLong;

impl From<LineTooLong> for String {
    fn from(e: LineTooLong) -> String {
        e.to_string()
    }
}

/// Lines as Go's `bufio.Scanner` yields them: split at `\n`, a trailing
/// `\r` dropped, no empty last line after a final newline. No length
/// limit: see [`go_scan_lines`] for the scanner's.
pub fn go_lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let lines = (!text.is_empty()).then(|| body.split('\n'));
    lines.into_iter().flatten().map(|l| l.strip_suffix('\r').unwrap_or(l))
}

/// [`go_lines`] with the scanner's limit: a line longer than
/// [`GO_MAX_LINE`] (counting a trailing `\r`) is [`LineTooLong`]. Go's
/// scanner stops there: a caller that returns the error stops with it, and
/// one whose Go original ignores the scanner's error ends silently with
/// `.map_while(Result::ok)`.
pub fn go_scan_lines(text: &str) -> impl Iterator<Item = Result<&str, LineTooLong>> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let lines = (!text.is_empty()).then(|| body.split('\n'));
    lines.into_iter().flatten().map(|l| if l.len() > GO_MAX_LINE { Err(LineTooLong) } else { Ok(l.strip_suffix('\r').unwrap_or(l)) })
}

/// Why Go's `strconv.ParseUint` rejected a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GoNumError {
    /// `strconv.ErrSyntax`.
    #[error("invalid syntax")]
    Syntax,
    /// `strconv.ErrRange`.
    #[error("value out of range")]
    Range,
}

/// Go's `strconv.ParseUint(s, 10, 64)`: ASCII digits only (no sign, no
/// `_`, no base prefix, any number of leading zeros), within 64 bits.
/// Unlike [`parse_u64`] (at most 20 bytes) a long run of leading zeros is
/// fine; unlike [`parse_go_uint`] (base 0) there are no prefixes.
pub fn parse_go_dec_uint(s: &str) -> Result<u64, GoNumError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GoNumError::Syntax);
    }
    s.parse().map_err(|_| GoNumError::Range)
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal numbers: an optional sign,
/// digits with `_` between them, a fraction and an exponent; `inf` and
/// `infinity` (optionally signed) and `nan` (unsigned) in any case. A value
/// out of range is an error, not ±Inf. Hexadecimal floats are not accepted.
pub fn parse_go_float(s: &str) -> Option<f64> {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned.eq_ignore_ascii_case("inf") || unsigned.eq_ignore_ascii_case("infinity") {
        return Some(if s.starts_with('-') { f64::NEG_INFINITY } else { f64::INFINITY });
    }
    if s.eq_ignore_ascii_case("nan") {
        return Some(f64::NAN);
    }
    if !unsigned.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-' | b'_')) {
        return None;
    }
    let v = if s.contains('_') {
        if !underscores_between_digits(unsigned) {
            return None;
        }
        s.replace('_', "").parse::<f64>().ok()?
    } else {
        s.parse::<f64>().ok()?
    };
    v.is_finite().then_some(v)
}

/// Go's rule for `_` in a decimal literal (`strconv.underscoreOK`, after
/// the sign): each one between two digits.
fn underscores_between_digits(s: &str) -> bool {
    let mut prev = b'^';
    for c in s.bytes() {
        match c {
            b'0'..=b'9' => prev = b'0',
            b'_' if prev != b'0' => return false,
            b'_' => prev = b'_',
            _ if prev == b'_' => return false,
            _ => prev = b'!',
        }
    }
    prev != b'_'
}

/// Go's `strings.ToValidUTF8(s, "\u{FFFD}")`: each run of invalid bytes
/// becomes one replacement character.
pub fn to_valid_utf8(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut bad = false;
    for chunk in b.utf8_chunks() {
        if !chunk.valid().is_empty() {
            out.push_str(chunk.valid());
            bad = false;
        }
        if !chunk.invalid().is_empty() {
            if !bad {
                out.push('\u{FFFD}');
            }
            bad = true;
        }
    }
    out
}

/// One `cpu` line of /proc/stat, as prometheus/procfs's `parseCPUStat`
/// reads it: `cpu` (the total: `None`) or `cpuN`, then up to ten counters
/// in ticks. Missing trailing counters are 0 (Go's `Sscanf` stops at the
/// end of the line); a counter that is not a number fails the line, which
/// fails node_exporter's cpu and stat collectors alike. Decimal counters
/// (Go's `%f`) are taken whole.
pub fn proc_stat_cpu(line: &[u8]) -> Option<(Option<u32>, [u64; 10])> {
    let mut f = fields(line);
    let name = f.next()?.strip_prefix(b"cpu")?;
    let cpu = if name.is_empty() { None } else { Some(u32::try_from(parse_u64(name)?).ok()?) };
    let mut vals = [0u64; 10];
    for (slot, v) in vals.iter_mut().zip(f) {
        *slot = match parse_u64(v) {
            Some(n) => n,
            None => parse_f64(v).filter(|x| x.is_finite() && *x >= 0.0)? as u64,
        };
    }
    Some((cpu, vals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_cpu_lines_as_procfs_reads_them() {
        assert_eq!(proc_stat_cpu(b"cpu  1 2 3 4 5 6 7 8 9 10"), Some((None, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])));
        assert_eq!(proc_stat_cpu(b"cpu3 1 2"), Some((Some(3), [1, 2, 0, 0, 0, 0, 0, 0, 0, 0])), "short lines are zero-filled");
        assert_eq!(proc_stat_cpu(b"cpu0 1.5 2 3 4").map(|c| c.1[0]), Some(1));
        assert_eq!(proc_stat_cpu(b"cpu  1 2 x"), None, "a malformed counter fails the line");
        assert_eq!(proc_stat_cpu(b"cpux 1 2 3 4"), None);
        assert_eq!(proc_stat_cpu(b"intr 1 2"), None);
    }

    #[test]
    fn parses_numbers() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"12a"), None);
        assert_eq!(parse_f64(b"0.25"), Some(0.25));
        assert_eq!(parse_f64(b"7"), Some(7.0));
        assert_eq!(parse_f64(b"x"), None);
    }

    #[test]
    fn splits_fields() {
        let f: Vec<&[u8]> = fields(b"  a \t bb  c\n").collect();
        assert_eq!(f, vec![&b"a"[..], b"bb", b"c"]);
    }

    #[test]
    fn go_unsigned_integers() {
        for (s, v) in [
            ("0", 0),
            ("19", 19),
            ("4294967295", 4294967295),
            ("0x0", 0),
            ("0x13", 19),
            ("0xffffffffffffffff", u64::MAX),
            ("010", 8),
            ("0b11", 3),
            ("0b101", 5),
            ("0o17", 15),
            ("1_000", 1000),
            ("0x_1f", 31),
            ("0x_ff_ff", 0xffff),
            ("9247011087720", 9247011087720),
            ("18446744073709551615", u64::MAX),
            ("0X1F", 31),
            ("017", 15),
            ("0_17", 15),
        ] {
            assert_eq!(parse_go_uint(s), Some(v), "{s}");
        }
        for bad in [
            "",
            "-1",
            "+1",
            "0x",
            "08",
            "1_",
            "_1",
            "1__0",
            "0x1_",
            "0x__1",
            "18446744073709551616",
            "0x10000000000000000",
            "N/A (no PMA)",
            "zero",
            "1.5",
            " 1",
            "0x13 ",
            "1a",
            "0x1g",
            "0x_",
            "0x1__f",
            "0x1f_",
        ] {
            assert_eq!(parse_go_uint(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn go_integers() {
        for (s, v) in [
            ("81", 81),
            ("1", 1),
            ("-2", -2),
            ("-1234", -1234),
            ("+7", 7),
            ("0", 0),
            ("010", 8),
            ("0x10", 16),
            ("0x1F", 31),
            ("0o17", 15),
            ("0b101", 5),
            ("1_0", 10),
            ("1_000", 1000),
            ("0x_ff", 255),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(parse_go_int(s), Some(v), "{s:?}");
        }
        for s in [
            "",
            "x",
            "-",
            "+",
            "0x",
            "0b",
            "08",
            "09",
            "1__0",
            "_1",
            "1_",
            "abc",
            "1.5",
            "+-1",
            "9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
            " 1",
        ] {
            assert_eq!(parse_go_int(s), None, "{s:?}");
        }
    }

    #[test]
    fn go_scanner_lines() {
        let all = |t| go_lines(t).collect::<Vec<_>>();
        assert_eq!(all(""), Vec::<&str>::new());
        assert_eq!(all("\n"), [""]);
        assert_eq!(all("a\r\nb\n\nc"), ["a", "b", "", "c"]);
        assert_eq!(all("a\nb\n"), ["a", "b"]);
        let long = format!("a\n{}\nb\n", "x".repeat(GO_MAX_LINE + 1));
        assert_eq!(go_lines(&long).count(), 3, "go_lines has no limit");
        let scanned: Vec<_> = go_scan_lines(&long).collect();
        assert_eq!(scanned, [Ok("a"), Err(LineTooLong), Ok("b")]);
        assert_eq!(go_scan_lines(&long).map_while(Result::ok).collect::<Vec<_>>(), ["a"]);
        let fits = format!("{}\r\n", "x".repeat(GO_MAX_LINE - 1));
        assert_eq!(go_scan_lines(&fits).collect::<Vec<_>>(), [Ok(&fits[..GO_MAX_LINE - 1])]);
        assert_eq!(go_scan_lines(&format!("{}\r", "x".repeat(GO_MAX_LINE))).next(), Some(Err(LineTooLong)), "the \\r counts");
        assert_eq!(go_scan_lines("a\r\n\n").collect::<Vec<_>>(), [Ok("a"), Ok("")]);
        assert_eq!(String::from(LineTooLong), "line too long");
    }

    #[test]
    fn go_decimal_unsigned_integers() {
        assert_eq!(parse_go_dec_uint("0"), Ok(0));
        assert_eq!(parse_go_dec_uint("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_go_dec_uint("000000000000000000000042"), Ok(42), "leading zeros, past parse_u64's 20 bytes");
        assert_eq!(parse_go_dec_uint("18446744073709551616"), Err(GoNumError::Range));
        for bad in ["", "+1", "-1", "0x10", "1_0", " 1", "1 ", "1.0", "a"] {
            assert_eq!(parse_go_dec_uint(bad), Err(GoNumError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn go_floats() {
        for (s, v) in [
            ("1", 1.0),
            ("+2", 2.0),
            ("-2.5", -2.5),
            ("1_000", 1000.0),
            ("-1_0.5", -10.5),
            ("1e3", 1000.0),
            (".5", 0.5),
            ("0.25", 0.25),
            ("031", 31.0),
        ] {
            assert_eq!(parse_go_float(s), Some(v), "{s:?}");
        }
        assert_eq!(parse_go_float("inf"), Some(f64::INFINITY));
        assert_eq!(parse_go_float("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_go_float("+INF"), Some(f64::INFINITY));
        assert!(parse_go_float("NaN").is_some_and(f64::is_nan));
        for bad in
            ["", "+nan", "-nan", "_1", "1_", "1__0", "-_1", "1_.5", "1e_5", "1e999", "-1e999", "0x1p3", "1 ", "x", "infx", "0x10", "1 2"]
        {
            assert_eq!(parse_go_float(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn invalid_utf8_runs_become_one_replacement() {
        assert_eq!(to_valid_utf8(b"LNV-45N1\xef\xbf\xbd\xef\xbf\xbd"), "LNV-45N1\u{FFFD}\u{FFFD}");
        assert_eq!(to_valid_utf8(b"a\xff\xfeb\xffc"), "a\u{FFFD}b\u{FFFD}c");
        assert_eq!(to_valid_utf8(b"a\xff\xfeb"), "a\u{FFFD}b");
        assert_eq!(to_valid_utf8(b"\xe2\x82"), "\u{FFFD}");
    }
}
