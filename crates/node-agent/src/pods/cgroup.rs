//! The cgroup v2 hierarchy as pod attribution sees it: cgroup ids (the
//! directory inode, what `bpf_get_current_cgroup_id` returns) mapped to the
//! pod and container a kubelet-made path names.
//!
//! Paths the kubelet and the runtimes make, all understood:
//! - cgroupfs driver: `kubepods/burstable/pod<uid>/<container id>` (CRI-O:
//!   `crio-<id>`);
//! - systemd driver: `kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
//!   (`crio-<id>.scope`, `docker-<id>.scope`; `crio-conmon-<id>.scope` is
//!   the pod's, not a container's);
//! - any prefix before the first `kubepods` component (`kubelet.slice/
//!   kubelet-kubepods.slice/...`, a `--cgroup-root`), and any depth below a
//!   container's cgroup (counted as that container).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A pod (by UID, or by static pod hash) and, below it, a container id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    /// The runtime's container id (64 hex digits), when the cgroup is a
    /// container's or below one.
    pub container: Option<String>,
}

/// A pod UID: a UUID, or the 32 hex digits of a static pod's hash.
fn is_uid(s: &str) -> bool {
    let b = s.as_bytes();
    match b.len() {
        36 => b.iter().enumerate().all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() }),
        32 => b.iter().all(u8::is_ascii_hexdigit),
        _ => false,
    }
}

