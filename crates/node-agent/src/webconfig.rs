//! `--web.config.file`: TLS and basic authentication in the format of
//! Prometheus' exporter-toolkit, served with rustls.
//!
//! A watcher re-reads the file, and the certificate, key and client CA files
//! it names, when they change: a change is applied once the files have
//! stayed the same for one poll (so an in-place rewrite is never read half
//! written). It fails closed: a change that does not load, or that loads
//! but would weaken what is in force (TLS off, a laxer client certificate
//! rule or TLS version, basic auth off or fewer users), is refused and
//! logged at error; the configuration in force stays. Restarting applies
//! any configuration that loads.
//!
//! bcrypt runs off the async workers, one verification at a time (as
//! exporter-toolkit serialises it), the requests waiting for it served a
//! peer at a time in turn (`crate::turns`), and every check against a
//! password takes as long as one against the costliest hash configured,
//! whether the user exists or not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// Why a web configuration does not load, naming the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("--web.config.file {file}: {msg}")]
pub struct Error {
    pub file: String,
    pub msg: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    client_ca: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// The response headers exporter-toolkit lets a configuration set.
const ALLOWED_HEADERS: &[&str] =
    &["Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection", "Content-Security-Policy"];

/// A loaded configuration.
pub struct Loaded {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    users: BTreeMap<String, String>,
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// Authorization header values already verified (bcrypt is slow on
    /// purpose; a scrape every 15 s must not pay it each time).
    verified: Mutex<std::collections::HashSet<String>>,
    /// What the configuration enforces, to refuse a weaker reload.
    strength: Strength,
    /// A hash of the costliest cost configured, checked for unknown users,
    /// and how long one check at that cost takes here.
    dummy: Option<(String, std::time::Duration)>,
    /// The files the configuration reads (itself, certificates, keys, CAs).
    files: Vec<PathBuf>,
}

/// What a configuration enforces, in the order a reload may not go down.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Strength {
    tls: bool,
    /// 0 none, 1 requested, 2 required (any issuer) or verified if given, 3 required and verified.
    client_auth: u8,
    min_tls: u8,
    users: usize,
}

impl Strength {
    /// Why `self` (the new configuration) is weaker than `old`, if it is.
    fn weaker_than(&self, old: &Strength) -> Option<String> {
        if old.tls && !self.tls {
            return Some("it turns TLS off".into());
        }
        if self.client_auth < old.client_auth {
            return Some("it relaxes the client certificate requirement".into());
        }
        if old.tls && self.min_tls < old.min_tls {
            return Some(format!("it lowers the minimum TLS version to 1.{}", self.min_tls.saturating_sub(10)));
        }
        if old.users > 0 && self.users == 0 {
            return Some("it turns basic authentication off".into());
        }
        if self.users < old.users {
            return Some(format!("it has fewer users ({} instead of {})", self.users, old.users));
        }
        None
    }
}

/// Whether a request may proceed.
#[derive(Debug, PartialEq, Eq)]
pub enum Auth {
    Allowed,
    Denied,
}

/// bcrypt verifications run one at a time (exporter-toolkit's rule), on a
/// blocking thread; the requests waiting for one take turns by peer.
static BCRYPT: crate::turns::Turns = crate::turns::Turns::new();

/// A decoded `Authorization: Basic` header.
struct Credentials {
    user: String,
    pass: String,
}

fn credentials(header: &str) -> Option<Credentials> {
    let b64 = header.strip_prefix("Basic ").map(str::trim)?;
    let raw = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).ok()?).ok()?;
    let (user, pass) = raw.split_once(':')?;
    Some(Credentials { user: user.to_string(), pass: pass.to_string() })
}

impl Loaded {
    pub fn none() -> Loaded {
        Loaded {
            tls: None,
            users: BTreeMap::new(),
            headers: Vec::new(),
            verified: Mutex::new(Default::default()),
            strength: Strength::default(),
            dummy: None,
            files: Vec::new(),
        }
    }

    /// Whether requests need credentials.
    pub fn needs_auth(&self) -> bool {
        !self.users.is_empty()
    }

    /// A header verified before, or no authentication configured.
    pub fn authorized_without_bcrypt(&self, header: Option<&str>) -> Option<Auth> {
        if self.users.is_empty() {
            return Some(Auth::Allowed);
        }
        let h = header?;
        if self.verified.lock().is_ok_and(|v| v.contains(h)) {
            return Some(Auth::Allowed);
        }
        None
    }

