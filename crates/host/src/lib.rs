//! node_exporter's host collectors: one module per collector under
//! [`collector`], named as node_exporter names it (its flag
//! `--collector.<name>`, its `collector` label and its file name), each with
//! pure parsers and thin I/O, registered in [`registry`]. How they run (the
//! scrape, its runner threads and deadlines, the memory policy) is the
//! runtime crate's job, not this one's.
//!
//! Shared helpers live in named modules, never in a collector: [`io`]
//! (kept procfs/sysfs files), [`parse`] (bytes to numbers), [`flags`]
//! (kingpin-style flags), [`filter`] (include/exclude patterns), [`rpc`]
//! (the /proc/net/rpc files of NFS) and [`sys`] (system calls). Collectors
//! never import each other.

use std::path::{Path, PathBuf};

pub use expo::{Kind, Sink};

pub mod catalog;
pub mod collector;
pub mod dbus;
pub mod filter;
pub mod flags;
pub mod io;
pub mod netlink;
pub mod parse;
pub mod registry;
pub mod rpc;
pub mod sys;
#[cfg(test)]
pub mod testutil;

/// Why a collector failed in one scrape.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    /// The host has nothing for this collector (e.g. no hwmon chips); it is
    /// reported with success 0 and logged at debug, as node_exporter does.
    #[error("no data: {0}")]
    NoData(String),
    /// The collector panicked: a bug, reported with success 0 and logged
    /// at error.
    #[error("collector panicked: {0}")]
    Panicked(String),
    /// A failure of another layer (a BPF map read, a netlink dump).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }

    pub fn parse(path: &Path, msg: impl Into<String>) -> Self {
        Error::Parse { path: path.to_path_buf(), msg: msg.into() }
    }

    /// A missing file means the host lacks the feature: no data, not a fault.
    pub fn from_read(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NoData(format!("{} does not exist", path.display()))
        } else {
            Error::io(path, source)
        }
    }

    pub fn is_no_data(&self) -> bool {
        matches!(self, Error::NoData(_))
    }
}

/// A bad flag value found while building a collector.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--{flag}: invalid regular expression {value:?}: {source}")]
    Regex {
        flag: String,
        value: String,
        #[source]
        source: Box<regex::Error>,
    },
    #[error("--{flag}: {msg}")]
    Invalid { flag: String, msg: String },
}

/// Host paths, injected from `--path.*`.
#[derive(Clone, Debug)]
pub struct Paths {
    pub procfs: PathBuf,
    pub sysfs: PathBuf,
    pub rootfs: PathBuf,
    pub udev_data: PathBuf,
}

impl Paths {
    pub fn proc(&self, rel: &str) -> PathBuf {
        self.procfs.join(rel)
    }
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.sysfs.join(rel)
    }
}

/// A built collector and its name.
pub type Named = (&'static str, Box<dyn Collector>);

/// One collector. `update` writes this scrape's samples into `sink`, which
/// the caller has cleared. A collector keeps its own read buffers.
pub trait Collector: Send {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error>;
}
