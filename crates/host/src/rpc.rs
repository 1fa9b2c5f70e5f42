//! The parts of /proc/net/rpc/nfs and /proc/net/rpc/nfsd the NFS client and
//! server statistics share, read as prometheus/procfs's `nfs` package reads
//! them: lines of a key and unsigned decimal integers, the NFSv2 and v3
//! procedure names, and the checks on a line's values.

/// The `proc2` procedures, in the files' order.
pub const V2_PROCEDURES: [&str; 18] = [
    "Null", "GetAttr", "SetAttr", "Root", "Lookup", "ReadLink", "Read", "WrCache", "Write", "Create", "Remove", "Rename", "Link",
    "SymLink", "MkDir", "RmDir", "ReadDir", "FsStat",
];

/// The `proc3` procedures, in the files' order.
pub const V3_PROCEDURES: [&str; 22] = [
    "Null",
    "GetAttr",
    "SetAttr",
    "Lookup",
    "Access",
    "ReadLink",
    "Read",
    "Write",
    "Create",
    "MkDir",
    "SymLink",
    "MkNod",
    "Remove",
    "RmDir",
    "Rename",
    "Link",
    "ReadDir",
    "ReadDirPlus",
    "FsStat",
    "FsInfo",
    "PathConf",
    "Commit",
];

/// Reads `text` line by line as procfs does: every line a key and at least
/// one unsigned integer (of a key `leading` gives a count for, only that
/// many first fields are read, and it must have them), handed to `line`.
/// `what` names the file in the messages ("NFS", "NFSd").
pub fn parse_lines(
    text: &str,
    what: &str,
    leading: impl Fn(&str) -> Option<usize>,
    mut line: impl FnMut(&str, &[u64]) -> Result<(), String>,
) -> Result<(), String> {
    let mut fields = Vec::with_capacity(80);
    let mut values = Vec::with_capacity(80);
    for l in crate::parse::go_scan_lines(text) {
        let l = l?;
        let mut parts = l.split_whitespace();
        let key = parts.next().unwrap_or("");
        fields.clear();
        fields.extend(parts);
        if fields.is_empty() {
            return Err(format!("invalid {what} metric line {l:?}"));
        }
        let numbers = match leading(key) {
            Some(n) => fields.get(..n).ok_or_else(|| format!("invalid {what} {key} metric line {l:?}"))?,
            None => &fields[..],
        };
        values.clear();
        for p in numbers {
            values.push(crate::parse::parse_go_dec_uint(p).map_err(|_| format!("invalid number {p:?} in line {l:?}"))?);
        }
        line(key, &values)?;
    }
    Ok(())
}

/// Exactly `N` values.
pub fn exact<const N: usize>(key: &str, v: &[u64]) -> Result<[u64; N], String> {
    v.try_into().map_err(|_| format!("invalid {key} line: {} values, want {N}", v.len()))
}

/// A count, then that many values; the values when the count agrees and
/// lies in `min..=max`.
pub fn counted<'a>(key: &str, v: &'a [u64], min: usize, max: usize) -> Result<&'a [u64], String> {
    let (&n, rest) = v.split_first().ok_or_else(|| format!("invalid {key} line: no values"))?;
    if n != rest.len() as u64 || rest.len() < min || rest.len() > max {
        return Err(format!("invalid {key} line: count {n}, {} values", rest.len()));
    }
    Ok(rest)
}

/// The first `N` of `v`, zero-padded when it has fewer.
pub fn first<const N: usize>(v: &[u64]) -> [u64; N] {
    let mut out = [0; N];
    let n = v.len().min(N);
    out[..n].copy_from_slice(&v[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str, leading: impl Fn(&str) -> Option<usize>) -> Result<Vec<(String, Vec<u64>)>, String> {
        let mut out = Vec::new();
        parse_lines(text, "NFS", leading, |k, v| {
            out.push((k.to_string(), v.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn lines_are_a_key_and_numbers() {
        let got = lines("net 1 2\nth 8 0 0.000 x\n", |k| (k == "th").then_some(2)).unwrap();
        assert_eq!(got, vec![("net".to_string(), vec![1, 2]), ("th".to_string(), vec![8, 0])]);
        assert_eq!(lines("", |_| None).unwrap(), vec![]);
        assert_eq!(lines("th 8\n", |k| (k == "th").then_some(2)), Err("invalid NFS th metric line \"th 8\"".into()));
        assert_eq!(lines("net\n", |_| None), Err("invalid NFS metric line \"net\"".into()));
        assert!(lines("\n", |_| None).is_err());
        assert_eq!(lines("net 1\r\n", |_| None), Ok(vec![("net".to_string(), vec![1])]), "a \\r ends the line, as in Go's scanner");
        assert!(lines("net 1 x\n", |_| None).is_err());
        assert!(lines(&format!("net {}1", "0".repeat(crate::parse::GO_MAX_LINE)), |_| None).is_err());
        let err = parse_lines("a 1\nb 2\n", "NFS", |_| None, |k, _| if k == "b" { Err("no b".into()) } else { Ok(()) });
        assert_eq!(err, Err("no b".into()));
    }

    #[test]
    fn value_checks() {
        assert_eq!(exact::<2>("io", &[1, 2]), Ok([1, 2]));
        assert!(exact::<2>("io", &[1]).is_err());
        assert_eq!(counted("proc4", &[2, 5, 6], 2, 2), Ok(&[5, 6][..]));
        assert!(counted("proc4", &[3, 5, 6], 0, usize::MAX).is_err());
        assert!(counted("proc4", &[1, 5], 2, 2).is_err());
        assert!(counted("proc4", &[], 0, usize::MAX).is_err());
        assert_eq!(first::<3>(&[1, 2]), [1, 2, 0]);
        assert_eq!(first::<1>(&[1, 2]), [1]);
    }
}
