//! A strict parser for the Prometheus text exposition format (0.0.4).
//!
//! Used by the `textfile` collector, which must flag a malformed file rather
//! than silently drop lines, and by the conformance tests and comparison
//! tools, which read node_exporter's output.
//!
//! (We parse ourselves: the crates available either skip lines they don't
//! understand or reshape histograms in ways that lose what we must re-expose.)

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

/// The declared type of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Type {
    fn parse(s: &str) -> Option<Type> {
        Some(match s {
            "counter" => Type::Counter,
            "gauge" => Type::Gauge,
            "histogram" => Type::Histogram,
            "summary" => Type::Summary,
            "untyped" | "unknown" => Type::Untyped,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
            Type::Summary => "summary",
            Type::Untyped => "untyped",
        }
    }
}

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp: Option<i64>,
}

/// A family: its declared name, help, type, and samples in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: Option<String>,
    pub kind: Type,
    pub samples: Vec<Sample>,
}

/// A parse error with its 1-based line number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

fn err(line: usize, msg: impl fmt::Display) -> ParseError {
    ParseError { line, msg: msg.to_string() }
}

fn valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses a Go-style float: decimal, exponent, `+Inf`, `-Inf`, `NaN`.
pub fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Undoes the text format's HELP escaping (`\\` and `\n`), left to right; any
/// other backslash is kept as written.
fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// The family a sample name belongs to, given the declared types.
fn family_of<'a>(name: &'a str, declared: &dyn Fn(&str) -> Option<Type>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            match declared(base) {
                Some(Type::Histogram) => return base,
                Some(Type::Summary) if suffix != "_bucket" => return base,
                _ => {}
            }
        }
    }
    name
}

/// A sample's labels, borrowed from the text (values unescaped only when
/// they hold an escape).
pub type LabelRefs<'a> = Vec<(&'a str, Cow<'a, str>)>;

fn parse_labels(s: &str, line: usize) -> Result<(LabelRefs<'_>, &str), ParseError> {
    // `s` starts right after `{`.
    let mut labels: LabelRefs<'_> = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
            i += 1;
        }
        if i < bytes.len() && bytes[i] == b'}' {
            return Ok((labels, &s[i + 1..]));
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && bytes[i] != b' ' {
            i += 1;
        }
        let name = &s[start..i];
        if !valid_label_name(name) {
            return Err(err(line, format!("invalid label name {name:?}")));
        }
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if i + 1 >= bytes.len() || bytes[i] != b'=' || bytes[i + 1] != b'"' {
            return Err(err(line, format!("expected =\" after label {name}")));
        }
        i += 2;
        let vstart = i;
        let mut owned: Option<String> = None;
        loop {
            let Some(&c) = bytes.get(i) else {
                return Err(err(line, "unterminated label value"));
            };
            match c {
                b'"' => break,
                b'\\' => {
                    let v = owned.get_or_insert_with(|| s[vstart..i].to_string());
                    match bytes.get(i + 1) {
                        Some(b'n') => v.push('\n'),
                        Some(b'\\') => v.push('\\'),
                        Some(b'"') => v.push('"'),
                        _ => return Err(err(line, "invalid escape in label value")),
                    }
                    i += 2;
                }
                _ => {
                    // One UTF-8 character.
                    let ch_len = s[i..].chars().next().map(char::len_utf8).unwrap_or(1);
                    if let Some(v) = owned.as_mut() {
                        v.push_str(&s[i..i + ch_len]);
                    }
                    i += ch_len;
                }
            }
        }
        let value = match owned {
            Some(v) => Cow::Owned(v),
            None => Cow::Borrowed(&s[vstart..i]),
        };
        i += 1;
        if labels.iter().any(|(k, _)| *k == name) {
            return Err(err(line, format!("duplicate label {name}")));
        }
        labels.push((name, value));
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        match bytes.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => {}
            _ => return Err(err(line, "expected , or } after label value")),
        }
    }
}

/// One sample line, borrowing from the text.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleRef<'a> {
    pub name: &'a str,
    pub labels: LabelRefs<'a>,
    pub value: f64,
    pub timestamp: Option<i64>,
}

/// One line of an exposition.
#[derive(Clone, Debug, PartialEq)]
pub enum Line<'a> {
    /// Empty, or a comment that is neither HELP nor TYPE.
    Other,
    Help {
        name: &'a str,
        help: String,
    },
    Type {
        name: &'a str,
        kind: Type,
    },
    Sample(SampleRef<'a>),
}

