//! The pods' cgroups as they come and go, followed on a thread of its own
//! so that a cgroup is named when it appears, not when a scrape happens to
//! walk the hierarchy: an init container, a Job's pod or a crash-looping
//! container that lives a few seconds between two scrapes still has its
//! counts named, by the path it had, after its cgroup is gone.
//!
//! The pods' subtrees of the cgroup v2 hierarchy (the `kubepods` cgroups,
//! found at the root or in a `.slice` just below it: `cgroup::walk_pods`'s
//! rule) are walked once at start and then followed with inotify: a
//! directory made (`IN_CREATE`) is looked at at once (its inode number is
//! its cgroup id) and watched in turn, one removed (`IN_DELETE`) is marked
//! gone. A queue overflow walks the subtrees again. Where inotify cannot be
//! had (no instance or watch left: `fs.inotify.max_user_instances`,
//! `max_user_watches`), the subtrees are walked every [`POLL_EVERY`]
//! instead, and a cgroup that lives less than that may go unnamed (said
//! once, at warn).
//!
//! Only pods' cgroups are kept: any other id is the host's. Gone cgroups
//! are kept for the retention (the pod attribution grace period) so that
//! their last counts can still be named, then forgotten; at most
//! [`MAX_KEPT`] cgroups are kept (about 400 bytes each), the ones gone
//! longest ago making room first. Readers call [`Hierarchy::view`], which
//! reads the events already queued first, so a cgroup made just before a
//! scrape is known to it.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::inotify;

use super::cgroup::{self, Cgroup};

/// How often the subtrees are walked where inotify is not available.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// The most cgroups kept: live ones of 1,000 pods (`index::MAX_PODS`) with
/// several containers each, and the gone ones of their grace period.
pub const MAX_KEPT: usize = 16_384;

/// Subtrees deeper than this are not followed (as `cgroup::walk`).
const MAX_DEPTH: usize = 32;

/// A pod's cgroup, and since when it is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    pub cgroup: Cgroup,
    pub gone: Option<Instant>,
}

/// How the hierarchy is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Events as cgroups are made and removed.
    Inotify,
    /// A walk every [`POLL_EVERY`].
    Polling,
}

/// The state the thread and the readers share.
pub struct State {
    root: PathBuf,
    inotify: Option<OwnedFd>,
    /// Watched directories by watch descriptor: their path and depth.
    watches: HashMap<i32, (String, usize)>,
    /// Pods' cgroups by id.
    cgroups: HashMap<u64, Known>,
    /// Live pods' cgroups by path, for removals (named by path).
    by_path: HashMap<String, u64>,
    retention: Duration,
    walked: Option<Instant>,
    /// Cgroups not kept because [`MAX_KEPT`] were (counted).
    pub refused: u64,
}

impl State {
    fn new(root: PathBuf, retention: Duration) -> State {
        State {
            root,
            inotify: None,
            watches: HashMap::new(),
            cgroups: HashMap::new(),
            by_path: HashMap::new(),
            retention,
            walked: None,
            refused: 0,
        }
    }

    pub fn mode(&self) -> Mode {
        if self.inotify.is_some() {
            Mode::Inotify
        } else {
            Mode::Polling
        }
    }

    /// The pod cgroup with this id (live, or gone within the retention);
    /// None for the host's cgroups.
    pub fn get(&self, id: u64) -> Option<&Known> {
        self.cgroups.get(&id)
    }

    /// The live pods' cgroups.
    pub fn live(&self) -> impl Iterator<Item = (u64, &Cgroup)> {
        self.cgroups.iter().filter(|(_, k)| k.gone.is_none()).map(|(id, k)| (*id, &k.cgroup))
    }

    pub fn len(&self) -> usize {
        self.cgroups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cgroups.is_empty()
    }

    /// Whether the directory `rel` (at `depth`, the root's children being
    /// at 0) is followed: `cgroup::walk_pods`'s rule.
    fn follows(rel: &str, depth: usize) -> bool {
        depth < MAX_DEPTH && (rel.contains("kubepods") || (depth == 0 && rel.ends_with(".slice")))
    }

