//! `ntp` (deprecated in node_exporter, default off): one SNTP query (RFC
//! 5905, a 48-byte client-mode packet of `--collector.ntp.protocol-version`,
//! sent with IP TTL `--collector.ntp.ip-ttl`, 1 s timeout) to the local NTP
//! server `--collector.ntp.server`:`--collector.ntp.server-port` per scrape,
//! exported as node_exporter 1.12.1 does through github.com/beevik/ntp
//! v1.5.0: `node_ntp_stratum`, `_leap`, `_rtt_seconds`, `_offset_seconds`,
//! `_reference_timestamp_seconds`, `_root_delay_seconds`,
//! `_root_dispersion_seconds`, and `_sanity` (1 when the reply passes
//! beevik's RFC 5905 validation, its root distance is within
//! `--collector.ntp.max-distance` and its minimum error within
//! `--collector.ntp.local-offset-tolerance`, plus one second around a
//! announced leap second's midnight). A failed query fails the scrape.
//! The 1 s timeout covers the exchange; resolving the server's name
//! (`getaddrinfo`, per scrape as beevik's client does) has no time limit of
//! its own and is bounded by the scraper's per-collector deadline
//! (`--collector.timeout`), past which the scrape goes on without this
//! collector.
//!
//! The packet is encoded and decoded here, by pure functions, rather than
//! through a crate: none of the maintained Rust SNTP clients (rsntp, sntpc)
//! exposes every field this needs together with the four raw timestamps
//! (beevik's minimum error is computed from them) and lets the protocol
//! version be 2, and beevik's exact integer arithmetic (Q32.32 and Q16.16 to
//! nanoseconds with its rounding, era handling, offset and RTT formulas) is
//! what makes the figures equal node_exporter's.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::flags::{self, BoolFlag, Flags, IntFlag, SignedDurationFlag, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const SERVER: StringFlag =
    StringFlag { name: "collector.ntp.server", default: "127.0.0.1", help: "NTP server to use for ntp collector" };
pub const PORT: IntFlag<i64> =
    IntFlag { name: "collector.ntp.server-port", default: 123, help: "UDP port number to connect to on NTP server" };
pub const VERSION: IntFlag<i64> = IntFlag { name: "collector.ntp.protocol-version", default: 4, help: "NTP protocol version" };
pub const IS_LOCAL: BoolFlag = BoolFlag {
    name: "collector.ntp.server-is-local",
    default: false,
    help: "Certify that collector.ntp.server address is not a public ntp server",
};
pub const TTL: IntFlag<i64> = IntFlag { name: "collector.ntp.ip-ttl", default: 1, help: "IP TTL to use while sending NTP query" };
pub const MAX_DISTANCE: SignedDurationFlag =
    SignedDurationFlag { name: "collector.ntp.max-distance", default: "3.46608s", help: "Max accumulated distance to the root" };
pub const TOLERANCE: SignedDurationFlag = SignedDurationFlag {
    name: "collector.ntp.local-offset-tolerance",
    default: "1ms",
    help: "Offset between local clock and local ntpd time to tolerate",
};

const NANOS: i64 = 1_000_000_000;
const DAY: i128 = 86_400 * NANOS as i128;
/// Seconds from 1900-01-01 (NTP era 0) to the Unix epoch.
const ERA0_UNIX: i128 = -2_208_988_800;
/// 2036-02-07T06:28:16Z, where NTP era 1 starts, in Unix seconds.
const ERA1_UNIX: i128 = 2_085_978_496;
/// beevik's query timeout as node_exporter sets it ("default ntpdate timeout").
const TIMEOUT: Duration = Duration::from_secs(1);
/// beevik's maxPollInterval (2^17 s) and maxDispersion (16 s), in ns.
const MAX_POLL: i64 = (1 << 17) * NANOS;
const MAX_DISPERSION: i64 = 16 * NANOS;

