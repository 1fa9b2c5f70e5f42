//! `--web.config.file` (exporter-toolkit format) with real clients (curl)
//! and real certificates (openssl): TLS, TLS version bounds, mTLS with
//! RequireAndVerifyClientCert, RequestClientCert and RequireAnyClientCert, basic auth with bcrypt hashes, response
//! headers, reload on change without a restart, and bad files failing at
//! start-up naming the file and the field.

use std::path::Path;
use std::process::Command;

use node_agent_tests::web::{curl, eventually, need_tools, pki};

fn start(config: &Path) -> Result<node_agent::agent::Agent, String> {
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent",
            "--web.listen-address=127.0.0.1:0",
            "--collector.disable-defaults",
            "--collector.loadavg",
            &format!("--web.config.file={}", config.display()),
        ])
        .expect("flags");
    node_agent::agent::Agent::start(&m).map_err(|e| e.to_string())
}

#[test]
fn tls_mtls_basic_auth_headers_and_reload() {
    if !need_tools() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    pki(d);
    let hash = bcrypt::hash("s3cret", 4).expect("bcrypt");
    let cfg = d.join("web.yml");
    // Relative paths resolve against the file's directory.
    std::fs::write(
        &cfg,
        format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\nbasic_auth_users:\n  prometheus: {hash}\n"),
    )
    .expect("write");
    let agent = start(&cfg).expect("starts");
    let url = format!("https://127.0.0.1:{}/metrics", agent.addrs[0].port());
    let ca = d.join("ca.crt").display().to_string();

    // Right credentials over verified TLS: data, and the configured header.
    let (code, body, _) = curl(&["--cacert", &ca, "-u", "prometheus:s3cret"], &url);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("node_load1 "));
    let out = Command::new("curl")
        .args(["-sS", "-D", "-", "-o", "/dev/null", "--cacert", &ca, "-u", "prometheus:s3cret"])
        .arg(&url)
        .output()
        .expect("curl");
    assert!(String::from_utf8_lossy(&out.stdout).to_lowercase().contains("x-frame-options: deny"));
    // Wrong or missing credentials: 401 and no data.
    for creds in [vec!["-u", "prometheus:wrong"], vec!["-u", "nobody:s3cret"], vec![]] {
        let mut args = vec!["--cacert", ca.as_str()];
        args.extend(creds.iter().copied());
        let (code, body, _) = curl(&args, &url);
        assert_eq!(code, 401, "{creds:?}");
        assert!(!body.contains("node_"), "no data without the right credentials");
    }
    // Plain HTTP on the TLS port gets nothing.
    let (code, body, _) = curl(&[], &url.replace("https", "http"));
    assert!(code != 200 && !body.contains("node_load1"));

    // Reload: TLS 1.3 only and mutual TLS, without a restart.
    std::fs::write(
        &cfg,
        format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  min_version: TLS13\nbasic_auth_users:\n  prometheus: {hash}\n"),
    )
    .expect("rewrite");
    // Applied by the watcher once the file has settled (within two polls).
    let refused = eventually(5, || curl(&["--cacert", &ca, "-u", "prometheus:s3cret"], &url).0 == 0);
    let (code, _, exit) = curl(&["--cacert", &ca, "-u", "prometheus:s3cret"], &url);
    assert!(refused && code == 0, "no client certificate: the handshake is refused (curl exit {exit})");
    let (client, client_key, rogue, rogue_key) = (d.join("client.crt"), d.join("client.key"), d.join("rogue.crt"), d.join("rogue.key"));
    let (code, body, _) = curl(
        &["--cacert", &ca, "-u", "prometheus:s3cret", "--cert", &client.display().to_string(), "--key", &client_key.display().to_string()],
        &url,
    );
    assert_eq!(code, 200, "a certificate from the client CA is accepted: {body}");
    let (code, _, _) = curl(
        &["--cacert", &ca, "-u", "prometheus:s3cret", "--cert", &rogue.display().to_string(), "--key", &rogue_key.display().to_string()],
        &url,
    );
    assert_eq!(code, 0, "a certificate from another CA is refused");
    let (code, _, _) = curl(
        &[
            "--cacert",
            &ca,
            "-u",
            "prometheus:s3cret",
            "--cert",
            &client.display().to_string(),
            "--key",
            &client_key.display().to_string(),
            "--tls-max",
            "1.2",
        ],
        &url,
    );
    assert_eq!(code, 0, "TLS 1.2 is refused under min_version TLS13");

    // A broken change is not applied: the previous configuration stays in force.
    std::fs::write(&cfg, "tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n").expect("rewrite");
    std::thread::sleep(node_agent::webconfig::POLL * 3);
    let (code, _, _) = curl(
        &["--cacert", &ca, "-u", "prometheus:s3cret", "--cert", &client.display().to_string(), "--key", &client_key.display().to_string()],
        &url,
    );
    assert_eq!(code, 200, "still served with the last good configuration");
}

