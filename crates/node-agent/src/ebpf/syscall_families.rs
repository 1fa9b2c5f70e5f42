//! The syscall families of `ebpf_syscall_latency` (the `family` label of
//! `node_ebpf_syscall_latency_seconds`): every syscall name of both name
//! tables (`syscall_names::X86_64` and `AARCH64`) is listed in exactly one
//! family here (a test checks it, so a syscall added to the tables cannot
//! silently fall to `other`), and the probe's per-number table for the
//! running architecture is built from these lists. A number with no name
//! (unassigned) and numbers past the table count as `other`; 32-bit compat
//! syscalls (x86 ia32 emulation) are classified by their number in the
//! 64-bit table.
//!
//! | family | what |
//! |---|---|
//! | `read` | reading a file descriptor |
//! | `write` | writing a file descriptor |
//! | `poll` | waiting for file descriptors or completions: poll, select, epoll, AIO and io_uring waits |
//! | `futex` | futexes (the waits and wakes under mutexes and condition variables), robust lists |
//! | `net` | sockets: create, bind, connect, accept, send, receive, options, shutdown |
//! | `file` | files, directories, file systems and other descriptors: open, stat, close, fcntl, ioctl, sync, xattrs, mounts, inotify, splice and copies between descriptors, eventfd/signalfd/timerfd, AIO and io_uring setup and submission |
//! | `memory` | address spaces: mmap, munmap, brk, mprotect, madvise, mlock, NUMA policy, SysV shared memory, memfd, swap |
//! | `process` | processes, threads and signals: clone, fork, exec, wait, kill, signal masks and waits (pause, sigsuspend, sigtimedwait), ids and credentials, scheduling, limits, prctl, ptrace, namespaces, seccomp, restart_syscall |
//! | `sleep` | sleeping for a time: nanosleep, clock_nanosleep |
//! | `other` | the rest, each listed: clocks and timers, SysV semaphores and messages, POSIX message queues, keys, bpf, perf_event_open, uname, sysinfo, getrandom, modules, kexec, reboot, obsolete and unimplemented calls |
//! | (not timed) | never return, so never timed: exit, exit_group |

use agent_common::syscall_latency::{self as sl, Families, MAX_SYSCALLS};

