//! `timex`: the kernel clock's NTP discipline state from adjtimex(2).

use crate::{Error, Paths};
use expo::{Kind, Sink};

const TIME_ERROR: i32 = 5;
const STA_NANO: i32 = 0x2000;
/// Scaled-ppm fixed point of adjtimex(2): ppm with a 16-bit fraction.
const PPM16FRAC: f64 = 1_000_000.0 * 65536.0;

pub struct Collector;

impl Collector {
    pub fn new(_p: &Paths) -> Self {
        Collector
    }
}

/// The readings of one adjtimex(2) call.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timex {
    pub state: i32,
    pub status: i32,
    pub offset: i64,
    pub freq: i64,
    pub maxerror: i64,
    pub esterror: i64,
    pub constant: i64,
    pub tick: i64,
    pub ppsfreq: i64,
    pub jitter: i64,
    pub shift: i32,
    pub stabil: i64,
    pub jitcnt: i64,
    pub calcnt: i64,
    pub errcnt: i64,
    pub stbcnt: i64,
    pub tai: i32,
}

fn read() -> std::io::Result<Timex> {
    // SAFETY: timex is plain data; zeroed (modes = 0) asks adjtimex only to read.
    let mut t: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid, writable timex.
    let state = unsafe { libc::adjtimex(&mut t) };
    if state < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Timex {
        state,
        status: t.status,
        offset: t.offset as i64,
        freq: t.freq as i64,
        maxerror: t.maxerror as i64,
        esterror: t.esterror as i64,
        constant: t.constant as i64,
        tick: t.tick as i64,
        ppsfreq: t.ppsfreq as i64,
        jitter: t.jitter as i64,
        shift: t.shift,
        stabil: t.stabil as i64,
        jitcnt: t.jitcnt as i64,
        calcnt: t.calcnt as i64,
        errcnt: t.errcnt as i64,
        stbcnt: t.stbcnt as i64,
        tai: t.tai,
    })
}

/// Converts readings into node_exporter's families.
pub fn emit(t: &Timex, sink: &mut Sink) {
    let divisor = if t.status & STA_NANO != 0 { 1e9 } else { 1e6 };
    let g = |sink: &mut Sink, name: &str, help: &str, v: f64| sink.single(name, help, Kind::Gauge, v);
    let c = |sink: &mut Sink, name: &str, help: &str, v: f64| sink.single(name, help, Kind::Counter, v);
    g(
        sink,
        "node_timex_sync_status",
        "Is clock synchronized to a reliable server (1 = yes, 0 = no).",
        if t.state == TIME_ERROR { 0.0 } else { 1.0 },
    );
    g(sink, "node_timex_offset_seconds", "Time offset in between local system and reference clock.", t.offset as f64 / divisor);
    g(sink, "node_timex_frequency_adjustment_ratio", "Local clock frequency adjustment.", 1.0 + t.freq as f64 / PPM16FRAC);
    g(sink, "node_timex_maxerror_seconds", "Maximum error in seconds.", t.maxerror as f64 / 1e6);
    g(sink, "node_timex_estimated_error_seconds", "Estimated error in seconds.", t.esterror as f64 / 1e6);
    g(sink, "node_timex_status", "Value of the status array bits.", t.status as f64);
    g(sink, "node_timex_loop_time_constant", "Phase-locked loop time constant.", t.constant as f64);
    g(sink, "node_timex_tick_seconds", "Seconds between clock ticks.", t.tick as f64 / 1e6);
    g(sink, "node_timex_pps_frequency_hertz", "Pulse per second frequency.", t.ppsfreq as f64 / PPM16FRAC);
    g(sink, "node_timex_pps_jitter_seconds", "Pulse per second jitter.", t.jitter as f64 / divisor);
    g(sink, "node_timex_pps_shift_seconds", "Pulse per second interval duration.", t.shift as f64);
    g(
        sink,
        "node_timex_pps_stability_hertz",
        "Pulse per second stability, average of recent frequency changes.",
        t.stabil as f64 / PPM16FRAC,
    );
    c(sink, "node_timex_pps_jitter_total", "Pulse per second count of jitter limit exceeded events.", t.jitcnt as f64);
    c(sink, "node_timex_pps_calibration_total", "Pulse per second count of calibration intervals.", t.calcnt as f64);
    c(sink, "node_timex_pps_error_total", "Pulse per second count of calibration errors.", t.errcnt as f64);
    c(sink, "node_timex_pps_stability_exceeded_total", "Pulse per second count of stability limit exceeded events.", t.stbcnt as f64);
    g(sink, "node_timex_tai_offset_seconds", "International Atomic Time (TAI) offset.", t.tai as f64);
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let t = read().map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                Error::NoData("not permitted to read adjtimex".into())
            } else {
                Error::io(std::path::Path::new("adjtimex(2)"), e)
            }
        })?;
        emit(&t, sink);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_units() {
        let t = Timex { state: 0, status: STA_NANO, offset: 1_500_000, freq: 65536, tick: 10000, maxerror: 16000, ..Default::default() };
        let mut s = Sink::new();
        emit(&t, &mut s);
        let get = |n: &str| s.families().iter().find(|f| f.name() == n).and_then(|f| f.samples().next()).map(|x| x.1);
        assert_eq!(get("node_timex_offset_seconds"), Some(0.0015));
        assert_eq!(get("node_timex_frequency_adjustment_ratio"), Some(1.000001));
        assert_eq!(get("node_timex_tick_seconds"), Some(0.01));
        assert_eq!(get("node_timex_maxerror_seconds"), Some(0.016));
        assert_eq!(get("node_timex_sync_status"), Some(1.0));
        let mut s = Sink::new();
        emit(&Timex { state: TIME_ERROR, ..Default::default() }, &mut s);
        assert_eq!(s.families()[0].samples().next().map(|x| x.1), Some(0.0));
    }
}
