//! `--web.config.file`: TLS and basic authentication in the format of
//! Prometheus' exporter-toolkit, served with rustls. The file is re-read
//! when it changes (checked on each new connection); a change that does not
//! load is logged and the previous configuration stays in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

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
}

/// A bcrypt hash (cost 10) checked against for unknown users.
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// Whether a request may proceed.
#[derive(Debug, PartialEq, Eq)]
pub enum Auth {
    Allowed,
    Denied,
}

impl Loaded {
    pub fn none() -> Loaded {
        Loaded { tls: None, users: BTreeMap::new(), headers: Vec::new(), verified: Mutex::new(Default::default()) }
    }

    /// Checks an `Authorization` header against `basic_auth_users`.
    pub fn authorize(&self, header: Option<&str>) -> Auth {
        if self.users.is_empty() {
            return Auth::Allowed;
        }
        let Some(h) = header else { return Auth::Denied };
        if self.verified.lock().is_ok_and(|v| v.contains(h)) {
            return Auth::Allowed;
        }
        let Some(b64) = h.strip_prefix("Basic ").map(str::trim) else { return Auth::Denied };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64) else { return Auth::Denied };
        let Ok(raw) = String::from_utf8(raw) else { return Auth::Denied };
        let Some((user, pass)) = raw.split_once(':') else { return Auth::Denied };
        let Some(hash) = self.users.get(user) else {
            // Spend the same time as for a known user (no user enumeration).
            let _ = bcrypt::verify(pass, DUMMY_HASH);
            return Auth::Denied;
        };
        if bcrypt::verify(pass, hash).unwrap_or(false) {
            if let Ok(mut v) = self.verified.lock() {
                if v.len() < 1024 {
                    v.insert(h.to_string());
                }
            }
            Auth::Allowed
        } else {
            Auth::Denied
        }
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
    for (user, hash) in &f.basic_auth_users {
        if bcrypt::HashParts::from_str(hash).is_err() {
            return Err(err(path, format!("basic_auth_users.{user}: not a bcrypt hash")));
        }
    }

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
    Ok(Loaded { tls, users: f.basic_auth_users, headers, verified: Mutex::new(Default::default()) })
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

/// A file's modification time and length: a change to either reloads it.
type Stamp = Option<(SystemTime, u64)>;

/// The configuration in force, re-read when its file changes.
pub struct Handle {
    path: Option<PathBuf>,
    state: RwLock<(Stamp, Arc<Loaded>)>,
}

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl Handle {
    /// No `--web.config.file`: plain HTTP, no authentication.
    pub fn none() -> Handle {
        Handle { path: None, state: RwLock::new((None, Arc::new(Loaded::none()))) }
    }

    /// Loads the file; an error here stops start-up.
    pub fn open(path: &Path) -> Result<Handle, Error> {
        let stamp = stamp(path);
        let loaded = load(path)?;
        Ok(Handle { path: Some(path.to_path_buf()), state: RwLock::new((stamp, Arc::new(loaded))) })
    }

    /// The configuration for a new connection, reloading a changed file.
    pub fn current(&self) -> Arc<Loaded> {
        let Some(path) = &self.path else {
            return self.state.read().map(|s| Arc::clone(&s.1)).unwrap_or_else(|_| Arc::new(Loaded::none()));
        };
        let now = stamp(path);
        if let Ok(s) = self.state.read() {
            if s.0 == now {
                return Arc::clone(&s.1);
            }
        }
        let Ok(mut s) = self.state.write() else { return Arc::new(Loaded::none()) };
        if s.0 != now {
            match load(path) {
                Ok(l) => {
                    tracing::info!(file = %path.display(), "web configuration reloaded");
                    s.1 = Arc::new(l);
                }
                Err(e) => tracing::error!(error = %e, "web configuration change not applied; the previous one stays in force"),
            }
            s.0 = now;
        }
        Arc::clone(&s.1)
    }

    pub fn tls(&self) -> bool {
        self.state.read().is_ok_and(|s| s.1.tls.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_user(user: &str, pass: &str) -> Loaded {
        let mut l = Loaded::none();
        l.users.insert(user.into(), bcrypt::hash(pass, 4).unwrap());
        l
    }

    fn basic(user: &str, pass: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
    }

    #[test]
    fn basic_auth_checks_and_caches() {
        assert!(bcrypt::HashParts::from_str(DUMMY_HASH).is_ok(), "the dummy hash is a real bcrypt hash");
        let l = with_user("prom", "pw");
        assert_eq!(l.authorize(None), Auth::Denied);
        assert_eq!(l.authorize(Some("Bearer x")), Auth::Denied);
        assert_eq!(l.authorize(Some("Basic !!!")), Auth::Denied);
        assert_eq!(l.authorize(Some(&basic("prom", "nope"))), Auth::Denied);
        assert_eq!(l.authorize(Some(&basic("other", "pw"))), Auth::Denied);
        assert_eq!(l.authorize(Some(&basic("prom", "pw"))), Auth::Allowed);
        assert!(l.verified.lock().unwrap().contains(&basic("prom", "pw")), "cached");
        assert_eq!(Loaded::none().authorize(None), Auth::Allowed, "no users: open");
    }
}
