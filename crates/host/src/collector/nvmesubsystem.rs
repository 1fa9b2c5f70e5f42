//! `nvmesubsystem`: NVMe(-oF) subsystem path health from
//! /sys/class/nvme-subsystem, as node_exporter's nvmesubsystem collector:
//! per subsystem an info series (NQN, model, serial, I/O policy), its
//! namespace block devices, the number of controller paths and of live
//! ones, and per controller path a one-hot state series. Without the class
//! directory, or when a required attribute is missing or forbidden, the
//! collector reports no data (node_exporter's ErrNoData).

use std::path::{Path, PathBuf};

use crate::io::sys_read_file;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The states a path can be reported in, sorted: the kernel's controller
/// states (after [`normalize_state`]) and `unknown`.
pub const STATES: [&str; 7] = ["connecting", "dead", "deleting", "live", "new", "resetting", "unknown"];

/// Maps a controller's `state` attribute to its metric state: the kernel's
/// names, `deleting (no IO)` folded into `deleting`, anything else `unknown`.
pub fn normalize_state(raw: &str) -> &'static str {
    match raw {
        "live" => "live",
        "connecting" => "connecting",
        "resetting" => "resetting",
        "dead" => "dead",
        "deleting" | "deleting (no IO)" => "deleting",
        "new" => "new",
        _ => "unknown",
    }
}

/// `nvme<digits>`: a controller entry of a subsystem directory.
pub fn is_controller(name: &str) -> bool {
    name.strip_prefix("nvme").is_some_and(all_digits)
}

/// `nvme<digits>n<digits>`: a namespace block device of a subsystem.
pub fn is_namespace(name: &str) -> bool {
    name.strip_prefix("nvme").and_then(|r| r.split_once('n')).is_some_and(|(c, n)| all_digits(c) && all_digits(n))
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// One controller path of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    pub name: String,
    pub state: String,
    pub transport: String,
}

/// One subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subsystem {
    pub name: String,
    pub nqn: String,
    pub model: String,
    pub serial: String,
    pub iopolicy: String,
    pub controllers: Vec<Controller>,
    pub namespaces: Vec<String>,
}

/// An I/O failure as node_exporter classifies it: not there or not allowed
/// is no data, anything else an error.
fn io_error(path: &Path, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            Error::NoData(format!("could not read NVMe subsystem info: {}: {e}", path.display()))
        }
        _ => Error::io(path, e),
    }
}

