//! The systemd and logind collectors against real D-Bus peers: a private
//! `dbus-daemon` of the test's own (never the machine's system bus) with
//! python-dbusmock's `systemd` and `logind` templates on it, set up with
//! units and sessions in known states through python-dbus, and the
//! collectors run in-process against that bus (their `address` option).
//! The systemd template has no `ListUnits`, no `SystemState`, no
//! `Virtualization` and only the `Id`/`LoadState`/`ActiveState` unit
//! properties: the test adds them (dbusmock's `AddMethod`, `AddProperty`,
//! `AddObject`, `AddProperties`), with the unit objects at the paths real
//! systemd gives them (`foo.service` → `…/unit/foo_2eservice`; the
//! template's own `AddMockUnit` uses another escaping). Also: a missing bus
//! and a peer that never answers fail the collectors quickly, and so does a
//! systemd that answers `ListUnits` and then stalls (its unit properties'
//! `Get` sleeping): the first timed-out call ends the scrape.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use expo::Sink;
use host::collector::{logind, systemd};
use host::Collector;
use node_agent_tests::dbus::{tools_or_skip, Bus};

fn series(sink: &Sink) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            let key = format!("{}{{{}}}", f.name(), l.join(","));
            assert!(out.insert(key.clone(), v).is_none(), "duplicate series {key}");
        }
    }
    out
}

fn scrape(c: &mut dyn Collector) -> BTreeMap<String, f64> {
    let mut sink = Sink::new();
    c.update(&mut sink).expect("collector succeeds");
    series(&sink)
}

fn systemd_options(address: &str, include: &str, exclude: &str) -> systemd::Options {
    systemd::Options {
        include: systemd::anchored("collector.systemd.unit-include", include).expect("include"),
        exclude: systemd::anchored("collector.systemd.unit-exclude", exclude).expect("exclude"),
        private: false,
        task_metrics: true,
        restarts_metrics: true,
        start_time_metrics: true,
        address: Some(address.to_string()),
        fallback: None,
        timeout: Duration::from_secs(5),
    }
}

fn paths() -> host::Paths {
    host::Paths { procfs: "/proc".into(), sysfs: "/sys".into(), rootfs: "/".into(), udev_data: "/run/udev/data".into() }
}

const DEFAULT_EXCLUDE: &str = ".+\\.(automount|device|mount|scope|slice)";

/// `ListUnits` over the mock's unit objects, in path order.
const UNITS: &str = r#"
M = 'org.freedesktop.systemd1'
main = bus.get_object(M, '/org/freedesktop/systemd1')
main.AddMethod(M + '.Manager', 'ListUnits', '', 'a(ssssssouso)',
    'ret = [(o.Get("org.freedesktop.systemd1.Unit", "Id"), "", o.Get("org.freedesktop.systemd1.Unit", "LoadState"), '
    'o.Get("org.freedesktop.systemd1.Unit", "ActiveState"), "", "", dbus.ObjectPath(k), dbus.UInt32(0), "", dbus.ObjectPath("/")) '
    'for k, o in sorted(objects.items()) if k.startswith("/org/freedesktop/systemd1/unit/")]',
    dbus_interface=MOCK)
def unit(name, path, load, active, unit_props={}, **kinds):
    p = '/org/freedesktop/systemd1/unit/' + path
    props = {'Id': name, 'LoadState': load, 'ActiveState': active}
    props.update(unit_props)
    main.AddObject(p, M + '.Unit', props, [], dbus_interface=MOCK)
    for kind, kprops in kinds.items():
        bus.get_object(M, p).AddProperties(M + '.' + kind, kprops, dbus_interface=MOCK)
U64MAX = dbus.UInt64(2**64 - 1)
unit('foo.service', 'foo_2eservice', 'loaded', 'active', {'ActiveEnterTimestamp': dbus.UInt64(1700000000500000)},
     Service={'Type': 'notify', 'NRestarts': dbus.UInt32(3), 'TasksCurrent': dbus.UInt64(5), 'TasksMax': U64MAX})
