//! Member offsets of kernel structures, read from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), for the few pointer walks pod attribution
//! needs (task → css_set → cgroup → kernfs_node → id; sock → cgroup).
//!
//! Hand-written rather than aya-obj's parser: aya-obj does not expose member
//! lookups, and finding a handful of offsets needs only the type section's
//! framing (about a hundred lines, unit-tested below).

use std::collections::HashMap;

/// Why offsets could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BtfError {
    #[error("not BTF (bad magic or header)")]
    Header,
    #[error("truncated BTF at byte {0}")]
    Truncated(usize),
    #[error("unknown BTF kind {0}")]
    Kind(u32),
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("no member {member} in struct {strukt}")]
    NoMember { strukt: String, member: String },
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// One type of the type section: kind, name, referenced type (modifiers)
/// and members (structs and unions: name, type, bit offset).
#[derive(Clone, Debug, Default)]
struct Type {
    kind: u32,
    name: u32,
    refers: u32,
    members: Vec<(u32, u32, u32)>,
}

/// The parsed types and strings.
pub struct Btf<'a> {
    strings: &'a [u8],
    types: Vec<Type>,
    structs: HashMap<&'a str, u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    let b = data.get(at..at + 4).ok_or(BtfError::Truncated(at))?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl<'a> Btf<'a> {
    /// Parses little-endian BTF (the kernel's own byte order on the
    /// architectures node-agent runs on).
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Header);
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or(BtfError::Header)?;
            data.get(start..start.checked_add(len).ok_or(BtfError::Header)?).ok_or(BtfError::Truncated(start))
        };
        let (tsec, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        // Type ids start at 1; 0 is void.
        let mut types = vec![Type::default()];
        let mut at = 0;
        while at < tsec.len() {
            let (name, info, size_or_type) = (u32_at(tsec, at)?, u32_at(tsec, at + 4)?, u32_at(tsec, at + 8)?);
            at += 12;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let kind_flag = info >> 31 == 1;
            let mut t = Type { kind, name, refers: size_or_type, members: Vec::new() };
            let extra = match kind {
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                1 | 14 | 17 => 4,
                3 => 12,
                KIND_STRUCT | KIND_UNION => {
                    for m in 0..vlen {
                        let base = at + m * 12;
                        let offset = u32_at(tsec, base + 8)?;
                        let bits = if kind_flag { offset & 0xff_ffff } else { offset };
                        t.members.push((u32_at(tsec, base)?, u32_at(tsec, base + 4)?, bits));
                    }
                    vlen * 12
                }
                6 | 13 => vlen * 8,
                15 | 19 => vlen * 12,
                k => return Err(BtfError::Kind(k)),
            };
            at += extra;
            types.push(t);
        }
        let mut btf = Btf { strings, types, structs: HashMap::new() };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT {
                if let Some(n) = btf.string(t.name).filter(|n| !n.is_empty()) {
                    // The first definition wins (modules may repeat names).
                    btf.structs.entry(n).or_insert(id as u32);
                }
            }
        }
        Ok(btf)
    }

    fn string(&self, off: u32) -> Option<&'a str> {
        let s = self.strings.get(off as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    }

    /// Skips typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let t = self.types.get(id as usize)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.refers,
                _ => return Some(t),
            }
        }
        None
    }

    /// Bit offset and type of `member` in `t`, looking into anonymous
    /// structs and unions.
    fn find(&self, t: &Type, member: &str, depth: u32) -> Option<(u32, u32)> {
        if depth > 8 {
            return None;
        }
        for &(name, ty, bits) in &t.members {
            if name == 0 {
                let inner = self.resolve(ty)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                    if let Some((b, mty)) = self.find(inner, member, depth + 1) {
                        return Some((bits + b, mty));
                    }
                }
            } else if self.string(name) == Some(member) {
                return Some((bits, ty));
            }
        }
        None
    }

    /// Byte offset of a member path in a struct: `("sock", &["sk_cgrp_data",
    /// "cgroup"])` is the offset of `sk->sk_cgrp_data.cgroup`.
    pub fn offset(&self, strukt: &str, path: &[&str]) -> Result<u32, BtfError> {
        let id = *self.structs.get(strukt).ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut t = self.resolve(id).ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut bits = 0;
        for (i, m) in path.iter().enumerate() {
            let missing = || BtfError::NoMember { strukt: strukt.to_string(), member: path[..=i].join(".") };
            let (b, ty) = self.find(t, m, 0).ok_or_else(missing)?;
            bits += b;
            if i + 1 < path.len() {
                t = self.resolve(ty).filter(|t| matches!(t.kind, KIND_STRUCT | KIND_UNION)).ok_or_else(missing)?;
            }
        }
        Ok(bits / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob: int, struct inner { int pad; int id; }, struct outer
    /// { int a; union { int b; struct inner in; }; } (anonymous union).
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0pad\0id\0inner\0outer\0a\0b\0in\0".to_vec();
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            strings.windows(needle.len()).position(|w| w == needle.as_bytes()).map(|p| p as u32 + 1).unwrap_or(0)
        };
        let mut t = Vec::new();
        let mut push = |v: &[u32]| v.iter().for_each(|x| t.extend_from_slice(&x.to_le_bytes()));
        // 1: int (4 bytes)
        push(&[s("int"), 1 << 24, 4, 32]);
        // 2: struct inner, 2 members
        push(&[s("inner"), 4 << 24 | 2, 8, s("pad"), 1, 0, s("id"), 1, 32]);
        // 3: anonymous union, 2 members
        push(&[0, 5 << 24 | 2, 8, s("b"), 1, 0, s("in"), 2, 0]);
        // 4: struct outer { int a; union {...} at byte 8 }
        push(&[s("outer"), 4 << 24 | 2, 16, s("a"), 1, 0, 0, 3, 64]);
        let mut out = vec![0x9f, 0xeb, 1, 0];
        for v in [24u32, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&t);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn offsets_through_anonymous_members_and_paths() {
        let data = blob();
        let btf = Btf::parse(&data).expect("parses");
        assert_eq!(btf.offset("inner", &["id"]), Ok(4));
        assert_eq!(btf.offset("outer", &["a"]), Ok(0));
        assert_eq!(btf.offset("outer", &["b"]), Ok(8));
        assert_eq!(btf.offset("outer", &["in", "id"]), Ok(12));
        assert_eq!(btf.offset("outer", &["in", "nope"]), Err(BtfError::NoMember { strukt: "outer".into(), member: "in.nope".into() }));
        assert_eq!(btf.offset("missing", &["a"]), Err(BtfError::NoStruct("missing".into())));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let data = blob();
        assert!(matches!(Btf::parse(&data[..10]), Err(BtfError::Header)));
        assert!(Btf::parse(&data[..data.len() - 20]).is_err());
        let mut bad_kind = data.clone();
        bad_kind[24 + 7] = 30; // kind 30 in the first type's info
        assert!(matches!(Btf::parse(&bad_kind), Err(BtfError::Kind(30))));
        for cut in 0..data.len() {
            let _ = Btf::parse(&data[..cut]);
        }
    }

    #[test]
    fn running_kernel_has_the_members_we_walk() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("SKIP: no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = Btf::parse(&data).expect("the kernel's BTF parses");
        for (s, path) in [
            ("task_struct", &["cgroups"][..]),
            ("css_set", &["dfl_cgrp"]),
            ("cgroup", &["kn"]),
            ("kernfs_node", &["id"]),
            ("sock", &["sk_cgrp_data", "cgroup"]),
        ] {
            let off = btf.offset(s, path).unwrap_or_else(|e| panic!("{s}.{path:?}: {e}"));
            assert!(off < 16384, "{s}.{path:?} at {off}");
        }
        // sk_cgrp_data.cgroup is the first member of sock_cgroup_data.
        assert_eq!(btf.offset("sock", &["sk_cgrp_data", "cgroup"]), btf.offset("sock", &["sk_cgrp_data"]));
    }
}
