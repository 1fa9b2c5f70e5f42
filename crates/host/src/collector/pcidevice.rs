//! `pcidevice`: the PCI devices of /sys/bus/pci/devices (symlinks whose
//! targets give each device's location and its parent bridge's), read as
//! procfs does: the identity attributes (class, vendor, device, subsystem
//! ids, revision) become the labels of `node_pcidevice_info`, optionally
//! with names resolved from a pci.ids file (`--collector.pcidevice.names`,
//! `--collector.pcidevice.idsfile`, parsed here by [`parse_pci_ids`]); the
//! link speed and width, SR-IOV, D3cold, power state and NUMA node
//! attributes become one gauge each per device. No PCI bus is no data.

use std::collections::{BTreeMap, HashMap};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::flags::{self, BoolFlag, Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const IDSFILE: StringFlag =
    StringFlag { name: "collector.pcidevice.idsfile", default: "", help: "Path to pci.ids file to use for PCI device identification." };
pub const NAMES: BoolFlag =
    BoolFlag { name: "collector.pcidevice.names", default: false, help: "Enable PCI device name resolution (requires pci.ids file)." };

/// Where node_exporter looks for pci.ids when `--collector.pcidevice.idsfile`
/// is not given (paths of the exporter's own file system, as node_exporter).
const DEFAULT_IDS_PATHS: &[&str] = &["/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"];

const POWER_STATES: &[&str] = &["D0", "D1", "D2", "D3hot", "D3cold", "unknown", "error"];

// ---------------------------------------------------------------- pci.ids

/// The names of a pci.ids file: vendors, their devices and the devices'
/// subsystems, and the classes with their subclasses and programming
/// interfaces. Keys are the file's ids as written (lower-case hex).
#[derive(Debug, Default)]
pub struct PciIds {
    vendors: HashMap<String, String>,
    /// vendor → device → name.
    devices: HashMap<String, HashMap<String, String>>,
    /// `vendor:device` → `subvendor:subdevice` → name.
    subsystems: HashMap<String, HashMap<String, String>>,
    /// `cc` → name.
    classes: HashMap<String, String>,
    /// `ccss` → name.
    subclasses: HashMap<String, String>,
    /// `ccsspp` → name.
    prog_ifs: HashMap<String, String>,
}

/// An entry line: its id and name, separated by the first two spaces.
fn id_and_name(line: &str) -> Option<(&str, &str)> {
    let (id, name) = line.split_once("  ")?;
    Some((id.trim(), name.trim()))
}

/// Parses a pci.ids file, as node_exporter reads it: `#` lines and empty
/// lines are skipped; `C cc  name` starts a class, whose one-tab lines are
/// subclasses and two-tab lines programming interfaces; any other
/// unindented `id  name` line is a vendor (ending the class section), its
/// one-tab lines devices and two-tab lines `subvendor subdevice  name`
/// subsystems. Lines without a name are ignored; it never fails.
pub fn parse_pci_ids(text: &str) -> PciIds {
    let mut ids = PciIds::default();
    let (mut vendor, mut device) = (String::new(), String::new());
    let (mut base_class, mut subclass) = (String::new(), String::new());
    let mut in_class = false;
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let tabs = if line.starts_with("\t\t\t") {
            3
        } else if line.starts_with("\t\t") {
            2
        } else if line.starts_with('\t') {
            1
        } else {
            0
        };
        if line.starts_with("C ") {
            if let Some((id, name)) = id_and_name(line) {
                // The id is what precedes the two spaces, without the `C`.
                let id = id.get(1..).unwrap_or("").trim();
                ids.classes.insert(id.to_string(), name.to_string());
                base_class = id.to_string();
                in_class = true;
            }
            continue;
        }
        if in_class && tabs == 1 {
            if let Some((id, name)) = id_and_name(&line[1..]) {
                if !base_class.is_empty() {
                    subclass = format!("{base_class}{id}");
                    ids.subclasses.insert(subclass.clone(), name.to_string());
                }
            }
            continue;
        }
        if in_class && tabs == 2 {
            if let Some((id, name)) = id_and_name(&line[2..]) {
                if !subclass.is_empty() {
                    ids.prog_ifs.insert(format!("{subclass}{id}"), name.to_string());
                }
            }
            continue;
        }
        match tabs {
            0 => {
                if let Some((id, name)) = id_and_name(line) {
                    vendor = id.to_string();
                    ids.vendors.insert(vendor.clone(), name.to_string());
                    device.clear();
                    in_class = false;
                }
            }
            1 => {
                if let Some((id, name)) = id_and_name(&line[1..]) {
                    if !vendor.is_empty() {
                        device = id.to_string();
                        ids.devices.entry(vendor.clone()).or_default().insert(device.clone(), name.to_string());
                    }
                }
            }
            _ => {
                // Two tabs or more (node_exporter strips two).
                if let Some((id, name)) = id_and_name(&line[2..]) {
                    if !vendor.is_empty() && !device.is_empty() {
                        let subs = ids.subsystems.entry(format!("{vendor}:{device}")).or_default();
                        let parts: Vec<&str> = id.split_whitespace().collect();
                        if let [sv, sd] = parts[..] {
                            subs.insert(format!("{sv}:{sd}"), name.to_string());
                        }
                    }
                }
            }
        }
    }
    ids
}