    /// A directory `rel` at `depth` exists (made, or found by a walk):
    /// kept if it is a pod's, then watched and its children looked at if
    /// it is followed.
    fn found(&mut self, rel: &str, depth: usize, now: Instant) {
        use std::os::unix::fs::MetadataExt;
        let path = self.root.join(rel);
        // Gone already: it lived for less than this took.
        let Ok(meta) = std::fs::symlink_metadata(&path) else { return };
        if !meta.is_dir() {
            return;
        }
        if let Some(pod) = cgroup::parse_path(rel) {
            self.keep(meta.ino(), Cgroup { path: rel.to_string(), pod: Some(pod) }, now);
        }
        if !State::follows(rel, depth) {
            return;
        }
        self.watch(&path, rel, depth);
        // Children made before the watch was in place.
        let Ok(entries) = std::fs::read_dir(&path) else { return };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let child = format!("{rel}/{}", e.file_name().to_string_lossy());
                self.found(&child, depth + 1, now);
            }
        }
    }

    /// Watches `path` for directories made and removed in it; a watch that
    /// cannot be added ends inotify for the whole hierarchy.
    fn watch(&mut self, path: &Path, rel: &str, depth: usize) {
        let Some(fd) = &self.inotify else { return };
        let flags =
            inotify::WatchFlags::CREATE | inotify::WatchFlags::DELETE | inotify::WatchFlags::ONLYDIR | inotify::WatchFlags::DONT_FOLLOW;
        match inotify::add_watch(fd, path, flags) {
            Ok(wd) => {
                self.watches.insert(wd, (rel.to_string(), depth));
            }
            // Gone meanwhile.
            Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => {}
            Err(e) => self.poll_instead(&format!("adding an inotify watch on {}: {e}", path.display())),
        }
    }

    fn poll_instead(&mut self, why: &str) {
        if self.inotify.take().is_some() {
            tracing::warn!(
                err = why,
                every = ?POLL_EVERY,
                "pod attribution: following the pods' cgroups by walking them instead of with inotify; a container living less than that may count for the host"
            );
            self.watches.clear();
        }
    }

    fn keep(&mut self, id: u64, cg: Cgroup, now: Instant) {
        // A path made again (removed and made between two looks) is a new cgroup.
        if let Some(old) = self.by_path.get(&cg.path).copied().filter(|old| *old != id) {
            if let Some(k) = self.cgroups.get_mut(&old) {
                k.gone.get_or_insert(now);
            }
        }
        if let Some(k) = self.cgroups.get_mut(&id) {
            k.gone = None;
            self.by_path.insert(cg.path, id);
            return;
        }
        if self.cgroups.len() >= MAX_KEPT {
            self.expire(now, true);
            if self.cgroups.len() >= MAX_KEPT {
                self.refused += 1;
                return;
            }
        }
        self.by_path.insert(cg.path.clone(), id);
        self.cgroups.insert(id, Known { cgroup: cg, gone: None });
    }

    /// Whether every pod cgroup that existed at `t` is known (or was gone
    /// before it could be looked at): always with inotify, which queues a
    /// directory's making before anything can run in it; else once a walk
    /// started after `t`.
    pub fn settled(&self, t: Instant) -> bool {
        self.inotify.is_some() || self.walked.is_some_and(|w| w > t)
    }

    fn removed(&mut self, rel: &str, now: Instant) {
        if let Some(id) = self.by_path.remove(rel) {
            if let Some(k) = self.cgroups.get_mut(&id) {
                k.gone.get_or_insert(now);
            }
        }
    }

    /// Forgets what went more than the retention ago; `room`: also the
    /// half of the gone ones that went longest ago, to make room.
    fn expire(&mut self, now: Instant, room: bool) {
        let retention = self.retention;
        self.cgroups.retain(|_, k| k.gone.is_none_or(|g| now.saturating_duration_since(g) < retention));
        if room {
            let mut gone: Vec<(Instant, u64)> = self.cgroups.iter().filter_map(|(id, k)| k.gone.map(|g| (g, *id))).collect();
            gone.sort_unstable();
            for (_, id) in gone.iter().take(gone.len().div_ceil(2)) {
                self.cgroups.remove(id);
            }
        }
    }

    /// Walks the subtrees: cgroups found are kept (and watched), those kept
    /// and not found are gone.
    fn walk(&mut self, now: Instant) {
        let before: Vec<String> = self.by_path.keys().cloned().collect();
        let Ok(entries) = std::fs::read_dir(&self.root) else { return };
        let top: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for name in top {
            self.found(&name, 0, now);
        }
        // What was kept and is not there any more is gone (a path made
        // again was found anew, and its old cgroup marked gone by `keep`).
        for path in before {
            if std::fs::symlink_metadata(self.root.join(&path)).is_err() {
                self.removed(&path, now);
            }
        }
        self.walked = Some(now);
    }

    /// Reads the events queued (never blocking) and acts on them.
    fn drain(&mut self, now: Instant) {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut events: Vec<(i32, inotify::ReadFlags, Option<String>)> = Vec::new();
        let mut overflow = false;
        {
            let Some(fd) = &self.inotify else { return };
            let mut reader = inotify::Reader::new(fd.as_fd(), &mut buf);
            loop {
                match reader.next() {
                    Ok(e) => {
                        if e.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
                            overflow = true;
                            continue;
                        }
                        let name = e.file_name().map(|n| n.to_string_lossy().into_owned()).filter(|n| !n.is_empty());
                        events.push((e.wd(), e.events(), name));
                    }
                    Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => break,
                    Err(e) => {
                        tracing::debug!(err = %e, "pod attribution: reading inotify events");
                        break;
                    }
                }
            }
        }
        for (wd, flags, name) in events {
            if flags.contains(inotify::ReadFlags::IGNORED) {
                self.watches.remove(&wd);
                continue;
            }
            let (Some((parent, depth)), Some(name)) = (self.watches.get(&wd).cloned(), name) else { continue };
            if !flags.contains(inotify::ReadFlags::ISDIR) {
                continue;
            }
            let rel = if parent.is_empty() { name } else { format!("{parent}/{name}") };
            let depth = if parent.is_empty() { 0 } else { depth + 1 };
            if flags.contains(inotify::ReadFlags::CREATE) {
                self.found(&rel, depth, now);
            } else if flags.contains(inotify::ReadFlags::DELETE) {
                self.removed(&rel, now);
            }
        }
        if overflow {
            tracing::debug!("pod attribution: the inotify queue overflowed; walking the pods' cgroups again");
            self.walk(now);
        }
    }

    /// What the thread does when nothing happened for a while: forgets old
    /// gone cgroups, and walks where there is no inotify.
    fn tick(&mut self, now: Instant) {
        self.expire(now, false);
        if self.inotify.is_none() && self.walked.is_none_or(|w| now.saturating_duration_since(w) >= POLL_EVERY) {
            self.walk(now);
        }
    }
}

