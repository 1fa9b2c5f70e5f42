//! Flag values the probes bound: a whole-unit duration or a count within a
//! range, with an error that says the range.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

/// `s` as a duration (`30s`, `5m`, `1h`: [`crate::pods::parse_duration`])
/// from `min` to `max`, both said as `range` in the error, with an example.
pub fn duration(s: &str, min: Duration, max: Duration, range: &str, example: &str) -> Result<Duration, String> {
    match crate::pods::parse_duration(s) {
        Some(d) if (min..=max).contains(&d) => Ok(d),
        _ => Err(format!("not a duration from {range}: {s:?} (e.g. {example})")),
    }
}

/// `s` as a number of `what` from `lo` to `hi`.
pub fn count<T: FromStr + PartialOrd + Display>(s: &str, lo: T, hi: T, what: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= lo && n <= hi => Ok(n),
        _ => Err(format!("not a number of {what} from {lo} to {hi}: {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_outside_the_range_are_refused_with_it() {
        assert_eq!(duration("5s", Duration::from_secs(1), Duration::from_secs(60), "1s to 1m", "5s"), Ok(Duration::from_secs(5)));
        let e = duration("2m", Duration::from_secs(1), Duration::from_secs(60), "1s to 1m", "5s").unwrap_err();
        assert!(e.contains("1s to 1m") && e.contains("\"2m\""), "{e}");
        assert_eq!(count::<usize>("4", 1, 100, "servers"), Ok(4));
        assert_eq!(count::<usize>("0", 1, 100, "servers"), Err("not a number of servers from 1 to 100: \"0\"".into()));
        assert!(count::<u32>("x", 1, 2, "things").is_err());
    }
}
