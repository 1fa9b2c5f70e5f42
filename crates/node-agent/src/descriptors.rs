//! The open-file limit, shared out (`RLIMIT_NOFILE`'s soft value, raised to
//! the hard one at start-up as Go programs do). Whatever the limit, the
//! agent starts and serves the host's metrics; what does not fit is
//! reported down, never fatal. In the order they are served:
//!
//! 1. [`RESERVE`]: what is opened after start-up and budgeted nowhere else
//!    (the scrape runners' transient opens, the collectors' netlink and
//!    D-Bus sockets, the shutdown signal's runtime, the web config's
//!    reloads), and [`MIN_CONNECTIONS`] connections, so that the kubelet's
//!    probes and a scrape always have room.
//! 2. The eBPF object: loaded only while its maps fit under the
//!    [`Ceiling`] (the limit less the two above), and each program
//!    attached only while it fits ([`PER_PROGRAM`]); a program that does
//!    not is down with the reason `descriptors`
//!    (`node_ebpf_program_down_reason`). Whatever the host collectors
//!    opened at build (perf's events, say) counts too: the ceiling is
//!    checked against the descriptors open at the time.
//! 3. Once the collectors are built (the runtime and the listeners are
//!    open before, counted in the ceiling's check), what the process holds
//!    is counted and the rest beyond the reserve shared ([`shares`]): two thirds to
//!    connections (`--web.max-connections` lowered to it, at least
//!    [`MIN_CONNECTIONS`]), the rest to proc and sys files kept open
//!    between scrapes (`host::io`, at most `host::io::MAX_KEPT`).
//!
//! At 64 the object does not fit (its maps alone are over 30) and every
//! program is down for it; at 128 most programs fit; at 256 every program
//! of every probe does, with room for about 90 connections.

/// Descriptors kept free for what is opened after start-up and budgeted
/// nowhere else: the scrape runners' transient opens (a directory and a
/// file each, a few runners at a time; an open that fails for want of
/// descriptors releases the kept files and is tried again), about eight
/// collector sockets (netlink, ethtool, D-Bus), the shutdown signal's
/// runtime (4), the web config watcher's reads, the process metrics'
/// listing of /proc/self/fd.
pub const RESERVE: usize = 32;

/// The fewest connections the server holds, whatever the limit: the
/// kubelet's probes and a scrape or two (admission closes idle ones to make
/// room for them).
pub const MIN_CONNECTIONS: usize = 16;

/// What one eBPF program may hold while it is loaded and attached: its
/// program and its link, kept, and one more while attaching (a
/// tracepoint's perf event before its link holds it, or the cgroup a
/// socket program attaches to).
pub const PER_PROGRAM: usize = 3;

/// Beyond its maps, what loading the eBPF object may hold at once: its BTF
/// (kept), and aya's feature probes (a map or program at a time, closed).
pub const OBJECT_EXTRA: usize = 4;

/// What the serving runtime opens, beside a descriptor per listen address:
/// its epoll and waker (before the collectors are built in `serve`, after
/// them where a command builds collectors and binds later).
pub const RUNTIME: usize = 2;

/// The most descriptors the process may hold while its eBPF object is
/// loaded and its programs attached: all but the [`RESERVE`], the
/// [`MIN_CONNECTIONS`], and what start-up opens afterwards ([`RUNTIME`],
/// the listeners).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceiling {
    pub max: usize,
    /// The open-file limit it was made from, for the messages.
    pub nofile: u64,
}

impl Ceiling {
    /// The ceiling under a limit of `nofile`, for an agent that binds
    /// `listeners` addresses once its collectors are built.
    pub fn for_limit(nofile: u64, listeners: usize) -> Ceiling {
        let later = RESERVE + MIN_CONNECTIONS + RUNTIME + listeners;
        Ceiling { max: usize::try_from(nofile).unwrap_or(usize::MAX).saturating_sub(later), nofile }
    }

    /// The ceiling under a limit of `nofile`, for an agent whose runtime
    /// and listeners are open already (counted with the open descriptors
    /// when the object is checked): the agent binds before it loads, so
    /// that the kubelet's first probe finds the port.
    pub fn bound(nofile: u64) -> Ceiling {
        Ceiling { max: usize::try_from(nofile).unwrap_or(usize::MAX).saturating_sub(RESERVE + MIN_CONNECTIONS), nofile }
    }

    /// Whether `need` more descriptors fit beside the `open` ones; why not
    /// when they do not (`what` needs them).
    pub fn fits(&self, open: usize, need: usize, what: &str) -> Result<(), String> {
        if open + need <= self.max {
            return Ok(());
        }
        Err(format!(
            "{what} needs {need} file descriptors and the open-file limit ({nofile}) leaves {room} for eBPF \
             beside the {open} open and the {kept} kept for connections and the rest: raise the container's nofile limit",
            nofile = self.nofile,
            room = self.max.saturating_sub(open),
            kept = usize::try_from(self.nofile).unwrap_or(usize::MAX).saturating_sub(self.max),
        ))
    }

    /// [`Ceiling::fits`] with the descriptors open now; fits when they
    /// cannot be counted (an open past the limit then fails with EMFILE,
    /// reported down all the same).
    pub fn fits_now(&self, need: usize, what: &str) -> Result<(), String> {
        match host::sys::open_fds() {
            Some(open) => self.fits(open, need, what),
            None => Ok(()),
        }
    }
}

