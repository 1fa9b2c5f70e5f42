//! Member offsets of kernel structures, read from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), for the few pointer walks pod attribution
//! needs (task → css_set → cgroup → kernfs_node → id; sock → cgroup), the
//! members of an enum (the names of packet drop reasons) and the parameter
//! types of a tracepoint's prototype (`btf_trace_<name>`).
//!
//! Hand-written rather than aya-obj's parser: aya-obj does not expose member
//! lookups, and finding a handful of offsets needs only the type section's
//! framing (about a hundred lines, unit-tested below).

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
    #[error("no {0} in the kernel's BTF")]
    NoType(String),
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_ENUM64: u32 = 19;

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// One type of the type section, as read: kind, name, referenced type
/// (modifiers, pointers) and where its members, parameters or enumerators
/// are in the section (read from there when asked, so that parsing the
/// kernel's whole BTF allocates 16 bytes per type and nothing more).
#[derive(Clone, Copy, Debug, Default)]
struct Type {
    kind: u8,
    kind_flag: bool,
    vlen: u16,
    name: u32,
    refers: u32,
    /// Byte offset of the type's trailing records in the type section.
    extra: u32,
}

/// The parsed types and strings.
pub struct Btf<'a> {
    strings: &'a [u8],
    section: &'a [u8],
    types: Vec<Type>,
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
        // Type ids start at 1; 0 is void. (About 16 bytes a type: the
        // kernel's BTF has some 150,000.)
        let mut types = Vec::with_capacity(tsec.len() / 24);
        types.push(Type::default());
        let mut at = 0;
        while at < tsec.len() {
            let (name, info, size_or_type) = (u32_at(tsec, at)?, u32_at(tsec, at + 4)?, u32_at(tsec, at + 8)?);
            at += 12;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                1 | 14 | 17 => 4,
                3 => 12,
                KIND_STRUCT | KIND_UNION | KIND_ENUM64 | 15 => vlen * 12,
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                k => return Err(BtfError::Kind(k)),
            };
            if at + extra > tsec.len() {
                return Err(BtfError::Truncated(at));
            }
            types.push(Type {
                kind: kind as u8,
                kind_flag: info >> 31 == 1,
                vlen: vlen as u16,
                name,
                refers: size_or_type,
                extra: at as u32,
            });
            at += extra;
        }
        Ok(Btf { strings, section: tsec, types })
    }

    /// The `i`th u32 of a type's trailing records (in bounds: checked by
    /// `parse`).
    fn word(&self, t: &Type, i: usize) -> u32 {
        u32_at(self.section, t.extra as usize + i * 4).unwrap_or(0)
    }

    /// A struct's or union's members: (name, type, bit offset).
    fn members(&self, t: &'a Type) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        let is_aggregate = matches!(t.kind as u32, KIND_STRUCT | KIND_UNION);
        (0..if is_aggregate { t.vlen as usize } else { 0 }).map(move |m| {
            let offset = self.word(t, m * 3 + 2);
            (self.word(t, m * 3), self.word(t, m * 3 + 1), if t.kind_flag { offset & 0xff_ffff } else { offset })
        })
    }

    /// An enum's enumerators: (name, value; a 32-bit enum's value as the
    /// kernel's enum holds it).
    fn values(&self, t: &'a Type) -> impl Iterator<Item = (u32, u64)> + '_ {
        let (n, wide) = match t.kind as u32 {
            KIND_ENUM => (t.vlen as usize, false),
            KIND_ENUM64 => (t.vlen as usize, true),
            _ => (0, false),
        };
        (0..n).map(move |m| {
            if wide {
                (self.word(t, m * 3), (self.word(t, m * 3 + 2) as u64) << 32 | self.word(t, m * 3 + 1) as u64)
            } else {
                (self.word(t, m * 2), self.word(t, m * 2 + 1) as u64)
            }
        })
    }

    /// A function prototype's parameter types.
    fn params(&self, t: &'a Type) -> impl Iterator<Item = u32> + '_ {
        (0..if t.kind as u32 == KIND_FUNC_PROTO { t.vlen as usize } else { 0 }).map(move |m| self.word(t, m * 2 + 1))
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
            match t.kind as u32 {
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
        for (name, ty, bits) in self.members(t) {
            if name == 0 {
                let inner = self.resolve(ty)?;
                if matches!(inner.kind as u32, KIND_STRUCT | KIND_UNION) {
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
        // The first definition wins (modules may repeat names).
        let mut t = self.named(&[KIND_STRUCT], strukt).ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut bits = 0;
        for (i, m) in path.iter().enumerate() {
            let missing = || BtfError::NoMember { strukt: strukt.to_string(), member: path[..=i].join(".") };
            let (b, ty) = self.find(t, m, 0).ok_or_else(missing)?;
            bits += b;
            if i + 1 < path.len() {
                t = self.resolve(ty).filter(|t| matches!(t.kind as u32, KIND_STRUCT | KIND_UNION)).ok_or_else(missing)?;
            }
        }
        Ok(bits / 8)
    }

    /// The first type of one of `kinds` named `name`.
    fn named(&self, kinds: &[u32], name: &str) -> Option<&Type> {
        self.types.iter().find(|t| kinds.contains(&(t.kind as u32)) && t.name != 0 && self.string(t.name) == Some(name))
    }

    /// The enumerators (name, value) of `enum name`, in declaration order.
    pub fn enumerators(&self, name: &str) -> Result<Vec<(&'a str, u64)>, BtfError> {
        let t = self.named(&[KIND_ENUM, KIND_ENUM64], name).ok_or_else(|| BtfError::NoType(format!("enum {name}")))?;
        Ok(self.values(t).filter_map(|(n, v)| Some((self.string(n)?, v))).collect())
    }

    /// The parameter types of the function prototype a typedef points to,
    /// in C spelling (`struct sk_buff *`, `enum skb_drop_reason`, `void *`):
    /// `btf_trace_kfree_skb` gives the raw tracepoint's arguments after its
    /// leading `void *`.
    pub fn typedef_params(&self, name: &str) -> Result<Vec<String>, BtfError> {
        let missing = || BtfError::NoType(format!("function prototype {name}"));
        let t = self.named(&[KIND_TYPEDEF], name).ok_or_else(missing)?;
        let mut t = self.resolve(t.refers).ok_or_else(missing)?;
        if t.kind as u32 == KIND_PTR {
            t = self.resolve(t.refers).ok_or_else(missing)?;
        }
        if t.kind as u32 != KIND_FUNC_PROTO {
            return Err(missing());
        }
        Ok(self.params(t).map(|ty| self.c_name(ty, 0)).collect())
    }

    /// A type in C spelling, qualifiers and typedefs skipped.
    fn c_name(&self, id: u32, depth: u32) -> String {
        if id == 0 {
            return "void".into();
        }
        let Some(t) = self.resolve(id).filter(|_| depth < 8) else { return "?".into() };
        let name = self.string(t.name).unwrap_or("");
        match t.kind as u32 {
            KIND_PTR => format!("{} *", self.c_name(t.refers, depth + 1)),
            KIND_STRUCT => format!("struct {name}"),
            KIND_UNION => format!("union {name}"),
            KIND_ENUM | KIND_ENUM64 => format!("enum {name}"),
            KIND_FWD => format!("struct {name}"),
            KIND_INT => name.to_string(),
            _ => format!("? {name}"),
        }
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

    /// A BTF blob with enum skb_drop_reason { SKB_CONSUMED = 1,
    /// SKB_DROP_REASON_NO_SOCKET = 3, SKB_DROP_REASON_SUBSYS_MASK =
    /// 0xffff0000 } (signed, as the kernel's), an enum64, struct sk_buff
    /// { void *sk at byte 24 }, and typedef btf_trace_kfree_skb = void
    /// (*)(void *, struct sk_buff *, void *, enum skb_drop_reason).
    fn enum_blob() -> Vec<u8> {
        kfree_skb_blob(true)
    }

    /// The same, the prototype without its reason (Linux < 5.17) unless `reason`.
    fn kfree_skb_blob(reason: bool) -> Vec<u8> {
        let strings = b"\0skb_drop_reason\0SKB_CONSUMED\0SKB_DROP_REASON_NO_SOCKET\0SKB_DROP_REASON_SUBSYS_MASK\0sk_buff\0btf_trace_kfree_skb\0wide\0W_BIG\0sk\0".to_vec();
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            strings.windows(needle.len()).position(|w| w == needle.as_bytes()).map(|p| p as u32 + 1).unwrap_or(0)
        };
        let mut t = Vec::new();
        let mut push = |v: &[u32]| v.iter().for_each(|x| t.extend_from_slice(&x.to_le_bytes()));
        // 1: enum skb_drop_reason (signed: kind_flag), 3 values
        push(&[
            s("skb_drop_reason"),
            1 << 31 | 6 << 24 | 3,
            4,
            s("SKB_CONSUMED"),
            1,
            s("SKB_DROP_REASON_NO_SOCKET"),
            3,
            s("SKB_DROP_REASON_SUBSYS_MASK"),
            0xffff_0000,
        ]);
        // 2: struct sk_buff { void *sk at bit 192 }
        push(&[s("sk_buff"), 4 << 24 | 1, 32, s("sk"), 4, 192]);
        // 3: struct sk_buff *; 4: void *
        push(&[0, 2 << 24, 2]);
        push(&[0, 2 << 24, 0]);
        // 5: func proto (void *, struct sk_buff *, void *, enum skb_drop_reason) -> void
        if reason {
            push(&[0, 13 << 24 | 4, 0, 0, 4, 0, 3, 0, 4, 0, 1]);
        } else {
            push(&[0, 13 << 24 | 3, 0, 0, 4, 0, 3, 0, 4]);
        }
        // 6: pointer to it; 7: typedef btf_trace_kfree_skb
        push(&[0, 2 << 24, 5]);
        push(&[s("btf_trace_kfree_skb"), 8 << 24, 6]);
        // 8: enum64 wide { W_BIG = 1 << 40 }
        push(&[s("wide"), 19 << 24 | 1, 8, s("W_BIG"), 0, 1 << 8]);
        let mut out = vec![0x9f, 0xeb, 1, 0];
        for v in [24u32, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&t);
        out.extend_from_slice(&strings);
        out
    }

    #[test]
    fn enumerators_and_prototype_parameters() {
        let data = enum_blob();
        let btf = Btf::parse(&data).expect("parses");
        assert_eq!(
            btf.enumerators("skb_drop_reason"),
            Ok(vec![("SKB_CONSUMED", 1), ("SKB_DROP_REASON_NO_SOCKET", 3), ("SKB_DROP_REASON_SUBSYS_MASK", 0xffff_0000)])
        );
        assert_eq!(btf.enumerators("wide"), Ok(vec![("W_BIG", 1 << 40)]));
        assert_eq!(btf.enumerators("nope"), Err(BtfError::NoType("enum nope".into())));
        let params = btf.typedef_params("btf_trace_kfree_skb");
        assert_eq!(params, Ok(vec!["void *".into(), "struct sk_buff *".into(), "void *".into(), "enum skb_drop_reason".into()]));
        assert!(btf.typedef_params("sk_buff").is_err());
        for cut in 0..data.len() {
            let _ = Btf::parse(&data[..cut]);
        }
    }

    #[test]
    fn kfree_skb_facts_from_btf() {
        let data = enum_blob();
        let btf = Btf::parse(&data).expect("parses");
        let d = crate::ebpf::kernel::drop_reasons(&btf).expect("kfree_skb passes a reason");
        // Argument indices count from the tracepoint's first argument, after `void *__data`.
        assert_eq!((d.skb_arg, d.reason_arg, d.rx_sk_arg, d.skb_sk), (0, Some(2), None, Some(24)));
        let names: Vec<(u64, &str)> = d.names.iter().map(|(v, n)| (*v, n.as_str())).collect();
        assert_eq!(names, [(1, "CONSUMED"), (3, "NO_SOCKET"), (0xffff_0000, "SUBSYS_MASK")]);
        // A blob whose kfree_skb passes no reason (Linux < 5.17): no reason
        // argument, no names (drops count as `unknown`), the packet where it is.
        let old = kfree_skb_blob(false);
        let btf = Btf::parse(&old).expect("parses");
        let d = crate::ebpf::kernel::drop_reasons(&btf).expect("kfree_skb passes a packet");
        assert_eq!((d.skb_arg, d.reason_arg, d.names.len()), (0, None, 0));
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
        assert!(btf.offset("sk_buff", &["sk"]).is_ok());
        let reasons = btf.enumerators("skb_drop_reason").expect("enum skb_drop_reason");
        assert!(reasons.iter().any(|(n, _)| *n == "SKB_DROP_REASON_NO_SOCKET"), "{reasons:?}");
        let params = btf.typedef_params("btf_trace_kfree_skb").expect("btf_trace_kfree_skb");
        assert_eq!(params.first().map(String::as_str), Some("void *"));
        assert!(params.iter().any(|p| p == "enum skb_drop_reason"), "{params:?}");
    }
}
