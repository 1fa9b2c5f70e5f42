//! deploy/: generated from the code and never drifting; every kustomization
//! builds (`kubectl kustomize`, kustomize v5); every object validates
//! strictly against the official Kubernetes schemas of two versions,
//! NodeAgent against its CRD, prometheus-operator objects against that
//! operator's CRD models; the agent's flags in the manifests are flags the
//! agent accepts; `plan` places the DaemonSet as intended; the Prometheus
//! configuration and rules pass promtool (check and unit tests); the Grafana
//! dashboard queries only metrics node-agent exports.
//!
//! Tools come from `cargo xtask test` (setup): kubectl (kustomize), promtool,
//! and a venv under target/tools with kubernetes-validate and
//! cloudcoil-models-prometheus-operator. Without them the tests skip with a
//! message, except in CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use node_agent_tests::compare::which;
use planner::{input, plan};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn need(what: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "{what} is required in CI (cargo xtask test installs it)");
        eprintln!("SKIP: {what} not installed (cargo xtask test installs it)");
    }
    found
}

fn python() -> Option<PathBuf> {
    let p = root().join("target/tools/venv/bin/python");
    need("the manifest validators (target/tools/venv)", p.is_file().then_some(p))
}

const VERSIONS: &str = "1.36.0,1.37.0";