    /// The bcrypt check of a header (blocking, slow on purpose): against the
    /// user's hash, and one check at the costliest cost configured for every
    /// request (the dummy hash, unless the user's hash is of that cost), so
    /// that every check does the same heavy work whatever the load.
    fn verify(&self, header: &str) -> Auth {
        let Some(c) = credentials(header) else { return Auth::Denied };
        let max_cost = self.dummy.as_ref().and_then(|(d, _)| bcrypt::HashParts::from_str(d).ok()).map(|p| p.get_cost());
        let (ok, costliest) = match self.users.get(&c.user) {
            Some(hash) => {
                let cost = bcrypt::HashParts::from_str(hash).ok().map(|p| p.get_cost());
                (bcrypt::verify(&c.pass, hash).unwrap_or(false), cost.is_some() && cost == max_cost)
            }
            None => (false, false),
        };
        if !costliest {
            if let Some((dummy, _)) = &self.dummy {
                let _ = bcrypt::verify(&c.pass, dummy);
            }
        }
        if !ok {
            return Auth::Denied;
        }
        if let Ok(mut v) = self.verified.lock() {
            if v.len() < 1024 {
                v.insert(header.to_string());
            }
        }
        Auth::Allowed
    }

    /// Checks an `Authorization` header against `basic_auth_users`: cached
    /// headers at once; others with bcrypt on a blocking thread, one at a
    /// time, each padded to the time of the costliest check (no user name
    /// or cost is told by timing). A request that must wait for its check
    /// queues behind one per other peer waiting (`peer`: its address, or
    /// IPv6 /64), holding what `queued` returns until its turn comes (the
    /// server marks its connection as one that may be closed to make room).
    pub async fn authorize<G>(self: &Arc<Self>, header: Option<&str>, peer: std::net::IpAddr, queued: impl FnOnce() -> G) -> Auth {
        if let Some(a) = self.authorized_without_bcrypt(header) {
            return a;
        }
        let Some(h) = header else { return Auth::Denied };
        if !h.starts_with("Basic ") {
            return Auth::Denied;
        }
        let turn = {
            let _queued = queued();
            BCRYPT.take(peer).await
        };
        let this = Arc::clone(self);
        let header = h.to_string();
        let started = std::time::Instant::now();
        // The turn goes with the check: a request that goes meanwhile (its
        // client hung up) does not let the next check start beside it.
        let auth = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            this.verify(&header)
        })
        .await
        .unwrap_or(Auth::Denied);
        if let Some((_, target)) = &self.dummy {
            if let Some(rest) = target.checked_sub(started.elapsed()) {
                tokio::time::sleep(rest).await;
            }
        }
        auth
    }
}

fn err(file: &Path, msg: impl Into<String>) -> Error {
    Error { file: file.display().to_string(), msg: msg.into() }
}

fn tls_version(v: &str, file: &Path, field: &str) -> Result<&'static rustls::SupportedProtocolVersion, Error> {
    match v {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => Err(err(file, format!("tls_server_config.{field}: {v} is not supported (rustls serves TLS 1.2 and 1.3)"))),
        _ => Err(err(file, format!("tls_server_config.{field}: unknown version {v:?} (TLS12, TLS13)"))),
    }
}

fn rank(v: &rustls::SupportedProtocolVersion) -> u8 {
    if v.version == rustls::ProtocolVersion::TLSv1_3 {
        13
    } else {
        12
    }
}

