"""The local sandbox's seccomp filter (bubblewrap's `--seccomp FD`): an allow-list of the system calls a Python
program and the programs it starts (a shell, coreutils, numpy) need; every other call fails.

The sandbox shares the host's kernel: what stays reachable is the way out, and a list of what to refuse stays one
kernel release behind (the second review found `io_setup`, `pidfd_getfd`, `mq_open`, `fanotify_init`, `kcmp` and
netlink sockets open). So the filter names what may run (`ALLOWED`, measured against the interpreter's start-up,
subprocess, threads, multiprocessing, numpy and the programs the tests and bench run) and refuses the rest: a call
the table knows (the kernel's numbers up to `KNOWN_UP_TO`) with EPERM, one it does not (a newer kernel's) with
ENOSYS, as a kernel that predates it would (glibc then falls back, e.g. `fchmodat2` to `fchmodat`), and so does
`clone3`, whose flags sit in memory the filter cannot read: glibc falls back to `clone`, whose flags it can. A
call through another ABI (32-bit `int 0x80`, x32, arm32 on aarch64) fails with ENOSYS.

Out, so: what is one counter or one object for the whole host (the old AIO's `fs.aio-nr`, which no namespace,
rlimit or cgroup bounds: one `io_setup(65536)` took it all; `sync`; inotify's and fanotify's per-user instances;
POSIX message queues; System V IPC and memfds, memory the kernel would hold outside any tmpfs; the keyring; the
kernel log), what reaches another process (ptrace, `process_vm_*`, `pidfd_*`, `kcmp`, `move_pages`, robust
lists), and what kernel escapes have come through (io_uring, userfaultfd, bpf, perf events, `splice`/`vmsplice`,
the mount API, namespaces, modules, personality). Some calls are allowed only with some arguments: `socket` and
`socketpair` for Unix, IPv4 and IPv6 (not netlink, which reaches kernel subsystems; not vsock, which a network
namespace does not isolate), `clone` without a namespace flag, `ioctl` for the terminal and descriptor requests
Python makes (others: ENOTTY, as a device without them answers), `prctl` for a process's own settings. The filter
is a classic BPF program written here (x86_64 and aarch64); elsewhere there is none, and the start-up log says so.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
X32_BIT = 0x40000000
ARG = 16  # offset of the first argument's low 32 bits in struct seccomp_data (both architectures: little-endian)
KNOWN_UP_TO = 450  # the highest number the kernel's tables (6.1) give on both: above it, ENOSYS

# name: (x86_64, aarch64); None where the architecture has no such call. Ordered roughly by how often programs
# make them: the filter checks them in this order.
ALLOWED: dict[str, tuple[int | None, int | None]] = {
    # the hot path: I/O, memory, locks, signals, time
    "read": (0, 63),
    "write": (1, 64),
    "close": (3, 57),
    "fstat": (5, 80),
    "newfstatat": (262, 79),
    "openat": (257, 56),
    "mmap": (9, 222),
    "munmap": (11, 215),
    "mprotect": (10, 226),
    "brk": (12, 214),
    "futex": (202, 98),
    "lseek": (8, 62),
    "rt_sigaction": (13, 134),
    "rt_sigprocmask": (14, 135),
    "getdents64": (217, 61),
    "pread64": (17, 67),
    "pwrite64": (18, 68),
    "readv": (19, 65),
    "writev": (20, 66),
    "statx": (332, 291),
    "ioctl": (16, 29),  # only IOCTLS
    "fcntl": (72, 25),
    "getpid": (39, 172),
    "gettid": (186, 178),
    "madvise": (28, 233),
    "poll": (7, None),
    "ppoll": (271, 73),
    "epoll_wait": (232, None),
    "epoll_pwait": (281, 22),
    "epoll_pwait2": (441, 441),
    "epoll_ctl": (233, 21),
    "select": (23, None),
    "pselect6": (270, 72),
    "getrandom": (318, 278),
    "clock_gettime": (228, 113),
    "clock_nanosleep": (230, 115),
    "nanosleep": (35, 101),
    "gettimeofday": (96, 169),
    # files: all within what the sandbox's mounts give it (its tmpfs; the rest is read-only)
    "open": (2, None),
    "creat": (85, None),
    "stat": (4, None),
    "lstat": (6, None),
    "access": (21, None),
    "faccessat": (269, 48),
    "faccessat2": (439, 439),
    "readlink": (89, None),
    "readlinkat": (267, 78),
    "getdents": (78, None),
    "mkdir": (83, None),
    "mkdirat": (258, 34),
    "rmdir": (84, None),
    "unlink": (87, None),
    "unlinkat": (263, 35),
    "rename": (82, None),
    "renameat": (264, 38),
    "renameat2": (316, 276),
    "link": (86, None),
    "linkat": (265, 37),
    "symlink": (88, None),
    "symlinkat": (266, 36),
    "chmod": (90, None),
    "fchmod": (91, 52),
    "fchmodat": (268, 53),
    "chown": (92, None),
    "fchown": (93, 55),
    "lchown": (94, None),
    "fchownat": (260, 54),
    "truncate": (76, 45),
    "ftruncate": (77, 46),
    "fallocate": (285, 47),
    "fsync": (74, 82),  # one file's; `sync` and `syncfs`, which flush filesystems, are out
    "fdatasync": (75, 83),
    "fadvise64": (221, 223),
    "utime": (132, None),
    "utimes": (235, None),
    "utimensat": (280, 88),
    "futimesat": (261, None),
    "getcwd": (79, 17),
    "chdir": (80, 49),
    "fchdir": (81, 50),
    "umask": (95, 166),
    "dup": (32, 23),
    "dup2": (33, None),
    "dup3": (292, 24),
    "flock": (73, 32),
    "mknod": (133, None),  # a FIFO (`os.mkfifo`): a device node needs CAP_MKNOD, and its tmpfs is nodev
    "mknodat": (259, 33),
    "statfs": (137, 43),
    "fstatfs": (138, 44),
    "preadv": (295, 69),
    "pwritev": (296, 70),
    "preadv2": (327, 286),
    "pwritev2": (328, 287),
    "sendfile": (40, 71),  # shutil.copyfile
    "copy_file_range": (326, 285),
    "close_range": (436, 436),
    "getxattr": (191, 8),  # reading only: shutil.copystat lists them, and fails on an EPERM
    "lgetxattr": (192, 9),
    "fgetxattr": (193, 10),
    "listxattr": (194, 11),
    "llistxattr": (195, 12),
    "flistxattr": (196, 13),
    "pipe": (22, None),
    "pipe2": (293, 59),
    "mremap": (25, 216),
    "msync": (26, 227),
    # processes: its own, in its own pid namespace
    "clone": (56, 220),  # only without a namespace flag
    "fork": (57, None),
    "vfork": (58, None),
    "execve": (59, 221),
    "execveat": (322, 281),
    "exit": (60, 93),
    "exit_group": (231, 94),
    "wait4": (61, 260),
    "waitid": (247, 95),
    "kill": (62, 129),  # its pid namespace's processes only; its init ignores what it has no handler for
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigreturn": (15, 139),
    "rt_sigsuspend": (130, 133),
    "rt_sigpending": (127, 136),
    "rt_sigtimedwait": (128, 137),
    "sigaltstack": (131, 132),
    "pause": (34, None),
    "getppid": (110, 173),
    "getuid": (102, 174),
    "geteuid": (107, 175),
    "getgid": (104, 176),
    "getegid": (108, 177),
    "getresuid": (118, 148),
    "getresgid": (120, 150),
    "getgroups": (115, 158),
    "setuid": (105, 146),  # the set* calls: refused by the kernel without capabilities, as a program expects
    "setgid": (106, 144),
    "setreuid": (113, 145),
    "setregid": (114, 143),
    "setresuid": (117, 147),
    "setresgid": (119, 149),
    "setgroups": (116, 159),
    "setfsuid": (122, 151),
    "setfsgid": (123, 152),
    "getpgid": (121, 155),
    "getpgrp": (111, None),
    "setpgid": (109, 154),
    "setsid": (112, 157),
    "getsid": (124, 156),
    "prctl": (157, 167),  # only PRCTLS
    "arch_prctl": (158, None),
    "set_tid_address": (218, 96),
    "set_robust_list": (273, 99),  # its own threads' (get_robust_list reads another process's: out)
    "rseq": (334, 293),
    "restart_syscall": (219, 128),
    "sched_yield": (24, 124),
    "sched_getaffinity": (204, 123),  # os.cpu_count, OpenBLAS
    "sched_setaffinity": (203, 122),
    "sched_getparam": (143, 121),
    "sched_getscheduler": (145, 120),
    "sched_get_priority_max": (146, 125),
    "sched_get_priority_min": (147, 126),
    "sched_rr_get_interval": (148, 127),
    "getpriority": (140, 141),
    "setpriority": (141, 140),  # lowering only, without capabilities
    "getrlimit": (97, 163),
    "setrlimit": (160, 164),
    "prlimit64": (302, 261),  # prlimit sets the run's limits on itself
    "getrusage": (98, 165),
    "times": (100, 153),
    "sysinfo": (99, 179),
    "uname": (63, 160),
    "capget": (125, 90),
    "getcpu": (309, 168),
    "mbind": (237, 235),  # its own memory's NUMA policy (numpy's allocator asks)
    "get_mempolicy": (239, 236),
    "set_mempolicy": (238, 237),
    "clock_getres": (229, 114),
    "time": (201, None),
    "alarm": (37, None),
    "setitimer": (38, 103),
    "getitimer": (36, 102),
    "timer_create": (222, 107),
    "timer_settime": (223, 110),
    "timer_gettime": (224, 108),
    "timer_getoverrun": (225, 109),
    "timer_delete": (226, 111),
    "timerfd_create": (283, 85),
    "timerfd_settime": (286, 86),
    "timerfd_gettime": (287, 87),
    # descriptors and sockets: its own network namespace (a loopback of its own)
    "eventfd": (284, None),
    "eventfd2": (290, 19),
    "signalfd": (282, None),
    "signalfd4": (289, 74),
    "epoll_create": (213, None),
    "epoll_create1": (291, 20),
    "socket": (41, 198),  # only FAMILIES
    "socketpair": (53, 199),  # only FAMILIES
    "bind": (49, 200),
    "connect": (42, 203),
    "listen": (50, 201),
    "accept": (43, 202),
    "accept4": (288, 242),
    "getsockname": (51, 204),
    "getpeername": (52, 205),
    "sendto": (44, 206),
    "recvfrom": (45, 207),
    "sendmsg": (46, 211),
    "recvmsg": (47, 212),
    "sendmmsg": (307, 269),
    "recvmmsg": (299, 243),
    "shutdown": (48, 210),
    "setsockopt": (54, 208),
    "getsockopt": (55, 209),
}
NOT_IMPLEMENTED = {"clone3": (435, 435)}  # ENOSYS, so that glibc falls back to `clone`
# What the reviews found open, and what a filter must refuse, by name (the tests check each is refused: EPERM)
REFUSED: dict[str, tuple[int | None, int | None]] = {
    "io_setup": (206, 0),
    "io_submit": (209, 2),
    "io_getevents": (208, 4),
    "io_destroy": (207, 1),
    "io_cancel": (210, 3),
    "io_uring_setup": (425, 425),
    "pidfd_open": (434, 434),
    "pidfd_getfd": (438, 438),
    "pidfd_send_signal": (424, 424),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "mq_open": (240, 180),
    "fanotify_init": (300, 262),
    "inotify_init1": (294, 26),
    "kcmp": (312, 272),
    "ptrace": (101, 117),
    "keyctl": (250, 219),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "unshare": (272, 97),
    "setns": (308, 268),
    "shmget": (29, 194),
    "memfd_create": (319, 279),
    "vmsplice": (278, 75),
    "sync": (162, 81),
    "move_pages": (279, 239),
    "get_robust_list": (274, 100),
}
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
FAMILIES = (AF_UNIX, AF_INET, AF_INET6)
CLONE_NAMESPACES = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# TCGETS, TIOCGPGRP, TIOCGWINSZ, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX (the same numbers on both architectures)
IOCTLS = (0x5401, 0x540F, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)
# PR_SET/GET_PDEATHSIG, PR_GET/SET_DUMPABLE, PR_SET/GET_NAME, PR_GET/SET_SECCOMP, PR_CAPBSET_READ, PR_SET/GET_
# TIMERSLACK, PR_SET/GET_CHILD_SUBREAPER, PR_SET/GET_NO_NEW_PRIVS, PR_SET/GET_THP_DISABLE, PR_SET_VMA
PRCTLS = (1, 2, 3, 4, 15, 16, 21, 22, 23, 29, 30, 36, 37, 38, 39, 41, 42, 0x53564D41)
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # machine: (column in the tables, AUDIT_ARCH_*)
ARGUMENTS: dict[str, tuple[int, tuple[int, ...], int]] = {  # name: (which argument, the values allowed, else)
    "socket": (0, FAMILIES, errno.EPERM),
    "socketpair": (0, FAMILIES, errno.EPERM),
    "ioctl": (1, IOCTLS, errno.ENOTTY),
    "prctl": (0, PRCTLS, errno.EPERM),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _ret(err: int | None) -> bytes:
    return _insn(RET_K, RET_ALLOW if err is None else RET_ERRNO | err)


def _block(name: str) -> list[bytes]:
    """What runs once the call is `name`; every path ends in a return (a jump's offset counts from the
    instruction after it and only goes forward, so each rule skips over its own block when the call is not it)."""
    if name in NOT_IMPLEMENTED:
        return [_ret(errno.ENOSYS)]
    if name == "clone":
        return [_insn(LD_W_ABS, ARG), _insn(JSET_K, CLONE_NAMESPACES, jt=0, jf=1), _ret(errno.EPERM), _ret(None)]
    if name not in ARGUMENTS:
        return [_ret(None)]
    argument, values, otherwise = ARGUMENTS[name]
    block = [_insn(LD_W_ABS, ARG + 8 * argument)]
    block += [_insn(JEQ_K, v, jt=len(values) - i, jf=0) for i, v in enumerate(values)]
    return [*block, _ret(otherwise), _ret(None)]


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one's), or None where there is none."""
    found = ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    column, arch = found
    insns = [_insn(LD_W_ABS, 4), _insn(JEQ_K, arch, jt=1, jf=0), _ret(errno.ENOSYS), _insn(LD_W_ABS, 0)]
    if column == 0:  # x32: the same numbers with a bit set
        insns += [_insn(JGE_K, X32_BIT, jt=0, jf=1), _ret(errno.ENOSYS)]
    for name, numbers in (*ALLOWED.items(), *NOT_IMPLEMENTED.items()):
        if (number := numbers[column]) is not None:
            block = _block(name)
            insns += [_insn(JEQ_K, number, jt=0, jf=len(block)), *block]
    insns += [_insn(JGE_K, KNOWN_UP_TO + 1, jt=0, jf=1), _ret(errno.ENOSYS), _ret(errno.EPERM)]
    return b"".join(insns)


def descriptor(filter_program: bytes) -> int:
    """A descriptor bwrap reads the filter from (it closes it)."""
    fd = os.memfd_create("agentroll-seccomp", os.MFD_CLOEXEC)
    os.write(fd, filter_program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