unit('bar.service', 'bar_2eservice', 'loaded', 'failed', {'ActiveEnterTimestamp': dbus.UInt64(5)},
     Service={'Type': 'simple', 'NRestarts': dbus.UInt32(0), 'TasksCurrent': dbus.UInt64(0), 'TasksMax': dbus.UInt64(100)})
unit('gone.service', 'gone_2eservice', 'not-found', 'inactive')
unit('getty@tty1.service', 'getty_40tty1_2eservice', 'loaded', 'activating', Service={'Type': 'idle'})
unit('web.socket', 'web_2esocket', 'loaded', 'active', {'ActiveEnterTimestamp': dbus.UInt64(1700000001000000)},
     Socket={'NAccepted': dbus.UInt32(7), 'NConnections': dbus.UInt32(2), 'NRefused': dbus.UInt32(1)})
unit('tick.timer', 'tick_2etimer', 'loaded', 'inactive', Timer={'LastTriggerUSec': dbus.UInt64(1600000000250000)})
unit('data.mount', 'data_2emount', 'loaded', 'active', Mount={'Type': 'ext4'})
unit('user.slice', 'user_2eslice', 'loaded', 'active')
unit('odd.service', 'odd_2eservice', 'loaded', 'reloading', Service={'Type': 'oneshot'})
unit('1st.target', '_31st_2etarget', 'loaded', 'active', {'ActiveEnterTimestamp': dbus.UInt64(42000000)})
"#;

const MANAGER_STATE: &str = r#"
main = bus.get_object('org.freedesktop.systemd1', '/org/freedesktop/systemd1')
main.AddProperty('org.freedesktop.systemd1.Manager', 'SystemState', 'running', dbus_interface=MOCK)
main.AddProperty('org.freedesktop.systemd1.Manager', 'Virtualization', 'kvm', dbus_interface=MOCK)
"#;

fn expected_default() -> BTreeMap<String, f64> {
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    let mut put = |k: String, v: f64| {
        want.insert(k, v);
    };
    put("node_systemd_version{version=\"v246\"}".into(), 246.0);
    put("node_systemd_virtualization_info{virtualization_type=\"kvm\"}".into(), 1.0);
    put("node_systemd_system_running{}".into(), 1.0);
    for (s, n) in [("active", 5.0), ("activating", 1.0), ("deactivating", 0.0), ("inactive", 2.0), ("failed", 1.0), ("reloading", 1.0)] {
        put(format!("node_systemd_units{{state={s:?}}}"), n);
    }
    let units = [
        ("foo.service", "active", "notify"),
        ("bar.service", "failed", "simple"),
        ("getty@tty1.service", "activating", "idle"),
        ("web.socket", "active", ""),
        ("tick.timer", "inactive", ""),
        ("odd.service", "reloading", "oneshot"),
        ("1st.target", "active", ""),
    ];
    for (name, active, ty) in units {
        for s in systemd::UNIT_STATES {
            put(format!("node_systemd_unit_state{{name={name:?},state={s:?},type={ty:?}}}"), if s == active { 1.0 } else { 0.0 });
        }
    }
    for (name, v) in [
        ("foo.service", 1700000000.5),
        ("bar.service", 0.0),
        ("getty@tty1.service", 0.0),
        ("web.socket", 1700000001.0),
        ("tick.timer", 0.0),
        ("odd.service", 0.0),
        ("1st.target", 42.0),
    ] {
        put(format!("node_systemd_unit_start_time_seconds{{name={name:?}}}"), v);
    }
    put("node_systemd_service_restart_total{name=\"foo.service\"}".into(), 3.0);
    put("node_systemd_service_restart_total{name=\"bar.service\"}".into(), 0.0);
    put("node_systemd_unit_tasks_current{name=\"foo.service\"}".into(), 5.0);
    put("node_systemd_unit_tasks_current{name=\"bar.service\"}".into(), 0.0);
    put("node_systemd_unit_tasks_max{name=\"bar.service\"}".into(), 100.0);
    put("node_systemd_timer_last_trigger_seconds{name=\"tick.timer\"}".into(), 1600000000.25);
    put("node_systemd_socket_accepted_connections_total{name=\"web.socket\"}".into(), 7.0);
    put("node_systemd_socket_current_connections{name=\"web.socket\"}".into(), 2.0);
    put("node_systemd_socket_refused_connections_total{name=\"web.socket\"}".into(), 1.0);
    want
}