fn strip_0x(id: &str) -> &str {
    id.strip_prefix("0x").unwrap_or(id)
}

impl PciIds {
    /// The vendor's name, or its id without `0x`.
    pub fn vendor_name(&self, vendor: &str) -> String {
        let v = strip_0x(vendor).to_lowercase();
        self.vendors.get(&v).cloned().unwrap_or(v)
    }

    /// The device's name, or its id without `0x`.
    pub fn device_name(&self, vendor: &str, device: &str) -> String {
        let v = strip_0x(vendor).to_lowercase();
        let d = strip_0x(device).to_lowercase();
        self.devices.get(&v).and_then(|m| m.get(&d)).cloned().unwrap_or(d)
    }

    /// The subsystem's name, or the subsystem device id without `0x`.
    pub fn subsystem_name(&self, vendor: &str, device: &str, sub_vendor: &str, sub_device: &str) -> String {
        let key = format!("{}:{}", strip_0x(vendor), strip_0x(device));
        let sub = format!("{}:{}", strip_0x(sub_vendor), strip_0x(sub_device));
        self.subsystems.get(&key).and_then(|m| m.get(&sub)).cloned().unwrap_or_else(|| strip_0x(sub_device).to_string())
    }

    /// The most specific name of a class id `0xccsspp`: its programming
    /// interface's, its subclass's or its class's, else `Unknown class (…)`.
    pub fn class_name(&self, class: &str) -> String {
        let c = strip_0x(class).to_lowercase();
        let found = [(6, &self.prog_ifs), (4, &self.subclasses), (2, &self.classes)].into_iter().find_map(|(n, m)| m.get(c.get(..n)?));
        match found {
            Some(name) => name.clone(),
            None => format!("Unknown class ({c})"),
        }
    }
}

// ---------------------------------------------------------------- devices

/// A PCI location `segment:bus:device.function` (hex).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub segment: i32,
    pub bus: i32,
    pub device: i32,
    pub function: i32,
}

/// Go's `%0Nx` of a signed number: a minus sign, then the magnitude.
fn go_hex(v: i32, width: usize) -> String {
    if v < 0 {
        format!("-{:0w$x}", v.unsigned_abs(), w = width.saturating_sub(1))
    } else {
        format!("{v:0width$x}")
    }
}

impl Location {
    /// segment, bus, device, function, as node_exporter's labels spell them.
    pub fn labels(&self) -> [String; 4] {
        [go_hex(self.segment, 4), go_hex(self.bus, 2), go_hex(self.device, 2), go_hex(self.function, 0)]
    }
}

/// Parses a location such as `0000:00:02.1`.
pub fn parse_location(s: &str) -> Result<Location, String> {
    let invalid = || format!("invalid location {s:?}");
    let parts: Vec<&str> = s.split(':').collect();
    let [seg, bus, rest] = parts[..] else { return Err(invalid()) };
    let tail: Vec<&str> = rest.split('.').collect();
    let [dev, func] = tail[..] else { return Err(invalid()) };
    let hex = |v: &str, what: &str| i32::from_str_radix(v, 16).map_err(|e| format!("invalid {what} {v:?} in {s:?}: {e}"));
    Ok(Location { segment: hex(seg, "segment")?, bus: hex(bus, "bus")?, device: hex(dev, "device")?, function: hex(func, "function")? })
}

/// Go's `filepath.Base`: the last element, trailing slashes removed.
fn go_base(p: &str) -> &str {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        return if p.is_empty() { "." } else { "/" };
    }
    t.rsplit('/').next().unwrap_or(t)
}

/// Go's `filepath.Base(filepath.Dir(p))`: the last element of the cleaned
/// directory part of `p`.
fn go_parent_base(p: &str) -> String {
    let dir = match p.rfind('/') {
        Some(i) => &p[..=i],
        None => "",
    };
    let rooted = dir.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in dir.split('/') {
        match c {
            "" | "." => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            ".." if rooted => {}
            c => parts.push(c),
        }
    }
    match parts.last() {
        Some(l) => l.to_string(),
        None if rooted => "/".into(),
        None => ".".into(),
    }
}

/// The device's location and its parent's (none when the parent is a
/// host bridge, `pciSSSS:BB`) from its /sys/bus/pci/devices link target,
/// e.g. `../../../devices/pci0000:00/0000:00:02.1/0000:01:00.0`.
pub fn locations_of_link(target: &str) -> Result<(Location, Option<Location>), String> {
    let loc = parse_location(go_base(target)).map_err(|e| format!("failed to parse device location: {e}"))?;
    let parent = go_parent_base(target);
    if parent.starts_with("pci") {
        return Ok((loc, None));
    }
    let parent = parse_location(&parent).map_err(|e| format!("failed to parse parent device location: {e}"))?;
    Ok((loc, Some(parent)))
}