pub struct Options {
    pub server: String,
    pub port: i64,
    pub version: i64,
    pub server_is_local: bool,
    pub ip_ttl: i64,
    /// Nanoseconds (Go durations may be negative).
    pub max_distance: i64,
    pub offset_tolerance: i64,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&SERVER, &PORT, &VERSION, &IS_LOCAL, &TTL, &MAX_DISTANCE, &TOLERANCE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options {
            server: SERVER.get(f),
            port: PORT.get(f)?,
            version: VERSION.get(f)?,
            server_is_local: IS_LOCAL.get(f),
            ip_ttl: TTL.get(f)?,
            max_distance: MAX_DISTANCE.get(f)?,
            offset_tolerance: TOLERANCE.get(f)?,
        })
    }

    /// node_exporter's start-up checks, in its order.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let loopback = self.server.parse::<IpAddr>().map(|ip| ip.to_canonical().is_loopback()).unwrap_or(false);
        if !self.server_is_local && !loopback {
            return Err(SERVER.invalid(format!("only IP address of local NTP server is valid for --{}", SERVER.name)));
        }
        if !(2..=4).contains(&self.version) {
            return Err(VERSION.invalid(format!("invalid NTP protocol version {}; must be 2, 3, or 4", self.version)));
        }
        if self.offset_tolerance < 0 {
            return Err(TOLERANCE.invalid("offset tolerance must be non-negative"));
        }
        if !(1..=65535).contains(&self.port) {
            return Err(PORT.invalid(format!("invalid NTP port number {}; must be between 1 and 65535 inclusive", self.port)));
        }
        Ok(())
    }
}

/// The 48-byte NTP header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub li_vn_mode: u8,
    pub stratum: u8,
    pub poll: i8,
    pub precision: i8,
    pub root_delay: u32,
    pub root_dispersion: u32,
    pub reference_id: u32,
    pub reference_time: u64,
    pub origin_time: u64,
    pub receive_time: u64,
    pub transmit_time: u64,
}

impl Header {
    pub fn leap(&self) -> u8 {
        self.li_vn_mode >> 6
    }
    pub fn version(&self) -> u8 {
        (self.li_vn_mode >> 3) & 7
    }
    pub fn mode(&self) -> u8 {
        self.li_vn_mode & 7
    }
}

/// beevik's query: client mode (3), `version`, no leap warning, precision
/// 0x20, and a random transmit timestamp (not the clock: RFC 5905 data
/// minimisation), which the reply must echo as its origin.
pub fn encode_request(version: u8, transmit: u64) -> [u8; 48] {
    let mut p = [0u8; 48];
    p[0] = ((version & 7) << 3) | 3;
    p[3] = 0x20;
    p[40..48].copy_from_slice(&transmit.to_be_bytes());
    p
}

/// Decodes the header of a reply (extra bytes, extensions and MACs, are ignored).
pub fn decode_header(b: &[u8]) -> Result<Header, String> {
    if b.len() < 48 {
        return Err(format!("short NTP reply: {} bytes", b.len()));
    }
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
    Ok(Header {
        li_vn_mode: b[0],
        stratum: b[1],
        poll: b[2] as i8,
        precision: b[3] as i8,
        root_delay: u32_at(4),
        root_dispersion: u32_at(8),
        reference_id: u32_at(12),
        reference_time: u64_at(16),
        origin_time: u64_at(24),
        receive_time: u64_at(32),
        transmit_time: u64_at(40),
    })
}

/// beevik's checks of a reply to the query whose transmit stamp was `sent`.
pub fn check_reply(h: &Header, sent: u64) -> Result<(), &'static str> {
    if h.mode() != 4 {
        return Err("invalid mode in response");
    }
    if h.transmit_time == 0 {
        return Err("invalid transmit time in response");
    }
    if h.origin_time != sent {
        return Err("server response didn't match request");
    }
    if h.receive_time > h.transmit_time {
        return Err("server clock ticked backwards");
    }
    Ok(())
}

/// A Q32.32 interval in nanoseconds, rounded as beevik's `ntpTime.Duration`.
pub fn ntp_duration(t: u64) -> i64 {
    let sec = (t >> 32) * NANOS as u64;
    let frac = (t & 0xffff_ffff) * NANOS as u64;
    let mut nsec = frac >> 32;
    if frac as u32 >= 0x8000_0000 {
        nsec += 1;
    }
    (sec + nsec) as i64
}

/// A Q16.16 interval in nanoseconds (`ntpTimeShort.Duration`).
pub fn short_duration(t: u32) -> i64 {
    let sec = u64::from(t >> 16) * NANOS as u64;
    let frac = u64::from(t & 0xffff) * NANOS as u64;
    let mut nsec = frac >> 16;
    if frac as u16 >= 0x8000 {
        nsec += 1;
    }
    (sec + nsec) as i64
}

