//! `os`: the operating system release from os-release under `--path.rootfs`.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    candidates: [PathBuf; 2],
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { candidates: [p.rootfs.join("etc/os-release"), p.rootfs.join("usr/lib/os-release")] }
    }
}

/// Parses os-release: KEY=value lines, values optionally quoted.
pub fn parse(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        let v = v.trim();
        let v = if v.len() >= 2 && ((v.starts_with('"') && v.ends_with('"')) || (v.starts_with('\'') && v.ends_with('\''))) {
            v[1..v.len() - 1].replace("\\\"", "\"").replace("\\$", "$").replace("\\\\", "\\")
        } else {
            v.to_string()
        };
        out.insert(k.to_string(), v);
    }
    out
}

/// `VERSION_ID` as a number: its leading `major.minor` digits, as node_exporter does.
pub fn version_number(v: &str) -> Option<f64> {
    let mut parts = v.split('.');
    let major = parts.next()?.trim();
    let num: String = match parts.next() {
        Some(minor) => format!("{major}.{}", minor.chars().take_while(|c| c.is_ascii_digit()).collect::<String>()),
        None => major.to_string(),
    };
    num.trim_end_matches('.').parse().ok()
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut last = None;
        let mut text = None;
        for c in &self.candidates {
            match crate::io::read_text(c) {
                Ok(t) => {
                    text = Some(t);
                    break;
                }
                Err(e) => last = Some((c.clone(), e)),
            }
        }
        let Some(text) = text else {
            return Err(match last {
                Some((p, e)) => Error::from_read(&p, e),
                None => Error::NoData("no os-release".into()),
            });
        };
        let m = parse(&text);
        let g = |k: &str| m.get(k).map(String::as_str).unwrap_or("");
        sink.family("node_os_info", "A metric with a constant '1' value labeled by build_id, id, id_like, image_id, image_version, name, pretty_name, variant, variant_id, version, version_codename, version_id.", Kind::Gauge).sample(
            &[
                ("build_id", g("BUILD_ID")),
                ("id", g("ID")),
                ("id_like", g("ID_LIKE")),
                ("image_id", g("IMAGE_ID")),
                ("image_version", g("IMAGE_VERSION")),
                ("name", g("NAME")),
                ("pretty_name", g("PRETTY_NAME")),
                ("variant", g("VARIANT")),
                ("variant_id", g("VARIANT_ID")),
                ("version", g("VERSION")),
                ("version_codename", g("VERSION_CODENAME")),
                ("version_id", g("VERSION_ID")),
            ],
            1.0,
        );
        if let Some(v) = version_number(g("VERSION_ID")) {
            sink.family("node_os_version", "Metric containing the major.minor part of the OS version.", Kind::Gauge)
                .sample(&[("id", g("ID")), ("id_like", g("ID_LIKE")), ("name", g("NAME"))], v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let m = super::parse("NAME=\"Ubuntu\"\nVERSION=\"20.04.2 LTS (Focal Fossa)\"\nID=ubuntu\n# c\nVERSION_ID=\"20.04\"\n");
        assert_eq!(m["NAME"], "Ubuntu");
        assert_eq!(m["ID"], "ubuntu");
        assert_eq!(super::version_number(&m["VERSION_ID"]), Some(20.04));
        assert_eq!(super::version_number("12"), Some(12.0));
        assert_eq!(super::version_number("rolling"), None);
    }
}