/// A link speed such as `8.0 GT/s PCIe`, in GT/s; `None` when the kernel
/// has none (`Unknown`, or empty).
pub fn parse_link_speed(s: &str) -> Result<Option<f64>, String> {
    if s.is_empty() || s.starts_with("Unknown") {
        return Ok(None);
    }
    let Some((num, unit)) = s.split_once(' ') else { return Err(format!("invalid link speed {s:?}")) };
    if unit != "GT/s PCIe" {
        return Err(format!("unknown unit of link speed {s:?}"));
    }
    num.trim().parse::<f64>().map(Some).map_err(|_| format!("invalid link speed {s:?}"))
}

/// Go's `strconv.ParseUint(s, base, …)`: no sign accepted.
fn go_uint<T: TryFrom<u64>>(s: &str, radix: u32) -> Option<T> {
    if s.starts_with('+') {
        return None;
    }
    T::try_from(u64::from_str_radix(s, radix).ok()?).ok()
}

/// One PCI device, as procfs's `PciDevice` (the attributes exported).
#[derive(Debug, Default, PartialEq)]
pub struct Device {
    pub location: Location,
    pub parent: Option<Location>,
    pub class: u32,
    pub vendor: u32,
    pub device: u32,
    pub subsystem_vendor: u32,
    pub subsystem_device: u32,
    pub revision: u32,
    pub max_link_speed: Option<f64>,
    pub max_link_width: Option<f64>,
    pub current_link_speed: Option<f64>,
    pub current_link_width: Option<f64>,
    pub numa_node: Option<i32>,
    pub sriov_drivers_autoprobe: Option<bool>,
    pub sriov_numvfs: Option<u32>,
    pub sriov_totalvfs: Option<u32>,
    pub sriov_vf_total_msix: Option<u64>,
    pub d3cold_allowed: Option<bool>,
    pub power_state: Option<String>,
}

/// Sets one attribute of `d` from its trimmed value: `Ok(false)` for a
/// name it does not know.
pub fn set_attr(d: &mut Device, name: &str, v: &str) -> Result<bool, String> {
    let bad = || format!("failed to parse {name} {v:?}");
    match name {
        "class" | "vendor" | "device" | "subsystem_vendor" | "subsystem_device" | "revision" => {
            let n = crate::parse::parse_go_int(v).and_then(|n| i32::try_from(n).ok()).ok_or_else(bad)? as u32;
            *match name {
                "class" => &mut d.class,
                "vendor" => &mut d.vendor,
                "device" => &mut d.device,
                "subsystem_vendor" => &mut d.subsystem_vendor,
                "subsystem_device" => &mut d.subsystem_device,
                _ => &mut d.revision,
            } = n;
            return Ok(true);
        }
        _ => {}
    }
    // The optional attributes: an empty value means none.
    if v.is_empty() {
        return Ok(true);
    }
    match name {
        "max_link_speed" => d.max_link_speed = parse_link_speed(v)?,
        "current_link_speed" => d.current_link_speed = parse_link_speed(v)?,
        "max_link_width" | "current_link_width" | "numa_node" => {
            if v.starts_with("Unknown") {
                return Ok(true);
            }
            match name {
                "numa_node" => d.numa_node = Some(v.parse().map_err(|_| bad())?),
                "max_link_width" => d.max_link_width = Some(v.parse::<i64>().map_err(|_| bad())? as f64),
                _ => d.current_link_width = Some(v.parse::<i64>().map_err(|_| bad())? as f64),
            }
        }
        "sriov_drivers_autoprobe" => d.sriov_drivers_autoprobe = Some(v.parse::<i32>().map_err(|_| bad())? != 0),
        "d3cold_allowed" => d.d3cold_allowed = Some(v.parse::<i32>().map_err(|_| bad())? != 0),
        "sriov_numvfs" => d.sriov_numvfs = Some(go_uint(v, 10).ok_or_else(bad)?),
        "sriov_totalvfs" => d.sriov_totalvfs = Some(go_uint(v, 10).ok_or_else(bad)?),
        // Read and checked, as procfs does, but not exported.
        "sriov_offset" | "sriov_stride" => {
            go_uint::<u32>(v, 10).ok_or_else(bad)?;
        }
        "sriov_vf_device" => {
            go_uint::<u32>(v, 16).ok_or_else(bad)?;
        }
        "sriov_vf_total_msix" => d.sriov_vf_total_msix = Some(go_uint(v, 10).ok_or_else(bad)?),
        "power_state" => d.power_state = Some(v.to_string()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Attributes every device has (a missing one fails the scrape).
const REQUIRED: &[&str] = &["class", "vendor", "device", "subsystem_vendor", "subsystem_device", "revision"];
/// Attributes a device may lack, in procfs's order.
const OPTIONAL: &[&str] = &[
    "max_link_speed",
    "max_link_width",
    "current_link_speed",
    "current_link_width",
    "numa_node",
    "sriov_drivers_autoprobe",
    "sriov_numvfs",
    "sriov_offset",
    "sriov_stride",
    "sriov_totalvfs",
    "sriov_vf_device",
    "sriov_vf_total_msix",
    "d3cold_allowed",
    "power_state",
];

/// One attribute as procfs's `SysReadFile` reads it (one read of at most
/// 128 bytes, trimmed); `None` when it does not exist. A missing file
/// surfaces as no data, as in node_exporter (its error wraps ENOENT).
fn read_attr(path: &Path, optional: bool) -> Result<Option<String>, Error> {
    match crate::io::sys_read_file(path) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_string())),
        Err(e) => {
            let e = e.into_io();
            if optional && e.kind() == ErrorKind::NotFound {
                Ok(None)
            } else {
                Err(Error::from_read(path, e))
            }
        }
    }
}