/// An NTP timestamp as Unix nanoseconds: era 1 (2036+) when the raw value
/// reads as before 1970, else era 0 (beevik v1.5.0's `ntpTime.Time`).
pub fn ntp_to_unix_ns(t: u64) -> i128 {
    const T1970: u64 = 0x83aa_7e80_0000_0000;
    let era = if t < T1970 { ERA1_UNIX } else { ERA0_UNIX };
    era * i128::from(NANOS) + i128::from(ntp_duration(t))
}

/// Unix nanoseconds as an NTP timestamp (`toNtpTime`, era 0 based).
pub fn unix_ns_to_ntp(ns: i128) -> u64 {
    let since = (ns - ERA0_UNIX * i128::from(NANOS)).clamp(i128::from(i64::MIN), i128::from(i64::MAX));
    let nsec = since as i64 as u64;
    let n = NANOS as u64;
    let sec = nsec / n;
    let rem = (nsec - sec * n) << 32;
    let mut frac = rem / n;
    if rem % n >= n / 2 {
        frac += 1;
    }
    (sec << 32) | frac
}

/// What beevik's `Response` holds that node_exporter reads; times in Unix
/// ns, durations in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub time: i128,
    pub clock_offset: i64,
    pub rtt: i64,
    pub precision: i64,
    pub stratum: u8,
    pub reference_time: i128,
    pub root_delay: i64,
    pub root_dispersion: i64,
    pub root_distance: i64,
    pub leap: u8,
    pub min_error: i64,
}

fn to_interval(t: i8) -> i64 {
    match t {
        t if t > 0 => (NANOS as u64).checked_shl(u32::from(t.unsigned_abs())).unwrap_or(0) as i64,
        t if t < 0 => (NANOS as u64).checked_shr(u32::from(t.unsigned_abs())).unwrap_or(0) as i64,
        _ => NANOS,
    }
}

impl Response {
    /// From a checked reply whose origin was replaced by our send time
    /// `org`, received at `dst` (both NTP timestamps of the local clock).
    pub fn new(h: &Header, org: u64, dst: u64) -> Self {
        let (rec, xmt) = (h.receive_time, h.transmit_time);
        let rtt = {
            let a = dst.wrapping_sub(org) as i64;
            let b = xmt.wrapping_sub(rec) as i64;
            ntp_duration(a.wrapping_sub(b).max(0) as u64)
        };
        let clock_offset = {
            let a = rec.wrapping_sub(org) as i64;
            let b = xmt.wrapping_sub(dst) as i64;
            let off = a.wrapping_add(b.wrapping_sub(a) / 2);
            if off < 0 {
                ntp_duration(off.wrapping_neg() as u64).wrapping_neg()
            } else {
                ntp_duration(off as u64)
            }
        };
        let min_error = {
            let e0 = org.saturating_sub(rec);
            let e1 = xmt.saturating_sub(dst);
            ntp_duration(e0.max(e1))
        };
        let root_delay = short_duration(h.root_delay);
        let root_dispersion = short_duration(h.root_dispersion);
        Response {
            time: ntp_to_unix_ns(xmt),
            clock_offset,
            rtt,
            precision: to_interval(h.precision),
            stratum: h.stratum,
            reference_time: ntp_to_unix_ns(h.reference_time),
            root_delay,
            root_dispersion,
            root_distance: rtt.wrapping_add(root_delay) / 2 + root_dispersion,
            leap: h.leap(),
            min_error,
        }
    }

    /// beevik's `Validate` (no authentication is configured).
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.stratum == 0 {
            return Err("kiss of death received");
        }
        if self.stratum >= 16 {
            return Err("invalid stratum in response");
        }
        let freshness = (self.time - self.reference_time).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        if freshness > MAX_POLL {
            return Err("server clock not fresh");
        }
        if self.root_delay / 2 + self.root_dispersion > MAX_DISPERSION {
            return Err("invalid dispersion in response");
        }
        if self.time < self.reference_time {
            return Err("invalid time reported");
        }
        if self.leap == 3 {
            return Err("invalid leap second in response");
        }
        Ok(())
    }
}

/// node_exporter's sanity verdict, with its cached "leap midnight": the
/// midnight after a reply that announced a leap second (the flag is dropped
/// right after it), around which one more second of error is tolerated.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sanity {
    pub leap_midnight: Option<i128>,
}