/// Whose a cgroup is, as far as can be told now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whose<'a> {
    /// Not a pod's: the host's.
    Host,
    /// A pod's (and maybe a container's).
    Pod(&'a cgroup::PodRef),
    /// Not known yet (a walk is due).
    NotYet,
}

/// Names cgroups by id: the followed hierarchy, or (tests, a node without
/// a cgroup v2 hierarchy) a walk's result or nothing.
pub trait Lookup {
    /// Whose the cgroup `id`, first counted at `seen`, is.
    fn whose(&self, id: u64, seen: Instant) -> Whose<'_>;
}

impl Lookup for State {
    fn whose(&self, id: u64, seen: Instant) -> Whose<'_> {
        match self.get(id) {
            Some(k) => k.cgroup.pod.as_ref().map_or(Whose::Host, Whose::Pod),
            None if self.settled(seen) => Whose::Host,
            None => Whose::NotYet,
        }
    }
}

/// A walk's result: what is not in it is the host's.
impl Lookup for HashMap<u64, Cgroup> {
    fn whose(&self, id: u64, _seen: Instant) -> Whose<'_> {
        match self.get(&id).and_then(|c| c.pod.as_ref()) {
            Some(p) => Whose::Pod(p),
            None => Whose::Host,
        }
    }
}