/// Reads the device behind the link `link` in /sys/bus/pci/devices.
fn read_device(link: &Path) -> Result<Device, Error> {
    let target = std::fs::read_link(link).map_err(|e| Error::from_read(link, e))?;
    let (loc, parent) = locations_of_link(&target.to_string_lossy()).map_err(|m| Error::parse(link, m))?;
    let mut d = Device { location: loc, parent, ..Device::default() };
    for (names, optional) in [(REQUIRED, false), (OPTIONAL, true)] {
        for name in names {
            let path = link.join(name);
            let Some(v) = read_attr(&path, optional)? else { continue };
            set_attr(&mut d, name, &v).map_err(|m| Error::parse(&path, m))?;
        }
    }
    Ok(d)
}

// ---------------------------------------------------------------- collector

pub struct Options {
    pub idsfile: String,
    pub names: bool,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&IDSFILE, &NAMES])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { idsfile: IDSFILE.get(f), names: NAMES.get(f) })
    }
}

/// Loads pci.ids from `idsfile`, else from the first default path that
/// opens; with none, no names (ids are shown instead), as node_exporter.
fn load_ids(idsfile: &str) -> PciIds {
    let candidates: Vec<&str> = if idsfile.is_empty() { DEFAULT_IDS_PATHS.to_vec() } else { vec![idsfile] };
    let mut buf = Vec::new();
    for path in candidates {
        match crate::io::read_into(Path::new(path), &mut buf) {
            Ok(()) => {
                let ids = parse_pci_ids(&String::from_utf8_lossy(&buf));
                tracing::debug!(path, vendors = ids.vendors.len(), classes = ids.classes.len(), "pcidevice: loaded PCI ids");
                return ids;
            }
            Err(e) => tracing::debug!(path, error = %e, "pcidevice: cannot read PCI ids file"),
        }
    }
    PciIds::default()
}

pub struct Collector {
    dir: PathBuf,
    /// The names, when `--collector.pcidevice.names` is on.
    ids: Option<PciIds>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let ids = o.names.then(|| load_ids(&o.idsfile));
        Ok(Collector { dir: p.sys("bus/pci/devices"), ids })
    }

    /// Every device, by location (a location listed twice is kept once).
    fn devices(&self) -> Result<Vec<Device>, Error> {
        let names = crate::io::sorted_names(&self.dir)?;
        let mut by_loc = BTreeMap::new();
        for name in names {
            let d = read_device(&self.dir.join(&name))?;
            let l = d.location;
            by_loc.insert((l.segment, l.bus, l.device, l.function), d);
        }
        Ok(by_loc.into_values().collect())
    }
}

type Gauge = (&'static str, &'static str, fn(&Device) -> f64);

const GAUGES: &[Gauge] = &[
    ("node_pcidevice_max_link_transfers_per_second", "Value of maximum link's transfers per second (T/s)", |d| {
        d.max_link_speed.map_or(-1.0, |v| v * 1e9)
    }),
    ("node_pcidevice_max_link_width", "Value of maximum link's width (number of lanes)", |d| d.max_link_width.unwrap_or(-1.0)),
    ("node_pcidevice_current_link_transfers_per_second", "Value of current link's transfers per second (T/s)", |d| {
        d.current_link_speed.map_or(-1.0, |v| v * 1e9)
    }),
    ("node_pcidevice_current_link_width", "Value of current link's width (number of lanes)", |d| d.current_link_width.unwrap_or(-1.0)),
    ("node_pcidevice_d3cold_allowed", "Whether the PCIe device supports D3cold power state (0/1).", |d| {
        f64::from(u8::from(d.d3cold_allowed.unwrap_or(false)))
    }),
    ("node_pcidevice_sriov_drivers_autoprobe", "Whether SR-IOV drivers autoprobe is enabled for the device (0/1).", |d| {
        f64::from(u8::from(d.sriov_drivers_autoprobe.unwrap_or(false)))
    }),
    ("node_pcidevice_sriov_numvfs", "Number of Virtual Functions (VFs) currently enabled for SR-IOV.", |d| {
        f64::from(d.sriov_numvfs.unwrap_or(0))
    }),
    ("node_pcidevice_sriov_totalvfs", "Total number of Virtual Functions (VFs) supported by the device.", |d| {
        f64::from(d.sriov_totalvfs.unwrap_or(0))
    }),
    ("node_pcidevice_sriov_vf_total_msix", "Total number of MSI-X vectors for Virtual Functions.", |d| {
        d.sriov_vf_total_msix.unwrap_or(0) as f64
    }),
];