impl Sanity {
    pub fn check(&mut self, r: &Response, max_distance: i64, tolerance: i64) -> bool {
        let mut max_err = tolerance;
        if r.leap == 1 || r.leap == 2 {
            self.leap_midnight = Some(r.time.div_euclid(DAY) * DAY + DAY);
        }
        if let Some(m) = self.leap_midnight {
            if m - DAY < r.time && r.time < m + DAY {
                max_err = max_err.saturating_add(NANOS);
            }
        }
        r.validate().is_ok() && r.root_distance <= max_distance && r.min_error <= max_err
    }
}

/// Go's `Duration.Seconds()`.
pub fn go_seconds(d: i64) -> f64 {
    (d / NANOS) as f64 + (d % NANOS) as f64 / 1e9
}

/// The reference timestamp as node_exporter exports it (0 for pre-1970).
pub fn reference_seconds(t: i128) -> f64 {
    if t.div_euclid(i128::from(NANOS)) > 0 {
        t as i64 as f64 / 1e9
    } else {
        0.0
    }
}

/// beevik's `fixHostPort`: the port is appended unless the address has one.
pub fn fix_host_port(address: &str, port: i64) -> Result<String, String> {
    if address.is_empty() {
        return Err("address string is empty".into());
    }
    if address.starts_with('[') {
        let end = address.find(']').ok_or("missing ']' in address")?;
        return match address.as_bytes().get(end + 1) {
            None => Ok(format!("{address}:{port}")),
            Some(b':') => Ok(address.to_string()),
            Some(_) => Err("unexpected character following ']' in address".into()),
        };
    }
    match address.matches(':').count() {
        0 => Ok(format!("{address}:{port}")),
        1 => Ok(address.to_string()),
        _ => Ok(format!("[{address}]:{port}")),
    }
}