fn kustomize(dir: &str) -> String {
    let out = Command::new("kubectl").args(["kustomize"]).arg(root().join(dir)).output().expect("kubectl runs");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

const KUSTOMIZATIONS: &[&str] = &[
    "deploy",
    "deploy/overlays/no-ebpf",
    "deploy/overlays/gpu-only",
    "deploy/overlays/seccomp-unconfined",
    "deploy/overlays/seccomp-profile",
    "deploy/overlays/controller",
    "deploy/overlays/prometheus-operator",
    "deploy/crd",
];

fn validate(python: &Path, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(python)
        .arg(root().join("tests/validate_manifests.py"))
        .arg(root().join("deploy/crd/crd.yaml"))
        .arg(VERSIONS)
        .args(files)
        .output()
        .expect("validator runs");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn committed_manifests_are_the_generated_ones() {
    let rules = std::fs::read_to_string(root().join(node_agent::manifests::RULES)).expect("rules.yml");
    let files = node_agent::manifests::render(&rules).expect("render");
    let mut stale = Vec::new();
    for (path, text) in &files {
        if std::fs::read_to_string(root().join(path)).ok().as_deref() != Some(text.as_str()) {
            stale.push(path.as_str());
        }
    }
    assert!(stale.is_empty(), "deploy/ differs from the code in {stale:?}: run `cargo xtask manifests`");
    // The image is this build's, the port the agent's default.
    let ds = std::fs::read_to_string(root().join("deploy/agent/daemonset.yaml")).expect("daemonset");
    assert!(ds.contains(&format!("image: ghcr.io/node-agent/node-agent:{}", env!("CARGO_PKG_VERSION"))));
    assert!(ds.contains("hostPort: 9100") && ds.contains("--web.listen-address=:9100"));
}

/// kubectl maps every object of an apply before it sends any, so an object
/// whose CRD is in the same apply fails ("no matches for kind ... ensure
/// CRDs are installed first"): no kustomization may hold both.
#[test]
fn no_kustomization_holds_a_crd_and_objects_of_its_kind() {
    if need("kubectl (kustomize)", which("kubectl")).is_none() {
        return;
    }
    for k in KUSTOMIZATIONS {
        let docs: Vec<serde_yaml_ng::Value> = kustomize(k).split("\n---\n").map(|d| serde_yaml_ng::from_str(d).expect("yaml")).collect();
        let defined: Vec<(String, String)> = docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some("CustomResourceDefinition"))
            .map(|d| (d["spec"]["group"].as_str().unwrap_or("").to_string(), d["spec"]["names"]["kind"].as_str().unwrap_or("").to_string()))
            .collect();
        for d in &docs {
            let group = d["apiVersion"].as_str().and_then(|v| v.split_once('/')).map(|(g, _)| g).unwrap_or("");
            let kind = d["kind"].as_str().unwrap_or("");
            assert!(
                !defined.iter().any(|(g, k)| g == group && k == kind),
                "{k}: a {kind} beside its own CRD: kubectl would refuse it until the CRD is established"
            );
        }
    }
    let kinds = |k: &str| -> Vec<String> {
        kustomize(k)
            .split("\n---\n")
            .map(|d| serde_yaml_ng::from_str::<serde_yaml_ng::Value>(d).expect("yaml")["kind"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(kinds("deploy/crd"), ["CustomResourceDefinition"]);
    assert!(kinds("deploy/overlays/controller").iter().any(|k| k == "NodeAgent"));
}

#[test]
fn every_kustomization_builds_and_validates_strictly() {
    let Some(py) = python() else { return };
    if need("kubectl (kustomize)", which("kubectl")).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    for k in KUSTOMIZATIONS {
        let p = dir.path().join(format!("{}.yaml", k.replace('/', "_")));
        std::fs::write(&p, kustomize(k)).expect("write");
        files.push(p);
    }
    // Not in a kustomization (the alternative to the ServiceMonitor).
    files.push(root().join("deploy/prometheus/operator/podmonitor.yaml"));
    let (ok, report) = validate(&py, &files);
    assert!(ok, "{report}");
    let checked = report.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(checked >= 50, "{checked} objects checked:\n{report}");
    for kind in [
        "DaemonSet/node-agent",
        "NodeAgent/node-agent",
        "CustomResourceDefinition/nodeagents.nodeagent.io",
        "ServiceMonitor/node-agent",
        "PodMonitor/node-agent",
        "PrometheusRule/node-agent",
        "Deployment/node-agent-controller",
    ] {
        assert!(report.lines().any(|l| l.starts_with("ok ") && l.contains(kind)), "{kind} not validated:\n{report}");
    }

    // The validator rejects what it should: an unknown field, a wrong type,
    // a field the operator's CRD does not have, a bad NodeAgent.
    let bad = dir.path().join("bad.yaml");
    let ds = kustomize("deploy");
    for (what, text) in [
        ("unknown DaemonSet field", ds.replace("  updateStrategy:", "  updateStrategi:\n    type: RollingUpdate\n  updateStrategy:")),
        ("wrong type", ds.replace("maxUnavailable: 1", "maxUnavailable: [1]")),
        (
            "unknown container field",
            ds.replace("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: true\n          readOnlyRootFs: true"),
        ),
        (
            "unknown ServiceMonitor field",
            std::fs::read_to_string(root().join("deploy/prometheus/operator/servicemonitor.yaml"))
                .expect("sm")
                .replace("interval: 15s", "interval: 15s\n      intervall: 15s"),
        ),
        (
            "unknown NodeAgent field",
            std::fs::read_to_string(root().join("deploy/controller/nodeagent.yaml"))
                .expect("na")
                .replace("autoRollback: true", "autoRollback: true\n      autoRollbak: true"),
        ),
        (
            "bad NodeAgent pod template",
            std::fs::read_to_string(root().join("deploy/controller/nodeagent.yaml"))
                .expect("na")
                .replace("hostPID: true", "hostPID: yes-please"),
        ),
    ] {
        std::fs::write(&bad, text).expect("write");
        let (ok, report) = validate(&py, std::slice::from_ref(&bad));
        assert!(!ok, "{what} was accepted:\n{report}");
    }
}

fn daemonset_of(built: &str) -> DaemonSet {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("built.yaml");
    std::fs::write(&p, built).expect("write");
    input::read::<DaemonSet>(&p, "DaemonSet").expect("daemonset").remove(0)
}

fn nodes() -> Vec<Node> {
    input::read(&root().join("tests/fixtures/daemonset/nodes.yaml"), "Node").expect("nodes")
}

fn eligible(p: &plan::Plan) -> Vec<&str> {
    p.nodes.iter().filter(|n| n.should_run).map(|n| n.node.as_str()).collect()
}

#[test]
fn plan_places_the_built_daemonsets_as_intended() {
    if need("kubectl (kustomize)", which("kubectl")).is_none() {
        return;
    }
    let nodes = nodes();
    // Control-plane taint, not-ready, cordoned, a NoExecute-dedicated node, GPU: all get one.
    let p = plan::plan(&daemonset_of(&kustomize("deploy")), &nodes, &[], planner::builders::at(1_000), None).expect("plan");
    assert_eq!(eligible(&p).len(), nodes.len(), "{:?}", p.nodes);
    assert_eq!(p.actions.len(), nodes.len());
    let p =
        plan::plan(&daemonset_of(&kustomize("deploy/overlays/gpu-only")), &nodes, &[], planner::builders::at(1_000), None).expect("plan");
    assert_eq!(eligible(&p), vec!["gpu-1"]);
}

fn container_args(ds: &DaemonSet) -> Vec<String> {
    ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).map(|s| s.containers[0].args.clone().unwrap_or_default()).unwrap_or_default()
}

fn capabilities(ds: &DaemonSet) -> Vec<String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].security_context.as_ref())
        .and_then(|c| c.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default()
}

#[test]
fn manifest_flags_are_flags_the_agent_accepts_and_overlays_do_what_they_say() {
    let resolve = |args: &[String]| {
        let m = node_agent::cmd::command()
            .try_get_matches_from(std::iter::once("node-agent".to_string()).chain(args.iter().cloned()))
            .expect("flags parse");
        node_agent::config::resolve(&m).map(|c| c.collectors.iter().map(|(n, _)| n.to_string()).collect::<BTreeSet<String>>())
    };
    let base: Vec<String> = node_agent::manifests::agent_args();
    let with_ebpf = resolve(&base).expect("the DaemonSet's flags resolve");
    assert!(with_ebpf.contains("ebpf_syscalls") && with_ebpf.contains("cpu"));
    if need("kubectl (kustomize)", which("kubectl")).is_none() {
        return;
    }
    let ds = daemonset_of(&kustomize("deploy"));
    assert_eq!(container_args(&ds), base);
    assert_eq!(capabilities(&ds), ["BPF", "PERFMON", "NET_ADMIN", "SYS_PTRACE"]);
    let sc = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].security_context.clone())
        .expect("securityContext");
    assert_eq!((sc.privileged, sc.allow_privilege_escalation, sc.read_only_root_filesystem), (Some(false), Some(false), Some(true)));
    assert_eq!(sc.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]));

    let no_ebpf = daemonset_of(&kustomize("deploy/overlays/no-ebpf"));
    let collectors = resolve(&container_args(&no_ebpf)).expect("the no-ebpf flags resolve");
    assert!(collectors.iter().all(|c| !c.starts_with("ebpf_")), "{collectors:?}");
    assert_eq!(collectors, with_ebpf.iter().filter(|c| !c.starts_with("ebpf_")).cloned().collect::<BTreeSet<_>>());
    assert_eq!(capabilities(&no_ebpf), ["SYS_PTRACE"]);
    let volumes: Vec<String> = no_ebpf
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.volumes.iter().flatten().map(|v| v.name.clone()).collect())
        .unwrap_or_default();
    assert_eq!(volumes, ["proc", "sys", "root"]);

    let unconfined = daemonset_of(&kustomize("deploy/overlays/seccomp-unconfined"));
    let profile = unconfined
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.seccomp_profile.clone())
        .expect("seccomp");
    assert_eq!(profile.type_, "Unconfined");
    assert_eq!(capabilities(&unconfined), capabilities(&ds), "still only the agent's capabilities");

    // The shipped profile: an init container writes it where the main
    // container's Localhost profile names it, through the kubelet's dir.
    let own = daemonset_of(&kustomize("deploy/overlays/seccomp-profile"));
    let spec = own.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("pod spec");
    let main = &spec.containers[0];
    let profile = main.security_context.as_ref().and_then(|c| c.seccomp_profile.clone()).expect("the container's seccompProfile");
    assert_eq!(
        (profile.type_.as_str(), profile.localhost_profile.as_deref()),
        ("Localhost", Some(node_agent::manifests::SECCOMP_PROFILE_NAME))
    );
    assert_eq!(
        spec.security_context.and_then(|c| c.seccomp_profile).map(|p| p.type_).as_deref(),
        Some("RuntimeDefault"),
        "the init container's"
    );
    let init = spec.init_containers.as_ref().and_then(|c| c.first()).expect("an init container");
    assert_eq!(init.image, main.image, "the same image writes the profile it embeds");
    let args = init.args.clone().unwrap_or_default();
    assert_eq!(args[..2], ["seccomp-profile", "--write"]);
    let mount =
        init.volume_mounts.iter().flatten().find(|m| args[2].starts_with(&m.mount_path)).expect("the profile is written to a volume");
    let volume = spec.volumes.iter().flatten().find(|v| v.name == mount.name).expect("the mount's volume");
    let host_dir = volume.host_path.as_ref().map(|h| h.path.clone()).expect("a hostPath");
    assert_eq!(host_dir, node_agent::manifests::KUBELET_SECCOMP_DIR);
    assert_eq!(
        args[2].strip_prefix(&format!("{}/", mount.mount_path)),
        Some(node_agent::manifests::SECCOMP_PROFILE_NAME),
        "written where Localhost reads it"
    );
    assert!(
        init.security_context.as_ref().and_then(|c| c.capabilities.as_ref()).and_then(|c| c.add.as_ref()).is_none(),
        "the init container needs no capability"
    );
    let sub = node_agent::cmd::command().try_get_matches_from(["node-agent"].into_iter().chain(args.iter().map(String::as_str)));
    assert!(sub.is_ok(), "the init container's arguments parse: {:?}", sub.err());
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests() {
    let Some(promtool) = need("promtool", which("promtool")) else { return };
    let dir = root().join("deploy/prometheus");
    for args in [vec!["check", "rules", "rules.yml"], vec!["test", "rules", "rules_test.yml"]] {
        let out = Command::new(&promtool).args(&args).current_dir(&dir).output().expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The PrometheusRule carries the same groups.
    let rule: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("deploy/prometheus/operator/prometheusrule.yaml")).expect("rule"))
            .expect("yaml");
    let plain: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("rules.yml")).expect("rules")).expect("yaml");
    assert_eq!(rule["spec"]["groups"], plain["groups"]);
}

