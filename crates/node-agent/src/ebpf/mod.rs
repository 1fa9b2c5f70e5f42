//! The eBPF loader: the object built from `agent-ebpf` and embedded in the
//! binary, loaded once per agent ([`loader`]), with the running kernel's
//! facts ([`kernel`]: tracefs formats, release, features) and the kernel's
//! BTF ([`btf`]) to fill each probe's read-only global, typed readers
//! of the probes' maps ([`maps`]), and the agent's side of the per-cgroup
//! ledgers that bound the peer probes' maps ([`ledger`]). The probes themselves are in
//! `crate::probes`, one module each.

pub mod btf;
pub mod kernel;
pub mod ledger;
pub mod loader;
pub mod map_stats;
pub mod maps;
pub mod syscall_families;
pub mod syscall_names;

pub use loader::{AttachError, Globals, LoadError, Probe, Shared};

/// The compiled eBPF object (empty when built with `NODE_AGENT_SKIP_EBPF=1`).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf.o"));

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use agent_common::{Hook, SkbDirection, SockAddrHook};
    use aya_obj::programs::{CgroupSkbAttachType, CgroupSockAddrAttachType};
    use aya_obj::ProgramSection;
    use object::{Object as _, ObjectSymbol as _};

    /// Without privileges: the embedded object has exactly the maps, globals
    /// and programs agent-common names (programs of the kind their hook
    /// says), none of the test-only programs, and the licence agent-ebpf's
    /// Cargo.toml declares.
    #[test]
    fn the_object_has_every_name_the_user_side_uses() {
        if super::OBJECT.is_empty() {
            assert!(std::env::var_os("CI").is_none(), "CI builds the eBPF programs (no NODE_AGENT_SKIP_EBPF)");
            eprintln!("SKIP: built with NODE_AGENT_SKIP_EBPF=1");
            return;
        }
        let obj = aya_obj::Object::parse(super::OBJECT).expect("the embedded object parses");
        let maps: BTreeSet<&str> =
            obj.maps.keys().map(String::as_str).filter(|m| !m.starts_with('.') && *m != super::loader::LOG_MAP).collect();
        let named: BTreeSet<&str> = agent_common::MAPS.iter().copied().collect();
        assert_eq!(maps, named, "maps in the object vs agent_common::MAPS");

        let mut programs = BTreeSet::new();
        for p in agent_common::PROGRAMS.iter().flat_map(|ps| ps.iter()) {
            let found = obj.programs.get(p.name).unwrap_or_else(|| panic!("program {} is not in the object", p.name));
            let kind_ok = match p.hook {
                Hook::TracePoint(..) => matches!(found.section, ProgramSection::TracePoint),
                Hook::RawTracePoint(_) | Hook::Run => matches!(found.section, ProgramSection::RawTracePoint),
                Hook::CgroupSkb(dir) => matches!(
                    (&found.section, dir),
                    (ProgramSection::CgroupSkb { attach_type: Some(CgroupSkbAttachType::Ingress) }, SkbDirection::Ingress)
                        | (ProgramSection::CgroupSkb { attach_type: Some(CgroupSkbAttachType::Egress) }, SkbDirection::Egress)
                ),
                Hook::CgroupSockAddr(call) => matches!(
                    (&found.section, call),
                    (ProgramSection::CgroupSockAddr { attach_type: CgroupSockAddrAttachType::UDPSendMsg4 }, SockAddrHook::UdpSendmsg4)
                        | (
                            ProgramSection::CgroupSockAddr { attach_type: CgroupSockAddrAttachType::UDPSendMsg6 },
                            SockAddrHook::UdpSendmsg6
                        )
                ),
            };
            assert!(kind_ok, "program {} is a {:?}, its hook says {:?}", p.name, found.section, p.hook);
            programs.insert(p.name);
        }
        // The variants loaded in their programs' place before Linux 5.12
        // (by symbol, under the programs' names).
        for v in [agent_common::tcp_peers::SET_STATE_BATON, agent_common::tcp_peers::SWEEP_BATON] {
            assert!(obj.programs.contains_key(v), "{v} is in the object");
            programs.insert(v);
        }
        let in_object: BTreeSet<&str> = obj.programs.keys().map(String::as_str).collect();
        assert_eq!(in_object, programs, "programs in the object vs agent_common::PROGRAMS");
        for p in agent_common::TEST_PROGRAMS.iter().flat_map(|ps| ps.iter()) {
            assert!(!obj.programs.contains_key(p.name), "test-only program {} is in the shipped object", p.name);
        }

        let elf = object::File::parse(super::OBJECT).expect("ELF");
        let symbols: BTreeSet<&str> = elf.symbols().filter_map(|s| s.name().ok()).collect();
        for g in agent_common::GLOBALS {
            assert!(symbols.contains(g), "global {g} is not in the object");
        }

        assert_eq!(obj.license.to_str().ok(), Some(agent_common::LICENSE), "the object's license section");
        let manifest =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../agent-ebpf/Cargo.toml")).expect("agent-ebpf/Cargo.toml");
        let crate_license = manifest.lines().find_map(|l| l.strip_prefix("license = ")).map(|v| v.trim_matches('"')).unwrap_or_default();
        // The kernel's spelling of a dual licence, and SPDX's.
        let spdx = match agent_common::LICENSE {
            "Dual MIT/GPL" => "MIT OR GPL-2.0-only",
            "Dual BSD/GPL" => "BSD-2-Clause OR GPL-2.0-only",
            "GPL" => "GPL-2.0-only",
            other => other,
        };
        assert_eq!(crate_license, spdx, "agent-ebpf's Cargo licence and the object's");
    }
}
