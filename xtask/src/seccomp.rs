//! `cargo xtask seccomp-profile`: node-agent's seccomp profile,
//! `deploy/seccomp/node-agent.json`, written from the container runtime's
//! default profile as installed here (containers-common's
//! `/usr/share/containers/seccomp.json`: podman's and CRI-O's
//! RuntimeDefault) with exactly two changes: bpf(2) and perf_event_open(2)
//! are allowed whatever the capabilities (the default allows them only with
//! CAP_SYS_ADMIN, which the agent is not given; the kernel still asks for
//! CAP_BPF and CAP_PERFMON). Everything else the default refuses stays
//! refused. The binary embeds the file (`node-agent seccomp-profile`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The runtime default this profile is made from.
pub const RUNTIME_DEFAULT: &str = "/usr/share/containers/seccomp.json";
/// The committed profile.
pub const PROFILE: &str = "deploy/seccomp/node-agent.json";
/// What the agent adds to the default.
pub const ADDED: &[&str] = &["bpf", "perf_event_open"];

/// The default profile with ADDED allowed unconditionally: the names are
/// taken out of every rule that mentions them (the default's conditional
/// allow and its conditional EPERM), and one rule allows them.
pub fn derive(default: &Value) -> Result<Value> {
    let mut p = default.clone();
    let Some(rules) = p.get_mut("syscalls").and_then(Value::as_array_mut) else { bail!("the default profile has no `syscalls` list") };
    for r in rules.iter_mut() {
        if let Some(names) = r.get_mut("names").and_then(Value::as_array_mut) {
            names.retain(|n| !n.as_str().is_some_and(|n| ADDED.contains(&n)));
        }
    }
    rules.retain(|r| r.get("names").and_then(Value::as_array).is_none_or(|n| !n.is_empty()));
    rules.push(json!({
        "names": ADDED,
        "action": "SCMP_ACT_ALLOW",
        "args": [],
        "comment": "node-agent: its eBPF programs (the kernel still requires CAP_BPF and CAP_PERFMON)",
        "includes": {},
        "excludes": {}
    }));
    Ok(p)
}

fn render(v: &Value) -> Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(v)?))
}

/// The profile from the default installed here.
pub fn from_installed() -> Result<String> {
    let text = std::fs::read_to_string(RUNTIME_DEFAULT).with_context(|| {
        format!("reading the runtime's default profile {RUNTIME_DEFAULT} (Debian's golang-github-containers-common, with podman)")
    })?;
    let default: Value = serde_json::from_str(&text).with_context(|| format!("parsing {RUNTIME_DEFAULT}"))?;
    render(&derive(&default)?)
}

/// Writes the committed profile; true when it changed.
pub fn write(root: &Path) -> Result<bool> {
    let text = from_installed()?;
    let path = root.join(PROFILE);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `name` is allowed with no condition on capabilities,
    /// arguments or kernel version.
    fn allowed(p: &Value, name: &str) -> bool {
        p["syscalls"].as_array().unwrap().iter().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                && r["names"].as_array().unwrap().iter().any(|n| n == name)
                && r.get("args").and_then(Value::as_array).is_none_or(Vec::is_empty)
                && r.get("includes").and_then(Value::as_object).is_none_or(|o| o.is_empty())
                && r.get("excludes").and_then(Value::as_object).is_none_or(|o| o.is_empty())
        })
    }

    fn names(p: &Value) -> std::collections::BTreeSet<String> {
        p["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()))
            .collect()
    }

    #[test]
    fn derived_from_a_default_adds_exactly_two_calls() {
        let default = json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW", "args": [], "includes": {}, "excludes": {}},
                {"names": ["bpf", "perf_event_open", "setns"], "action": "SCMP_ACT_ALLOW", "args": [], "includes": {"caps": ["CAP_SYS_ADMIN"]}, "excludes": {}},
                {"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "args": [], "includes": {}, "excludes": {"caps": ["CAP_SYS_ADMIN"]}, "errnoRet": 1}
            ]
        });
        let p = derive(&default).unwrap();
        assert!(allowed(&p, "bpf") && allowed(&p, "perf_event_open"));
        assert!(allowed(&p, "read") && !allowed(&p, "setns"), "the rest as it was");
        assert_eq!(p["syscalls"].as_array().unwrap().len(), 3, "the emptied EPERM rule is gone, one rule added");
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
    }

    /// The committed profile is the installed default plus the two calls
    /// (regenerate with `cargo xtask seccomp-profile` when the runtime's
    /// default changes), and refuses what that default refuses.
    #[test]
    fn the_committed_profile_is_the_runtime_default_plus_two() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let committed = std::fs::read_to_string(root.join(PROFILE)).expect("the committed profile");
        let p: Value = serde_json::from_str(&committed).unwrap();
        for n in ADDED {
            assert!(allowed(&p, n), "{n} is not allowed unconditionally");
        }
        for refused in ["add_key", "request_key", "kexec_load"] {
            assert!(!allowed(&p, refused), "{refused} must stay refused");
        }
        if !Path::new(RUNTIME_DEFAULT).exists() {
            assert!(std::env::var_os("CI").is_none(), "{RUNTIME_DEFAULT} (podman's containers-common) must be installed in CI");
            eprintln!("SKIP: no {RUNTIME_DEFAULT} to compare with");
            return;
        }
        let default: Value = serde_json::from_str(&std::fs::read_to_string(RUNTIME_DEFAULT).unwrap()).unwrap();
        assert_eq!(committed, from_installed().unwrap(), "{PROFILE} is stale: run `cargo xtask seccomp-profile`");
        let (ours, theirs) = (names(&p), names(&default));
        assert_eq!(ours, theirs, "the same syscalls are named");
        let newly: Vec<&String> = ours.iter().filter(|n| allowed(&p, n) && !allowed(&default, n)).collect();
        assert_eq!(newly, ["bpf", "perf_event_open"]);
    }
}