/// Parses one line (1-based line number `n`, for errors).
pub fn parse_line(raw: &str, n: usize) -> Result<Line<'_>, ParseError> {
    let line = raw.trim();
    if line.is_empty() {
        return Ok(Line::Other);
    }
    if let Some(rest) = line.strip_prefix('#') {
        let rest = rest.trim_start();
        if let Some(h) = rest.strip_prefix("HELP ") {
            let (name, help) = h.split_once(' ').unwrap_or((h, ""));
            return Ok(Line::Help { name, help: unescape_help(help) });
        }
        if let Some(t) = rest.strip_prefix("TYPE ") {
            let mut it = t.split_whitespace();
            let (Some(name), Some(kind), None) = (it.next(), it.next(), it.next()) else {
                return Err(err(n, "malformed TYPE line"));
            };
            let kind = Type::parse(kind).ok_or_else(|| err(n, format!("unknown type {kind:?}")))?;
            return Ok(Line::Type { name, kind });
        }
        return Ok(Line::Other);
    }
    let name_end = line.find(['{', ' ', '\t']).ok_or_else(|| err(n, "sample without value"))?;
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err(err(n, format!("invalid metric name {name:?}")));
    }
    let (labels, rest) =
        if line[name_end..].starts_with('{') { parse_labels(&line[name_end + 1..], n)? } else { (Vec::new(), &line[name_end..]) };
    let mut it = rest.split_whitespace();
    let value = it.next().ok_or_else(|| err(n, "sample without value"))?;
    let value = parse_value(value).ok_or_else(|| err(n, format!("invalid value {value:?}")))?;
    let timestamp = match it.next() {
        Some(t) => Some(t.parse::<i64>().map_err(|_| err(n, format!("invalid timestamp {t:?}")))?),
        None => None,
    };
    if it.next().is_some() {
        return Err(err(n, "trailing text after sample"));
    }
    Ok(Line::Sample(SampleRef { name, labels, value, timestamp }))
}

/// What an exposition declares: every family's TYPE and HELP. Building it
/// checks every line, so a malformed text fails here, before anything is
/// taken from it.
#[derive(Debug, Default)]
pub struct Declarations<'a> {
    pub types: HashMap<&'a str, Type>,
    pub helps: HashMap<&'a str, String>,
}

impl<'a> Declarations<'a> {
    pub fn scan(text: &'a str) -> Result<Declarations<'a>, ParseError> {
        let mut d = Declarations::default();
        for (n, line) in text.lines().enumerate() {
            match parse_line(line, n + 1)? {
                Line::Type { name, kind } => {
                    if d.types.insert(name, kind).is_some_and(|old| old != kind) {
                        return Err(err(n + 1, format!("conflicting TYPE for {name}")));
                    }
                }
                Line::Help { name, help } => {
                    d.helps.insert(name, help);
                }
                Line::Other | Line::Sample(_) => {}
            }
        }
        Ok(d)
    }

    /// The family a sample name belongs to (`x_bucket` of histogram `x` is `x`).
    pub fn family_of<'s>(&self, name: &'s str) -> &'s str {
        family_of(name, &|n| self.types.get(n).copied())
    }

    /// A family's declared type (untyped when undeclared).
    pub fn kind(&self, family: &str) -> Type {
        self.types.get(family).copied().unwrap_or(Type::Untyped)
    }

    /// Calls `f` with every sample of an already scanned text and its family.
    pub fn samples(&self, text: &'a str, mut f: impl FnMut(&'a str, SampleRef<'a>)) {
        for (n, line) in text.lines().enumerate() {
            if let Ok(Line::Sample(s)) = parse_line(line, n + 1) {
                f(self.family_of(s.name), s);
            }
        }
    }
}

/// Parses a whole exposition. Families keep first-appearance order.
pub fn parse(text: &str) -> Result<Vec<Family>, ParseError> {
    let decl = Declarations::scan(text)?;
    let mut families: Vec<Family> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    decl.samples(text, |fam, s| {
        let i = *index.entry(fam).or_insert_with(|| {
            families.push(Family { name: fam.to_string(), help: decl.helps.get(fam).cloned(), kind: decl.kind(fam), samples: Vec::new() });
            families.len() - 1
        });
        let labels = s.labels.into_iter().map(|(k, v)| (k.to_string(), v.into_owned())).collect();
        families[i].samples.push(Sample { name: s.name.to_string(), labels, value: s.value, timestamp: s.timestamp });
    });
    Ok(families)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_families() {
        let t = "# HELP a_total Help \\n x.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\"} 3\n\
                 # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\nplain 1e+06 123\n";
        let f = parse(t).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].kind, Type::Counter);
        assert_eq!(f[0].help.as_deref(), Some("Help \n x."));
        assert_eq!(f[0].samples[0].labels[1], ("y".into(), "q\"".into()));
        assert_eq!(f[1].name, "h");
        assert_eq!(f[1].samples.len(), 4);
        assert_eq!(f[2].kind, Type::Untyped);
        assert_eq!(f[2].samples[0].value, 1e6);
        assert_eq!(f[2].samples[0].timestamp, Some(123));
    }

    #[test]
    fn help_unescapes_left_to_right() {
        let f = parse("# HELP a x \\\\n y \\n z \\q\na 1\n").unwrap();
        assert_eq!(f[0].help.as_deref(), Some("x \\n y \n z \\q"));
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["a{b=\"1\" 1", "a{b=1} 1", "a", "a x", "1a 1", "a{b=\"1\",b=\"2\"} 1", "# TYPE a wrong", "a 1 2 3"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