fn diff(got: &BTreeMap<String, f64>, want: &BTreeMap<String, f64>) -> String {
    let mut out = String::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push_str(&format!("missing {k} {v}\n")),
            Some(g) if g != v => out.push_str(&format!("{k}: got {g}, want {v}\n")),
            _ => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            out.push_str(&format!("extra {k} {v}\n"));
        }
    }
    out
}

#[test]
fn systemd_series_equal_the_mocked_units() {
    if !tools_or_skip("the D-Bus truth tests") {
        return;
    }
    let t0 = Instant::now();
    let mut bus = Bus::start();
    bus.mock("systemd", "org.freedesktop.systemd1");
    bus.py(UNITS);

    // The template lacks SystemState: from version 212 node_exporter fails.
    let mut c = systemd::Collector::new(systemd_options(&bus.address, ".+", DEFAULT_EXCLUDE), &paths()).expect("collector");
    let err = c.update(&mut Sink::new()).expect_err("no SystemState is a failure");
    assert!(err.to_string().contains("couldn't get system state"), "{err}");

    bus.py(MANAGER_STATE);
    let got = scrape(&mut c);
    let d = diff(&got, &expected_default());
    assert!(d.is_empty(), "systemd series differ:\n{d}");

    // The peer's own view: node_systemd_units counts every listed unit.
    let listed: usize = bus
        .py("print(len(bus.get_object('org.freedesktop.systemd1', '/org/freedesktop/systemd1').ListUnits(dbus_interface='org.freedesktop.systemd1.Manager')))")
        .trim()
        .parse()
        .expect("count");
    let counted: f64 = got.iter().filter(|(k, _)| k.starts_with("node_systemd_units{")).map(|(_, v)| v).sum();
    assert_eq!(counted, listed as f64);

    // Include and exclude, anchored: `foo` alone matches no unit.
    let mut f =
        systemd::Collector::new(systemd_options(&bus.address, "(foo|bar)\\.service|web\\..*", "bar.*"), &paths()).expect("collector");
    let got = scrape(&mut f);
    let names: std::collections::BTreeSet<&str> =
        got.keys().filter(|k| k.starts_with("node_systemd_unit_state{")).filter_map(|k| k.split('"').nth(1)).collect();
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["foo.service", "web.socket"]);
    assert_eq!(got["node_systemd_units{state=\"active\"}"], 5.0, "the summary counts unfiltered units");
    let mut f = systemd::Collector::new(systemd_options(&bus.address, "foo", ""), &paths()).expect("collector");
    assert!(!scrape(&mut f).keys().any(|k| k.starts_with("node_systemd_unit_state")), "patterns are anchored");

    // A state change, read over the kept connection.
    bus.py(
        "bus.get_object('org.freedesktop.systemd1', '/org/freedesktop/systemd1/unit/bar_2eservice').UpdateProperties('org.freedesktop.systemd1.Unit', {'ActiveState': 'active'}, dbus_interface=MOCK)",
    );
    let got = scrape(&mut c);
    assert_eq!(got["node_systemd_unit_state{name=\"bar.service\",state=\"active\",type=\"simple\"}"], 1.0);
    assert_eq!(got["node_systemd_unit_state{name=\"bar.service\",state=\"failed\",type=\"simple\"}"], 0.0);
    assert_eq!(got["node_systemd_units{state=\"active\"}"], 6.0);
    assert_eq!(got["node_systemd_units{state=\"failed\"}"], 0.0);
    assert_eq!(got["node_systemd_unit_start_time_seconds{name=\"bar.service\"}"], 5e-6);

    // The bus restarts: the kept connection breaks, the same scrape reconnects.
    bus.restart();
    bus.mock("systemd", "org.freedesktop.systemd1");
    bus.py(UNITS);
    bus.py(MANAGER_STATE);
    let got = scrape(&mut c);
    let d = diff(&got, &expected_default());
    assert!(d.is_empty(), "after a bus restart:\n{d}");
    // A generous bound (a loaded CI), far below what a hang would take.
    assert!(t0.elapsed() < Duration::from_secs(120), "took {:?}", t0.elapsed());
}

