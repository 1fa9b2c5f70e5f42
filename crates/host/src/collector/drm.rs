//! `drm`: AMD GPU statistics from /sys/class/drm/card[0-9]/device, as
//! node_exporter's drm collector: for each card whose driver is amdgpu, an
//! info series (VRAM vendor, power performance level, unique id) and the
//! GPU busy percentage and GTT, VRAM and visible-VRAM sizes and use in
//! bytes. Other cards are skipped; no cards (or no class directory) is
//! success with no series, as in node_exporter.

use std::path::{Path, PathBuf};

use crate::io::sys_read_file;
use crate::parse::parse_go_uint;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The statistics of one amdgpu card; an attribute that can't be read is
/// 0 or empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AmdCard {
    pub name: String,
    pub gpu_busy_percent: u64,
    pub gtt_size: u64,
    pub gtt_used: u64,
    pub vis_vram_size: u64,
    pub vis_vram_used: u64,
    pub vram_size: u64,
    pub vram_used: u64,
    pub vram_vendor: String,
    pub power_performance_level: String,
    pub unique_id: String,
}

/// `card<one digit>`: the names `filepath.Glob("card[0-9]")` matches.
pub fn is_card(name: &str) -> bool {
    name.len() == 5 && name.starts_with("card") && name.as_bytes()[4].is_ascii_digit()
}

/// The card's uevent names the amdgpu driver (procfs matches the text
/// `DRIVER=amdgpu` anywhere in it).
pub fn is_amdgpu(uevent: &str) -> bool {
    uevent.contains("DRIVER=amdgpu")
}

/// A numeric attribute as procfs parses it (`strconv.ParseUint(v, 0, 64)`).
pub fn parse_value(text: &str) -> Option<u64> {
    parse_go_uint(text)
}

fn trimmed(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

/// Reads one card directory: `None` for a card whose driver is not amdgpu
/// or whose uevent has no data (ENODATA).
fn read_card(card: &Path, name: &str) -> Result<Option<AmdCard>, Error> {
    let device = card.join("device");
    let uevent_path = device.join("uevent");
    let uevent = match sys_read_file(&uevent_path) {
        Ok(b) => trimmed(&b),
        Err(e) => {
            let e = e.into_io();
            if e.raw_os_error() == Some(libc::ENODATA) {
                return Ok(None);
            }
            return Err(Error::io(&uevent_path, e));
        }
    };
    if !is_amdgpu(&uevent) {
        return Ok(None);
    }
    // procfs resolves the device link (for names it does not export here)
    // and fails the card when it can't.
    std::fs::canonicalize(&device).map_err(|e| Error::io(&device, e))?;
    let text = |attr: &str| sys_read_file(&device.join(attr)).ok().map(|b| trimmed(&b));
    let number = |attr: &str| -> Result<u64, Error> {
        match text(attr) {
            None => Ok(0),
            // node_exporter dereferences a nil value here and crashes; we
            // fail the scrape instead.
            Some(v) => parse_value(&v).ok_or_else(|| Error::parse(&device.join(attr), format!("not a number: {v:?}"))),
        }
    };
    Ok(Some(AmdCard {
        name: name.to_string(),
        gpu_busy_percent: number("gpu_busy_percent")?,
        gtt_size: number("mem_info_gtt_total")?,
        gtt_used: number("mem_info_gtt_used")?,
        vis_vram_size: number("mem_info_vis_vram_total")?,
        vis_vram_used: number("mem_info_vis_vram_used")?,
        vram_size: number("mem_info_vram_total")?,
        vram_used: number("mem_info_vram_used")?,
        vram_vendor: text("mem_info_vram_vendor").unwrap_or_default(),
        power_performance_level: text("power_dpm_force_performance_level").unwrap_or_default(),
        unique_id: text("unique_id").unwrap_or_default(),
    }))
}

/// The amdgpu cards under `class` (/sys/class/drm), in name order. As Go's
/// `filepath.Glob`, a directory that can't be listed has no cards.
pub fn read_cards(class: &Path) -> Result<Vec<AmdCard>, Error> {
    let mut names: Vec<String> = match std::fs::read_dir(class) {
        Ok(rd) => rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).filter(|n| is_card(n)).collect(),
        Err(_) => Vec::new(),
    };
    names.sort_unstable();
    let mut cards = Vec::new();
    for n in names {
        if let Some(c) = read_card(&class.join(&n), &n)? {
            cards.push(c);
        }
    }
    Ok(cards)
}

