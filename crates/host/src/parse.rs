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

#[cfg(test)]
mod tests {
    use super::*;

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
}