const SESSIONS: &str = r#"
L = 'org.freedesktop.login1'
S = L + '.Session'
m = bus.get_object(L, '/org/freedesktop/login1')
m.AddSeat('seat1', dbus_interface=MOCK)
m.AddSession('c1', 'seat0', dbus.UInt32(1000), 'alice', True, dbus_interface=MOCK)
s3 = m.AddSession('c3', 'seat1', dbus.UInt32(1000), 'alice', True, dbus_interface=MOCK)
# A remote session without a seat, which the template's AddSession cannot make.
m.AddObject('/org/freedesktop/login1/session/c2', S, {'Id': 'c2', 'Name': 'bob', 'Remote': True, 'Type': 'tty',
    'Class': 'greeter', 'User': dbus.Struct((dbus.UInt32(1001), dbus.ObjectPath('/org/freedesktop/login1/user/1001')), signature='uo'),
    'Seat': dbus.Struct(('', dbus.ObjectPath('/')), signature='so')}, [], dbus_interface=MOCK)
bus.get_object(L, s3).UpdateProperties(S, {'Type': 'wayland', 'Class': 'manager'}, dbus_interface=MOCK)
"#;

/// The peer's own view, as `seat remote type class` lines after the seats.
const VIEW: &str = r#"
L = 'org.freedesktop.login1'
m = bus.get_object(L, '/org/freedesktop/login1')
print(' '.join(s[0] for s in m.ListSeats(dbus_interface=L + '.Manager')))
for s in m.ListSessions(dbus_interface=L + '.Manager'):
    o = bus.get_object(L, s[4])
    g = lambda n: o.Get(L + '.Session', n, dbus_interface='org.freedesktop.DBus.Properties')
    print('%s|%s|%s|%s' % (s[3], 'true' if g('Remote') else 'false', g('Type'), g('Class')))
"#;

#[test]
fn logind_sessions_equal_the_mocked_sessions() {
    if !tools_or_skip("the D-Bus truth tests") {
        return;
    }
    let mut bus = Bus::start();
    bus.mock("logind", "org.freedesktop.login1");
    let o = || logind::Options { address: Some(bus.address.clone()), timeout: Duration::from_secs(5) };
    let mut c = logind::Collector::new(o(), &paths()).expect("collector");

    // No seats, no sessions: the empty seat's 70 zero series.
    let got = scrape(&mut c);
    assert_eq!(got.len(), 2 * 7 * 5);
    assert!(got.values().all(|v| *v == 0.0));

    bus.py(SESSIONS);
    let view = bus.py(VIEW);
    let mut lines = view.lines();
    let mut seats: Vec<String> = lines.next().unwrap_or("").split_whitespace().map(str::to_string).collect();
    seats.push(String::new());
    let known = |v: &str, k: &[&str]| if k.contains(&v) { v.to_string() } else { "other".to_string() };
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    for remote in logind::REMOTE_VALUES {
        for ty in logind::TYPE_VALUES {
            for class in logind::CLASS_VALUES {
                for seat in &seats {
                    want.insert(format!("node_logind_sessions{{class={class:?},remote={remote:?},seat={seat:?},type={ty:?}}}"), 0.0);
                }
            }
        }
    }
    for l in lines {
        let f: Vec<&str> = l.split('|').collect();
        let key = format!(
            "node_logind_sessions{{class={:?},remote={:?},seat={:?},type={:?}}}",
            known(f[3], &logind::CLASS_VALUES),
            f[1],
            f[0],
            known(f[2], &logind::TYPE_VALUES)
        );
        *want.get_mut(&key).unwrap_or_else(|| panic!("{key} not among the series")) += 1.0;
    }
    // The view is what the script set up.
    assert_eq!(seats, ["seat1", "seat0", ""]);
    assert_eq!(want.len(), 2 * 7 * 5 * 3);
    assert_eq!(want["node_logind_sessions{class=\"user\",remote=\"false\",seat=\"seat0\",type=\"other\"}"], 1.0);
    assert_eq!(want["node_logind_sessions{class=\"greeter\",remote=\"true\",seat=\"\",type=\"tty\"}"], 1.0);
    assert_eq!(want["node_logind_sessions{class=\"other\",remote=\"false\",seat=\"seat1\",type=\"wayland\"}"], 1.0);

    let got = scrape(&mut c);
    let d = diff(&got, &want);
    assert!(d.is_empty(), "logind series differ:\n{d}");
}