/// Parses and loads a configuration file (relative paths are relative to
/// its directory, as exporter-toolkit resolves them).
pub fn load(path: &Path) -> Result<Loaded, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| err(path, e.to_string()))?;
    let mut files = vec![path.to_path_buf()];
    let f: File = serde_yaml_ng::from_str(&text).map_err(|e| err(path, e.to_string()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let rel = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };

    let mut headers = Vec::new();
    if let Some(h) = &f.http_server_config {
        if h.http2 == Some(true) {
            return Err(err(path, "http_server_config.http2: node-agent serves HTTP/1.1 only"));
        }
        for (k, v) in &h.headers {
            if !ALLOWED_HEADERS.iter().any(|a| a.eq_ignore_ascii_case(k)) {
                return Err(err(
                    path,
                    format!("http_server_config.headers: {k:?} may not be set (allowed: {})", ALLOWED_HEADERS.join(", ")),
                ));
            }
            let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| err(path, format!("http_server_config.headers: {k}: {e}")))?;
            let value = hyper::header::HeaderValue::from_str(v).map_err(|e| err(path, format!("http_server_config.headers: {k}: {e}")))?;
            headers.push((name, value));
        }
    }
    let mut max_cost = 0;
    for (user, hash) in &f.basic_auth_users {
        let parts = bcrypt::HashParts::from_str(hash).map_err(|_| err(path, format!("basic_auth_users.{user}: not a bcrypt hash")))?;
        max_cost = max_cost.max(parts.get_cost());
    }
    let mut strength = Strength { users: f.basic_auth_users.len(), ..Strength::default() };

    let tls = match f.tls_server_config {
        None => None,
        Some(t) => {
            for (set, field) in [
                (t.cipher_suites.is_some(), "cipher_suites"),
                (t.curve_preferences.is_some(), "curve_preferences"),
                (t.client_allowed_sans.is_some(), "client_allowed_sans"),
            ] {
                if set {
                    return Err(err(
                        path,
                        format!("tls_server_config.{field} is not supported: rustls chooses from its own safe defaults"),
                    ));
                }
            }
            let _ = t.prefer_server_cipher_suites;
            let min = tls_version(t.min_version.as_deref().unwrap_or("TLS12"), path, "min_version")?;
            strength.tls = true;
            strength.min_tls = rank(min);
            files.extend([&t.cert_file, &t.key_file, &t.client_ca_file].into_iter().flatten().map(|p| rel(p)));
            let max = tls_version(t.max_version.as_deref().unwrap_or("TLS13"), path, "max_version")?;

            let certs: Vec<CertificateDer<'static>> = match (&t.cert_file, &t.cert) {
                (Some(p), None) => CertificateDer::pem_file_iter(rel(p))
                    .and_then(|i| i.collect())
                    .map_err(|e| err(path, format!("tls_server_config.cert_file {}: {e}", rel(p).display())))?,
                (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| err(path, format!("tls_server_config.cert: {e}")))?,
                (None, None) => return Err(err(path, "tls_server_config: cert_file or cert is required")),
                (Some(_), Some(_)) => return Err(err(path, "tls_server_config: set cert_file or cert, not both")),
            };
            if certs.is_empty() {
                return Err(err(path, "tls_server_config: no certificate found"));
            }
            let key: PrivateKeyDer<'static> = match (&t.key_file, &t.key) {
                (Some(p), None) => PrivateKeyDer::from_pem_file(rel(p))
                    .map_err(|e| err(path, format!("tls_server_config.key_file {}: {e}", rel(p).display())))?,
                (None, Some(pem)) => {
                    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| err(path, format!("tls_server_config.key: {e}")))?
                }
                (None, None) => return Err(err(path, "tls_server_config: key_file or key is required")),
                (Some(_), Some(_)) => return Err(err(path, "tls_server_config: set key_file or key, not both")),
            };
            let versions: Vec<&'static rustls::SupportedProtocolVersion> = [&rustls::version::TLS12, &rustls::version::TLS13]
                .into_iter()
                .filter(|v| rank(v) >= rank(min) && rank(v) <= rank(max))
                .collect();
            if versions.is_empty() {
                return Err(err(path, "tls_server_config: min_version is above max_version"));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&versions)
                .map_err(|e| err(path, e.to_string()))?;
            let auth = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
            strength.client_auth = match auth {
                "RequestClientCert" => 1,
                "RequireAnyClientCert" | "VerifyClientCertIfGiven" => 2,
                "RequireAndVerifyClientCert" => 3,
                _ => 0,
            };
            let roots = || -> Result<Arc<rustls::RootCertStore>, Error> {
                let cas: Vec<CertificateDer<'static>> = match (&t.client_ca_file, &t.client_ca) {
                    (Some(p), _) => CertificateDer::pem_file_iter(rel(p))
                        .and_then(|i| i.collect())
                        .map_err(|e| err(path, format!("tls_server_config.client_ca_file {}: {e}", rel(p).display())))?,
                    (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
                        .collect::<Result<_, _>>()
                        .map_err(|e| err(path, format!("tls_server_config.client_ca: {e}")))?,
                    (None, None) => return Err(err(path, format!("tls_server_config: client_auth_type {auth} needs client_ca_file"))),
                };
                let mut store = rustls::RootCertStore::empty();
                for c in cas {
                    store.add(c).map_err(|e| err(path, format!("tls_server_config.client_ca_file: {e}")))?;
                }
                Ok(Arc::new(store))
            };
            let builder = match auth {
                "NoClientCert" => builder.with_no_client_auth(),
                "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
                    let v = rustls::server::WebPkiClientVerifier::builder_with_provider(roots()?, provider);
                    let v = if auth == "VerifyClientCertIfGiven" { v.allow_unauthenticated() } else { v };
                    builder.with_client_cert_verifier(v.build().map_err(|e| err(path, format!("tls_server_config.client_ca_file: {e}")))?)
                }
                // As Go's crypto/tls: ask for a certificate (and require one)
                // without checking who issued it; the handshake still proves
                // the client holds its key.
                "RequestClientCert" | "RequireAnyClientCert" => builder.with_client_cert_verifier(Arc::new(AnyClientCert {
                    mandatory: auth == "RequireAnyClientCert",
                    algorithms: provider.signature_verification_algorithms,
                })),
                other => return Err(err(path, format!("tls_server_config.client_auth_type: unknown value {other:?}"))),
            };
            let mut cfg =
                builder.with_single_cert(certs, key).map_err(|e| err(path, format!("tls_server_config: certificate and key: {e}")))?;
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(Arc::new(cfg))
        }
    };
    // Unknown users are checked against a hash of the costliest cost, and
    // every check is padded to its time.
    let dummy = if max_cost > 0 {
        let hash = bcrypt::hash("node-agent: no such user", max_cost).map_err(|e| err(path, format!("basic_auth_users: {e}")))?;
        let t = std::time::Instant::now();
        let _ = bcrypt::verify("node-agent: timing", &hash);
        Some((hash, t.elapsed()))
    } else {
        None
    };
    Ok(Loaded { tls, users: f.basic_auth_users, headers, verified: Mutex::new(Default::default()), strength, dummy, files })
}