/// What the limit leaves connections and kept files once the agent is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// The most connections held (`--web.max-connections`, lowered).
    pub connections: usize,
    /// The most proc and sys files kept open between scrapes.
    pub kept: usize,
}

/// The shares of an open-file limit of `nofile` with `open` descriptors
/// held after start-up (the eBPF object, the listeners, the runtime, what
/// the collectors keep): of what is left beyond [`RESERVE`], two thirds go
/// to connections (at most `max_connections`, at least [`MIN_CONNECTIONS`]
/// unless `max_connections` is lower) and the rest to kept files (at most
/// `host::io::MAX_KEPT`).
pub fn shares(nofile: u64, open: usize, max_connections: usize) -> Shares {
    let left = usize::try_from(nofile).unwrap_or(usize::MAX).saturating_sub(open).saturating_sub(RESERVE);
    let connections = (left / 3 * 2).max(MIN_CONNECTIONS).min(max_connections.max(1));
    let kept = left.saturating_sub(connections).min(host::io::MAX_KEPT);
    Shares { connections, kept }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent held once its listener was bound, measured (the
    /// count it shares out from, in its log): with every probe's programs
    /// (at nofile 256), and with the object down (at 64).
    const WITH_EBPF: usize = 87;
    const WITHOUT_EBPF: usize = 13;

    #[test]
    fn everything_fits_the_limit() {
        for nofile in [16u64, 64, 100, 128, 256, 512, 1024, 4096, 20_000, 1 << 20] {
            for open in [WITHOUT_EBPF, WITH_EBPF] {
                let s = shares(nofile, open, 1024);
                let total = open + RESERVE + s.connections + s.kept;
                // Past the reserve and the fewest connections, nothing is
                // given that the limit does not have.
                if nofile as usize >= open + RESERVE + MIN_CONNECTIONS {
                    assert!(total <= nofile as usize, "nofile {nofile}, {open} open: {s:?} makes {total}");
                }
                assert!(s.connections >= MIN_CONNECTIONS, "nofile {nofile}: {s:?}");
                assert!(s.kept <= host::io::MAX_KEPT);
            }
        }
    }

    #[test]
    fn the_shares_at_the_limits_that_matter() {
        // The issue's: at 256 with every probe, a third of the limit for
        // connections (it was half: 128, beside the object's 74 and 64
        // kept files, which exhausted it).
        assert_eq!(shares(256, WITH_EBPF, 1024), Shares { connections: 90, kept: 47 });
        // At 64 with the object down: the fewest connections, a few kept.
        assert_eq!(shares(64, WITHOUT_EBPF, 1024), Shares { connections: 16, kept: 3 });
        // Common limits: the connections' cap and the kept files' as before.
        assert_eq!(shares(4096, WITH_EBPF, 1024), Shares { connections: 1024, kept: 512 });
        assert_eq!(shares(1 << 20, WITH_EBPF, 1024), Shares { connections: 1024, kept: 512 });
        assert_eq!(shares(1024, WITH_EBPF, 1024).connections, 602);
        // A lower --web.max-connections stays; the rest goes to kept files.
        assert_eq!(shares(1024, WITH_EBPF, 100), Shares { connections: 100, kept: 512 });
        assert_eq!(shares(64, WITHOUT_EBPF, 4), Shares { connections: 4, kept: 15 });
        // Nothing left (something else took the descriptors): the fewest
        // connections all the same, from the reserve.
        assert_eq!(shares(64, 64, 1024), Shares { connections: 16, kept: 0 });
    }

    #[test]
    fn the_ebpf_ceiling_leaves_the_reserve_and_the_fewest_connections() {
        let c = Ceiling::for_limit(256, 1);
        assert_eq!(c.max, 256 - RESERVE - MIN_CONNECTIONS - RUNTIME - 1);
        assert!(c.fits(100, 74, "the object").is_ok());
        let e = c.fits(180, 34, "the eBPF object (34 maps)").unwrap_err();
        assert!(e.contains("open-file limit (256) leaves 25") && e.contains("nofile"), "{e}");
        assert!(Ceiling::for_limit(64, 1).fits(12, 34 + OBJECT_EXTRA, "the object").is_err(), "at 64 the object does not fit");
        assert_eq!(Ceiling::for_limit(10, 1).max, 0);
        // Bound first: the runtime and the listeners are among the open.
        assert_eq!(Ceiling::bound(256).max, Ceiling::for_limit(256, 1).max + RUNTIME + 1);
        assert!(Ceiling::for_limit(1 << 20, 2).fits_now(1000, "x").is_ok());
        // Whatever the object takes under its ceiling, the runtime and the
        // listeners that come after it leave the reserve and the fewest
        // connections whole.
        for nofile in [64u64, 100, 128, 256, 1024] {
            let c = Ceiling::for_limit(nofile, 2);
            let after = c.max + RUNTIME + 2;
            assert_eq!(shares(nofile, after, 1024).connections, MIN_CONNECTIONS, "{nofile}");
            assert!(after + RESERVE + MIN_CONNECTIONS <= nofile as usize, "{nofile}");
        }
    }
}