/// Reading a file descriptor.
pub const READ: &[&str] = &["read", "readv", "pread64", "preadv", "preadv2"];
/// Writing a file descriptor.
pub const WRITE: &[&str] = &["write", "writev", "pwrite64", "pwritev", "pwritev2"];
/// Waiting for file descriptors or completions: poll, select, epoll, AIO and io_uring waits.
pub const POLL: &[&str] = &[
    "poll",
    "ppoll",
    "ppoll_time64",
    "select",
    "pselect6",
    "pselect6_time64",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_wait",
    "epoll_wait_old",
    "epoll_pwait",
    "epoll_pwait2",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "io_uring_enter",
];
/// Futexes (the waits and wakes under mutexes and condition variables), robust lists.
pub const FUTEX: &[&str] = &["futex", "futex_time64", "futex_waitv", "set_robust_list", "get_robust_list"];
/// Sockets: create, bind, connect, accept, send, receive, options, shutdown.
pub const NET: &[&str] = &[
    "socket",
    "socketpair",
    "bind",
    "listen",
    "accept",
    "accept4",
    "connect",
    "getsockname",
    "getpeername",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "recvmmsg_time64",
    "shutdown",
    "setsockopt",
    "getsockopt",
];
/// Files, directories, file systems and other descriptors: open, stat, close, fcntl, ioctl, sync, xattrs, mounts, inotify, splice and copies between descriptors, eventfd/signalfd/timerfd, AIO and io_uring setup and submission.
pub const FILE: &[&str] = &[
    "open",
    "openat",
    "openat2",
    "creat",
    "close",
    "close_range",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "fstatat",
    "statx",
    "statfs",
    "fstatfs",
    "ustat",
    "sysfs",
    "access",
    "faccessat",
    "faccessat2",
    "lseek",
    "ioctl",
    "fcntl",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "getdents",
    "getdents64",
    "mkdir",
    "mkdirat",
    "rmdir",
    "rename",
    "renameat",
    "renameat2",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",
    "mknod",
    "mknodat",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "fchown",
    "fchownat",
    "lchown",
    "umask",
    "truncate",
    "ftruncate",
    "fallocate",
    "fadvise64",
    "readahead",
    "fsync",
    "fdatasync",
    "sync",
    "syncfs",
    "sync_file_range",
    "sync_file_range2",
    "flock",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "utime",
    "utimes",
    "utimensat",
    "utimensat_time64",
    "futimesat",
    "chdir",
    "fchdir",
    "getcwd",
    "chroot",
    "mount",
    "umount2",
    "pivot_root",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "quotactl",
    "quotactl_fd",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    "fanotify_init",
    "fanotify_mark",
    "name_to_handle_at",
    "open_by_handle_at",
    "sendfile",
    "splice",
    "tee",
    "vmsplice",
    "copy_file_range",
    "eventfd",
    "eventfd2",
    "signalfd",
    "signalfd4",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_settime64",
    "timerfd_gettime",
    "timerfd_gettime64",
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_uring_setup",
    "io_uring_register",
    "lookup_dcookie",
];
/// Address spaces: mmap, munmap, brk, mprotect, madvise, mlock, NUMA policy, SysV shared memory, memfd, swap.
pub const MEMORY: &[&str] = &[
    "mmap",
    "munmap",
    "mremap",
    "brk",
    "mprotect",
    "pkey_mprotect",
    "pkey_alloc",
    "pkey_free",
    "madvise",
    "process_madvise",
    "mincore",
    "msync",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "remap_file_pages",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "set_mempolicy_home_node",
    "migrate_pages",
    "move_pages",
    "membarrier",
    "userfaultfd",
    "process_vm_readv",
    "process_vm_writev",
    "memfd_create",
    "memfd_secret",
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "swapon",
    "swapoff",
    "process_mrelease",
];
/// Processes, threads and signals: clone, fork, exec, wait, kill, signal masks and waits (pause, sigsuspend, sigtimedwait), ids and credentials, scheduling, limits, prctl, ptrace, namespaces, seccomp, restart_syscall.
pub const PROCESS: &[&str] = &[
    "clone",
    "clone3",
    "fork",
    "vfork",
    "execve",
    "execveat",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigpending",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "sigaltstack",
    "pause",
    "getpid",
    "gettid",
    "getppid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setfsuid",
    "setfsgid",
    "setgroups",
    "getpgid",
    "setpgid",
    "getpgrp",
    "getsid",
    "setsid",
    "prctl",
    "arch_prctl",
    "ptrace",
    "setns",
    "unshare",
    "personality",
    "seccomp",
    "capget",
    "capset",
    "prlimit64",
    "setrlimit",
    "getrlimit",
    "getrusage",
    "times",
    "getpriority",
    "setpriority",
    "sched_yield",
    "sched_setaffinity",
    "sched_getaffinity",
    "sched_setattr",
    "sched_getattr",
    "sched_setparam",
    "sched_getparam",
    "sched_setscheduler",
    "sched_getscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "set_tid_address",
    "rseq",
    "kcmp",
    "set_thread_area",
    "get_thread_area",
    "modify_ldt",
    "ioperm",
    "iopl",
    "ioprio_get",
    "ioprio_set",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "restart_syscall",
];
/// Sleeping for a time: nanosleep, clock_nanosleep.
pub const SLEEP: &[&str] = &["nanosleep", "clock_nanosleep", "clock_nanosleep_time64"];
/// The rest, each listed: clocks and timers, SysV semaphores and messages, POSIX message queues, keys, bpf, perf_event_open, uname, sysinfo, getrandom, modules, kexec, reboot, obsolete and unimplemented calls.
pub const OTHER: &[&str] = &[
    "time",
    "gettimeofday",
    "settimeofday",
    "clock_gettime",
    "clock_gettime64",
    "clock_settime",
    "clock_settime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "alarm",
    "getitimer",
    "setitimer",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_notify",
    "mq_getsetattr",
    "add_key",
    "request_key",
    "keyctl",
    "bpf",
    "perf_event_open",
    "uname",
    "sysinfo",
    "syslog",
    "getrandom",
    "getcpu",
    "sethostname",
    "setdomainname",
    "reboot",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "acct",
    "vhangup",
    "_sysctl",
    "nfsservctl",
    "uselib",
    "security",
    "tuxcall",
    "afs_syscall",
    "vserver",
    "getpmsg",
    "putpmsg",
];
/// Never return, so never timed: exit, exit_group.
pub const NOT_TIMED: &[&str] = &["exit", "exit_group"];

