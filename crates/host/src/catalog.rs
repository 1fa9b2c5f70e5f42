//! Every flag node_exporter 1.12.1 accepts on Linux, as data: name, kind,
//! default, help, whether it is hidden, the collector it belongs to, and
//! for `--collector.<name>` its default state. Extracted from node_exporter
//! v1.12.1 (Apache-2.0; `collector/*.go`, `node_exporter.go`), exporter-toolkit
//! v0.17.1 (`web/kingpinflag`), prometheus/common v0.70.1 (`promslog/flag`)
//! and kingpin v2.4.0's built-ins.
//!
//! node-agent declares a collector's flags in the collector's own module;
//! this table is the reference they are tested against, and it declares the
//! flags of node_exporter collectors node-agent does not have, so that a
//! node_exporter command line is accepted whole.

/// How a flag takes its value (kingpin's `Bool()`, `String()`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// `--name` / `--no-name`.
    Bool,
    String,
    /// Repeatable; the values in command-line order.
    Strings,
    Int,
    Duration,
}

/// One node_exporter flag.
#[derive(Clone, Copy, Debug)]
pub struct FlagSpec {
    pub name: &'static str,
    pub kind: FlagKind,
    /// As node_exporter prints it ("" when none; "true"/"false" for bools).
    pub default: &'static str,
    pub help: &'static str,
    pub hidden: bool,
    /// The collector it belongs to.
    pub collector: Option<&'static str>,
    /// `--collector.<name>` itself.
    pub enables: bool,
}

/// A deprecated flag node_exporter still accepts, the flag it stands for,
/// the warning logged when it is used, and the error when both are given.
#[derive(Clone, Copy, Debug)]
pub struct Deprecated {
    pub alias: &'static str,
    pub replaced_by: &'static str,
    pub warning: &'static str,
    pub conflict: &'static str,
}