const INFO_HELP: &str = "Non-numeric data from /sys/bus/pci/devices/<location>, value is always 1.";
const POWER_HELP: &str = "PCIe device power state, one of: D0, D1, D2, D3hot, D3cold, unknown or error.";
const NUMA_HELP: &str = "NUMA node number for the PCI device. -1 indicates unknown or not available.";

/// The labels of `node_pcidevice_info`, sorted by name.
fn info_labels(d: &Device, loc: &[String; 4], ids: Option<&PciIds>) -> Vec<(&'static str, String)> {
    let parent = d.parent.map(|p| p.labels()).unwrap_or_else(|| ["*", "*", "*", "*"].map(String::from));
    let [seg, bus, dev, func] = loc.clone();
    let [pseg, pbus, pdev, pfunc] = parent;
    let class = format!("0x{:06x}", d.class);
    let vendor = format!("0x{:04x}", d.vendor);
    let device = format!("0x{:04x}", d.device);
    let sub_vendor = format!("0x{:04x}", d.subsystem_vendor);
    let sub_device = format!("0x{:04x}", d.subsystem_device);
    let mut l = Vec::with_capacity(19);
    if let Some(ids) = ids {
        l.push(("vendor_name", ids.vendor_name(&vendor)));
        l.push(("device_name", ids.device_name(&vendor, &device)));
        l.push(("subsystem_vendor_name", ids.vendor_name(&sub_vendor)));
        l.push(("subsystem_device_name", ids.subsystem_name(&vendor, &device, &sub_vendor, &sub_device)));
        l.push(("class_name", ids.class_name(&class)));
    }
    l.extend([
        ("segment", seg),
        ("bus", bus),
        ("device", dev),
        ("function", func),
        ("parent_segment", pseg),
        ("parent_bus", pbus),
        ("parent_device", pdev),
        ("parent_function", pfunc),
        ("class_id", class),
        ("vendor_id", vendor),
        ("device_id", device),
        ("subsystem_vendor_id", sub_vendor),
        ("subsystem_device_id", sub_device),
        ("revision", format!("0x{:02x}", d.revision)),
    ]);
    l.sort_unstable_by_key(|(k, _)| *k);
    l
}