/// deploy/prometheus/prometheus.yml with its Kubernetes discovery replaced
/// by file discovery carrying the meta labels a node and a pod would have,
/// and the agent's port replaced by `port` (Debian's Prometheus is built
/// without Kubernetes discovery).
fn testable_config(dir: &Path, port: u16, interval: &str) -> PathBuf {
    let mut cfg: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("deploy/prometheus/prometheus.yml")).expect("config")).expect("yaml");
    cfg["global"]["scrape_interval"] = interval.into();
    cfg["global"]["evaluation_interval"] = interval.into();
    cfg["rule_files"] = serde_yaml_ng::to_value(vec![root().join("deploy/prometheus/rules.yml").display().to_string()]).expect("yaml");
    let targets = [
        ("node-agent", serde_json::json!([{"targets": ["127.0.0.1:10250"], "labels": {"__meta_kubernetes_node_name": "test-node"}}])),
        (
            "node-agent-controller",
            serde_json::json!([{"targets": ["127.0.0.1:1"], "labels": {"__meta_kubernetes_pod_label_app_kubernetes_io_name": "something-else", "__meta_kubernetes_pod_container_port_name": "metrics"}}]),
        ),
    ];
    let jobs = cfg["scrape_configs"].as_sequence_mut().expect("scrape_configs");
    for job in jobs.iter_mut() {
        let name = job["job_name"].as_str().unwrap_or_default().to_string();
        let sd = job["kubernetes_sd_configs"].as_sequence().cloned().unwrap_or_default();
        // Structure of what promtool cannot check here.
        for s in &sd {
            assert!(
                ["node", "pod", "endpoints", "service", "endpointslice", "ingress"].contains(&s["role"].as_str().unwrap_or("")),
                "{name}: role {:?}",
                s["role"]
            );
        }
        let file = dir.join(format!("{name}.json"));
        let t = targets.iter().find(|(n, _)| *n == name).map(|(_, t)| t.clone()).expect("a target for every job");
        std::fs::write(&file, t.to_string()).expect("write");
        let m = job.as_mapping_mut().expect("job");
        m.remove("kubernetes_sd_configs");
        m.insert(
            "file_sd_configs".into(),
            serde_yaml_ng::to_value(vec![serde_json::json!({"files": [file.display().to_string()]})]).expect("yaml"),
        );
        for r in m.get_mut("relabel_configs").and_then(|r| r.as_sequence_mut()).into_iter().flatten() {
            if r["replacement"].as_str() == Some("${1}:9100") {
                r["replacement"] = format!("${{1}}:{port}").into();
            }
        }
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&cfg).expect("yaml")).expect("write");
    path
}