/// A directory's entry names, sorted (Go's `os.ReadDir`).
fn list(path: &Path) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(path).map_err(|e| io_error(path, e))? {
        let e = e.map_err(|e| io_error(path, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort_unstable();
    Ok(names)
}

/// An attribute as procfs's `SysReadFile` reads it: one read of at most
/// 128 bytes, trimmed.
fn attr(path: &Path) -> Result<String, Error> {
    let b = sys_read_file(path).map_err(|e| io_error(path, e.into_io()))?;
    Ok(String::from_utf8_lossy(&b).trim().to_string())
}

fn read_subsystem(dir: &Path, name: &str) -> Result<Subsystem, Error> {
    let nqn = attr(&dir.join("subsysnqn"))?;
    let model = attr(&dir.join("model"))?;
    let serial = attr(&dir.join("serial"))?;
    let iopolicy = attr(&dir.join("iopolicy"))?;
    let mut controllers = Vec::new();
    let mut namespaces = Vec::new();
    for entry in list(dir)? {
        if is_controller(&entry) {
            let c = dir.join(&entry);
            let state = attr(&c.join("state"))?;
            let transport = attr(&c.join("transport"))?;
            // Not exported, but procfs requires it.
            attr(&c.join("address"))?;
            controllers.push(Controller { name: entry, state, transport });
        } else if is_namespace(&entry) {
            namespaces.push(entry);
        }
    }
    Ok(Subsystem { name: name.to_string(), nqn, model, serial, iopolicy, controllers, namespaces })
}

/// Every `nvme-subsys*` entry of the class directory, in name order.
pub fn read_class(class: &Path) -> Result<Vec<Subsystem>, Error> {
    list(class)?.into_iter().filter(|n| n.starts_with("nvme-subsys")).map(|n| read_subsystem(&class.join(&n), &n)).collect()
}

/// Writes the families of `subsystems`.
pub fn write(sink: &mut Sink, subsystems: &[Subsystem]) {
    if subsystems.is_empty() {
        return;
    }
    let mut info = sink.family("node_nvmesubsystem_info", "Non-numeric information about an NVMe subsystem.", Kind::Gauge);
    for s in subsystems {
        info.sample(&[("iopolicy", &s.iopolicy), ("model", &s.model), ("nqn", &s.nqn), ("serial", &s.serial), ("subsystem", &s.name)], 1.0);
    }
    if subsystems.iter().any(|s| !s.namespaces.is_empty()) {
        let mut ns = sink.family("node_nvmesubsystem_namespace_info", "Maps an NVMe namespace block device to its subsystem.", Kind::Gauge);
        for s in subsystems {
            for d in &s.namespaces {
                ns.sample(&[("device", d), ("subsystem", &s.name)], 1.0);
            }
        }
    }
    if subsystems.iter().any(|s| !s.controllers.is_empty()) {
        let mut st = sink.family(
            "node_nvmesubsystem_path_state",
            "Current NVMe controller path state (1 for the current state, 0 for all others).",
            Kind::Gauge,
        );
        for s in subsystems {
            for c in &s.controllers {
                let current = normalize_state(&c.state);
                for state in STATES {
                    st.sample(
                        &[("controller", &c.name), ("state", state), ("subsystem", &s.name), ("transport", &c.transport)],
                        if state == current { 1.0 } else { 0.0 },
                    );
                }
            }
        }
    }
    let mut paths = sink.family("node_nvmesubsystem_paths", "Number of controller paths for an NVMe subsystem.", Kind::Gauge);
    for s in subsystems {
        paths.sample(&[("subsystem", &s.name)], s.controllers.len() as f64);
    }
    let mut live =
        sink.family("node_nvmesubsystem_paths_live", "Number of controller paths in live state for an NVMe subsystem.", Kind::Gauge);
    for s in subsystems {
        let n = s.controllers.iter().filter(|c| normalize_state(&c.state) == "live").count();
        live.sample(&[("subsystem", &s.name)], n as f64);
    }
}

pub struct Collector {
    class: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { class: p.sys("class/nvme-subsystem") }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let subsystems = read_class(&self.class)?;
        write(sink, &subsystems);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, write as put};
    use crate::Collector as _;

    /// node_exporter's TestNVMeSubsystemMetrics expectation (HELP lines
    /// dropped).
    const NE_EXPECTED: &str = r#"# TYPE node_nvmesubsystem_info gauge
node_nvmesubsystem_info{iopolicy="round-robin",model="Dell PowerStore",nqn="nqn.2014-08.org.nvmexpress:uuid:a34c4f3a-0d6f-5cec-dead-beefcafebabe",serial="SN12345678",subsystem="nvme-subsys0"} 1
# TYPE node_nvmesubsystem_namespace_info gauge
node_nvmesubsystem_namespace_info{device="nvme0n1",subsystem="nvme-subsys0"} 1
# TYPE node_nvmesubsystem_path_state gauge
node_nvmesubsystem_path_state{controller="nvme0",state="connecting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme0",state="dead",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme0",state="deleting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme0",state="live",subsystem="nvme-subsys0",transport="fc"} 1
node_nvmesubsystem_path_state{controller="nvme0",state="new",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme0",state="resetting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme0",state="unknown",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="connecting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="dead",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="deleting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="live",subsystem="nvme-subsys0",transport="fc"} 1
node_nvmesubsystem_path_state{controller="nvme1",state="new",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="resetting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme1",state="unknown",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="connecting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="dead",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="deleting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="live",subsystem="nvme-subsys0",transport="fc"} 1
node_nvmesubsystem_path_state{controller="nvme2",state="new",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="resetting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme2",state="unknown",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="connecting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="dead",subsystem="nvme-subsys0",transport="fc"} 1
node_nvmesubsystem_path_state{controller="nvme3",state="deleting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="live",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="new",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="resetting",subsystem="nvme-subsys0",transport="fc"} 0
node_nvmesubsystem_path_state{controller="nvme3",state="unknown",subsystem="nvme-subsys0",transport="fc"} 0
# TYPE node_nvmesubsystem_paths gauge
node_nvmesubsystem_paths{subsystem="nvme-subsys0"} 4
# TYPE node_nvmesubsystem_paths_live gauge
node_nvmesubsystem_paths_live{subsystem="nvme-subsys0"} 3
"#;

    /// node_exporter's fixture sys/class/nvme-subsystem (from sys.ttar;
    /// nvme0n1 is an empty directory there).
    fn ne_fixture(root: &Path) {
        let s = "sys/class/nvme-subsystem/nvme-subsys0";
        put(root, &format!("{s}/iopolicy"), "round-robin\n");
        put(root, &format!("{s}/model"), "Dell PowerStore\n");
        put(root, &format!("{s}/serial"), "SN12345678\n");
        put(root, &format!("{s}/subsysnqn"), "nqn.2014-08.org.nvmexpress:uuid:a34c4f3a-0d6f-5cec-dead-beefcafebabe\n");
        for (i, state) in ["live", "live", "live", "dead"].iter().enumerate() {
            put(root, &format!("{s}/nvme{i}/state"), &format!("{state}\n"));
            put(root, &format!("{s}/nvme{i}/transport"), "fc\n");
            put(root, &format!("{s}/nvme{i}/address"), &format!("nn-0x200000109b12345{}:pn-0x100000109b12345{}\n", 6 + i, 6 + i));
        }
        std::fs::create_dir_all(root.join(format!("{s}/nvme0n1"))).unwrap();
    }

    /// The sink as (family, TYPE, sorted samples), and the same of an
    /// exposition text.
    type Fams = Vec<(String, String, Vec<(Vec<(String, String)>, f64)>)>;

    fn of_sink(sink: &Sink) -> Fams {
        let mut out: Fams = sink
            .families()
            .iter()
            .map(|f| {
                let kind = match f.kind() {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Untyped => "untyped",
                    Kind::Histogram => "histogram",
                };
                let mut s: Vec<_> =
                    f.samples().map(|(l, v)| (l.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>(), v)).collect();
                s.sort_by(|a, b| a.0.cmp(&b.0));
                (f.name().to_string(), kind.to_string(), s)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn of_text(text: &str) -> Fams {
        let mut out: Fams = expo::text::parse(text)
            .unwrap()
            .into_iter()
            .map(|f| {
                let mut s: Vec<_> = f.samples.into_iter().map(|s| (s.labels, s.value)).collect();
                s.sort_by(|a, b| a.0.cmp(&b.0));
                (f.name, f.kind.as_str().to_string(), s)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn scrape(root: &Path) -> Result<Sink, Error> {
        let mut c = super::Collector::new(&paths(root));
        let mut sink = Sink::new();
        c.update(&mut sink).map(|()| sink)
    }

    #[test]
    fn matches_node_exporters_unit_test() {
        let dir = tempfile::tempdir().unwrap();
        ne_fixture(dir.path());
        assert_eq!(of_sink(&scrape(dir.path()).unwrap()), of_text(NE_EXPECTED));
    }

    #[test]
    fn reads_procfs_fixture_subsystems() {
        // procfs's TestNVMeSubsystemClass (two subsystems, mixed transports).
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let base = "sys/class/nvme-subsystem";
        for (sub, nqn, model, serial, pol) in [
            (
                "nvme-subsys0",
                "nqn.2014-08.org.nvmexpress:uuid:a34c4f3a-0d6f-5cec-dead-beefcafebabe",
                "Dell PowerStore",
                "SN12345678",
                "round-robin",
            ),
            ("nvme-subsys1", "nqn.2014-08.org.nvmexpress:uuid:b45d5e4b-1e7f-6ded-beef-deadcafe1234", "NetApp ONTAP", "NTAP98765", "numa"),
        ] {
            put(root, &format!("{base}/{sub}/subsysnqn"), &format!("{nqn}\n"));
            put(root, &format!("{base}/{sub}/model"), &format!("{model}\n"));
            put(root, &format!("{base}/{sub}/serial"), &format!("{serial}\n"));
            put(root, &format!("{base}/{sub}/iopolicy"), &format!("{pol}\n"));
        }
        for (sub, c, state, tr) in [
            ("nvme-subsys0", "nvme0", "live", "fc"),
            ("nvme-subsys0", "nvme1", "live", "fc"),
            ("nvme-subsys0", "nvme2", "dead", "fc"),
            ("nvme-subsys1", "nvme3", "live", "tcp"),
            ("nvme-subsys1", "nvme4", "connecting", "rdma"),
        ] {
            put(root, &format!("{base}/{sub}/{c}/state"), &format!("{state}\n"));
            put(root, &format!("{base}/{sub}/{c}/transport"), &format!("{tr}\n"));
            put(root, &format!("{base}/{sub}/{c}/address"), "traddr=10.0.0.1,trsvcid=4420\n");
        }
        for ns in ["nvme-subsys0/nvme0n1", "nvme-subsys1/nvme3n1", "nvme-subsys1/nvme4n1"] {
            std::fs::create_dir_all(root.join(format!("{base}/{ns}"))).unwrap();
        }
        // Not a subsystem, and not controllers or namespaces.
        put(root, &format!("{base}/other/x"), "");
        put(root, &format!("{base}/nvme-subsys1/nvme-fabrics"), "");
        put(root, &format!("{base}/nvme-subsys1/nvme3c3n1"), "");
        let subs = read_class(&root.join(base)).unwrap();
        let ctrl =
            |name: &str, state: &str, transport: &str| Controller { name: name.into(), state: state.into(), transport: transport.into() };
        assert_eq!(subs.len(), 2);
        assert_eq!((subs[0].model.as_str(), subs[0].iopolicy.as_str()), ("Dell PowerStore", "round-robin"));
        assert_eq!(subs[0].controllers, vec![ctrl("nvme0", "live", "fc"), ctrl("nvme1", "live", "fc"), ctrl("nvme2", "dead", "fc")]);
        assert_eq!(subs[0].namespaces, vec!["nvme0n1"]);
        assert_eq!((subs[1].name.as_str(), subs[1].serial.as_str(), subs[1].iopolicy.as_str()), ("nvme-subsys1", "NTAP98765", "numa"));
        assert_eq!(subs[1].controllers, vec![ctrl("nvme3", "live", "tcp"), ctrl("nvme4", "connecting", "rdma")]);
        assert_eq!(subs[1].namespaces, vec!["nvme3n1", "nvme4n1"]);
    }

    #[test]
    fn normalizes_states() {
        // node_exporter's TestNormalizeControllerState.
        for (raw, want) in [
            ("live", "live"),
            ("connecting", "connecting"),
            ("resetting", "resetting"),
            ("dead", "dead"),
            ("deleting", "deleting"),
            ("deleting (no IO)", "deleting"),
            ("new", "new"),
            ("", "unknown"),
            ("something-else", "unknown"),
        ] {
            assert_eq!(normalize_state(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn entry_names() {
        assert!(is_controller("nvme0") && is_controller("nvme12"));
        assert!(!is_controller("nvme") && !is_controller("nvme0n1") && !is_controller("nvmex"));
        assert!(is_namespace("nvme0n1") && is_namespace("nvme10n22"));
        assert!(!is_namespace("nvme0") && !is_namespace("nvme0n") && !is_namespace("nvmen1") && !is_namespace("nvme0c0n1"));
    }

    #[test]
    fn no_class_dir_is_no_data_and_empty_is_nothing() {
        // node_exporter's TestNVMeSubsystemNoDevices.
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).err().unwrap().is_no_data());
        std::fs::create_dir_all(dir.path().join("sys/class/nvme-subsystem")).unwrap();
        assert!(scrape(dir.path()).unwrap().families().is_empty());
    }

    #[test]
    fn missing_attribute_is_no_data_other_failures_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        ne_fixture(dir.path());
        let s = dir.path().join("sys/class/nvme-subsystem/nvme-subsys0");
        std::fs::remove_file(s.join("nvme2/address")).unwrap();
        assert!(scrape(dir.path()).err().unwrap().is_no_data(), "errors.Is(err, fs.ErrNotExist)");
        put(dir.path(), "sys/class/nvme-subsystem/nvme-subsys0/nvme2/address", "x\n");
        // A controller entry that is a file: ENOTDIR, an error.
        put(dir.path(), "sys/class/nvme-subsystem/nvme-subsys0/nvme7", "");
        assert!(matches!(scrape(dir.path()), Err(Error::Io { .. })));
    }
}