/// Go's RequestClientCert / RequireAnyClientCert: any certificate, issuer
/// unchecked; only the handshake signature (possession of the key) is.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::server::danger::ClientCertVerifier for AnyClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What identifies a file's content: device, inode, length, mtime and
/// ctime (nanoseconds); `None` when it cannot be read.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), m.mtime() * 1_000_000_000 + m.mtime_nsec(), m.ctime() * 1_000_000_000 + m.ctime_nsec()))
}

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    files.iter().map(|f| stamp(f)).collect()
}

/// How often the watcher looks at the files.
pub const POLL: Duration = Duration::from_secs(1);

/// The configuration in force, and its watcher.
pub struct Handle {
    state: Arc<RwLock<Arc<Loaded>>>,
    stop: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(s) = &self.stop {
            s.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The result of looking at the files once.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// Changed since the last look: applied once stable.
    Settling,
    Applied,
    /// Did not load, or would weaken what is in force.
    Refused(String),
}

/// Decides over successive looks at the files (pure of time: the caller
/// polls).
pub struct Watcher {
    path: PathBuf,
    applied: Vec<Stamp>,
    pending: Option<Vec<Stamp>>,
    refused: Option<Vec<Stamp>>,
}

impl Watcher {
    pub fn new(path: &Path, loaded: &Loaded) -> Watcher {
        Watcher { path: path.to_path_buf(), applied: stamps(&loaded.files), pending: None, refused: None }
    }

    /// Looks once: a change is loaded when the files are as they were at
    /// the previous look (settled), and applied unless it fails or weakens.
    pub fn poll(&mut self, current: &RwLock<Arc<Loaded>>) -> Change {
        let files = current.read().map(|c| c.files.clone()).unwrap_or_default();
        let now = stamps(&files);
        if now == self.applied {
            self.pending = None;
            return Change::None;
        }
        if self.refused.as_ref() == Some(&now) {
            return Change::None;
        }
        if self.pending.as_ref() != Some(&now) {
            self.pending = Some(now);
            return Change::Settling;
        }
        self.pending = None;
        let res = load(&self.path).and_then(|new| {
            let old = current.read().map(|c| c.strength.clone()).unwrap_or_default();
            match new.strength.weaker_than(&old) {
                Some(why) => Err(err(
                    &self.path,
                    format!("refused: {why}; the configuration in force stays (restart node-agent to apply a weaker one)"),
                )),
                None => Ok(new),
            }
        });
        match res {
            Ok(new) => {
                // The new configuration may name other files: watch those.
                self.applied = stamps(&new.files);
                if let Ok(mut c) = current.write() {
                    *c = Arc::new(new);
                }
                self.refused = None;
                Change::Applied
            }
            Err(e) => {
                self.refused = Some(now);
                Change::Refused(e.to_string())
            }
        }
    }
}

impl Handle {
    /// No `--web.config.file`: plain HTTP, no authentication.
    pub fn none() -> Handle {
        Handle { state: Arc::new(RwLock::new(Arc::new(Loaded::none()))), stop: None }
    }

