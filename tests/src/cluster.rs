//! A real Kubernetes control plane for the tests (envtest's practice, our
//! own code): etcd and kube-apiserver v1.36.2 from `../shared/k8s/` on
//! loopback, on free ports, with certificates made here, authorization
//! `Node,RBAC` and the default admission plugins plus
//! OwnerReferencesPermissionEnforcement, as a hardened cluster runs them.
//! kubectl v1.36.2 from the same archive talks to it as cluster-admin
//! (a client certificate in `system:masters`), or as a ServiceAccount (a
//! token the API server issued, [`ControlPlane::token_kubeconfig`]).
//! kube-scheduler and kube-controller-manager (a chosen controller list)
//! start where a test asks. Without a kubelet, Node objects are made as a
//! kubelet and the node lifecycle controller would leave them
//! ([`ControlPlane::node`]); a real kubelet over containerd registers
//! [`KUBELET_NODE`] where a test starts one ([`crate::kubelet`]: the API
//! server has a client certificate for kubelets, the kubelet one for that
//! node).
//!
//! The archive is unpacked once per machine under `target/k8s/`. Where it
//! is absent, [`ControlPlane::start_or_skip`] skips with a message, except
//! in CI, where it fails. Everything started is killed by PID when the
//! [`ControlPlane`] is dropped; its etcd data and certificates are in a
//! temporary directory removed with it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Kubernetes release in `../shared/k8s/`.
pub const VERSION: &str = "v1.36.2";

/// The name of the node a kubelet registers ([`crate::kubelet`]): its
/// client certificate is made with the control plane's.
pub const KUBELET_NODE: &str = "node-1";