/// A per-card gauge family: name, help, value.
type Gauge = (&'static str, &'static str, fn(&AmdCard) -> u64);

/// Writes the families of `cards`.
pub fn write(sink: &mut Sink, cards: &[AmdCard]) {
    if cards.is_empty() {
        return;
    }
    let mut info = sink.family("node_drm_card_info", "Card information", Kind::Gauge);
    for c in cards {
        info.sample(
            &[
                ("card", &c.name),
                ("memory_vendor", &c.vram_vendor),
                ("power_performance_level", &c.power_performance_level),
                ("unique_id", &c.unique_id),
                ("vendor", "amd"),
            ],
            1.0,
        );
    }
    let gauges: [Gauge; 7] = [
        ("node_drm_gpu_busy_percent", "How busy the GPU is as a percentage.", |c| c.gpu_busy_percent),
        ("node_drm_memory_gtt_size_bytes", "The size of the graphics translation table (GTT) block in bytes.", |c| c.gtt_size),
        ("node_drm_memory_gtt_used_bytes", "The used amount of the graphics translation table (GTT) block in bytes.", |c| c.gtt_used),
        ("node_drm_memory_vram_size_bytes", "The size of VRAM in bytes.", |c| c.vram_size),
        ("node_drm_memory_vram_used_bytes", "The used amount of VRAM in bytes.", |c| c.vram_used),
        ("node_drm_memory_vis_vram_size_bytes", "The size of visible VRAM in bytes.", |c| c.vis_vram_size),
        ("node_drm_memory_vis_vram_used_bytes", "The used amount of visible VRAM in bytes.", |c| c.vis_vram_used),
    ];
    for (name, help, value) in gauges {
        let mut f = sink.family(name, help, Kind::Gauge);
        for c in cards {
            f.sample(&[("card", &c.name)], value(c) as f64);
        }
    }
}

