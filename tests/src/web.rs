//! Helpers for the TLS and authentication tests: real certificates made
//! with openssl, real requests made with curl.

use std::path::Path;
use std::process::Command;

use crate::compare::which;

/// openssl and curl are installed (in CI they must be).
pub fn need_tools() -> bool {
    for t in ["openssl", "curl"] {
        if which(t).is_none() {
            assert!(std::env::var_os("CI").is_none(), "{t} is required in CI");
            eprintln!("SKIP: {t} not installed");
            return false;
        }
    }
    true
}

pub fn sh(cmd: &str, dir: &Path) {
    let out = Command::new("sh").arg("-c").arg(cmd).current_dir(dir).output().expect("sh");
    assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a server certificate for 127.0.0.1 signed by it, a client
/// certificate signed by it, and a self-signed client certificate.
pub fn pki(dir: &Path) {
    let key = "openssl req -x509 -newkey rsa:2048 -nodes -days 2";
    sh(&format!("{key} -keyout ca.key -out ca.crt -subj /CN=test-ca"), dir);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write");
    sh("openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1", dir);
    sh("openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.crt", dir);
    sh("openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=prometheus", dir);
    // X.509 v3 with the client-auth usage (WebPKI refuses v1 certificates).
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("write");
    sh("openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.crt", dir);
    sh(&format!("{key} -keyout rogue.key -out rogue.crt -subj /CN=rogue"), dir);
}

/// curl's (HTTP status or 0, body, exit code).
pub fn curl(args: &[&str], url: &str) -> (u16, String, i32) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string(), out.status.code().unwrap_or(-1))
}

/// Waits up to `secs` for `f` to hold.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    f()
}