/// The ClusterIP range the API server allocates Services from.
pub const SERVICE_RANGE: &str = "10.96.0.0/24";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The archive: `$NODE_AGENT_K8S_ARCHIVE`, else `../shared/k8s/` beside
/// the repository.
pub fn archive() -> PathBuf {
    std::env::var_os("NODE_AGENT_K8S_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(format!("../shared/k8s/kubernetes-{VERSION}-linux-amd64.tar.zst")))
}

/// The directory holding the binaries, unpacked from [`archive`] on first
/// use (one process at a time: a lock file; a marker once complete).
pub fn binaries() -> Result<PathBuf, String> {
    let dir = repo().join("target/k8s").join(VERSION);
    let done = dir.join(".unpacked");
    if done.exists() {
        return Ok(dir);
    }
    let archive = archive();
    if !archive.is_file() {
        return Err(format!("{} is absent", archive.display()));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lock = std::fs::File::create(dir.with_extension("lock")).map_err(|e| e.to_string())?;
    // SAFETY: flock on a descriptor this function owns; released when the
    // file is dropped.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if done.exists() {
        return Ok(dir);
    }
    let script = format!("set -o pipefail; zstd -q -d --long=30 -c '{}' | tar -x -C '{}'", archive.display(), dir.display());
    let out = Command::new("bash").args(["-c", &script]).output().map_err(|e| format!("bash: {e}"))?;
    if !out.status.success() {
        return Err(format!("unpacking {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr)));
    }
    std::fs::write(&done, VERSION).map_err(|e| e.to_string())?;
    Ok(dir)
}

pub(crate) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| e.to_string())
}

/// A child killed (SIGTERM, then SIGKILL after 5 s) and reaped when dropped,
/// and killed by the kernel if the thread that started it dies first (a
/// test killed on a timeout leaves no API server behind).
pub(crate) struct Daemon(pub(crate) Child);

/// `cmd`, to die with the thread that spawns it.
pub(crate) fn dies_with_us(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
    // only the child's own state, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) {
            if t.elapsed() > Duration::from_secs(5) {
                let _ = self.0.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.wait();
    }
}

/// A running etcd + kube-apiserver.
pub struct ControlPlane {
    // Dropped in this order: what runs against the API server, the API
    // server, etcd, then the files.
    others: Vec<Daemon>,
    apiserver: Option<Daemon>,
    /// etcd's client port and the API server's.
    ports: (u16, u16),
    _etcd: Daemon,
    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub url: String,
    /// cluster-admin's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The directory of the binaries (kubectl, kube-controller-manager, …).
    pub bin: PathBuf,
    /// The cluster CA's certificate, PEM.
    pub ca_pem: String,
    /// Where the API server logs.
    pub log: PathBuf,
    dir: tempfile::TempDir,
}

/// PEM files for the cluster: CA, the API server's serving certificate,
/// an admin client certificate, the service-account signing key.
fn certificates(dir: &Path) -> Result<String, String> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
    let e = |e: rcgen::Error| e.to_string();
    let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).map_err(|e| format!("{name}: {e}"));
    let ca_key = KeyPair::generate().map_err(e)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "node-agent test cluster CA");
    let ca = ca.self_signed(&ca_key).map_err(e)?;
    // A key and a certificate the CA signs, as `<file>.crt` and `<file>.key`.
    let issue = |file: &str, names: &[&str], dn: &[(DnType, &str)], usage: ExtendedKeyUsagePurpose| -> Result<(), String> {
        let key = KeyPair::generate().map_err(e)?;
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map_err(e)?;
        for (t, v) in dn {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.extended_key_usages = vec![usage];
        write(&format!("{file}.crt"), p.signed_by(&key, &ca, &ca_key).map_err(e)?.pem())?;
        write(&format!("{file}.key"), key.serialize_pem())
    };
    let names = ["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.96.0.1"];
    issue("apiserver", &names, &[(DnType::CommonName, "kube-apiserver")], ExtendedKeyUsagePurpose::ServerAuth)?;
    let admin = [(DnType::CommonName, "admin"), (DnType::OrganizationName, "system:masters")];
    issue("admin", &[], &admin, ExtendedKeyUsagePurpose::ClientAuth)?;
    // The API server's identity towards kubelets (logs, exec, the stats
    // proxy), which kubelets authorize through it (webhook mode).
    let kubelet_client = [(DnType::CommonName, "kube-apiserver-kubelet-client"), (DnType::OrganizationName, "system:masters")];
    issue("apiserver-kubelet-client", &[], &kubelet_client, ExtendedKeyUsagePurpose::ClientAuth)?;
    // The kubelet's client identity, as the Node authorizer expects it.
    let node = format!("system:node:{KUBELET_NODE}");
    issue(
        "kubelet",
        &[],
        &[(DnType::CommonName, node.as_str()), (DnType::OrganizationName, "system:nodes")],
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let sa = KeyPair::generate().map_err(e)?;
    write("sa.key", sa.serialize_pem())?;
    write("sa.pub", sa.public_key_pem())?;
    write("ca.crt", ca.pem())?;
    Ok(ca.pem())
}

/// kubectl from `bin` with `kubeconfig`; a failure to run it is an
/// unsuccessful output naming why.
fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(bin.join("kubectl")).arg("--kubeconfig").arg(kubeconfig).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| {
        use std::os::unix::process::ExitStatusExt;
        Output { status: std::process::ExitStatus::from_raw(127 << 8), stdout: Vec::new(), stderr: format!("kubectl: {e}").into_bytes() }
    })
}

