//! Drop-in: the DaemonSet arguments of the node_exporter manifests people
//! deploy start node-agent unchanged, and it serves this machine. The only
//! substitutions are the ones Kubernetes makes: `$(HOST_IP)` (the downward
//! API), the port (a free one here, 9100 in a pod) and `/host` (the pod's
//! host mounts: here a directory of links to this machine's /proc, /sys
//! and /).

use std::io::Read;
use std::time::{Duration, Instant};

/// kube-prometheus (jsonnet, main) node-exporter DaemonSet.
const KUBE_PROMETHEUS: &[&str] = &[
    "--web.listen-address=127.0.0.1:PORT",
    "--path.sysfs=/host/sys",
    "--path.rootfs=/host/root",
    "--path.udev.data=/host/root/run/udev/data",
    "--no-collector.wifi",
    "--no-collector.hwmon",
    "--no-collector.btrfs",
    "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run/k3s/containerd/.+|var/lib/docker/.+|var/lib/kubelet/pods/.+)($|/)",
    "--collector.netclass.ignored-devices=^(veth.*|[a-f0-9]{15})$",
    "--collector.netdev.device-exclude=^(veth.*|[a-f0-9]{15})$",
];

/// The prometheus-node-exporter Helm chart, default values.
const HELM: &[&str] = &[
    "--path.procfs=/host/proc",
    "--path.sysfs=/host/sys",
    "--path.rootfs=/host/root",
    "--path.udev.data=/host/root/run/udev/data",
    "--web.listen-address=[$(HOST_IP)]:PORT",
];

/// The same chart as kube-prometheus-stack configures it (its extraArgs).
const KUBE_PROMETHEUS_STACK: &[&str] = &[
    "--path.procfs=/host/proc",
    "--path.sysfs=/host/sys",
    "--path.rootfs=/host/root",
    "--path.udev.data=/host/root/run/udev/data",
    "--web.listen-address=[$(HOST_IP)]:PORT",
    "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|var/lib/docker/.+|var/lib/kubelet/.+)($|/)",
    "--collector.filesystem.fs-types-exclude=^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|sysfs|tracefs)$",
];

fn serves(name: &str, args: &[&str]) {
    let host = tempfile::tempdir().expect("tempdir");
    for (link, target) in [("proc", "/proc"), ("sys", "/sys"), ("root", "/")] {
        std::os::unix::fs::symlink(target, host.path().join(link)).expect("symlink");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("$(HOST_IP)", "127.0.0.1")
                .replace("PORT", &port.to_string())
                .replace("=/host/", &format!("={}/", host.path().display()))
        })
        .collect();
    let child = std::process::Command::new(node_agent_tests::agent_binary())
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut guard = node_agent_tests::Kill(child);
    let t = Instant::now();
    let body = loop {
        if let Ok(Some(status)) = guard.0.try_wait() {
            let mut err = String::new();
            let _ = guard.0.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("{name}: node-agent exited at start-up ({status}) with {args:?}:\n{err}");
        }
        if let Some((200, body)) = node_agent_tests::http_get(([127, 0, 0, 1], port).into(), "/metrics", Duration::from_secs(30)) {
            break body;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{name}: not serving after 30 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    for family in [
        "node_cpu_seconds_total{",
        "node_memory_MemAvailable_bytes ",
        "node_filesystem_avail_bytes{",
        "node_load1 ",
        "node_exporter_build_info{",
    ] {
        assert!(body.contains(family), "{name}: no {family} in the scrape");
    }
    for c in ["cpu", "meminfo", "filesystem", "loadavg", "netdev", "diskstats"] {
        let line = format!("node_scrape_collector_success{{collector=\"{c}\"}} 1");
        assert!(body.contains(&line), "{name}: {c} did not succeed");
    }
    if args.iter().any(|a| a == "--no-collector.hwmon") {
        assert!(!body.contains("collector=\"hwmon\""), "{name}: --no-collector.hwmon is honoured");
    }
}

#[test]
fn kube_prometheus_args_start_unchanged_and_serve() {
    serves("kube-prometheus", KUBE_PROMETHEUS);
}

#[test]
fn helm_chart_default_args_start_unchanged_and_serve() {
    serves("prometheus-node-exporter chart", HELM);
}

#[test]
fn kube_prometheus_stack_args_start_unchanged_and_serve() {
    serves("kube-prometheus-stack", KUBE_PROMETHEUS_STACK);
}