/// Every list with its family (`sl::NOT_TIMED` for syscalls that never return).
pub const LISTS: [(u8, &[&str]); 11] = [
    (sl::READ, READ),
    (sl::WRITE, WRITE),
    (sl::POLL, POLL),
    (sl::FUTEX, FUTEX),
    (sl::NET, NET),
    (sl::FILE, FILE),
    (sl::MEMORY, MEMORY),
    (sl::PROCESS, PROCESS),
    (sl::SLEEP, SLEEP),
    (sl::OTHER, OTHER),
    (sl::NOT_TIMED, NOT_TIMED),
];

/// The family of syscall `name`, if it is listed.
pub fn family(name: &str) -> Option<u8> {
    LISTS.iter().find(|(_, names)| names.contains(&name)).map(|(f, _)| *f)
}

/// The per-number table for a name table (`syscall_names::X86_64` or
/// `AARCH64`): each number's family, `other` where unnamed or unlisted.
pub fn table(names: &[&str]) -> Families {
    let mut t = Families::DEFAULT;
    for (nr, name) in names.iter().enumerate().take(MAX_SYSCALLS) {
        if let (Some(slot), Some(f)) = (t.by_nr.get_mut(nr), family(name)) {
            *slot = f;
        }
    }
    t
}

/// The table of the architecture the agent runs on.
pub fn native_table() -> Families {
    table(if cfg!(target_arch = "aarch64") { &super::syscall_names::AARCH64 } else { &super::syscall_names::X86_64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::syscall_names::{AARCH64, X86_64};

    #[test]
    fn every_name_of_both_tables_is_listed_once() {
        for name in X86_64.iter().chain(AARCH64.iter()).filter(|n| !n.is_empty()) {
            let n = LISTS.iter().filter(|(_, names)| names.contains(name)).count();
            assert_eq!(n, 1, "{name} is in {n} family lists (add it to one in syscall_families.rs)");
        }
    }

    #[test]
    fn every_listed_name_is_a_syscall() {
        for (_, names) in LISTS {
            for name in names {
                assert!(X86_64.contains(name) || AARCH64.contains(name), "{name} is in neither name table");
            }
        }
    }

    #[test]
    fn tables_by_number() {
        let x = table(&X86_64);
        assert_eq!(x.by_nr[0], sl::READ);
        assert_eq!(x.by_nr[1], sl::WRITE);
        assert_eq!(x.by_nr[35], sl::SLEEP, "nanosleep");
        assert_eq!(x.by_nr[230], sl::SLEEP, "clock_nanosleep");
        assert_eq!(x.by_nr[202], sl::FUTEX);
        assert_eq!(x.by_nr[60], sl::NOT_TIMED, "exit");
        assert_eq!(x.by_nr[231], sl::NOT_TIMED, "exit_group");
        assert_eq!(x.by_nr[232], sl::POLL, "epoll_wait");
        assert_eq!(x.by_nr[MAX_SYSCALLS - 1], sl::OTHER);
        let a = table(&AARCH64);
        assert_eq!(a.by_nr[63], sl::READ);
        assert_eq!(a.by_nr[101], sl::SLEEP, "nanosleep");
        assert_eq!(a.by_nr[93], sl::NOT_TIMED, "exit");
        assert_eq!(a.by_nr[98], sl::FUTEX);
        // Unassigned numbers are `other`.
        assert!(AARCH64.iter().enumerate().filter(|(_, n)| n.is_empty()).all(|(nr, _)| a.by_nr[nr] == sl::OTHER));
        for (i, name) in sl::FAMILY_NAMES.iter().enumerate() {
            assert!(LISTS.iter().any(|(f, _)| *f as usize == i), "family {name} has a list");
        }
    }
}