#[test]
fn no_bus_or_a_silent_peer_fails_quickly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = format!("unix:path={}", dir.path().join("none").display());
    let t = Instant::now();
    let mut s = systemd::Collector::new(systemd_options(&missing, ".+", DEFAULT_EXCLUDE), &paths()).expect("collector");
    let e = s.update(&mut Sink::new()).expect_err("no bus");
    eprintln!("systemd without a bus: {e}");
    assert!(e.to_string().contains("couldn't get dbus connection"), "{e}");
    let mut l =
        logind::Collector::new(logind::Options { address: Some(missing), timeout: Duration::from_secs(5) }, &paths()).expect("collector");
    let e = l.update(&mut Sink::new()).expect_err("no bus");
    eprintln!("logind without a bus: {e}");
    assert!(e.to_string().contains("unable to connect to dbus"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());

    // A socket that accepts and never answers the authentication.
    let path = dir.path().join("silent");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let mut o = systemd_options(&format!("unix:path={}", path.display()), ".+", DEFAULT_EXCLUDE);
    o.timeout = Duration::from_millis(500);
    let mut s = systemd::Collector::new(o, &paths()).expect("collector");
    for _ in 0..2 {
        let t = Instant::now();
        let e = s.update(&mut Sink::new()).expect_err("silent peer");
        eprintln!("systemd with a silent peer: {e} ({:?})", t.elapsed());
        assert!(e.to_string().contains("timed out"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    }
    drop(listener);
}

/// bar.service's `Properties.Get` sleeps, blocking the mock's main loop:
/// every later call stalls too.
const STALL: &str = r#"
bus.get_object('org.freedesktop.systemd1', '/org/freedesktop/systemd1/unit/bar_2eservice').AddMethod(
    'org.freedesktop.DBus.Properties', 'Get', 'ss', 'v', 'import time\ntime.sleep(15)\nret = ""', dbus_interface=MOCK)
"#;

#[test]
fn systemd_fails_at_once_when_unit_properties_stall() {
    if !tools_or_skip("the D-Bus truth tests") {
        return;
    }
    let mut bus = Bus::start();
    bus.mock("systemd", "org.freedesktop.systemd1");
    bus.py(UNITS);
    bus.py(MANAGER_STATE);
    let mut o = systemd_options(&bus.address, ".+", DEFAULT_EXCLUDE);
    o.timeout = Duration::from_secs(1);
    let mut c = systemd::Collector::new(o, &paths()).expect("collector");
    scrape(&mut c);
    bus.py(STALL);
    // The kept connection: bar.service's Type (its first unit property)
    // times out, and the scrape ends there instead of waiting a timeout for
    // each of the ~20 unit properties after it.
    let t = Instant::now();
    let e = c.update(&mut Sink::new()).expect_err("a stalled systemd");
    eprintln!("systemd stalling on unit properties: {e} ({:?})", t.elapsed());
    assert!(e.to_string().contains("couldn't get the Type of bar.service") && e.to_string().contains("timed out"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
    // The next scrape, on a new connection: the stalled Version ends it.
    let t = Instant::now();
    let e = c.update(&mut Sink::new()).expect_err("still stalled");
    eprintln!("systemd still stalled: {e} ({:?})", t.elapsed());
    assert!(e.to_string().contains("Version") && e.to_string().contains("timed out"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
}