fn unix_ns(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the valid, owned buffer `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(b))
}

pub struct Collector {
    o: Options,
    sanity: Sanity,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        o.validate()?;
        tracing::warn!(collector = "ntp", "This collector is deprecated and will be removed in the next major version release.");
        Ok(Collector { o, sanity: Sanity::default() })
    }

    /// One SNTP exchange, as beevik's `QueryWithOptions`.
    fn query(&self) -> Result<Response, String> {
        let version = u8::try_from(self.o.version).map_err(|_| "invalid protocol version requested")?;
        let remote = fix_host_port(&self.o.server, self.o.port)?;
        let addrs: Vec<SocketAddr> = remote.to_socket_addrs().map_err(|e| format!("{remote}: {e}"))?.collect();
        let addr = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().ok_or_else(|| format!("{remote}: no address"))?;
        let local: SocketAddr = if addr.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let sock = UdpSocket::bind(local).map_err(|e| e.to_string())?;
        sock.connect(addr).map_err(|e| e.to_string())?;
        if self.o.ip_ttl != 0 {
            let ttl = u32::try_from(self.o.ip_ttl).map_err(|_| format!("setsockopt IP_TTL {}: invalid argument", self.o.ip_ttl))?;
            sock.set_ttl(ttl).map_err(|e| format!("setsockopt IP_TTL {ttl}: {e}"))?;
        }
        let deadline = Instant::now() + TIMEOUT;
        let sent = random_u64().map_err(|e| e.to_string())?;
        let req = encode_request(version, sent);
        sock.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
        let xmit = SystemTime::now();
        sock.send(&req).map_err(|e| e.to_string())?;
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        sock.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 8192];
        let n = sock.recv(&mut buf).map_err(|e| e.to_string())?;
        let recv = SystemTime::now();
        let h = decode_header(&buf[..n])?;
        check_reply(&h, sent)?;
        Ok(Response::new(&h, unix_ns_to_ntp(unix_ns(xmit)), unix_ns_to_ntp(unix_ns(recv))))
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let r = self.query().map_err(|e| Error::Other(format!("couldn't get SNTP reply: {e}").into()))?;
        let g = Kind::Gauge;
        sink.single("node_ntp_stratum", "NTPD stratum.", g, f64::from(r.stratum));
        sink.single("node_ntp_leap", "NTPD leap second indicator, 2 bits.", g, f64::from(r.leap));
        sink.single("node_ntp_rtt_seconds", "RTT to NTPD.", g, go_seconds(r.rtt));
        sink.single("node_ntp_offset_seconds", "ClockOffset between NTP and local clock.", g, go_seconds(r.clock_offset));
        sink.single("node_ntp_reference_timestamp_seconds", "NTPD ReferenceTime, UNIX timestamp.", g, reference_seconds(r.reference_time));
        sink.single("node_ntp_root_delay_seconds", "NTPD RootDelay.", g, go_seconds(r.root_delay));
        sink.single("node_ntp_root_dispersion_seconds", "NTPD RootDispersion.", g, go_seconds(r.root_dispersion));
        let sane = self.sanity.check(&r, self.o.max_distance, self.o.offset_tolerance);
        sink.single(
            "node_ntp_sanity",
            "NTPD sanity according to RFC5905 heuristics and configured limits.",
            g,
            if sane { 1.0 } else { 0.0 },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Options {
        Options {
            server: "127.0.0.1".into(),
            port: 123,
            version: 4,
            server_is_local: false,
            ip_ttl: 1,
            max_distance: 3_466_080_000,
            offset_tolerance: 1_000_000,
        }
    }

    const S: u64 = 1 << 32;

    /// A reply from a stratum-2 server: root delay 1/16 s, dispersion 1/32 s.
    fn reply(org: u64, rec: u64, xmt: u64) -> Header {
        Header {
            li_vn_mode: (4 << 3) | 4,
            stratum: 2,
            poll: 6,
            precision: -20,
            root_delay: 0x0000_1000,
            root_dispersion: 0x0000_0800,
            reference_id: 0x7f7f_0101,
            reference_time: xmt - 64 * S,
            origin_time: org,
            receive_time: rec,
            transmit_time: xmt,
        }
    }

    #[test]
    fn request_layout() {
        let p = encode_request(4, 0x0102_0304_0506_0708);
        assert_eq!(p[0], 0x23, "LI 0, VN 4, mode 3");
        assert_eq!(encode_request(2, 0)[0], 0x13);
        assert_eq!(encode_request(3, 0)[0], 0x1b);
        assert_eq!(p[3], 0x20);
        assert_eq!(&p[40..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(p[1..3].iter().chain(&p[4..40]).all(|&b| b == 0));
    }

    #[test]
    fn decode_roundtrip_and_short() {
        let mut b = [0u8; 60];
        b[0] = 0b01_100_100;
        b[1] = 7;
        b[2] = 10;
        b[3] = 0xe9; // -23
        b[4..8].copy_from_slice(&0x0001_8000u32.to_be_bytes());
        b[16..24].copy_from_slice(&0xe000_0000_8000_0000u64.to_be_bytes());
        b[40..48].copy_from_slice(&7u64.to_be_bytes());
        let h = decode_header(&b).unwrap();
        assert_eq!((h.leap(), h.version(), h.mode(), h.stratum, h.poll, h.precision), (1, 4, 4, 7, 10, -23));
        assert_eq!(h.root_delay, 0x0001_8000);
        assert_eq!(h.reference_time, 0xe000_0000_8000_0000);
        assert_eq!(h.transmit_time, 7);
        assert!(decode_header(&b[..47]).is_err());
        assert!(decode_header(&[]).is_err());
    }

    #[test]
    fn reply_checks() {
        let h = reply(99, 1000 * S, 1000 * S + 1);
        assert_eq!(check_reply(&h, 99), Ok(()));
        assert!(check_reply(&h, 98).is_err(), "origin must echo our transmit stamp");
        assert!(check_reply(&Header { li_vn_mode: 0x23, ..h }, 99).is_err(), "client mode is not a reply");
        assert!(check_reply(&Header { transmit_time: 0, receive_time: 0, ..h }, 99).is_err());
        assert!(check_reply(&Header { receive_time: h.transmit_time + 1, ..h }, 99).is_err());
    }

    #[test]
    fn fixed_point_conversions() {
        assert_eq!(ntp_duration(S), NANOS);
        assert_eq!(ntp_duration(S / 2), NANOS / 2);
        assert_eq!(ntp_duration(1), 0, "2^-32 s rounds to 0 ns");
        assert_eq!(ntp_duration(3), 1, "3 * 0.2328 ns rounds up");
        assert_eq!(short_duration(0x0001_0000), NANOS);
        assert_eq!(short_duration(0x0000_1000), 62_500_000);
        assert_eq!(short_duration(1), 15_259, "15258.789 ns rounds up");
        // 1970 in era 0; a small raw value is era 1 (2036+)
        assert_eq!(ntp_to_unix_ns(0x83aa_7e80u64 << 32), 0);
        assert_eq!(ntp_to_unix_ns(0), ERA1_UNIX * NANOS as i128);
        assert_eq!(ntp_to_unix_ns(S), (ERA1_UNIX + 1) * NANOS as i128);
        // to and from: within one ns
        for ns in [0i128, 1_700_000_000_123_456_789, 1_234_567_890_999_999_999] {
            let back = ntp_to_unix_ns(unix_ns_to_ntp(ns));
            assert!((back - ns).abs() <= 1, "{ns} -> {back}");
        }
        assert_eq!(unix_ns_to_ntp(0), 0x83aa_7e80u64 << 32);
    }

    #[test]
    fn offset_rtt_and_min_error() {
        let base = unix_ns_to_ntp(1_700_000_000 * NANOS as i128);
        // client sends at t, server (0.5 s ahead) receives at t+0.01+0.5,
        // replies 0.002 s later; client receives at t+0.022
        let ms = |m: u64| m * S / 1000;
        let (org, rec, xmt, dst) = (base, base + ms(510), base + ms(512), base + ms(22));
        let r = Response::new(&reply(org, rec, xmt), org, dst);
        assert!((r.rtt - 20_000_000).abs() <= 1, "rtt {}", r.rtt);
        assert!((r.clock_offset - 500_000_000).abs() <= 1, "offset {}", r.clock_offset);
        assert_eq!(r.min_error, ntp_duration(xmt - dst), "causality violated by the server's lead");
        assert_eq!(r.root_delay, 62_500_000);
        assert_eq!(r.root_dispersion, 31_250_000);
        assert_eq!(r.root_distance, (r.rtt + r.root_delay) / 2 + r.root_dispersion);
        assert_eq!(r.precision, NANOS >> 20);
        // the client ahead: a negative offset, no causality violation
        let (rec, xmt) = (base - ms(490), base - ms(488));
        let r = Response::new(&reply(org, rec, xmt), org, dst);
        assert!((r.clock_offset + 500_000_000).abs() <= 1, "offset {}", r.clock_offset);
        assert_eq!(r.min_error, ntp_duration(org - rec));
        // an RTT that comes out negative is 0
        let r = Response::new(&reply(org, base, base + ms(50)), org, base + ms(10));
        assert_eq!(r.rtt, 0);
    }

    fn good() -> Response {
        let t = 1_700_000_000 * NANOS as i128;
        Response {
            time: t,
            clock_offset: 0,
            rtt: 100_000,
            precision: 1,
            stratum: 2,
            reference_time: t - 64 * NANOS as i128,
            root_delay: 10_000_000,
            root_dispersion: 10_000_000,
            root_distance: 15_050_000,
            leap: 0,
            min_error: 0,
        }
    }

    #[test]
    fn validation_rules() {
        assert_eq!(good().validate(), Ok(()));
        assert!(Response { stratum: 0, ..good() }.validate().is_err());
        assert!(Response { stratum: 16, ..good() }.validate().is_err());
        assert!(Response { stratum: 15, ..good() }.validate().is_ok());
        assert!(Response { leap: 3, ..good() }.validate().is_err());
        assert!(Response { reference_time: good().time + 1, ..good() }.validate().is_err());
        assert!(Response { reference_time: good().time - i128::from(MAX_POLL) - 1, ..good() }.validate().is_err());
        assert!(Response { reference_time: good().time - i128::from(MAX_POLL), ..good() }.validate().is_ok());
        assert!(Response { root_dispersion: MAX_DISPERSION + 1, ..good() }.validate().is_err());
        assert!(Response { root_delay: 2 * MAX_DISPERSION, root_dispersion: 1, ..good() }.validate().is_err());
    }

    #[test]
    fn sanity_limits_and_leap_midnight() {
        let mut s = Sanity::default();
        assert!(s.check(&good(), 3_466_080_000, 1_000_000));
        assert!(!s.check(&Response { root_distance: 3_466_080_001, ..good() }, 3_466_080_000, 1_000_000));
        assert!(!s.check(&Response { min_error: 1_000_001, ..good() }, 3_466_080_000, 1_000_000));
        assert!(s.leap_midnight.is_none());
        // a leap announced: the next midnight is cached and 1 s more is tolerated
        let t = good().time;
        let midnight = (t / DAY + 1) * DAY;
        assert!(s.check(&Response { leap: 1, min_error: 900_000_000, ..good() }, 3_466_080_000, 1_000_000));
        assert_eq!(s.leap_midnight, Some(midnight));
        // after the flag drops, still tolerated up to a day past midnight
        let later = Response { time: midnight + DAY - 1, reference_time: midnight, min_error: 900_000_000, ..good() };
        assert!(s.check(&later, 3_466_080_000, 1_000_000));
        let after = Response { time: midnight + DAY, reference_time: midnight + 1, min_error: 900_000_000, ..good() };
        assert!(!s.check(&after, 3_466_080_000, 1_000_000));
        // invalid replies are never sane
        assert!(!Sanity::default().check(&Response { stratum: 0, ..good() }, i64::MAX, i64::MAX));
    }

    /// beevik v1.5.0's offline test vectors (ntp_test.go).
    #[test]
    fn beevik_vectors() {
        // TestOfflineConvertShort
        for (t, ns) in [
            (0x0000_0000u32, 0i64),
            (0x0000_0001, 15_259),
            (0x0000_8000, 500_000_000),
            (0x0000_c000, 750_000_000),
            (0x0000_ff80, NANOS - NANOS / 512),
            (0x0001_0000, NANOS),
            (0x0001_8000, 1_500_000_000),
            (0xffff_0000, 65_535 * NANOS),
            (0xffff_ff80, 65_536 * NANOS - NANOS / 512),
        ] {
            assert_eq!(short_duration(t), ns, "{t:#x}");
        }
        // TestOfflineTimeRollover: both directions
        for (t, unix) in [
            (0x0000_0000_0000_0000u64, 2_085_978_496i128),
            (0x0000_0001_0000_0000, 2_085_978_497),
            (0x1000_0000_0000_0000, 2_354_413_952),
            (0x8000_0000_0000_0000, 4_233_462_144),
            (0x83aa_7e70_0000_0000, 4_294_967_280),
            (0x83aa_7e80_0000_0000, 0),
            (0x9000_0000_0000_0000, 206_930_304),
            (0xe000_0000_0000_0000, 1_549_107_584),
            (0xf000_0000_0000_0000, 1_817_543_040),
            (0xffff_ffff_0000_0000, 2_085_978_495),
        ] {
            assert_eq!(ntp_to_unix_ns(t), unix * i128::from(NANOS), "{t:#x}");
            assert_eq!(unix_ns_to_ntp(unix * i128::from(NANOS)), t, "{unix}");
        }
        // TestOfflineConvertLong
        for t in [0x0u64, 0xff80_0000, 0x1_ff80_0000, 0x8000_0000_ff80_0000, 0xffff_ffff_ff80_0000] {
            assert_eq!(unix_ns_to_ntp(ntp_to_unix_ns(t)), t, "{t:#x}");
        }
        let at = |unix: i128, plus_ms: i128| unix_ns_to_ntp(unix * i128::from(NANOS) + plus_ms * 1_000_000);
        let offset = |org, rec, xmt, dst| Response::new(&reply(org, rec, xmt), org, dst).clock_offset;
        // TestOfflineOffsetCalculation(Negative)
        let now = 1_700_000_000;
        assert_eq!(offset(at(now, 0), at(now, 20_000), at(now, 21_000), at(now, 5_000)), 18 * NANOS);
        assert_eq!(offset(at(now, 101_000), at(now, 102_000), at(now, 103_000), at(now, 105_000)), -NANOS / 2);
        // TestOfflineOffsetRollover: across the 2036 era boundary
        for (client, server) in [
            (0i128, 1_717_027_200i128),
            (1_717_027_200, 0),
            (2_429_913_600, 1_704_067_200),
            (1_704_067_200, 2_429_913_600),
            (2_429_913_600, 2_432_592_000),
            (2_432_592_000, 2_429_913_600),
        ] {
            let got = offset(at(client, 0), at(server, 0), at(server, 1_000), at(client, 1_000));
            assert_eq!(i128::from(got), (server - client) * i128::from(NANOS), "{client} -> {server}");
        }
    }

    #[test]
    fn seconds_like_go() {
        assert_eq!(go_seconds(1_500_000_000), 1.5);
        assert_eq!(go_seconds(-1_500_000_000), -1.5);
        assert_eq!(go_seconds(123), 123e-9);
        assert_eq!(reference_seconds(1_700_000_000_500_000_000), 1_700_000_000.5);
        assert_eq!(reference_seconds(999_999_999), 0.0);
        assert_eq!(reference_seconds(-5), 0.0);
    }

    #[test]
    fn host_port() {
        assert_eq!(fix_host_port("127.0.0.1", 123).unwrap(), "127.0.0.1:123");
        assert_eq!(fix_host_port("ntp.local:999", 123).unwrap(), "ntp.local:999");
        assert_eq!(fix_host_port("::1", 5).unwrap(), "[::1]:5");
        assert_eq!(fix_host_port("[::1]", 5).unwrap(), "[::1]:5");
        assert_eq!(fix_host_port("[::1]:7", 5).unwrap(), "[::1]:7");
        assert!(fix_host_port("[::1", 5).is_err());
        assert!(fix_host_port("[::1]x", 5).is_err());
        assert!(fix_host_port("", 5).is_err());
    }

    #[test]
    fn start_up_validation_names_the_flag() {
        let p = crate::testutil::paths(std::path::Path::new("/nonexistent"));
        let err = |o: Options| Collector::new(o, &p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(Collector::new(opts(), &p).is_ok());
        assert!(Collector::new(Options { server: "::1".into(), ..opts() }, &p).is_ok());
        assert!(Collector::new(Options { server: "127.1.2.3".into(), ..opts() }, &p).is_ok());
        assert!(Collector::new(Options { server: "::ffff:127.0.0.1".into(), ..opts() }, &p).is_ok());
        assert!(err(Options { server: "10.0.0.1".into(), ..opts() }).contains("--collector.ntp.server:"));
        assert!(err(Options { server: "localhost".into(), ..opts() }).contains("--collector.ntp.server:"));
        assert!(Collector::new(Options { server: "pool.example".into(), server_is_local: true, ..opts() }, &p).is_ok());
        for v in [1, 5] {
            assert!(err(Options { version: v, ..opts() }).contains("--collector.ntp.protocol-version:"));
        }
        assert!(err(Options { offset_tolerance: -1, ..opts() }).contains("--collector.ntp.local-offset-tolerance:"));
        for port in [0, 65536, -1] {
            assert!(err(Options { port, ..opts() }).contains("--collector.ntp.server-port:"));
        }
    }

    #[test]
    fn flags_parse_with_defaults() {
        let cmd = clap::Command::new("t").args(Options::args());
        let m = cmd.clone().try_get_matches_from(["t"]).unwrap();
        let o = Options::from_flags(&Flags::new(&m)).unwrap();
        assert_eq!((o.server.as_str(), o.port, o.version, o.server_is_local, o.ip_ttl), ("127.0.0.1", 123, 4, false, 1));
        assert_eq!((o.max_distance, o.offset_tolerance), (3_466_080_000, 1_000_000));
        let m = cmd
            .clone()
            .try_get_matches_from(["t", "--collector.ntp.local-offset-tolerance=-2ms", "--collector.ntp.server-is-local"])
            .unwrap();
        let o = Options::from_flags(&Flags::new(&m)).unwrap();
        assert!(o.server_is_local);
        assert!(o.validate().unwrap_err().to_string().contains("local-offset-tolerance"));
        let m = cmd.try_get_matches_from(["t", "--collector.ntp.server-port=x"]).unwrap();
        assert!(Options::from_flags(&Flags::new(&m)).err().unwrap().to_string().contains("server-port"));
    }

    #[test]
    fn no_server_fails_the_scrape() {
        use crate::Collector as _;
        // a port nobody listens on: ECONNREFUSED (or the 1 s timeout)
        let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let p = crate::testutil::paths(std::path::Path::new("/nonexistent"));
        let mut c = Collector::new(Options { port: i64::from(port), ..opts() }, &p).unwrap();
        let e = c.update(&mut Sink::new()).unwrap_err();
        assert!(e.to_string().contains("couldn't get SNTP reply"), "{e}");
    }
}
