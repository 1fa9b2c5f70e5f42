//! `selinux`: whether SELinux is enabled, and its configured and current modes.

use std::path::PathBuf;

use crate::io::read_trimmed;
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    enforce: PathBuf,
    config: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { enforce: p.sys("fs/selinux/enforce"), config: p.rootfs.join("etc/selinux/config") }
    }
}

/// The mode in /etc/selinux/config: enforcing 1, permissive 0, disabled -1.
pub fn config_mode(text: &str) -> Option<f64> {
    let v = text.lines().find_map(|l| l.trim().strip_prefix("SELINUX="))?;
    match v.trim().trim_matches('"') {
        "enforcing" => Some(1.0),
        "permissive" => Some(0.0),
        "disabled" => Some(-1.0),
        _ => None,
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let Some(current) = read_trimmed(&self.enforce) else {
            sink.single("node_selinux_enabled", "SELinux is enabled, 1 is true, 0 is false", Kind::Gauge, 0.0);
            return Ok(());
        };
        sink.single("node_selinux_enabled", "SELinux is enabled, 1 is true, 0 is false", Kind::Gauge, 1.0);
        if let Some(mode) = crate::io::read_text(&self.config).ok().as_deref().and_then(config_mode) {
            sink.single("node_selinux_config_mode", "Configured SELinux enforcement mode", Kind::Gauge, mode);
        }
        let cur = if current == "1" { 1.0 } else { 0.0 };
        sink.single("node_selinux_current_mode", "Current SELinux enforcement mode", Kind::Gauge, cur);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn config() {
        assert_eq!(super::config_mode("# x\nSELINUX=enforcing\nSELINUXTYPE=targeted\n"), Some(1.0));
        assert_eq!(super::config_mode("SELINUX=disabled"), Some(-1.0));
        assert_eq!(super::config_mode(""), None);
    }
}