/// Go's RequestClientCert and RequireAnyClientCert: a certificate is asked
/// for (and required) but its issuer is not checked.
#[test]
fn request_and_require_any_client_cert() {
    if !need_tools() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    pki(d);
    let cfg = d.join("web.yml");
    let ca = d.join("ca.crt").display().to_string();
    let (rogue, rogue_key) = (d.join("rogue.crt").display().to_string(), d.join("rogue.key").display().to_string());
    let (client, client_key) = (d.join("client.crt").display().to_string(), d.join("client.key").display().to_string());
    for (auth, without_cert) in [("RequireAnyClientCert", 0), ("RequestClientCert", 200)] {
        std::fs::write(&cfg, format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: {auth}\n"))
            .expect("write");
        let agent = start(&cfg).expect("starts");
        let url = format!("https://127.0.0.1:{}/metrics", agent.addrs[0].port());
        let (code, _, exit) = curl(&["--cacert", &ca], &url);
        assert_eq!(code, without_cert, "{auth} without a certificate (curl exit {exit})");
        let (code, body, _) = curl(&["--cacert", &ca, "--cert", &rogue, "--key", &rogue_key], &url);
        assert_eq!(code, 200, "{auth}: a self-signed certificate is accepted: {body}");
        assert!(body.contains("node_load1 "));
        let (code, _, _) = curl(&["--cacert", &ca, "--cert", &client, "--key", &client_key], &url);
        assert_eq!(code, 200, "{auth}: a CA-signed one too");
    }
}

#[test]
fn bad_web_config_files_fail_at_start_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("web.yml");
    for (text, want) in [
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  bogus: 1\n", "unknown field `bogus`"),
        ("basic_auth_users:\n  me: plaintext\n", "basic_auth_users.me: not a bcrypt hash"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "tls_server_config.cert_file"),
        ("tls_server_config:\n  key_file: k\n", "cert_file or cert is required"),
        ("http_server_config:\n  headers:\n    Set-Cookie: x\n", "may not be set"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n", "not supported"),
    ] {
        std::fs::write(&cfg, text).expect("write");
        let e = match start(&cfg) {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(e) => e,
        };
        assert!(e.contains("--web.config.file") && e.contains(want), "{text:?}: {e}");
    }
}

/// One request on a kept-alive connection: the status code.
fn request_on(s: &mut std::net::TcpStream, auth: &str) -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n").as_bytes()).expect("write");
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).expect("status line");
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).expect("header");
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("code")
}

fn basic(user: &str, password: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = format!("{user}:{password}").into_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// The web config is read per request: after a password rotation the old
/// password gets 401 on a connection kept alive from before it, and the
/// new one is accepted on that same connection (it used to be captured
/// per connection at accept, and kept working for as long as it stayed open).
#[test]
fn a_rotated_password_is_refused_on_a_kept_alive_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("web.yml");
    let hash = |p: &str| bcrypt::hash(p, 4).expect("bcrypt");
    std::fs::write(&cfg, format!("basic_auth_users:\n  prometheus: {}\n", hash("old"))).expect("write");
    let agent = start(&cfg).expect("start");
    let mut s = std::net::TcpStream::connect(agent.addrs[0]).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    assert_eq!(basic("prometheus", "old"), "cHJvbWV0aGV1czpvbGQ=");
    assert_eq!(request_on(&mut s, &basic("prometheus", "old")), 200);
    std::fs::write(&cfg, format!("basic_auth_users:\n  prometheus: {}\n", hash("new"))).expect("rotate");
    let t = std::time::Instant::now();
    loop {
        let code = request_on(&mut s, &basic("prometheus", "old"));
        if code == 401 {
            break;
        }
        assert!(t.elapsed() < node_agent::webconfig::POLL * 5, "the old password still works on the kept-alive connection");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(request_on(&mut s, &basic("prometheus", "new")), 200, "the new password, same connection");
}