pub const FLAGS: &[FlagSpec] = &[
    FlagSpec { name: "collector.arp", kind: FlagKind::Bool, default: "true", help: "Enable the arp collector (default: enabled).", hidden: false, collector: Some("arp"), enables: true },
    FlagSpec { name: "collector.arp.device-exclude", kind: FlagKind::String, default: "", help: "Regexp of arp devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("arp"), enables: false },
    FlagSpec { name: "collector.arp.device-include", kind: FlagKind::String, default: "", help: "Regexp of arp devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("arp"), enables: false },
    FlagSpec { name: "collector.arp.netlink", kind: FlagKind::Bool, default: "true", help: "Use netlink to gather stats instead of /proc/net/arp.", hidden: false, collector: Some("arp"), enables: false },
    FlagSpec { name: "collector.bcache", kind: FlagKind::Bool, default: "true", help: "Enable the bcache collector (default: enabled).", hidden: false, collector: Some("bcache"), enables: true },
    FlagSpec { name: "collector.bcache.priorityStats", kind: FlagKind::Bool, default: "false", help: "Expose expensive priority stats.", hidden: false, collector: Some("bcache"), enables: false },
    FlagSpec { name: "collector.bcachefs", kind: FlagKind::Bool, default: "true", help: "Enable the bcachefs collector (default: enabled).", hidden: false, collector: Some("bcachefs"), enables: true },
    FlagSpec { name: "collector.bonding", kind: FlagKind::Bool, default: "true", help: "Enable the bonding collector (default: enabled).", hidden: false, collector: Some("bonding"), enables: true },
    FlagSpec { name: "collector.btrfs", kind: FlagKind::Bool, default: "true", help: "Enable the btrfs collector (default: enabled).", hidden: false, collector: Some("btrfs"), enables: true },
    FlagSpec { name: "collector.buddyinfo", kind: FlagKind::Bool, default: "false", help: "Enable the buddyinfo collector (default: disabled).", hidden: false, collector: Some("buddyinfo"), enables: true },
    FlagSpec { name: "collector.cgroups", kind: FlagKind::Bool, default: "false", help: "Enable the cgroups collector (default: disabled).", hidden: false, collector: Some("cgroups"), enables: true },
    FlagSpec { name: "collector.conntrack", kind: FlagKind::Bool, default: "true", help: "Enable the conntrack collector (default: enabled).", hidden: false, collector: Some("conntrack"), enables: true },
    FlagSpec { name: "collector.cpu", kind: FlagKind::Bool, default: "true", help: "Enable the cpu collector (default: enabled).", hidden: false, collector: Some("cpu"), enables: true },
    FlagSpec { name: "collector.cpu.guest", kind: FlagKind::Bool, default: "true", help: "Enables metric node_cpu_guest_seconds_total", hidden: false, collector: Some("cpu"), enables: false },
    FlagSpec { name: "collector.cpu.info", kind: FlagKind::Bool, default: "false", help: "Enables metric cpu_info", hidden: false, collector: Some("cpu"), enables: false },
    FlagSpec { name: "collector.cpu.info.bugs-include", kind: FlagKind::String, default: "", help: "Filter the `bugs` field in cpuInfo with a value that must be a regular expression", hidden: false, collector: Some("cpu"), enables: false },
    FlagSpec { name: "collector.cpu.info.flags-include", kind: FlagKind::String, default: "", help: "Filter the `flags` field in cpuInfo with a value that must be a regular expression", hidden: false, collector: Some("cpu"), enables: false },
    FlagSpec { name: "collector.cpu_vulnerabilities", kind: FlagKind::Bool, default: "false", help: "Enable the cpu_vulnerabilities collector (default: disabled).", hidden: false, collector: Some("cpu_vulnerabilities"), enables: true },
    FlagSpec { name: "collector.cpufreq", kind: FlagKind::Bool, default: "true", help: "Enable the cpufreq collector (default: enabled).", hidden: false, collector: Some("cpufreq"), enables: true },
    FlagSpec { name: "collector.disable-defaults", kind: FlagKind::Bool, default: "false", help: "Set all collectors to disabled by default.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "collector.diskstats", kind: FlagKind::Bool, default: "true", help: "Enable the diskstats collector (default: enabled).", hidden: false, collector: Some("diskstats"), enables: true },
    FlagSpec { name: "collector.diskstats.device-exclude", kind: FlagKind::String, default: "^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\\d+n\\d+p)\\d+$", help: "Regexp of diskstats devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("diskstats"), enables: false },
    FlagSpec { name: "collector.diskstats.device-include", kind: FlagKind::String, default: "", help: "Regexp of diskstats devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("diskstats"), enables: false },
    FlagSpec { name: "collector.diskstats.ignored-devices", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.diskstats.device-exclude", hidden: true, collector: Some("diskstats"), enables: false },
    FlagSpec { name: "collector.dmi", kind: FlagKind::Bool, default: "true", help: "Enable the dmi collector (default: enabled).", hidden: false, collector: Some("dmi"), enables: true },
    FlagSpec { name: "collector.dmmultipath", kind: FlagKind::Bool, default: "true", help: "Enable the dmmultipath collector (default: enabled).", hidden: false, collector: Some("dmmultipath"), enables: true },
    FlagSpec { name: "collector.drbd", kind: FlagKind::Bool, default: "false", help: "Enable the drbd collector (default: disabled).", hidden: false, collector: Some("drbd"), enables: true },
    FlagSpec { name: "collector.drm", kind: FlagKind::Bool, default: "false", help: "Enable the drm collector (default: disabled).", hidden: false, collector: Some("drm"), enables: true },
    FlagSpec { name: "collector.edac", kind: FlagKind::Bool, default: "true", help: "Enable the edac collector (default: enabled).", hidden: false, collector: Some("edac"), enables: true },
    FlagSpec { name: "collector.entropy", kind: FlagKind::Bool, default: "true", help: "Enable the entropy collector (default: enabled).", hidden: false, collector: Some("entropy"), enables: true },
    FlagSpec { name: "collector.ethtool", kind: FlagKind::Bool, default: "false", help: "Enable the ethtool collector (default: disabled).", hidden: false, collector: Some("ethtool"), enables: true },
    FlagSpec { name: "collector.ethtool.device-exclude", kind: FlagKind::String, default: "", help: "Regexp of ethtool devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("ethtool"), enables: false },
    FlagSpec { name: "collector.ethtool.device-include", kind: FlagKind::String, default: "", help: "Regexp of ethtool devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("ethtool"), enables: false },
    FlagSpec { name: "collector.ethtool.metrics-include", kind: FlagKind::String, default: ".*", help: "Regexp of ethtool stats to include.", hidden: false, collector: Some("ethtool"), enables: false },
    FlagSpec { name: "collector.fibrechannel", kind: FlagKind::Bool, default: "true", help: "Enable the fibrechannel collector (default: enabled).", hidden: false, collector: Some("fibrechannel"), enables: true },
    FlagSpec { name: "collector.filefd", kind: FlagKind::Bool, default: "true", help: "Enable the filefd collector (default: enabled).", hidden: false, collector: Some("filefd"), enables: true },
    FlagSpec { name: "collector.filesystem", kind: FlagKind::Bool, default: "true", help: "Enable the filesystem collector (default: enabled).", hidden: false, collector: Some("filesystem"), enables: true },
    FlagSpec { name: "collector.filesystem.fs-types-exclude", kind: FlagKind::String, default: "^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|erofs|sysfs|tracefs)$", help: "Regexp of filesystem types to exclude for filesystem collector. (mutually exclusive to fs-types-include)", hidden: false, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.fs-types-include", kind: FlagKind::String, default: "", help: "Regexp of filesystem types to include for filesystem collector. (mutually exclusive to fs-types-exclude)", hidden: false, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.ignored-fs-types", kind: FlagKind::String, default: "", help: "Regexp of filesystem types to ignore for filesystem collector.", hidden: true, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.ignored-mount-points", kind: FlagKind::String, default: "", help: "Regexp of mount points to ignore for filesystem collector.", hidden: true, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.mount-points-exclude", kind: FlagKind::String, default: "^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)", help: "Regexp of mount points to exclude for filesystem collector. (mutually exclusive to mount-points-include)", hidden: false, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.mount-points-include", kind: FlagKind::String, default: "", help: "Regexp of mount points to include for filesystem collector. (mutually exclusive to mount-points-exclude)", hidden: false, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.mount-timeout", kind: FlagKind::Duration, default: "5s", help: "how long to wait for a mount to respond before marking it as stale", hidden: true, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.filesystem.stat-workers", kind: FlagKind::Int, default: "4", help: "how many stat calls to process simultaneously", hidden: true, collector: Some("filesystem"), enables: false },
    FlagSpec { name: "collector.hwmon", kind: FlagKind::Bool, default: "true", help: "Enable the hwmon collector (default: enabled).", hidden: false, collector: Some("hwmon"), enables: true },
    FlagSpec { name: "collector.hwmon.chip-exclude", kind: FlagKind::String, default: "", help: "Regexp of hwmon chip to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("hwmon"), enables: false },
    FlagSpec { name: "collector.hwmon.chip-include", kind: FlagKind::String, default: "", help: "Regexp of hwmon chip to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("hwmon"), enables: false },
    FlagSpec { name: "collector.hwmon.sensor-exclude", kind: FlagKind::String, default: "", help: "Regexp of hwmon sensor to exclude (mutually exclusive to sensor-include).", hidden: false, collector: Some("hwmon"), enables: false },
    FlagSpec { name: "collector.hwmon.sensor-include", kind: FlagKind::String, default: "", help: "Regexp of hwmon sensor to include (mutually exclusive to sensor-exclude).", hidden: false, collector: Some("hwmon"), enables: false },
    FlagSpec { name: "collector.infiniband", kind: FlagKind::Bool, default: "true", help: "Enable the infiniband collector (default: enabled).", hidden: false, collector: Some("infiniband"), enables: true },
    FlagSpec { name: "collector.infiniband.device-exclude", kind: FlagKind::String, default: "", help: "Regexp of infiniband devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("infiniband"), enables: false },
    FlagSpec { name: "collector.infiniband.device-include", kind: FlagKind::String, default: "", help: "Regexp of infiniband devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("infiniband"), enables: false },
    FlagSpec { name: "collector.interrupts", kind: FlagKind::Bool, default: "false", help: "Enable the interrupts collector (default: disabled).", hidden: false, collector: Some("interrupts"), enables: true },
    FlagSpec { name: "collector.interrupts.include-zeros", kind: FlagKind::Bool, default: "true", help: "Include interrupts that have a zero value", hidden: false, collector: Some("interrupts"), enables: false },
    FlagSpec { name: "collector.interrupts.name-exclude", kind: FlagKind::String, default: "", help: "Regexp of interrupts name to exclude (mutually exclusive to --collector.interrupts.name-include).", hidden: false, collector: Some("interrupts"), enables: false },
    FlagSpec { name: "collector.interrupts.name-include", kind: FlagKind::String, default: "", help: "Regexp of interrupts name to include (mutually exclusive to --collector.interrupts.name-exclude).", hidden: false, collector: Some("interrupts"), enables: false },
    FlagSpec { name: "collector.ipvs", kind: FlagKind::Bool, default: "true", help: "Enable the ipvs collector (default: enabled).", hidden: false, collector: Some("ipvs"), enables: true },
    FlagSpec { name: "collector.ipvs.backend-labels", kind: FlagKind::String, default: "local_address,local_port,remote_address,remote_port,proto,local_mark", help: "Comma separated list for IPVS backend stats labels.", hidden: false, collector: Some("ipvs"), enables: false },
    FlagSpec { name: "collector.kernel_hung", kind: FlagKind::Bool, default: "true", help: "Enable the kernel_hung collector (default: enabled).", hidden: false, collector: Some("kernel_hung"), enables: true },
    FlagSpec { name: "collector.ksmd", kind: FlagKind::Bool, default: "false", help: "Enable the ksmd collector (default: disabled).", hidden: false, collector: Some("ksmd"), enables: true },
    FlagSpec { name: "collector.lnstat", kind: FlagKind::Bool, default: "false", help: "Enable the lnstat collector (default: disabled).", hidden: false, collector: Some("lnstat"), enables: true },
    FlagSpec { name: "collector.loadavg", kind: FlagKind::Bool, default: "true", help: "Enable the loadavg collector (default: enabled).", hidden: false, collector: Some("loadavg"), enables: true },
    FlagSpec { name: "collector.logind", kind: FlagKind::Bool, default: "false", help: "Enable the logind collector (default: disabled).", hidden: false, collector: Some("logind"), enables: true },
    FlagSpec { name: "collector.mdadm", kind: FlagKind::Bool, default: "true", help: "Enable the mdadm collector (default: enabled).", hidden: false, collector: Some("mdadm"), enables: true },
    FlagSpec { name: "collector.meminfo", kind: FlagKind::Bool, default: "true", help: "Enable the meminfo collector (default: enabled).", hidden: false, collector: Some("meminfo"), enables: true },
    FlagSpec { name: "collector.meminfo_numa", kind: FlagKind::Bool, default: "false", help: "Enable the meminfo_numa collector (default: disabled).", hidden: false, collector: Some("meminfo_numa"), enables: true },
    FlagSpec { name: "collector.mountstats", kind: FlagKind::Bool, default: "false", help: "Enable the mountstats collector (default: disabled).", hidden: false, collector: Some("mountstats"), enables: true },
    FlagSpec { name: "collector.netclass", kind: FlagKind::Bool, default: "true", help: "Enable the netclass collector (default: enabled).", hidden: false, collector: Some("netclass"), enables: true },
    FlagSpec { name: "collector.netclass.ignore-invalid-speed", kind: FlagKind::Bool, default: "false", help: "Ignore devices where the speed is invalid. This will be the default behavior in 2.x.", hidden: false, collector: Some("netclass"), enables: false },
    FlagSpec { name: "collector.netclass.ignored-devices", kind: FlagKind::String, default: "^$", help: "Regexp of net devices to ignore for netclass collector.", hidden: false, collector: Some("netclass"), enables: false },
    FlagSpec { name: "collector.netclass.netlink", kind: FlagKind::Bool, default: "false", help: "Use netlink to gather stats instead of /proc/net/dev.", hidden: false, collector: Some("netclass"), enables: false },
    FlagSpec { name: "collector.netclass_rtnl.with-stats", kind: FlagKind::Bool, default: "false", help: "Expose the statistics for each network device, replacing netdev collector.", hidden: false, collector: Some("netclass"), enables: false },
    FlagSpec { name: "collector.netdev", kind: FlagKind::Bool, default: "true", help: "Enable the netdev collector (default: enabled).", hidden: false, collector: Some("netdev"), enables: true },
    FlagSpec { name: "collector.netdev.address-info", kind: FlagKind::Bool, default: "false", help: "Collect address-info for every device", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.device-blacklist", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.netdev.device-exclude", hidden: true, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.device-exclude", kind: FlagKind::String, default: "", help: "Regexp of net devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.device-include", kind: FlagKind::String, default: "", help: "Regexp of net devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.device-whitelist", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.netdev.device-include", hidden: true, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.enable-detailed-metrics", kind: FlagKind::Bool, default: "false", help: "Use (incompatible) metric names that provide more detailed stats on Linux", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.label-ifalias", kind: FlagKind::Bool, default: "false", help: "Add ifAlias label", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netdev.netlink", kind: FlagKind::Bool, default: "true", help: "Use netlink to gather stats instead of /proc/net/dev.", hidden: false, collector: Some("netdev"), enables: false },
    FlagSpec { name: "collector.netstat", kind: FlagKind::Bool, default: "true", help: "Enable the netstat collector (default: enabled).", hidden: false, collector: Some("netstat"), enables: true },
    FlagSpec { name: "collector.netstat.fields", kind: FlagKind::String, default: "^(.*_(InErrors|InErrs)|Ip_Forwarding|Ip(6|Ext)_(InOctets|OutOctets)|Icmp6?_(InMsgs|OutMsgs)|TcpExt_(Listen.*|Syncookies.*|TCPSynRetrans|TCPTimeouts|TCPOFOQueue|TCPRcvQDrop)|Tcp_(ActiveOpens|InSegs|OutSegs|OutRsts|PassiveOpens|RetransSegs|CurrEstab)|Udp6?_(InDatagrams|OutDatagrams|NoPorts|RcvbufErrors|SndbufErrors))$", help: "Regexp of fields to return for netstat collector.", hidden: false, collector: Some("netstat"), enables: false },
    FlagSpec { name: "collector.network_route", kind: FlagKind::Bool, default: "false", help: "Enable the network_route collector (default: disabled).", hidden: false, collector: Some("network_route"), enables: true },
    FlagSpec { name: "collector.nfs", kind: FlagKind::Bool, default: "true", help: "Enable the nfs collector (default: enabled).", hidden: false, collector: Some("nfs"), enables: true },
    FlagSpec { name: "collector.nfsd", kind: FlagKind::Bool, default: "true", help: "Enable the nfsd collector (default: enabled).", hidden: false, collector: Some("nfsd"), enables: true },
    FlagSpec { name: "collector.ntp", kind: FlagKind::Bool, default: "false", help: "Enable the ntp collector (default: disabled).", hidden: false, collector: Some("ntp"), enables: true },
    FlagSpec { name: "collector.ntp.ip-ttl", kind: FlagKind::Int, default: "1", help: "IP TTL to use while sending NTP query", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.local-offset-tolerance", kind: FlagKind::Duration, default: "1ms", help: "Offset between local clock and local ntpd time to tolerate", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.max-distance", kind: FlagKind::Duration, default: "3.46608s", help: "Max accumulated distance to the root", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.protocol-version", kind: FlagKind::Int, default: "4", help: "NTP protocol version", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.server", kind: FlagKind::String, default: "127.0.0.1", help: "NTP server to use for ntp collector", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.server-is-local", kind: FlagKind::Bool, default: "false", help: "Certify that collector.ntp.server address is not a public ntp server", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.ntp.server-port", kind: FlagKind::Int, default: "123", help: "UDP port number to connect to on NTP server", hidden: false, collector: Some("ntp"), enables: false },
    FlagSpec { name: "collector.nvme", kind: FlagKind::Bool, default: "true", help: "Enable the nvme collector (default: enabled).", hidden: false, collector: Some("nvme"), enables: true },
    FlagSpec { name: "collector.nvmesubsystem", kind: FlagKind::Bool, default: "false", help: "Enable the nvmesubsystem collector (default: disabled).", hidden: false, collector: Some("nvmesubsystem"), enables: true },
    FlagSpec { name: "collector.os", kind: FlagKind::Bool, default: "true", help: "Enable the os collector (default: enabled).", hidden: false, collector: Some("os"), enables: true },
    FlagSpec { name: "collector.pcidevice", kind: FlagKind::Bool, default: "false", help: "Enable the pcidevice collector (default: disabled).", hidden: false, collector: Some("pcidevice"), enables: true },
    FlagSpec { name: "collector.pcidevice.idsfile", kind: FlagKind::String, default: "", help: "Path to pci.ids file to use for PCI device identification.", hidden: false, collector: Some("pcidevice"), enables: false },
    FlagSpec { name: "collector.pcidevice.names", kind: FlagKind::Bool, default: "false", help: "Enable PCI device name resolution (requires pci.ids file).", hidden: false, collector: Some("pcidevice"), enables: false },
    FlagSpec { name: "collector.perf", kind: FlagKind::Bool, default: "false", help: "Enable the perf collector (default: disabled).", hidden: false, collector: Some("perf"), enables: true },
    FlagSpec { name: "collector.perf.cache-profilers", kind: FlagKind::Strings, default: "", help: "perf cache profilers that should be collected", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.cpus", kind: FlagKind::String, default: "", help: "List of CPUs from which perf metrics should be collected", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.disable-cache-profilers", kind: FlagKind::Bool, default: "false", help: "disable perf cache profilers", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.disable-hardware-profilers", kind: FlagKind::Bool, default: "false", help: "disable perf hardware profilers", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.disable-software-profilers", kind: FlagKind::Bool, default: "false", help: "disable perf software profilers", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.hardware-profilers", kind: FlagKind::Strings, default: "", help: "perf hardware profilers that should be collected", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.software-profilers", kind: FlagKind::Strings, default: "", help: "perf software profilers that should be collected", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.perf.tracepoint", kind: FlagKind::Strings, default: "", help: "perf tracepoint that should be collected", hidden: false, collector: Some("perf"), enables: false },
    FlagSpec { name: "collector.powersupply.ignored-supplies", kind: FlagKind::String, default: "^$", help: "Regexp of power supplies to ignore for powersupplyclass collector.", hidden: false, collector: Some("powersupplyclass"), enables: false },
    FlagSpec { name: "collector.powersupplyclass", kind: FlagKind::Bool, default: "true", help: "Enable the powersupplyclass collector (default: enabled).", hidden: false, collector: Some("powersupplyclass"), enables: true },
    FlagSpec { name: "collector.pressure", kind: FlagKind::Bool, default: "true", help: "Enable the pressure collector (default: enabled).", hidden: false, collector: Some("pressure"), enables: true },
    FlagSpec { name: "collector.processes", kind: FlagKind::Bool, default: "false", help: "Enable the processes collector (default: disabled).", hidden: false, collector: Some("processes"), enables: true },
    FlagSpec { name: "collector.qdisc", kind: FlagKind::Bool, default: "false", help: "Enable the qdisc collector (default: disabled).", hidden: false, collector: Some("qdisc"), enables: true },
    FlagSpec { name: "collector.qdisc.device-exclude", kind: FlagKind::String, default: "", help: "Regexp of qdisc devices to exclude (mutually exclusive to device-include).", hidden: false, collector: Some("qdisc"), enables: false },
    FlagSpec { name: "collector.qdisc.device-include", kind: FlagKind::String, default: "", help: "Regexp of qdisc devices to include (mutually exclusive to device-exclude).", hidden: false, collector: Some("qdisc"), enables: false },
    FlagSpec { name: "collector.qdisc.fixtures", kind: FlagKind::String, default: "", help: "test fixtures to use for qdisc collector end-to-end testing", hidden: false, collector: Some("qdisc"), enables: false },
    FlagSpec { name: "collector.qdisk.device-exclude", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.qdisc.device-exclude", hidden: true, collector: Some("qdisc"), enables: false },
    FlagSpec { name: "collector.qdisk.device-include", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.qdisc.device-include", hidden: true, collector: Some("qdisc"), enables: false },
    FlagSpec { name: "collector.rapl", kind: FlagKind::Bool, default: "true", help: "Enable the rapl collector (default: enabled).", hidden: false, collector: Some("rapl"), enables: true },
    FlagSpec { name: "collector.rapl.enable-zone-label", kind: FlagKind::Bool, default: "false", help: "Enables service unit metric unit_start_time_seconds", hidden: false, collector: Some("rapl"), enables: false },
    FlagSpec { name: "collector.runit", kind: FlagKind::Bool, default: "false", help: "Enable the runit collector (default: disabled).", hidden: false, collector: Some("runit"), enables: true },
    FlagSpec { name: "collector.runit.servicedir", kind: FlagKind::String, default: "/etc/service", help: "Path to runit service directory.", hidden: false, collector: Some("runit"), enables: false },
    FlagSpec { name: "collector.schedstat", kind: FlagKind::Bool, default: "true", help: "Enable the schedstat collector (default: enabled).", hidden: false, collector: Some("schedstat"), enables: true },
    FlagSpec { name: "collector.selinux", kind: FlagKind::Bool, default: "true", help: "Enable the selinux collector (default: enabled).", hidden: false, collector: Some("selinux"), enables: true },
    FlagSpec { name: "collector.slabinfo", kind: FlagKind::Bool, default: "false", help: "Enable the slabinfo collector (default: disabled).", hidden: false, collector: Some("slabinfo"), enables: true },
    FlagSpec { name: "collector.slabinfo.slabs-exclude", kind: FlagKind::String, default: "", help: "Regexp of slabs to exclude in slabinfo collector.", hidden: false, collector: Some("slabinfo"), enables: false },
    FlagSpec { name: "collector.slabinfo.slabs-include", kind: FlagKind::String, default: ".*", help: "Regexp of slabs to include in slabinfo collector.", hidden: false, collector: Some("slabinfo"), enables: false },
    FlagSpec { name: "collector.sockstat", kind: FlagKind::Bool, default: "true", help: "Enable the sockstat collector (default: enabled).", hidden: false, collector: Some("sockstat"), enables: true },
    FlagSpec { name: "collector.softirqs", kind: FlagKind::Bool, default: "false", help: "Enable the softirqs collector (default: disabled).", hidden: false, collector: Some("softirqs"), enables: true },
    FlagSpec { name: "collector.softnet", kind: FlagKind::Bool, default: "true", help: "Enable the softnet collector (default: enabled).", hidden: false, collector: Some("softnet"), enables: true },
    FlagSpec { name: "collector.stat", kind: FlagKind::Bool, default: "true", help: "Enable the stat collector (default: enabled).", hidden: false, collector: Some("stat"), enables: true },
    FlagSpec { name: "collector.stat.softirq", kind: FlagKind::Bool, default: "false", help: "Export softirq calls per vector", hidden: false, collector: Some("stat"), enables: false },
    FlagSpec { name: "collector.supervisord", kind: FlagKind::Bool, default: "false", help: "Enable the supervisord collector (default: disabled).", hidden: false, collector: Some("supervisord"), enables: true },
    FlagSpec { name: "collector.supervisord.url", kind: FlagKind::String, default: "http://localhost:9001/RPC2", help: "XML RPC endpoint.", hidden: false, collector: Some("supervisord"), enables: false },
    FlagSpec { name: "collector.swap", kind: FlagKind::Bool, default: "false", help: "Enable the swap collector (default: disabled).", hidden: false, collector: Some("swap"), enables: true },
    FlagSpec { name: "collector.sysctl", kind: FlagKind::Bool, default: "false", help: "Enable the sysctl collector (default: disabled).", hidden: false, collector: Some("sysctl"), enables: true },
    FlagSpec { name: "collector.sysctl.include", kind: FlagKind::Strings, default: "", help: "Select sysctl metrics to include", hidden: false, collector: Some("sysctl"), enables: false },
    FlagSpec { name: "collector.sysctl.include-info", kind: FlagKind::Strings, default: "", help: "Select sysctl metrics to include as info metrics", hidden: false, collector: Some("sysctl"), enables: false },
    FlagSpec { name: "collector.systemd", kind: FlagKind::Bool, default: "false", help: "Enable the systemd collector (default: disabled).", hidden: false, collector: Some("systemd"), enables: true },
    FlagSpec { name: "collector.systemd.enable-restarts-metrics", kind: FlagKind::Bool, default: "false", help: "Enables service unit metric service_restart_total", hidden: false, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.enable-start-time-metrics", kind: FlagKind::Bool, default: "false", help: "Enables service unit metric unit_start_time_seconds", hidden: false, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.enable-task-metrics", kind: FlagKind::Bool, default: "false", help: "Enables service unit tasks metrics unit_tasks_current and unit_tasks_max", hidden: false, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.private", kind: FlagKind::Bool, default: "false", help: "Establish a private, direct connection to systemd without dbus (Strongly discouraged since it requires root. For testing purposes only).", hidden: true, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.unit-blacklist", kind: FlagKind::String, default: "", help: "DEPRECATED: Use collector.systemd.unit-exclude", hidden: true, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.unit-exclude", kind: FlagKind::String, default: ".+\\.(automount|device|mount|scope|slice)", help: "Regexp of systemd units to exclude. Units must both match include and not match exclude to be included.", hidden: false, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.unit-include", kind: FlagKind::String, default: ".+", help: "Regexp of systemd units to include. Units must both match include and not match exclude to be included.", hidden: false, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.systemd.unit-whitelist", kind: FlagKind::String, default: "", help: "DEPRECATED: Use --collector.systemd.unit-include", hidden: true, collector: Some("systemd"), enables: false },
    FlagSpec { name: "collector.tapestats", kind: FlagKind::Bool, default: "true", help: "Enable the tapestats collector (default: enabled).", hidden: false, collector: Some("tapestats"), enables: true },
    FlagSpec { name: "collector.tapestats.ignored-devices", kind: FlagKind::String, default: "^$", help: "Regexp of devices to ignore for tapestats.", hidden: false, collector: Some("tapestats"), enables: false },
    FlagSpec { name: "collector.tcpstat", kind: FlagKind::Bool, default: "false", help: "Enable the tcpstat collector (default: disabled).", hidden: false, collector: Some("tcpstat"), enables: true },
    FlagSpec { name: "collector.textfile", kind: FlagKind::Bool, default: "true", help: "Enable the textfile collector (default: enabled).", hidden: false, collector: Some("textfile"), enables: true },
    FlagSpec { name: "collector.textfile.directory", kind: FlagKind::Strings, default: "", help: "Directory to read text files with metrics from, supports glob matching. (repeatable)", hidden: false, collector: Some("textfile"), enables: false },
    FlagSpec { name: "collector.thermal_zone", kind: FlagKind::Bool, default: "true", help: "Enable the thermal_zone collector (default: enabled).", hidden: false, collector: Some("thermal_zone"), enables: true },
    FlagSpec { name: "collector.time", kind: FlagKind::Bool, default: "true", help: "Enable the time collector (default: enabled).", hidden: false, collector: Some("time"), enables: true },
    FlagSpec { name: "collector.timex", kind: FlagKind::Bool, default: "true", help: "Enable the timex collector (default: enabled).", hidden: false, collector: Some("timex"), enables: true },
    FlagSpec { name: "collector.udp_queues", kind: FlagKind::Bool, default: "true", help: "Enable the udp_queues collector (default: enabled).", hidden: false, collector: Some("udp_queues"), enables: true },
    FlagSpec { name: "collector.uname", kind: FlagKind::Bool, default: "true", help: "Enable the uname collector (default: enabled).", hidden: false, collector: Some("uname"), enables: true },
    FlagSpec { name: "collector.vmstat", kind: FlagKind::Bool, default: "true", help: "Enable the vmstat collector (default: enabled).", hidden: false, collector: Some("vmstat"), enables: true },
    FlagSpec { name: "collector.vmstat.fields", kind: FlagKind::String, default: "^(oom_kill|pgpg|pswp|pg.*fault).*", help: "Regexp of fields to return for vmstat collector.", hidden: false, collector: Some("vmstat"), enables: false },
    FlagSpec { name: "collector.watchdog", kind: FlagKind::Bool, default: "true", help: "Enable the watchdog collector (default: enabled).", hidden: false, collector: Some("watchdog"), enables: true },
    FlagSpec { name: "collector.wifi", kind: FlagKind::Bool, default: "false", help: "Enable the wifi collector (default: disabled).", hidden: false, collector: Some("wifi"), enables: true },
    FlagSpec { name: "collector.wifi.fixtures", kind: FlagKind::String, default: "", help: "test fixtures to use for wifi collector metrics", hidden: false, collector: Some("wifi"), enables: false },
    FlagSpec { name: "collector.xfrm", kind: FlagKind::Bool, default: "false", help: "Enable the xfrm collector (default: disabled).", hidden: false, collector: Some("xfrm"), enables: true },
    FlagSpec { name: "collector.xfs", kind: FlagKind::Bool, default: "true", help: "Enable the xfs collector (default: enabled).", hidden: false, collector: Some("xfs"), enables: true },
    FlagSpec { name: "collector.zfs", kind: FlagKind::Bool, default: "true", help: "Enable the zfs collector (default: enabled).", hidden: false, collector: Some("zfs"), enables: true },
    FlagSpec { name: "collector.zoneinfo", kind: FlagKind::Bool, default: "false", help: "Enable the zoneinfo collector (default: disabled).", hidden: false, collector: Some("zoneinfo"), enables: true },
    FlagSpec { name: "completion-bash", kind: FlagKind::Bool, default: "false", help: "Output possible completions for the given args.", hidden: true, collector: None, enables: false },
    FlagSpec { name: "completion-script-bash", kind: FlagKind::Bool, default: "false", help: "Generate completion script for bash.", hidden: true, collector: None, enables: false },
    FlagSpec { name: "completion-script-zsh", kind: FlagKind::Bool, default: "false", help: "Generate completion script for ZSH.", hidden: true, collector: None, enables: false },
    FlagSpec { name: "help", kind: FlagKind::Bool, default: "false", help: "Show context-sensitive help (also try --help-long and --help-man).", hidden: false, collector: None, enables: false },
    FlagSpec { name: "help-long", kind: FlagKind::Bool, default: "false", help: "Generate long help.", hidden: true, collector: None, enables: false },
    FlagSpec { name: "help-man", kind: FlagKind::Bool, default: "false", help: "Generate a man page.", hidden: true, collector: None, enables: false },
    FlagSpec { name: "log.format", kind: FlagKind::String, default: "logfmt", help: "Output format of log messages. One of: [logfmt, json]", hidden: false, collector: None, enables: false },
    FlagSpec { name: "log.level", kind: FlagKind::String, default: "info", help: "Only log messages with the given severity or above. One of: [debug, info, warn, error]", hidden: false, collector: None, enables: false },
    FlagSpec { name: "path.procfs", kind: FlagKind::String, default: "/proc", help: "procfs mountpoint.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "path.rootfs", kind: FlagKind::String, default: "/", help: "rootfs mountpoint.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "path.sysfs", kind: FlagKind::String, default: "/sys", help: "sysfs mountpoint.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "path.udev.data", kind: FlagKind::String, default: "/run/udev/data", help: "udev data path.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "runtime.gomaxprocs", kind: FlagKind::Int, default: "1", help: "The target number of CPUs Go will run on (GOMAXPROCS)", hidden: false, collector: None, enables: false },
    FlagSpec { name: "version", kind: FlagKind::Bool, default: "false", help: "Show application version.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.config.file", kind: FlagKind::String, default: "", help: "Path to configuration file that can enable TLS or authentication. See: https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.disable-exporter-metrics", kind: FlagKind::Bool, default: "false", help: "Exclude metrics about the exporter itself (promhttp_*, process_*, go_*).", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.listen-address", kind: FlagKind::Strings, default: ":9100", help: "Addresses on which to expose metrics and web interface. Repeatable for multiple addresses. Examples: `:9100` or `[::1]:9100` for http, `vsock://:9100` for vsock", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.max-requests", kind: FlagKind::Int, default: "40", help: "Maximum number of parallel scrape requests. Use 0 to disable.", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.systemd-socket", kind: FlagKind::Bool, default: "false", help: "Use systemd socket activation listeners instead of port listeners (Linux only).", hidden: false, collector: None, enables: false },
    FlagSpec { name: "web.telemetry-path", kind: FlagKind::String, default: "/metrics", help: "Path under which to expose metrics.", hidden: false, collector: None, enables: false },
];

pub const DEPRECATED: &[Deprecated] = &[
    Deprecated { alias: "collector.diskstats.ignored-devices", replaced_by: "collector.diskstats.device-exclude", warning: "--collector.diskstats.ignored-devices is DEPRECATED and will be removed in 2.0.0, use --collector.diskstats.device-exclude", conflict: "--collector.diskstats.ignored-devices and --collector.diskstats.device-exclude are mutually exclusive" },
    Deprecated { alias: "collector.filesystem.ignored-fs-types", replaced_by: "collector.filesystem.fs-types-exclude", warning: "--collector.filesystem.ignored-fs-types is DEPRECATED and will be removed in 2.0.0, use --collector.filesystem.fs-types-exclude", conflict: "--collector.filesystem.ignored-fs-types and --collector.filesystem.fs-types-exclude are mutually exclusive" },
    Deprecated { alias: "collector.filesystem.ignored-mount-points", replaced_by: "collector.filesystem.mount-points-exclude", warning: "--collector.filesystem.ignored-mount-points is DEPRECATED and will be removed in 2.0.0, use --collector.filesystem.mount-points-exclude", conflict: "--collector.filesystem.ignored-mount-points and --collector.filesystem.mount-points-exclude are mutually exclusive" },
    Deprecated { alias: "collector.netdev.device-blacklist", replaced_by: "collector.netdev.device-exclude", warning: "--collector.netdev.device-blacklist is DEPRECATED and will be removed in 2.0.0, use --collector.netdev.device-exclude", conflict: "--collector.netdev.device-blacklist and --collector.netdev.device-exclude are mutually exclusive" },
    Deprecated { alias: "collector.netdev.device-whitelist", replaced_by: "collector.netdev.device-include", warning: "--collector.netdev.device-whitelist is DEPRECATED and will be removed in 2.0.0, use --collector.netdev.device-include", conflict: "--collector.netdev.device-whitelist and --collector.netdev.device-include are mutually exclusive" },
    Deprecated { alias: "collector.qdisk.device-exclude", replaced_by: "collector.qdisc.device-exclude", warning: "--collector.qdisk.device-exclude is DEPRECATED and will be removed in 2.0.0, use --collector.qdisc.device-exclude", conflict: "--collector.qdisk.device-exclude and --collector.qdisc.device-exclude are mutually exclusive" },
    Deprecated { alias: "collector.qdisk.device-include", replaced_by: "collector.qdisc.device-include", warning: "--collector.qdisk.device-include is DEPRECATED and will be removed in 2.0.0, use --collector.qdisc.device-include", conflict: "--collector.qdisk.device-include and --collector.qdisc.device-include are mutually exclusive" },
    Deprecated { alias: "collector.systemd.unit-blacklist", replaced_by: "collector.systemd.unit-exclude", warning: "--collector.systemd.unit-blacklist is DEPRECATED and will be removed in 2.0.0, use --collector.systemd.unit-exclude", conflict: "--collector.systemd.unit-blacklist and --collector.systemd.unit-exclude are mutually exclusive" },
    Deprecated { alias: "collector.systemd.unit-whitelist", replaced_by: "collector.systemd.unit-include", warning: "--collector.systemd.unit-whitelist is DEPRECATED and will be removed in 2.0.0, use --collector.systemd.unit-include", conflict: "--collector.systemd.unit-whitelist and --collector.systemd.unit-include are mutually exclusive" },
];

/// node_exporter 1.12's deprecated collectors log this once when enabled.
pub const DEPRECATED_COLLECTOR_WARNING: &str = "This collector is deprecated and will be removed in the next major version release.";

/// The spec of flag `name`.
pub fn find(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.name == name)
}

/// node_exporter's collectors on Linux, with their default states.
pub fn collectors() -> impl Iterator<Item = (&'static str, bool)> {
    FLAGS.iter().filter(|f| f.enables).filter_map(|f| Some((f.collector?, f.default == "true")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_node_exporter_1_12_on_linux() {
        assert_eq!(FLAGS.len(), 188);
        let on: Vec<&str> = collectors().filter(|c| c.1).map(|c| c.0).collect();
        let off: Vec<&str> = collectors().filter(|c| !c.1).map(|c| c.0).collect();
        assert_eq!((on.len(), off.len()), (49, 30));
        assert!(on.contains(&"bcachefs") && off.contains(&"meminfo_numa") && off.contains(&"cpu_vulnerabilities"));
        assert_eq!(DEPRECATED.len(), 9);
        let mut names: Vec<&str> = FLAGS.iter().map(|f| f.name).collect();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len(), "sorted, unique");
    }
}