pub struct Collector {
    class: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { class: p.sys("class/drm") }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let cards = read_cards(&self.class)?;
        write(sink, &cards);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, rows, write as put};
    use crate::Collector as _;

    /// procfs's testdata sys/class/drm: card0 an amdgpu, card1 an i915
    /// with connectors.
    fn procfs_fixture(root: &Path) {
        let d = "sys/class/drm/card0/device";
        put(
            root,
            &format!("{d}/uevent"),
            "DRIVER=amdgpu\nPCI_CLASS=30000\nPCI_ID=1002:687F\nPCI_SUBSYS_ID=1043:04C4\nPCI_SLOT_NAME=0000:09:00.0\nMODALIAS=pci:v00001002d0000687Fsv00001043sd000004C4bc03sc00i00\n",
        );
        for (attr, v) in [
            ("gpu_busy_percent", "4"),
            ("mem_info_gtt_total", "8573157376"),
            ("mem_info_gtt_used", "144560128"),
            ("mem_info_vis_vram_total", "8573157376"),
            ("mem_info_vis_vram_used", "1490378752"),
            ("mem_info_vram_total", "8573157376"),
            ("mem_info_vram_used", "1490378752"),
            ("mem_info_vram_vendor", "samsung"),
            ("power_dpm_force_performance_level", "manual"),
            ("unique_id", "0123456789abcdef"),
            ("power_state", "D0"),
        ] {
            put(root, &format!("{d}/{attr}"), &format!("{v}\n"));
        }
        put(root, "sys/class/drm/card1/card1-DP-1/status", "disconnected\n");
        put(
            root,
            "sys/class/drm/card1/device/uevent",
            "DRIVER=i915\nPCI_CLASS=30000\nPCI_ID=8086:5917\nPCI_SUBSYS_ID=17AA:2258\nPCI_SLOT_NAME=0000:00:02.0\nMODALIAS=pci:v00008086d00005917sv000017AAsd00002258bc03sc00i00\n",
        );
        put(root, "sys/class/drm/card1/device/enable", "1\n");
    }

    fn scrape(root: &Path) -> Result<Sink, Error> {
        let mut c = super::Collector::new(&paths(root));
        let mut sink = Sink::new();
        c.update(&mut sink).map(|()| sink)
    }

    #[test]
    fn reads_procfs_fixture_cards() {
        // procfs's TestClassDRMCardAMDGPUStats.
        let dir = tempfile::tempdir().unwrap();
        procfs_fixture(dir.path());
        let cards = read_cards(&dir.path().join("sys/class/drm")).unwrap();
        assert_eq!(
            cards,
            vec![AmdCard {
                name: "card0".into(),
                gpu_busy_percent: 4,
                gtt_size: 8573157376,
                gtt_used: 144560128,
                vis_vram_size: 8573157376,
                vis_vram_used: 1490378752,
                vram_size: 8573157376,
                vram_used: 1490378752,
                vram_vendor: "samsung".into(),
                power_performance_level: "manual".into(),
                unique_id: "0123456789abcdef".into(),
            }]
        );
    }

    #[test]
    fn exports_node_exporters_series() {
        let dir = tempfile::tempdir().unwrap();
        procfs_fixture(dir.path());
        let sink = scrape(dir.path()).unwrap();
        let card = || vec![("card".to_string(), "card0".to_string())];
        let info = vec![
            ("card".to_string(), "card0".to_string()),
            ("memory_vendor".to_string(), "samsung".to_string()),
            ("power_performance_level".to_string(), "manual".to_string()),
            ("unique_id".to_string(), "0123456789abcdef".to_string()),
            ("vendor".to_string(), "amd".to_string()),
        ];
        let mut got = rows(&sink);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let want = vec![
            ("node_drm_card_info".to_string(), info, 1.0),
            ("node_drm_gpu_busy_percent".to_string(), card(), 4.0),
            ("node_drm_memory_gtt_size_bytes".to_string(), card(), 8573157376.0),
            ("node_drm_memory_gtt_used_bytes".to_string(), card(), 144560128.0),
            ("node_drm_memory_vis_vram_size_bytes".to_string(), card(), 8573157376.0),
            ("node_drm_memory_vis_vram_used_bytes".to_string(), card(), 1490378752.0),
            ("node_drm_memory_vram_size_bytes".to_string(), card(), 8573157376.0),
            ("node_drm_memory_vram_used_bytes".to_string(), card(), 1490378752.0),
        ];
        assert_eq!(got, want);
        assert!(sink.families().iter().all(|f| f.kind() == Kind::Gauge));
    }

    #[test]
    fn card_names_and_driver_match() {
        assert!(is_card("card0") && is_card("card9"));
        assert!(!is_card("card10") && !is_card("card0-DP-1") && !is_card("card") && !is_card("renderD128"));
        assert!(is_amdgpu("DRIVER=amdgpu\nPCI_CLASS=30000") && is_amdgpu("X=1\nDRIVER=amdgpu"));
        assert!(!is_amdgpu("DRIVER=i915") && !is_amdgpu(""));
        assert_eq!(parse_value("42"), Some(42));
        assert_eq!(parse_value("0x10"), Some(16), "base 0, as procfs");
        assert_eq!(parse_value("-1"), None);
        assert_eq!(parse_value(""), None);
    }

    #[test]
    fn no_cards_is_success_with_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap().families().is_empty(), "Glob of a missing directory: no cards, no error");
        put(dir.path(), "sys/class/drm/card1/device/uevent", "DRIVER=i915\n");
        put(dir.path(), "sys/class/drm/renderD128/device/uevent", "DRIVER=amdgpu\n");
        assert!(scrape(dir.path()).unwrap().families().is_empty());
    }

    #[test]
    fn missing_attributes_are_zero_and_bad_ones_errors() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "sys/class/drm/card2/device/uevent", "DRIVER=amdgpu\n");
        let cards = read_cards(&dir.path().join("sys/class/drm")).unwrap();
        assert_eq!(cards, vec![AmdCard { name: "card2".into(), ..Default::default() }]);
        put(dir.path(), "sys/class/drm/card2/device/gpu_busy_percent", "busy\n");
        assert!(matches!(scrape(dir.path()), Err(Error::Parse { .. })));
    }

    #[test]
    fn a_card_without_uevent_fails_the_collector() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/class/drm/card0/device")).unwrap();
        assert!(matches!(scrape(dir.path()), Err(Error::Io { .. })), "procfs returns the open error");
    }
}