    /// Loads the file (an error here stops start-up) and starts watching it
    /// and the files it names.
    pub fn open(path: &Path) -> Result<Handle, Error> {
        let loaded = load(path)?;
        let mut watcher = Watcher::new(path, &loaded);
        let state = Arc::new(RwLock::new(Arc::new(loaded)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, sp) = (Arc::clone(&state), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("web-config".into())
            .spawn(move || {
                while !sp.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(POLL);
                    match watcher.poll(&st) {
                        Change::Applied => tracing::info!(file = %watcher.path.display(), "web configuration reloaded"),
                        Change::Refused(e) => tracing::error!(error = %e, "web configuration change not applied"),
                        Change::None | Change::Settling => {}
                    }
                }
            })
            .map_err(|e| err(path, format!("starting its watcher: {e}")))?;
        Ok(Handle { state, stop: Some(stop) })
    }

    /// The configuration for a new connection.
    pub fn current(&self) -> Arc<Loaded> {
        self.state.read().map(|s| Arc::clone(&s)).unwrap_or_else(|_| Arc::new(Loaded::none()))
    }

    pub fn tls(&self) -> bool {
        self.state.read().is_ok_and(|s| s.tls.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_user(user: &str, pass: &str) -> Arc<Loaded> {
        let mut l = Loaded::none();
        l.users.insert(user.into(), bcrypt::hash(pass, 4).unwrap());
        l.dummy = Some((bcrypt::hash("x", 4).unwrap(), Duration::ZERO));
        Arc::new(l)
    }

    fn auth(l: &Arc<Loaded>, h: Option<&str>) -> Auth {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(l.authorize(
            h,
            std::net::Ipv4Addr::LOCALHOST.into(),
            || (),
        ))
    }

    fn basic(user: &str, pass: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
    }

    #[test]
    fn basic_auth_checks_and_caches() {
        let l = with_user("prom", "pw");
        assert_eq!(auth(&l, None), Auth::Denied);
        assert_eq!(auth(&l, Some("Bearer x")), Auth::Denied);
        assert_eq!(auth(&l, Some("Basic !!!")), Auth::Denied);
        assert_eq!(auth(&l, Some(&basic("prom", "nope"))), Auth::Denied);
        assert_eq!(auth(&l, Some(&basic("other", "pw"))), Auth::Denied);
        assert_eq!(auth(&l, Some(&basic("prom", "pw"))), Auth::Allowed);
        assert!(l.verified.lock().unwrap().contains(&basic("prom", "pw")), "cached");
        assert_eq!(auth(&Arc::new(Loaded::none()), None), Auth::Allowed, "no users: open");
    }

    #[test]
    fn a_reload_may_not_weaken_what_is_in_force() {
        let full = Strength { tls: true, client_auth: 3, min_tls: 13, users: 2 };
        assert_eq!(full.weaker_than(&full), None);
        assert!(Strength { tls: false, ..full.clone() }.weaker_than(&full).unwrap().contains("TLS off"));
        assert!(Strength { client_auth: 0, ..full.clone() }.weaker_than(&full).unwrap().contains("client certificate"));
        assert!(Strength { min_tls: 12, ..full.clone() }.weaker_than(&full).unwrap().contains("minimum TLS"));
        assert!(Strength { users: 0, ..full.clone() }.weaker_than(&full).unwrap().contains("basic authentication off"));
        assert!(Strength { users: 1, ..full.clone() }.weaker_than(&full).unwrap().contains("fewer users"));
        assert_eq!(full.weaker_than(&Strength::default()), None, "stronger is fine");
        assert_eq!(Strength { users: 3, ..full.clone() }.weaker_than(&full), None, "more users is fine");
    }

    #[test]
    fn the_watcher_refuses_an_empty_file_and_applies_a_settled_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("web.yml");
        let h1 = bcrypt::hash("a", 4).unwrap();
        std::fs::write(&p, format!("basic_auth_users:\n  u1: {h1}\n  u2: {h1}\n")).unwrap();
        let loaded = load(&p).unwrap();
        let mut w = Watcher::new(&p, &loaded);
        let current = RwLock::new(Arc::new(loaded));
        assert_eq!(w.poll(&current), Change::None);
        for weaker in ["", "# only a comment\n", "{}\n", &format!("basic_auth_users:\n  u1: {h1}\n")] {
            std::fs::write(&p, weaker).unwrap();
            assert_eq!(w.poll(&current), Change::Settling, "{weaker:?}");
            assert!(matches!(w.poll(&current), Change::Refused(_)), "{weaker:?} weakens auth");
            assert_eq!(current.read().unwrap().users.len(), 2, "still in force");
        }
        std::fs::write(&p, format!("basic_auth_users:\n  u1: {h1}\n  u2: {h1}\n  u3: {h1}\n")).unwrap();
        assert_eq!(w.poll(&current), Change::Settling);
        assert_eq!(w.poll(&current), Change::Applied);
        assert_eq!(current.read().unwrap().users.len(), 3);
    }
}