/// The pod UID a path component names, if it is a pod's cgroup.
fn pod_uid(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    if let Some(rest) = name.strip_prefix("pod").filter(|r| is_uid(r)) {
        return Some(rest.to_string());
    }
    let pos = name.rfind("-pod")?;
    let uid = name[pos + 4..].replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// The container id a path component under a pod names, if any.
fn container_id(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    if name.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "cri-o-"].iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The pod and container a cgroup path (relative to the hierarchy's root)
/// belongs to; None for the host's cgroups.
pub fn parse_path(rel: &str) -> Option<PodRef> {
    let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    let first = comps.iter().position(|c| c.contains("kubepods"))?;
    let (at, uid) = comps.iter().enumerate().skip(first + 1).find_map(|(i, c)| pod_uid(c).map(|u| (i, u)))?;
    let container = comps.get(at + 1).and_then(|c| container_id(c));
    Some(PodRef { uid, container })
}

/// The root of the cgroup v2 hierarchy under a sysfs mount: `fs/cgroup`
/// (unified mode) or `fs/cgroup/unified` (hybrid mode); None on a v1-only
/// host, where every task's cgroup v2 id is the root's.
pub fn v2_root(sysfs: &Path) -> Option<PathBuf> {
    let base = sysfs.join("fs/cgroup");
    [base.clone(), base.join("unified")].into_iter().find(|p| p.join("cgroup.controllers").exists())
}

/// One cgroup of a walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    pub path: String,
    pub pod: Option<PodRef>,
}

/// Bounds of a walk, against hostile or runaway trees.
const MAX_DEPTH: usize = 32;
pub const MAX_CGROUPS: usize = 100_000;

/// Whether a cgroup path is a pod's own cgroup or one of its containers'
/// (not a cgroup below a container, nor a pod's other cgroups such as
/// CRI-O's conmon): the cgroups the kubelet sets CPU limits on.
pub fn is_own(rel: &str) -> bool {
    let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    let Some((last, parents)) = comps.split_last() else { return false };
    if parse_path(rel).is_none() {
        return false;
    }
    pod_uid(last).is_some() || (container_id(last).is_some() && parents.last().is_some_and(|p| pod_uid(p).is_some()))
}

/// Every cgroup under `root` by id. Uses readdir's inode numbers only (no
/// stat): on cgroupfs the inode number is the cgroup id.
pub fn walk(root: &Path) -> HashMap<u64, Cgroup> {
    walk_where(root, |_, _| true)
}

/// The pods' cgroups only: the subtrees of the `kubepods` cgroups (found
/// at the root, or in a `.slice` just below it), not the host's.
pub fn walk_pods(root: &Path) -> HashMap<u64, Cgroup> {
    let mut out = walk_where(root, |rel, depth| rel.contains("kubepods") || (depth == 0 && rel.ends_with(".slice")));
    out.retain(|_, c| c.pod.is_some());
    out
}

/// The cgroups under `root`, descending only into those `descend(path,
/// depth)` accepts.
fn walk_where(root: &Path, descend: impl Fn(&str, usize) -> bool) -> HashMap<u64, Cgroup> {
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    let mut out = HashMap::new();
    if let Ok(m) = std::fs::metadata(root) {
        out.insert(m.ino(), Cgroup { path: String::new(), pod: None });
    }
    let mut stack = vec![(root.to_path_buf(), String::new(), 0usize)];
    while let Some((dir, rel, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) || out.len() >= MAX_CGROUPS {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let pod = parse_path(&path);
            out.insert(e.ino(), Cgroup { path: path.clone(), pod });
            if depth + 1 < MAX_DEPTH && descend(&path, depth) {
                stack.push((e.path(), path, depth + 1));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f9e2c6a-1b3d-4e5f-8a7b-9c0d1e2f3a4b";
    const CID: &str = "4c5d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

    fn pod(container: Option<&str>) -> Option<PodRef> {
        Some(PodRef { uid: UID.into(), container: container.map(str::to_string) })
    }

    #[test]
    fn own_cgroups_are_the_pods_and_its_containers() {
        assert!(is_own(&format!("kubepods/burstable/pod{UID}")));
        assert!(is_own(&format!("kubepods/burstable/pod{UID}/{CID}")));
        let systemd = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", UID.replace('-', "_"));
        assert!(is_own(&systemd));
        assert!(is_own(&format!("{systemd}/cri-containerd-{CID}.scope")));
        assert!(!is_own(&format!("{systemd}/crio-conmon-{CID}.scope")), "conmon is the pod's, not limited");
        assert!(!is_own(&format!("kubepods/burstable/pod{UID}/{CID}/sub")), "below a container");
        assert!(!is_own("kubepods/burstable"));
        assert!(!is_own("system.slice/containerd.service"));
        assert!(!is_own(""));
    }

    #[test]
    fn pod_walk_keeps_to_the_pods_subtrees() {
        let dir = std::env::temp_dir().join(format!("na-walk-pods-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for rel in [
            format!("kubepods/burstable/pod{UID}/{CID}"),
            format!("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{}.slice", UID.replace('-', "_")),
            "system.slice/kubepods-lookalike/deeper".to_string(),
            format!("user.slice/x/kubepods/pod{UID}"),
        ] {
            std::fs::create_dir_all(dir.join(rel)).expect("mkdir");
        }
        let mut found: Vec<String> = walk_pods(&dir).into_values().map(|c| c.path).collect();
        found.sort();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            found,
            [
                format!("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{}.slice", UID.replace('-', "_")),
                format!("kubepods/burstable/pod{UID}"),
                format!("kubepods/burstable/pod{UID}/{CID}"),
            ]
        );
    }

    #[test]
    fn cgroupfs_driver_paths() {
        assert_eq!(parse_path(&format!("kubepods/burstable/pod{UID}")), pod(None));
        assert_eq!(parse_path(&format!("kubepods/besteffort/pod{UID}/{CID}")), pod(Some(CID)));
        assert_eq!(parse_path(&format!("kubepods/pod{UID}/{CID}")), pod(Some(CID)), "guaranteed QoS");
        assert_eq!(parse_path(&format!("kubepods/burstable/pod{UID}/crio-{CID}")), pod(Some(CID)));
        assert_eq!(parse_path(&format!("kubepods/burstable/pod{UID}/{CID}/init.scope/x")), pod(Some(CID)), "below a container");
    }

    #[test]
    fn systemd_driver_paths() {
        let u = UID.replace('-', "_");
        let slice = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice");
        assert_eq!(parse_path(&slice), pod(None));
        assert_eq!(parse_path(&format!("{slice}/cri-containerd-{CID}.scope")), pod(Some(CID)));
        assert_eq!(parse_path(&format!("{slice}/crio-{CID}.scope")), pod(Some(CID)));
        assert_eq!(parse_path(&format!("{slice}/docker-{CID}.scope")), pod(Some(CID)));
        assert_eq!(parse_path(&format!("{slice}/crio-conmon-{CID}.scope")), pod(None), "conmon is the pod's");
        assert_eq!(parse_path(&format!("kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{CID}.scope")), pod(Some(CID)));
        // kind and --cgroup-root prefixes.
        assert_eq!(
            parse_path(&format!("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope")),
            pod(Some(CID))
        );
    }

    #[test]
    fn static_pod_hashes_and_host_paths() {
        let hash = "6f1e2d3c4b5a69788796a5b4c3d2e1f0";
        assert_eq!(parse_path(&format!("kubepods/burstable/pod{hash}/{CID}")).map(|p| p.uid), Some(hash.to_string()));
        for host in [
            "",
            "system.slice/containerd.service",
            "kubepods",
            "kubepods/burstable",
            "kubepods.slice/kubepods-burstable.slice",
            "user.slice/user-1000.slice/pod1234",
            &format!("system.slice/pod{UID}"), // no kubepods ancestor
            "kubepods/burstable/podnot-a-uid",
        ] {
            assert_eq!(parse_path(host), None, "{host:?}");
        }
        // A short or non-hex container directory is the pod's own.
        assert_eq!(parse_path(&format!("kubepods/pod{UID}/abc")), pod(None));
    }

    #[test]
    fn walk_maps_inodes_to_paths() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let c = dir.path().join(format!("kubepods/burstable/pod{UID}/{CID}"));
        std::fs::create_dir_all(&c).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("system.slice/cron.service")).expect("mkdir");
        std::fs::write(dir.path().join("cgroup.procs"), "").expect("file");
        let w = walk(dir.path());
        let ino = std::fs::metadata(&c).expect("stat").ino();
        assert_eq!(w[&ino].pod, pod(Some(CID)));
        assert_eq!(w[&ino].path, format!("kubepods/burstable/pod{UID}/{CID}"));
        assert_eq!(w.len(), 1 + 4 + 2, "root, the kubepods chain and the two host dirs; no files");
        assert_eq!(w[&std::fs::metadata(dir.path()).expect("stat").ino()].path, "");
    }
}