/// The device labels, sorted by name.
fn by_loc(l: &[String; 4]) -> [(&'static str, &str); 4] {
    [("bus", l[1].as_str()), ("device", l[2].as_str()), ("function", l[3].as_str()), ("segment", l[0].as_str())]
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let devices = self.devices()?;
        if devices.is_empty() {
            return Ok(());
        }
        let locs: Vec<[String; 4]> = devices.iter().map(|d| d.location.labels()).collect();

        let mut f = sink.new_family("node_pcidevice_info", INFO_HELP, Kind::Gauge);
        for (d, loc) in devices.iter().zip(&locs) {
            let labels = info_labels(d, loc, self.ids.as_ref());
            let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            f.sample(&l, 1.0);
        }
        for (name, help, value) in GAUGES {
            let mut f = sink.new_family(name, help, Kind::Gauge);
            for (d, loc) in devices.iter().zip(&locs) {
                f.sample(&by_loc(loc), value(d));
            }
        }
        if devices.iter().any(|d| d.power_state.is_some()) {
            let mut f = sink.new_family("node_pcidevice_power_state", POWER_HELP, Kind::Gauge);
            for (d, loc) in devices.iter().zip(&locs) {
                let Some(state) = d.power_state.as_deref() else { continue };
                let [b, dv, fu, s] = by_loc(loc);
                for st in POWER_STATES {
                    f.sample(&[b, dv, fu, s, ("state", st)], if *st == state { 1.0 } else { 0.0 });
                }
            }
        }
        if devices.iter().any(|d| d.numa_node.is_some_and(|n| n != -1)) {
            let mut f = sink.new_family("node_pcidevice_numa_node", NUMA_HELP, Kind::Gauge);
            for (d, loc) in devices.iter().zip(&locs) {
                match d.numa_node {
                    Some(n) if n != -1 => {
                        f.sample(&by_loc(loc), f64::from(n));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    /// node_exporter's fixture pci.ids, whole.
    const PCI_IDS: &str = "# Test PCI IDs file for node_exporter testing
# This file contains sample entries for testing PCI name resolution

# Classes
C 06  Bridge device
\t04  PCI bridge
C 01  Mass storage controller
\t08  Non-Volatile memory controller
\t\t02  NVM Express
C 02  Network controller
\t00  Ethernet controller

# Vendors
1022  Advanced Micro Devices, Inc. [AMD]
\t1634  Renoir/Cezanne PCIe GPP Bridge
\t\t17aa 5095  T540-5095 Unified Wire Ethernet Controller

c0a9  Micron/Crucial Technology
\t540a  P2 [Nick P2] / P3 / P3 Plus NVMe PCIe SSD (DRAM-less)
\t\tc0a9 5021  PS5021-E21 PCIe4 NVMe Controller (DRAM-less)

8086  Intel Corporation
\t1521  I350 Gigabit Network Connection
\t\t8086 00a3  Ethernet Network Adapter I350-T4 for OCP NIC 3.0

17aa  Lenovo";

    #[test]
    fn pci_ids_names() {
        let ids = parse_pci_ids(PCI_IDS);
        assert_eq!(ids.vendor_name("0x8086"), "Intel Corporation");
        assert_eq!(ids.vendor_name("0x17AA"), "Lenovo");
        assert_eq!(ids.vendor_name("0x1234"), "1234");
        assert_eq!(ids.device_name("0x1022", "0x1634"), "Renoir/Cezanne PCIe GPP Bridge");
        assert_eq!(ids.device_name("0x1022", "0x9999"), "9999");
        assert_eq!(ids.subsystem_name("0xc0a9", "0x540a", "0xc0a9", "0x5021"), "PS5021-E21 PCIe4 NVMe Controller (DRAM-less)");
        assert_eq!(ids.subsystem_name("0xc0a9", "0x540a", "0xc0a9", "0x5022"), "5022");
        assert_eq!(ids.class_name("0x010802"), "NVM Express");
        assert_eq!(ids.class_name("0x020000"), "Ethernet controller");
        assert_eq!(ids.class_name("0x060400"), "PCI bridge");
        assert_eq!(ids.class_name("0x060100"), "Bridge device");
        assert_eq!(ids.class_name("0x0c0330"), "Unknown class (0c0330)");
        assert_eq!(ids.class_name("é"), "Unknown class (é)");
    }

    #[test]
    fn pci_ids_context_and_malformed_lines() {
        // Vendors before classes, as in the real file; lines without two
        // spaces are ignored; a vendor line ends the class section.
        let text = "8086  Intel\n\t1521 noname\n\t1522  I350\n\t\tbad  x\n\t\t8086 0001  Sub\nC 0c  Serial bus controller\n\t03  USB controller\n\t\t30  XHCI\n\tbroken\nffff  Illegal\n\t0001  Dev\r\n";
        let ids = parse_pci_ids(text);
        assert_eq!(ids.device_name("0x8086", "0x1521"), "1521");
        assert_eq!(ids.device_name("0x8086", "0x1522"), "I350");
        assert_eq!(ids.subsystem_name("0x8086", "0x1522", "0x8086", "0x0001"), "Sub");
        assert_eq!(ids.class_name("0x0c0330"), "XHCI");
        assert_eq!(ids.class_name("0x0c0320"), "USB controller");
        assert_eq!(ids.device_name("0xffff", "0x0001"), "Dev");
        assert_eq!(ids.class_name("0xff0001"), "Unknown class (ff0001)");
        let empty = parse_pci_ids("");
        assert_eq!(empty.vendor_name("0x8086"), "8086");
        let garbage = parse_pci_ids("C\n\t\t\t\nC \n\t\t  x\n  \n");
        assert_eq!(garbage.vendor_name("0x0"), "0");
    }

    #[test]
    fn locations() {
        assert_eq!(parse_location("0000:45:00.0").unwrap(), Location { segment: 0, bus: 0x45, device: 0, function: 0 });
        assert_eq!(parse_location("0001:0a:1f.7").unwrap().labels(), ["0001", "0a", "1f", "7"].map(String::from));
        assert!(parse_location("0000:45:00").is_err());
        assert!(parse_location("0000:45.00.0").is_err());
        assert!(parse_location("0000:zz:00.0").is_err());
        assert!(parse_location("0000:00:00.0.1").is_err());
        assert_eq!(Location { segment: -1, bus: 0, device: 0, function: 0 }.labels()[0], "-001");
        let (l, p) = locations_of_link("../../../devices/pci0000:00/0000:00:02.1/0000:01:00.0").unwrap();
        assert_eq!((l.bus, p.map(|p| (p.bus, p.device, p.function))), (1, Some((0, 2, 1))));
        let (_, p) = locations_of_link("../../../devices/pci0000:00/0000:00:02.1").unwrap();
        assert_eq!(p, None);
        assert!(locations_of_link("0000:00:02.1").is_err());
        assert!(locations_of_link("../devices/weird/0000:00:02.1").is_err());
        assert_eq!(go_parent_base("a/b/../c"), "a");
        assert_eq!(go_base("a/b/"), "b");
    }

    #[test]
    fn link_speeds() {
        assert_eq!(parse_link_speed("8.0 GT/s PCIe"), Ok(Some(8.0)));
        assert_eq!(parse_link_speed("2.5 GT/s PCIe"), Ok(Some(2.5)));
        assert_eq!(parse_link_speed("Unknown"), Ok(None));
        assert_eq!(parse_link_speed(""), Ok(None));
        assert!(parse_link_speed("8 GT/s").is_err());
        assert!(parse_link_speed("8.0GT/s").is_err());
        assert!(parse_link_speed("x GT/s PCIe").is_err());
    }

    #[test]
    fn attributes() {
        let mut d = Device::default();
        assert_eq!(set_attr(&mut d, "class", "0x060400"), Ok(true));
        assert_eq!(d.class, 0x060400);
        assert!(set_attr(&mut d, "vendor", "0x1_0000_0000").is_err());
        assert!(set_attr(&mut d, "vendor", "").is_err());
        assert_eq!(set_attr(&mut d, "numa_node", "-1"), Ok(true));
        assert_eq!(d.numa_node, Some(-1));
        assert!(set_attr(&mut d, "sriov_numvfs", "+4").is_err());
        assert!(set_attr(&mut d, "sriov_numvfs", "-4").is_err());
        assert_eq!(set_attr(&mut d, "sriov_vf_device", "1520"), Ok(true));
        assert!(set_attr(&mut d, "sriov_vf_device", "xyz").is_err());
        assert_eq!(set_attr(&mut d, "max_link_width", "Unknown"), Ok(true));
        assert_eq!(d.max_link_width, None);
        assert!(set_attr(&mut d, "max_link_width", "x4").is_err());
        assert_eq!(set_attr(&mut d, "d3cold_allowed", "2"), Ok(true));
        assert_eq!(d.d3cold_allowed, Some(true));
        assert_eq!(set_attr(&mut d, "power_state", ""), Ok(true));
        assert_eq!(d.power_state, None);
        assert_eq!(set_attr(&mut d, "unknown_attr", "1"), Ok(false));
    }

    /// A device's directory under sys/devices, its link name and attributes.
    type FixtureDevice<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    /// The three devices of node_exporter's fixture tree, as links.
    fn fixture(root: &Path) {
        let devs: &[FixtureDevice] = &[
            (
                "pci0000:00/0000:00:02.1",
                "0000:00:02.1",
                &[
                    ("class", "0x060400"),
                    ("vendor", "0x1022"),
                    ("device", "0x1634"),
                    ("subsystem_vendor", "0x17aa"),
                    ("subsystem_device", "0x5095"),
                    ("revision", "0x00"),
                    ("current_link_speed", "8.0 GT/s PCIe"),
                    ("current_link_width", "4"),
                    ("max_link_speed", "8.0 GT/s PCIe"),
                    ("max_link_width", "8"),
                    ("numa_node", "-1"),
                    ("d3cold_allowed", "1"),
                    ("power_state", "D0"),
                    ("sriov_drivers_autoprobe", "0"),
                    ("sriov_numvfs", "0"),
                    ("sriov_totalvfs", "0"),
                    ("sriov_vf_total_msix", "0"),
                ],
            ),
            (
                "pci0000:00/0000:00:02.1/0000:01:00.0",
                "0000:01:00.0",
                &[
                    ("class", "0x010802"),
                    ("vendor", "0xc0a9"),
                    ("device", "0x540a"),
                    ("subsystem_vendor", "0xc0a9"),
                    ("subsystem_device", "0x5021"),
                    ("revision", "0x01"),
                    ("current_link_speed", "8.0 GT/s PCIe"),
                    ("current_link_width", "4"),
                    ("max_link_speed", "16.0 GT/s PCIe"),
                    ("max_link_width", "4"),
                    ("numa_node", "-1"),
                    ("d3cold_allowed", "1"),
                    ("power_state", "D0"),
                    ("sriov_drivers_autoprobe", "1"),
                    ("sriov_numvfs", "4"),
                    ("sriov_totalvfs", "8"),
                    ("sriov_vf_total_msix", "16"),
                ],
            ),
            (
                "pci0000:40/0000:40:01.3/0000:45:00.0",
                "0000:45:00.0",
                &[
                    ("class", "0x020000"),
                    ("vendor", "0x8086"),
                    ("device", "0x1521"),
                    ("subsystem_vendor", "0x8086"),
                    ("subsystem_device", "0x00a3"),
                    ("revision", "0x01"),
                    ("current_link_speed", "5.0 GT/s PCIe"),
                    ("current_link_width", "4"),
                    ("max_link_speed", "5.0 GT/s PCIe"),
                    ("max_link_width", "4"),
                    ("numa_node", "0"),
                    ("d3cold_allowed", "1"),
                    ("power_state", "D0"),
                    ("sriov_drivers_autoprobe", "1"),
                    ("sriov_numvfs", "0"),
                    ("sriov_offset", "128"),
                    ("sriov_stride", "4"),
                    ("sriov_totalvfs", "7"),
                    ("sriov_vf_device", "1520"),
                    ("sriov_vf_total_msix", "0"),
                ],
            ),
        ];
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        for (dir, name, attrs) in devs {
            for (a, v) in *attrs {
                testutil::write(root, &format!("sys/devices/{dir}/{a}"), &format!("{v}\n"));
            }
            std::os::unix::fs::symlink(format!("../../../devices/{dir}"), root.join("sys/bus/pci/devices").join(name)).unwrap();
        }
    }

    fn scrape(root: &Path, o: Options) -> Result<Vec<testutil::Row>, Error> {
        let mut c = Collector::new(o, &testutil::paths(root)).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        Ok(testutil::rows(&sink))
    }

    fn get<'a>(rows: &'a [testutil::Row], family: &str, label: (&str, &str)) -> Vec<&'a testutil::Row> {
        rows.iter().filter(|r| r.0 == family && r.1.iter().any(|(k, v)| k == label.0 && v == label.1)).collect()
    }

    #[test]
    fn collects_the_fixture() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let rows = scrape(d.path(), Options { idsfile: String::new(), names: false }).unwrap();
        // 3 info, 9 gauges × 3, 7 power states × 3, 1 NUMA node.
        assert_eq!(rows.len(), 3 + 27 + 21 + 1);
        let info = get(&rows, "node_pcidevice_info", ("bus", "01"));
        let want: Vec<(String, String)> = [
            ("bus", "01"),
            ("class_id", "0x010802"),
            ("device", "00"),
            ("device_id", "0x540a"),
            ("function", "0"),
            ("parent_bus", "00"),
            ("parent_device", "02"),
            ("parent_function", "1"),
            ("parent_segment", "0000"),
            ("revision", "0x01"),
            ("segment", "0000"),
            ("subsystem_device_id", "0x5021"),
            ("subsystem_vendor_id", "0xc0a9"),
            ("vendor_id", "0xc0a9"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(info[0].1, want);
        let root = get(&rows, "node_pcidevice_info", ("bus", "00"));
        assert!(root[0].1.contains(&("parent_bus".into(), "*".into())));
        assert_eq!(get(&rows, "node_pcidevice_max_link_transfers_per_second", ("bus", "01"))[0].2, 1.6e10);
        assert_eq!(get(&rows, "node_pcidevice_sriov_totalvfs", ("bus", "45"))[0].2, 7.0);
        let numa = get(&rows, "node_pcidevice_numa_node", ("bus", "45"));
        assert_eq!((numa.len(), numa[0].2), (1, 0.0));
        let power = get(&rows, "node_pcidevice_power_state", ("bus", "45"));
        assert_eq!(power.iter().map(|r| r.2).sum::<f64>(), 1.0);
        assert_eq!(get(&rows, "node_pcidevice_power_state", ("state", "D0")).len(), 3);
    }

    #[test]
    fn resolves_names() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        let ids = d.path().join("pci.ids");
        std::fs::write(&ids, PCI_IDS).unwrap();
        let rows = scrape(d.path(), Options { idsfile: ids.to_string_lossy().into_owned(), names: true }).unwrap();
        let names = |bus: &str| -> Vec<(String, String)> {
            get(&rows, "node_pcidevice_info", ("bus", bus))[0].1.iter().filter(|(k, _)| k.ends_with("_name")).cloned().collect()
        };
        let s = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(
            names("00"),
            s(&[
                ("class_name", "PCI bridge"),
                ("device_name", "Renoir/Cezanne PCIe GPP Bridge"),
                ("subsystem_device_name", "T540-5095 Unified Wire Ethernet Controller"),
                ("subsystem_vendor_name", "Lenovo"),
                ("vendor_name", "Advanced Micro Devices, Inc. [AMD]"),
            ])
        );
        assert_eq!(
            names("45"),
            s(&[
                ("class_name", "Ethernet controller"),
                ("device_name", "I350 Gigabit Network Connection"),
                ("subsystem_device_name", "Ethernet Network Adapter I350-T4 for OCP NIC 3.0"),
                ("subsystem_vendor_name", "Intel Corporation"),
                ("vendor_name", "Intel Corporation"),
            ])
        );
        // An unreadable ids file: the name labels carry the ids.
        let rows = scrape(d.path(), Options { idsfile: d.path().join("absent").to_string_lossy().into_owned(), names: true }).unwrap();
        let info = get(&rows, "node_pcidevice_info", ("bus", "45"));
        assert!(info[0].1.contains(&("vendor_name".into(), "8086".into())));
        assert!(info[0].1.contains(&("class_name".into(), "Unknown class (020000)".into())));
    }

    #[test]
    fn errors_and_no_data() {
        let d = tempfile::tempdir().unwrap();
        let o = || Options { idsfile: String::new(), names: false };
        assert!(scrape(d.path(), o()).unwrap_err().is_no_data());
        fixture(d.path());
        // A bad attribute fails the scrape.
        testutil::write(d.path(), "sys/devices/pci0000:00/0000:00:02.1/max_link_speed", "8 GT/s\n");
        let e = scrape(d.path(), o()).unwrap_err();
        assert!(!e.is_no_data(), "{e}");
        testutil::write(d.path(), "sys/devices/pci0000:00/0000:00:02.1/max_link_speed", "Unknown\n");
        let rows = scrape(d.path(), o()).unwrap();
        assert_eq!(get(&rows, "node_pcidevice_max_link_transfers_per_second", ("bus", "00"))[0].2, -1.0);
        // A missing identity attribute: node_exporter's error wraps ENOENT (no data).
        std::fs::remove_file(d.path().join("sys/devices/pci0000:00/0000:00:02.1/revision")).unwrap();
        assert!(scrape(d.path(), o()).unwrap_err().is_no_data());
        // An entry that is not a link is an error.
        testutil::write(d.path(), "sys/devices/pci0000:00/0000:00:02.1/revision", "0x00\n");
        testutil::write(d.path(), "sys/bus/pci/devices/0000:99:00.0", "x");
        assert!(!scrape(d.path(), o()).unwrap_err().is_no_data());
    }
}