#[test]
fn promtool_checks_the_scrape_config() {
    let Some(promtool) = need("promtool", which("promtool")) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = testable_config(dir.path(), 9100, "15s");
    let out = Command::new(&promtool).args(["check", "config"]).arg(&cfg).output().expect("promtool runs");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn query(prom: &str, q: &str) -> serde_json::Value {
    let url = format!("http://{prom}/api/v1/query?query={}", form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>());
    node_agent_tests::compare::http_get(&url).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(serde_json::Value::Null)
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> Option<String>) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Debian's Prometheus on 127.0.0.1 scrapes a running node-agent through
/// the shipped scrape config (its relabelling rewrites the node address to
/// the agent's port) and rules; its HTTP API must show the target up and
/// answer queries over node_cpu_seconds_total and an eBPF histogram.
#[test]
fn a_real_prometheus_scrapes_the_agent_through_the_shipped_config() {
    let Some(prometheus) = need("prometheus", which("prometheus")) else { return };
    // SAFETY: geteuid(2) has no preconditions.
    let root_user = unsafe { libc::geteuid() } == 0;
    if !root_user {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: not root, the eBPF programs cannot load");
        return;
    }
    let m = node_agent::cmd::command().try_get_matches_from(["node-agent", "--web.listen-address=127.0.0.1:0"]).expect("flags");
    let agent = node_agent::agent::Agent::start(&m).expect("agent");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = testable_config(dir.path(), agent.addrs[0].port(), "1s");
    let prom = format!("127.0.0.1:{}", free_port());
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log"))
        .spawn()
        .expect("prometheus starts");
    let _kill = node_agent_tests::Kill(child);

    let target = wait_until("the node-agent target to be up", 60, || {
        let t: serde_json::Value = node_agent_tests::compare::http_get(&format!("http://{prom}/api/v1/targets"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())?;
        t["data"]["activeTargets"]
            .as_array()?
            .iter()
            .find(|t| t["labels"]["job"] == "node-agent" && t["health"] == "up")
            .map(|t| t.to_string())
    });
    let t: serde_json::Value = serde_json::from_str(&target).expect("json");
    assert_eq!(t["labels"]["instance"], "test-node", "{t}");
    assert_eq!(t["labels"]["node"], "test-node", "{t}");
    assert_eq!(t["scrapeUrl"], format!("http://127.0.0.1:{}/metrics", agent.addrs[0].port()), "the relabelling targets the agent's port");

    let cpus = wait_until("node_cpu_seconds_total", 30, || {
        let r = query(&prom, "count(node_cpu_seconds_total{job=\"node-agent\",mode=\"idle\"})");
        r["data"]["result"][0]["value"][1].as_str().map(str::to_string)
    });
    let n: usize = cpus.parse().expect("a count");
    assert_eq!(n, std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), "one idle series per CPU");

    let p99 = wait_until("a run-queue latency p99", 60, || {
        let r = query(
            &prom,
            "histogram_quantile(0.99, sum by (le) (rate(node_ebpf_runqueue_latency_seconds_bucket{job=\"node-agent\"}[10s])))",
        );
        r["data"]["result"][0]["value"][1].as_str().filter(|v| v.parse::<f64>().is_ok_and(|x| x.is_finite() && x > 0.0)).map(str::to_string)
    });
    let p99: f64 = p99.parse().expect("number");
    assert!(p99 > 1e-7 && p99 < 10.0, "p99 run-queue latency {p99} s");
    // The shipped recording rule evaluates over the scraped histogram.
    wait_until("the recording rule", 60, || {
        let r = query(&prom, "instance:node_ebpf_runqueue_latency_seconds:p99_5m{instance=\"test-node\"}");
        r["data"]["result"][0]["value"][1].as_str().filter(|v| v.parse::<f64>().is_ok_and(f64::is_finite)).map(str::to_string)
    });
    // No agent alert fires against a healthy agent.
    let alerts = query(&prom, "ALERTS{alertname=~\"NodeAgent.*\",alertstate=\"firing\"}");
    assert_eq!(alerts["data"]["result"].as_array().map(Vec::len), Some(0), "{alerts}");
    drop(agent);
}

/// A container cgroup with a CPU limit, in the hierarchy with the CPU
/// controller (v2 when it has one, else v1's `cpu`), holding a task in a
/// network namespace of its own; both removed on drop.
struct LimitedCgroup(Vec<std::path::PathBuf>, std::process::Child);

impl LimitedCgroup {
    fn new(uid: &str, cid: &str) -> LimitedCgroup {
        let v2 = node_agent::pods::cgroup::v2_root(Path::new("/sys"))
            .filter(|r| std::fs::read_to_string(r.join("cgroup.controllers")).unwrap_or_default().split_whitespace().any(|c| c == "cpu"));
        let root = v2.clone().unwrap_or_else(|| Path::new("/sys/fs/cgroup/cpu").to_path_buf());
        let mut made = Vec::new();
        let mut dir = root;
        for c in ["kubepods".to_string(), "burstable".into(), format!("pod{uid}"), cid.to_string()] {
            if v2.is_some() {
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+cpu");
            }
            dir.push(c);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                made.push(dir.clone());
            }
        }
        if v2.is_some() {
            std::fs::write(dir.join("cpu.max"), "50000 100000").expect("cpu.max");
        } else {
            std::fs::write(dir.join("cpu.cfs_quota_us"), "50000").expect("cpu.cfs_quota_us");
        }
        let task = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("echo $$ > {}/cgroup.procs && exec unshare -n sleep 120", dir.display()))
            .spawn()
            .expect("a task in the pod");
        LimitedCgroup(made, task)
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        let _ = self.1.kill();
        let _ = self.1.wait();
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Families served only while something is wrong, so absent from the
/// healthy agent `exported_names` runs: each is seen served by another test.
const ONLY_WHEN_DOWN: &[&str] = &[
    // A program's reason for being down: tests/tests/image.rs reads it
    // under podman's default seccomp profile.
    "node_ebpf_program_down_reason",
];

fn exported_names() -> BTreeSet<String> {
    // An API server with one pod on this node, for the per-pod families.
    use node_agent_tests::apiserver::{pod, Api, Running};
    let api = std::sync::Arc::new(Api::new());
    {
        let mut st = api.state.lock().expect("state");
        let p = pod("0f9e2c6a-1b3d-4e5f-8a7b-9c0d1e2f3a4b", "web", "web-0", "deploy-node", "app", &"a".repeat(64));
        api.put(&mut st, "pods", "web", "web-0", p, false);
    }
    let cluster = Running::start(api).expect("API server");
    // The pod's container with a CPU limit, for the throttling families.
    let _limited = LimitedCgroup::new("0f9e2c6a-1b3d-4e5f-8a7b-9c0d1e2f3a4b", &"a".repeat(64));
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent".to_string(),
            "--web.listen-address=127.0.0.1:0".into(),
            "--ebpf.bpf-stats".into(),
            format!("--collector.ebpf_pods.kubeconfig={}", cluster.kubeconfig.path().display()),
            "--collector.ebpf_pods.node-name=deploy-node".into(),
        ])
        .expect("flags");
    let agent = node_agent::agent::Agent::start(&m).expect("agent");
    // Histograms labelled by device exist once there was block I/O: make some
    // (written and synced on the disk the build directory is on).
    let mut text = String::new();
    for i in 0..20 {
        let f = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("io-{i}"));
        std::fs::write(&f, vec![7u8; 1 << 20]).expect("write");
        std::fs::File::open(&f).and_then(|f| f.sync_all()).expect("sync");
        let _ = std::fs::remove_file(&f);
        // A datagram to a closed port: a drop (NO_SOCKET), whose reason's
        // series exists once it was seen.
        if let Ok(s) = std::net::UdpSocket::bind("127.0.0.1:0") {
            let closed = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|c| c.local_addr());
            if let Ok(to) = closed {
                let _ = s.send_to(b"drop", to);
            }
            // A DNS query (A, "x."), to port 53 where nothing may answer:
            // the per-pod DNS families exist once one was seen.
            let _ = s.send_to(&[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'x', 0, 0, 1, 0, 1], "127.0.0.1:53");
        }
        text = node_agent_tests::compare::http_get(&format!("http://{}/metrics", agent.addrs[0])).expect("scrape");
        if text.contains("node_ebpf_block_io_latency_seconds_bucket")
            && text.contains("node_ebpf_pod_attribution_synced 1")
            && text.contains("node_ebpf_skb_drops_total")
            && text.contains("node_pod_cpu_cfs_throttled_periods_total{")
            && text.contains("node_pod_tcp_listen_overflows_total{")
            && text.contains("node_ebpf_pod_dns_queries_total{")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut names: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_string())
        .collect();
    let controller = controller::metrics::Metrics::new();
    controller.set_progress("monitoring", "node-agent", 1, 1, false);
    for l in controller.encode().lines() {
        if let Some(name) = l.strip_prefix("# TYPE ").and_then(|r| r.split(' ').next()) {
            names.insert(name.to_string());
            names.insert(format!("{name}_total"));
        } else if !l.starts_with('#') && !l.is_empty() {
            names.insert(l.split(['{', ' ']).next().unwrap_or("").to_string());
        }
    }
    names.insert("up".into());
    names
}