pub(crate) fn kubeconfig(path: &Path, url: &str, ca: &Path, user: &str) -> Result<(), String> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\nusers:\n- name: user\n  user:\n{user}",
        ca.display()
    );
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Starts kube-apiserver on `secure` against etcd on `client`, with the
/// certificates in `d`, and waits until `/readyz` answers ok. Its log is
/// appended to `d/apiserver.log`.
fn apiserver(bin: &Path, d: &Path, client: u16, secure: u16, admin: &Path) -> Result<Daemon, String> {
    let f = |name: &str| d.join(name).display().to_string();
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(d.join("apiserver.log")).map_err(|e| format!("apiserver.log: {e}"))?;
    let child = dies_with_us(&mut Command::new(bin.join("kube-apiserver")))
        .args(["--etcd-servers", &format!("http://127.0.0.1:{client}")])
        .args(["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"])
        .args(["--secure-port", &secure.to_string()])
        .args(["--endpoint-reconciler-type", "none"])
        .args(["--tls-cert-file", &f("apiserver.crt"), "--tls-private-key-file", &f("apiserver.key")])
        .args(["--client-ca-file", &f("ca.crt")])
        .args(["--service-account-issuer", "https://kubernetes.default.svc.cluster.local"])
        .args(["--service-account-key-file", &f("sa.pub"), "--service-account-signing-key-file", &f("sa.key")])
        .args(["--service-cluster-ip-range", SERVICE_RANGE])
        .args(["--authorization-mode", "Node,RBAC"])
        .args(["--enable-admission-plugins", "OwnerReferencesPermissionEnforcement"])
        .args(["--cert-dir", &f("certs")])
        .args(["--kubelet-client-certificate", &f("apiserver-kubelet-client.crt")])
        .args(["--kubelet-client-key", &f("apiserver-kubelet-client.key")])
        .args(["--kubelet-preferred-address-types", "InternalIP"])
        .arg("--v=1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("kube-apiserver: {e}"))?;
    let mut apiserver = Daemon(child);
    let tail = || {
        let text = std::fs::read_to_string(d.join("apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    let t = Instant::now();
    loop {
        let out = kubectl(bin, admin, &["get", "--raw", "/readyz"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
            return Ok(apiserver);
        }
        if let Ok(Some(status)) = apiserver.0.try_wait() {
            return Err(format!("kube-apiserver exited ({status}):\n{}", tail()));
        }
        if t.elapsed() > Duration::from_secs(90) {
            return Err(format!("kube-apiserver not ready in 90 s:\n{}", tail()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl ControlPlane {
    /// Starts etcd and the API server and waits until `/readyz` answers ok
    /// (about 5–15 s here).
    pub fn start() -> Result<ControlPlane, String> {
        let bin = binaries()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path();
        let ca_pem = certificates(d)?;
        let (client, peer, secure) = (free_port()?, free_port()?, free_port()?);
        let log = |name: &str| std::fs::File::create(d.join(name)).map_err(|e| format!("{name}: {e}"));
        let etcd = dies_with_us(&mut Command::new(bin.join("etcd")))
            .arg("--data-dir")
            .arg(d.join("etcd"))
            .args(["--name", "test"])
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("test=http://127.0.0.1:{peer}")])
            .args(["--unsafe-no-fsync", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log("etcd.log")?)
            .spawn()
            .map_err(|e| format!("etcd: {e}"))?;
        let etcd = Daemon(etcd);
        let f = |name: &str| d.join(name).display().to_string();
        let url = format!("https://127.0.0.1:{secure}");
        let admin = d.join("admin.kubeconfig");
        let user = format!("    client-certificate: {}\n    client-key: {}\n", f("admin.crt"), f("admin.key"));
        kubeconfig(&admin, &url, &d.join("ca.crt"), &user)?;
        let apiserver = apiserver(&bin, d, client, secure, &admin)?;
        Ok(ControlPlane {
            others: Vec::new(),
            apiserver: Some(apiserver),
            ports: (client, secure),
            _etcd: etcd,
            url,
            kubeconfig: admin,
            bin,
            ca_pem,
            log: d.join("apiserver.log"),
            dir,
        })
    }

    /// [`ControlPlane::start`], or None with a message when the archive is
    /// absent outside CI (in CI: a failure).
    pub fn start_or_skip(what: &str) -> Option<ControlPlane> {
        if !archive().is_file() {
            assert!(std::env::var_os("CI").is_none(), "{what}: {} is required in CI", archive().display());
            eprintln!("SKIP: {what} needs {}", archive().display());
            return None;
        }
        match ControlPlane::start() {
            Ok(cp) => Some(cp),
            Err(e) => panic!("{what}: the control plane did not start: {e}"),
        }
    }

    /// The API server's log, its last 40 lines.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// kubectl v1.36.2 as cluster-admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.kubeconfig, args)
    }

    /// kubectl with another kubeconfig.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        kubectl(&self.bin, kubeconfig, args)
    }

    /// Stops the API server (SIGTERM, as a rolling control-plane upgrade
    /// does), keeps it down for `down`, and starts it again on the same
    /// port and etcd; returns once it is ready. Clients' watches break and
    /// resume against a fresh watch cache.
    pub fn restart_apiserver(&mut self, down: Duration) -> Result<(), String> {
        let (client, secure) = self.ports;
        drop(self.apiserver.take());
        std::thread::sleep(down);
        self.apiserver = Some(apiserver(&self.bin, self.dir.path(), client, secure, &self.kubeconfig)?);
        Ok(())
    }

    /// Starts kube-scheduler v1.36.2 (cluster-admin's kubeconfig, no leader
    /// election), which binds pods to the Node objects a test makes; it is
    /// stopped with the control plane.
    pub fn start_scheduler(&mut self) -> Result<(), String> {
        self.start_component("kube-scheduler", &[])
    }

    /// Starts kube-controller-manager v1.36.2 running only `controllers`
    /// (e.g. `daemonset`), with cluster-admin's kubeconfig and no leader
    /// election; it is stopped with the control plane.
    pub fn start_controller_manager(&mut self, controllers: &str) -> Result<(), String> {
        let ca = self.dir.path().join("ca.crt").display().to_string();
        self.start_component(
            "kube-controller-manager",
            &["--controllers", controllers, "--use-service-account-credentials=false", "--root-ca-file", &ca],
        )
    }

    /// A control-plane component with cluster-admin's kubeconfig, no leader
    /// election, its health port free on loopback, its log in `<name>.log`.
    fn start_component(&mut self, name: &str, args: &[&str]) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).map_err(|e| format!("{name}.log: {e}"))?;
        let child = dies_with_us(&mut Command::new(self.bin.join(name)))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .args(["--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port", &free_port()?.to_string(), "--v=1"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        self.others.push(Daemon(child));
        Ok(())
    }

    /// The directory of the certificates, kubeconfigs and logs.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The scheduler's log, its last 40 lines.
    pub fn scheduler_log_tail(&self) -> String {
        self.component_log_tail("kube-scheduler")
    }

    /// The log of a component [`ControlPlane`] started (`kube-scheduler`,
    /// `kube-controller-manager`), its last 40 lines.
    pub fn component_log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A Node object `name` with `labels`, Ready and untainted, with room
    /// for 110 pods (what a kubelet would register and report and the node
    /// lifecycle controller make of it), no kubelet behind it.
    pub fn node(&self, name: &str, labels: &[(&str, &str)]) -> Result<(), String> {
        let labels: String = labels.iter().map(|(k, v)| format!("\n    {k}: \"{v}\"")).collect();
        let node = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:{}\n",
            if labels.is_empty() { " {}".into() } else { labels }
        );
        let file = self.dir.path().join(format!("node-{name}.yaml"));
        std::fs::write(&file, node).map_err(|e| e.to_string())?;
        let run = |args: &[&str]| -> Result<(), String> {
            let out = self.kubectl(args);
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)))
            }
        };
        run(&["apply", "-f", &file.display().to_string()])?;
        let room = r#"{"cpu":"4","memory":"8Gi","pods":"110"}"#;
        let status = format!(
            r#"{{"status":{{"capacity":{room},"allocatable":{room},"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":null}}]}}}}"#
        );
        run(&["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status])?;
        // The API server taints a new Node not-ready (NoSchedule);
        // kube-controller-manager's node lifecycle controller, not run here,
        // lifts it once the node reports Ready.
        run(&["taint", "node", name, "node.kubernetes.io/not-ready:NoSchedule-"])
    }

    /// A kubeconfig authenticating as ServiceAccount `namespace/name`,
    /// with a token the API server issued for it (`kubectl create token`).
    pub fn token_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf, String> {
        let out = self.kubectl(&["-n", namespace, "create", "token", name, "--duration=1h"]);
        if !out.status.success() {
            return Err(format!("kubectl create token {namespace}/{name}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let path = self.dir.path().join(format!("{namespace}-{name}.kubeconfig"));
        kubeconfig(&path, &self.url, &self.dir.path().join("ca.crt"), &format!("    token: {token}\n"))?;
        Ok(path)
    }
}
