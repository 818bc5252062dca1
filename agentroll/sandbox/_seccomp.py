"""A seccomp filter for the local sandbox (bubblewrap's `--seccomp FD`): system calls model code never needs, which are
where kernel escapes have come from, fail with EPERM.

The sandbox shares the host's kernel: a bug in it is a way out. Namespaces already refuse most privileged calls to a
process without capabilities; this narrows what stays reachable: io_uring, userfaultfd, bpf, perf_event_open, the
keyring, ptrace, personality, the mount API, (un)sharing namespaces, modules, kexec, reboot, swap, accounting, the
kernel log, quotas, file handles, x86's `modify_ldt`. It also refuses the memory a program could have the kernel hold
for it outside any process's address space and outside its tmpfs: System V shared memory, semaphore sets and message
queues, `memfd_create` and `memfd_secret`. Where the run has no cgroup (an ordinary user, as a rule) nothing else
would bound it: a program of a 256 MB run held 1.5 GB in SysV segments, touched and detached, and as much in memfds
(each under the file-size limit). And `socket(AF_VSOCK)`: vsock is not isolated by a network namespace (from a VM, a
program could reach its hypervisor's services). A call made through another ABI (32-bit `int 0x80`, x32 on x86_64),
whose numbers would slip past the list, fails with ENOSYS. The filter is a classic BPF program written here (x86_64
and aarch64); elsewhere there is none, and the start-up log says so.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
X32_BIT = 0x40000000

# name: (x86_64, aarch64); None where the architecture has no such call
DENIED: dict[str, tuple[int | None, int | None]] = {
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "personality": (135, 92),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "syslog": (103, 116),
    "quotactl": (179, 60),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "iopl": (172, None),
    "ioperm": (173, None),
    "modify_ldt": (154, None),
    "shmget": (29, 194),
    "semget": (64, 190),
    "msgget": (68, 186),
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
}
ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # machine: (column in DENIED, AUDIT_ARCH_*)
SOCKET = (41, 198)  # socket(2): refused for AF_VSOCK, the one family a network namespace does not isolate: from a VM,
AF_VSOCK = 40  # the sandbox could reach its hypervisor's services (a port it binds is taken on the whole VM too)
ARG0 = 16  # offset of the first argument's low 32 bits in struct seccomp_data (both architectures: little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default: this one's), or None where there is none."""
    found = ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    column, arch = found
    numbers = sorted({n for pair in DENIED.values() if (n := pair[column]) is not None})
    checks = [(JGE_K, X32_BIT, "enosys")] if column == 0 else []
    checks += [(JEQ_K, n, "eperm") for n in numbers]
    checks.append((JEQ_K, SOCKET[column], "socket"))
    # 0: load the arch; 1: ours? skip 2; 2: not ours: ENOSYS; 3: load the number; 4...: the checks; then allow;
    # socket(2): load its family, AF_VSOCK? EPERM, else allow; then the answers EPERM, ENOSYS (a jump's offset
    # counts from the instruction after it, and only goes forward)
    allow = 4 + len(checks)
    target = {"socket": allow + 1, "eperm": allow + 4, "enosys": allow + 5}
    insns = [_insn(LD_W_ABS, 4), _insn(JEQ_K, arch, jt=1, jf=0), _insn(RET_K, RET_ERRNO | errno.ENOSYS)]
    insns.append(_insn(LD_W_ABS, 0))
    for at, (code, k, where) in enumerate(checks, start=4):
        insns.append(_insn(code, k, jt=target[where] - at - 1, jf=0))
    insns += [_insn(RET_K, RET_ALLOW), _insn(LD_W_ABS, ARG0), _insn(JEQ_K, AF_VSOCK, jt=1, jf=0)]
    insns += [_insn(RET_K, RET_ALLOW), _insn(RET_K, RET_ERRNO | errno.EPERM), _insn(RET_K, RET_ERRNO | errno.ENOSYS)]
    return b"".join(insns)


def descriptor(filter_program: bytes) -> int:
    """A descriptor bwrap reads the filter from (it closes it)."""
    fd = os.memfd_create("agentroll-seccomp", os.MFD_CLOEXEC)
    os.write(fd, filter_program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