/// Metric names in a PromQL expression: identifiers outside strings, label
/// matchers, grouping clauses and ranges, that are not followed by `(`
/// (functions) and are not keywords.
fn metric_names(expr: &str) -> Vec<String> {
    let mut s = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_str = false;
    for c in expr.chars() {
        match c {
            '"' => in_str = !in_str,
            _ if in_str => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            c => s.push(c),
        }
        if c == '}' || c == ']' {
            s.push(' ');
        }
    }
    let grouping = regex::Regex::new(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)").expect("regex");
    let s = grouping.replace_all(&s, " ");
    let ident = regex::Regex::new(r"\$?[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?").expect("regex");
    const KEYWORDS: &[&str] = &["by", "without", "and", "or", "unless", "bool", "offset", "on", "ignoring", "inf", "nan"];
    ident
        .find_iter(&s)
        .map(|m| m.as_str().trim())
        .filter(|t| !t.ends_with('(') && !t.starts_with('$') && !KEYWORDS.contains(t))
        .map(str::to_string)
        .collect()
}

#[test]
fn promql_metric_names_are_extracted_correctly() {
    assert_eq!(
        metric_names(r#"topk(10, sum by (syscall) (rate(node_ebpf_syscalls_total{instance=~"$instance"}[$__rate_interval])))"#),
        ["node_ebpf_syscalls_total"]
    );
    assert_eq!(
        metric_names(r#"1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])) / on (instance) node_load1"#),
        ["node_cpu_seconds_total", "node_load1"]
    );
    assert_eq!(metric_names("count(node_ebpf_program_up == 0) or vector(0)"), ["node_ebpf_program_up"]);
}

fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

/// Every metric the dashboard and the rules query is one node-agent (or its
/// controller) exports; as root the eBPF families are live too.
#[test]
fn dashboard_and_rules_query_only_exported_metrics() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: not root, the eBPF families would be missing");
        return;
    }
    let exported = exported_names();
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/node-agent.json")).expect("dashboard")).expect("json");
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    if let Some(q) = dash["templating"]["list"][1]["query"]["query"].as_str() {
        exprs.push(q.replace("label_values(", "").replace(", instance)", ""));
    }
    let rules: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("deploy/prometheus/rules.yml")).expect("rules")).expect("yaml");
    let mut recorded = BTreeSet::new();
    for g in rules["groups"].as_sequence().into_iter().flatten() {
        for r in g["rules"].as_sequence().into_iter().flatten() {
            exprs.push(r["expr"].as_str().unwrap_or_default().to_string());
            if let Some(name) = r["record"].as_str() {
                recorded.insert(name.to_string());
            }
        }
    }
    assert!(exprs.len() >= 30, "{} expressions", exprs.len());
    let mut missing = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for e in &exprs {
        for name in metric_names(e) {
            seen.insert(name.clone());
            if !exported.contains(&name) && !recorded.contains(&name) && !ONLY_WHEN_DOWN.contains(&name.as_str()) {
                missing.insert(format!("{name} (in {e})"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:#?}");
    for family in [
        "node_ebpf_runqueue_latency_seconds_bucket",
        "node_ebpf_block_io_latency_seconds_bucket",
        "node_ebpf_syscall_errors_total",
        "node_ebpf_oom_kills_total",
        "node_ebpf_tcp_retransmits_total",
        "node_ebpf_skb_drops_total",
        "node_agent_controller_rollout_halted",
        "node_ebpf_pod_runqueue_wait_seconds_total",
        "node_ebpf_pod_oom_kills_total",
        "node_ebpf_pod_tcp_retransmits_total",
        "node_ebpf_pod_block_io_bytes_total",
        "node_ebpf_pod_syscall_errors_total",
        "node_ebpf_pod_skb_drops_total",
        "node_pod_cpu_cfs_throttled_periods_total",
        "node_pod_cpu_cfs_throttled_seconds_total",
        "node_pod_cpu_cfs_throttle_duration_seconds_bucket",
        "node_pod_tcp_listen_overflows_total",
        "node_ebpf_syscall_latency_seconds_bucket",
        "node_ebpf_tcp_connect_latency_seconds_bucket",
        "node_ebpf_tcp_rtt_seconds_bucket",
        "node_ebpf_tcp_connect_failures_total",
        "node_ebpf_pod_tcp_connect_failures_total",
        "node_ebpf_pod_tcp_rtt_seconds_total",
    ] {
        assert!(seen.contains(family), "{family} is not on the dashboard or in the rules");
    }
}