/// The followed hierarchy; dropping it stops the thread.
pub struct Hierarchy {
    state: Arc<Mutex<State>>,
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hierarchy {
    /// Follows the pods' subtrees of the cgroup v2 hierarchy at `root`,
    /// keeping gone cgroups for `retention`.
    pub fn start(root: PathBuf, retention: Duration) -> std::io::Result<Hierarchy> {
        let mut st = State::new(root, retention);
        match inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK) {
            Ok(fd) => {
                st.inotify = Some(fd);
                // The root, for the `kubepods` cgroups made after the agent.
                let root = st.root.clone();
                st.watch(&root, "", 0);
            }
            Err(e) => st.poll_instead(&format!("inotify_init: {e}")),
        }
        st.walk(Instant::now());
        let state = Arc::new(Mutex::new(st));
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)?;
        let thread = {
            let state = Arc::clone(&state);
            let stop = stop.try_clone()?;
            std::thread::Builder::new().name("pod-cgroups".into()).spawn(move || follow(&state, &stop))?
        };
        Ok(Hierarchy { state, stop: Some(stop), thread: Some(thread) })
    }

    /// The hierarchy as it is now (the events queued read first), locked.
    pub fn view(&self) -> MutexGuard<'_, State> {
        let mut st = lock(&self.state);
        st.drain(Instant::now());
        st
    }
}

