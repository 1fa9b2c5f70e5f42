//! A private D-Bus message bus of a test's own (`dbus-daemon` on a unix
//! socket in a temporary directory, never the machine's system bus) with
//! python-dbusmock services on it (`/usr/bin/python3 -m dbusmock --system
//! --template …`, its `DBUS_SYSTEM_BUS_ADDRESS` pointing at that bus), and
//! python-dbus scripts run against it. Everything is killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Kill;

pub const PYTHON: &str = "/usr/bin/python3";
pub const DAEMON: &str = "/usr/bin/dbus-daemon";

/// Whether dbus-daemon and python3-dbusmock are installed; outside CI their
/// absence is a skip with a message, in CI a failure.
pub fn tools_or_skip(what: &str) -> bool {
    let mock = Command::new(PYTHON).args(["-c", "import dbus, dbusmock"]).stderr(Stdio::null()).status();
    if Path::new(DAEMON).is_file() && mock.is_ok_and(|s| s.success()) {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{what}: dbus-daemon and python3-dbusmock must be installed in CI");
    eprintln!("SKIP: {what} need dbus-daemon and python3-dbusmock");
    false
}

/// A private bus and the mocks started on it.
pub struct Bus {
    /// Dropped after the processes (fields drop in order).
    mocks: Vec<Kill>,
    daemon: Option<Kill>,
    /// `unix:path=<dir>/bus`.
    pub address: String,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Bus {
    pub fn start() -> Bus {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("bus");
        let mut bus = Bus { mocks: Vec::new(), daemon: None, address: format!("unix:path={}", socket.display()), socket, dir };
        bus.start_daemon();
        bus
    }

    fn start_daemon(&mut self) {
        let conf = self.dir.path().join("bus.conf");
        let text = format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>{}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            self.address
        );
        std::fs::write(&conf, text).expect("write bus.conf");
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new(DAEMON)
            .arg(format!("--config-file={}", conf.display()))
            .arg("--nofork")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        self.daemon = Some(Kill(child));
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "dbus-daemon did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the mocks and the daemon and starts a new, empty daemon at the
    /// same address (connections to the old one break).
    pub fn restart(&mut self) {
        self.mocks.clear();
        self.daemon = None;
        self.start_daemon();
    }

    /// Starts dbusmock's `template` as a system-bus service and waits until
    /// it owns `name`.
    pub fn mock(&mut self, template: &str, name: &str) {
        let child = Command::new(PYTHON)
            .args(["-m", "dbusmock", "--system", "--template", template])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start python3 -m dbusmock");
        self.mocks.push(Kill(child));
        self.py(&format!(
            "import time\nfor _ in range(500):\n    if bus.name_has_owner({name:?}): break\n    time.sleep(0.02)\nelse:\n    raise SystemExit('{name} did not appear')\n"
        ));
    }

    /// Runs a python-dbus script with `bus` (a connection to this bus),
    /// `dbus` and `MOCK` (dbusmock's interface) defined; returns its stdout.
    pub fn py(&self, script: &str) -> String {
        let prelude = "import sys, dbus\nbus = dbus.bus.BusConnection(sys.argv[1])\nMOCK = 'org.freedesktop.DBus.Mock'\n";
        let out =
            Command::new(PYTHON).arg("-c").arg(format!("{prelude}{script}")).arg(&self.address).output().expect("run /usr/bin/python3");
        assert!(out.status.success(), "python script failed: {}\n{script}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}