impl Drop for Hierarchy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = rustix::io::write(&stop, &1u64.to_ne_bytes());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The thread: waits for events (or the stop) at most [`POLL_EVERY`] at a
/// time, and acts on them.
fn follow(state: &Mutex<State>, stop: &OwnedFd) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let timeout = Timespec { tv_sec: POLL_EVERY.as_secs() as i64, tv_nsec: 0 };
    // The thread's own handle on the inotify instance, to wait on without the lock.
    let mut ino = lock(state).inotify.as_ref().and_then(|fd| fd.try_clone().ok());
    loop {
        let mut fds = vec![PollFd::new(stop, PollFlags::IN)];
        if let Some(fd) = &ino {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        let _ = rustix::event::poll(&mut fds, Some(&timeout));
        if !fds[0].revents().is_empty() {
            return;
        }
        let now = Instant::now();
        let mut st = lock(state);
        st.drain(now);
        st.tick(now);
        if st.inotify.is_none() {
            // Walking instead: the instance goes with the last handle.
            ino = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f9e2c6a-1b3d-4e5f-8a7b-9c0d1e2f3a4b";
    const CID: &str = "4c5d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

    fn ino(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).expect("stat").ino()
    }

    /// A pod and its container made after the start, the container removed
    /// before anyone looked: both are known, the container as gone, with its
    /// path; a host directory is not kept.
    fn made_then_removed(h: &Hierarchy, root: &Path) {
        let pod = root.join(format!("kubepods/burstable/pod{UID}"));
        std::fs::create_dir_all(&pod).expect("mkdir");
        let c = pod.join(CID);
        std::fs::create_dir(&c).expect("mkdir");
        let id = ino(&c);
        std::fs::create_dir_all(root.join("system.slice/cron.service")).expect("mkdir");
        let host = ino(&root.join("system.slice/cron.service"));
        // Named while it lives (a container lives longer than this takes).
        let deadline = Instant::now() + POLL_EVERY * 3;
        while h.view().get(id).is_none() {
            assert!(Instant::now() < deadline, "the container's cgroup was never named");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_dir(&c).expect("rmdir");
        // Inotify: known at once; polling: after the thread's next walk.
        let deadline = Instant::now() + POLL_EVERY * 3;
        loop {
            let v = h.view();
            if v.get(id).is_some_and(|k| k.gone.is_some()) || Instant::now() > deadline {
                let k = v.get(id).expect("the container's cgroup is known");
                assert_eq!(k.cgroup.path, format!("kubepods/burstable/pod{UID}/{CID}"));
                assert_eq!(k.cgroup.pod.as_ref().and_then(|p| p.container.as_deref()), Some(CID));
                assert!(k.gone.is_some(), "and gone");
                assert!(v.get(ino(&pod)).is_some_and(|k| k.gone.is_none()), "the pod's own cgroup is live");
                assert!(v.get(host).is_none(), "host cgroups are not kept");
                return;
            }
            drop(v);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn cgroups_made_and_removed_between_two_looks_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = Hierarchy::start(dir.path().to_path_buf(), Duration::from_secs(60)).expect("start");
        assert_eq!(h.view().mode(), Mode::Inotify);
        // Made and removed with no look in between: the events name it.
        let pod = dir.path().join(format!("kubepods/burstable/pod{UID}"));
        std::fs::create_dir_all(&pod).expect("mkdir");
        let c = pod.join(CID);
        std::fs::create_dir(&c).expect("mkdir");
        let id = ino(&c);
        // The thread looks at a new directory at once (no reader drains
        // the events here: the state is looked at without `view`).
        let deadline = Instant::now() + POLL_EVERY * 3;
        while lock(&h.state).get(id).is_none() {
            assert!(Instant::now() < deadline, "the thread never named it");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_dir(&c).expect("rmdir");
        let v = h.view();
        let k = v.get(id).expect("named while it lived");
        assert!(k.gone.is_some());
        drop(v);
        made_then_removed(&h, dir.path());
    }

    #[test]
    fn without_inotify_the_subtrees_are_walked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut st = State::new(dir.path().to_path_buf(), Duration::from_secs(60));
        st.poll_instead("test");
        st.walk(Instant::now());
        let state = Arc::new(Mutex::new(st));
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).expect("eventfd");
        let thread = {
            let (state, stop) = (Arc::clone(&state), stop.try_clone().expect("dup"));
            std::thread::spawn(move || follow(&state, &stop))
        };
        let h = Hierarchy { state, stop: Some(stop), thread: Some(thread) };
        assert_eq!(h.view().mode(), Mode::Polling);
        let pod = dir.path().join(format!("kubepods/burstable/pod{UID}"));
        std::fs::create_dir_all(pod.join(CID)).expect("mkdir");
        let id = ino(&pod.join(CID));
        let deadline = Instant::now() + POLL_EVERY * 3;
        while h.view().get(id).is_none() {
            assert!(Instant::now() < deadline, "the walk finds it");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::remove_dir(pod.join(CID)).expect("rmdir");
        while h.view().get(id).is_some_and(|k| k.gone.is_none()) {
            assert!(Instant::now() < deadline + POLL_EVERY * 3, "the walk sees it gone");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn systemd_paths_and_cgroups_there_before_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = UID.replace('-', "_");
        let slice = format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice");
        std::fs::create_dir_all(dir.path().join(&slice)).expect("mkdir");
        let h = Hierarchy::start(dir.path().to_path_buf(), Duration::from_secs(60)).expect("start");
        assert!(h.view().get(ino(&dir.path().join(&slice))).is_some(), "found by the first walk");
        let scope = dir.path().join(&slice).join(format!("cri-containerd-{CID}.scope"));
        std::fs::create_dir(&scope).expect("mkdir");
        let v = h.view();
        let k = v.get(ino(&scope)).expect("a container made after the start");
        assert_eq!(k.cgroup.pod.as_ref().map(|p| p.uid.as_str()), Some(UID));
        assert_eq!(v.live().count(), 2);
    }

    #[test]
    fn gone_cgroups_are_forgotten_after_the_retention_and_the_kept_are_bounded() {
        let mut st = State::new(PathBuf::from("/nonexistent"), Duration::from_secs(10));
        let t0 = Instant::now();
        let cg =
            |i: u64| Cgroup { path: format!("kubepods/pod{UID}/{i:064}"), pod: cgroup::parse_path(&format!("kubepods/pod{UID}/{i:064}")) };
        for i in 0..3 {
            st.keep(i, cg(i), t0);
        }
        st.removed(&cg(1).path, t0);
        st.expire(t0 + Duration::from_secs(9), false);
        assert_eq!(st.len(), 3, "within the retention");
        st.expire(t0 + Duration::from_secs(10), false);
        assert!(st.get(1).is_none() && st.get(0).is_some() && st.get(2).is_some());
        // Full: the gone ones make room first; with none gone, new ones are refused.
        for i in 3..MAX_KEPT as u64 + 1 {
            st.keep(i, cg(i), t0);
        }
        assert_eq!((st.len(), st.refused), (MAX_KEPT, 0));
        st.removed(&cg(5).path, t0);
        st.keep(1 << 40, cg(1 << 40), t0);
        assert!(st.get(5).is_none() && st.get(1 << 40).is_some(), "a gone cgroup made room");
        st.keep((1 << 40) + 1, cg((1 << 40) + 1), t0);
        assert_eq!((st.len(), st.refused), (MAX_KEPT, 1));
    }
}
