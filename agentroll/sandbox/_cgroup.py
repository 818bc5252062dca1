"""A control group per sandbox run, where agentroll may make them: the limits then hold for the run, all its
processes together (memory, tmpfs pages included; processes and threads; one core of CPU), and its memory
kills are counted.

Found once (`Cgroups.make`): agentroll's own cgroup of each controller (`/proc/self/cgroup`, under its mount in
`/proc/self/mountinfo`), a group `agentroll-PID` made in it, then one `run-N` inside per run. cgroup v1 (one
hierarchy per controller: memory and pids needed, cpu if there) or v2 (one hierarchy, where agentroll's own
cgroup already hands memory and pids to its children: a delegated subtree, or a container's root). Making one
needs write access there: root, as a rule, inside a container's own subtree. Where none can be made `make`
returns None, and the sandbox falls back to a process cap and per-process limits (docs/tool-use.md).

A run's group is removed when the run ends; `sweep` removes those of an agentroll that is gone (killed before
it could).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ..process.children import alive

PREFIX = "agentroll-"
CPU_PERIOD_US = 100_000
RUNS = itertools.count()  # run groups are named apart across every sandbox of this agentroll


@dataclass(frozen=True, slots=True)
class Hierarchy:
    version: int  # 1 or 2
    base: Path  # agentroll's own cgroup in it
    controllers: frozenset[str]  # v1: the hierarchy's; v2: those agentroll's own cgroup hands to its children


def hierarchies(mountinfo: str, cgroup: str) -> list[Hierarchy]:
    """Each mounted cgroup hierarchy with agentroll's own cgroup in it, from the texts of /proc/self/mountinfo
    and /proc/self/cgroup."""
    own: dict[str, str] = {}  # controller list ("memory", "cpu,cpuacct", "" for v2) -> path
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            own[parts[1]] = parts[2]
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, mountpoint, fstype = fields[3], fields[4], fields[dash + 1]
        options = set(fields[dash + 3].split(",")) if len(fields) > dash + 3 else set()
        if fstype == "cgroup2" and "" in own:
            path, version = own[""], 2
            try:  # what agentroll's own cgroup hands down to the groups it makes
                given = Path(mountpoint) / _inside(path, root) / "cgroup.subtree_control"
                controllers = frozenset(given.read_text().split())
            except (OSError, ValueError):
                continue
        elif fstype == "cgroup":
            key = next((k for k in own if k and set(k.split(",")) <= options and set(k.split(",")) & options), None)
            if key is None:
                continue
            path, version, controllers = own[key], 1, frozenset(key.split(","))
        else:
            continue
        try:
            found.append(Hierarchy(version, Path(mountpoint) / _inside(path, root), controllers))
        except ValueError:
            continue
    return found


def _inside(path: str, root: str) -> str:
    """`path` (as /proc/self/cgroup names it) relative to the mount's root."""
    if root != "/" and path != root and not path.startswith(root + "/"):
        raise ValueError(f"{path} is not under {root}")
    return path[len(root) :].lstrip("/") if root != "/" else path.lstrip("/")


@dataclass(slots=True)
class RunGroup:
    """One run's cgroup (a directory per hierarchy)."""

    dirs: list[Path]
    memory: Path  # the directory holding the memory controller's files
    version: int

    def attach(self, pid: int) -> None:
        for directory in self.dirs:
            (directory / "cgroup.procs").write_text(str(pid))

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process of the run for going over its memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value) > 0
        except OSError:
            pass
        return False

    def forget(self) -> None:
        """Remove the groups of a run that never started (nothing in them)."""
        for directory in self.dirs:
            _remove(directory)

    async def remove(self, patience_s: float = 10.0) -> None:
        """Kill what is left of the run and remove its groups. A killed process leaves its group once the kernel
        has torn it down (microseconds, as a rule): until then the group is busy, and is tried again. One still
        busy after `patience_s` is left for the next start's sweep."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience_s
        for directory in self.dirs:
            while not _remove(directory) and loop.time() < deadline:
                await asyncio.sleep(0.001)


def _kill_all(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def _remove(directory: Path) -> bool:
    """Whether `directory` is gone (its processes are killed when it is not)."""
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        _kill_all(directory)
        return False
    return True


@dataclass(slots=True)
class Cgroups:
    """agentroll's group in each hierarchy, where the runs' groups are made."""

    own: list[tuple[Hierarchy, Path]]
    memory_bytes: int
    processes: int

    @classmethod
    def make(cls, memory_bytes: int, processes: int) -> Cgroups | None:
        """agentroll's groups, or None where memory and pids groups cannot both be made for runs."""
        try:
            found = hierarchies(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
        except OSError:
            return None
        v2 = [h for h in found if h.version == 2 and {"memory", "pids"} <= h.controllers]
        v1 = {c: h for h in found if h.version == 1 for c in h.controllers}
        made = None
        if "memory" in v1 and "pids" in v1:
            wanted = [v1["memory"], v1["pids"], *([v1["cpu"]] if "cpu" in v1 else [])]
            made = cls._made(list({id(h): h for h in wanted}.values()), memory_bytes, processes)
        if made is None and v2:
            made = cls._made(v2[:1], memory_bytes, processes)
        return made

    @classmethod
    def _made(cls, chosen: list[Hierarchy], memory_bytes: int, processes: int) -> Cgroups | None:
        own = []
        try:
            for h in chosen:
                sweep(h.base)
                directory = h.base / f"{PREFIX}{os.getpid()}"
                directory.mkdir(exist_ok=True)
                own.append((h, directory))
                if h.version == 2:
                    wanted = sorted({"memory", "pids", "cpu"} & h.controllers)
                    (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
            made = cls(own, memory_bytes, processes)
            for directory in made.run().dirs:  # one made, limited, attached to nothing and removed: they work here
                directory.rmdir()
            return made
        except OSError:
            for _, directory in own:
                _remove(directory)
            return None

    def run(self) -> RunGroup:
        """A new group for one run, its limits set."""
        name = f"run-{next(RUNS)}"
        dirs: list[Path] = []
        memory = None
        version = self.own[0][0].version
        try:
            for h, parent in self.own:
                directory = parent / name
                directory.mkdir()
                dirs.append(directory)
                if "memory" in h.controllers:
                    memory = directory
                    self._memory(directory, h.version)
                if "pids" in h.controllers:
                    (directory / "pids.max").write_text(str(self.processes))
                if "cpu" in h.controllers:
                    self._cpu(directory, h.version)
        except OSError:
            for directory in dirs:
                _remove(directory)
            raise
        assert memory is not None
        return RunGroup(dirs, memory, version)

    def _memory(self, directory: Path, version: int) -> None:
        if version == 2:
            (directory / "memory.max").write_text(str(self.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                (directory / "memory.swap.max").write_text("0")
            return
        (directory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        with contextlib.suppress(OSError):  # memory and swap together: no more than memory alone
            (directory / "memory.memsw.limit_in_bytes").write_text(str(self.memory_bytes))

    def _cpu(self, directory: Path, version: int) -> None:
        """One core's worth of CPU time, however many processes and threads the run has."""
        if version == 2:
            (directory / "cpu.max").write_text(f"{CPU_PERIOD_US} {CPU_PERIOD_US}")
            return
        with contextlib.suppress(OSError):
            (directory / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (directory / "cpu.cfs_quota_us").write_text(str(CPU_PERIOD_US))

    def close(self) -> None:
        """Remove agentroll's groups, unless another sandbox of this agentroll still has runs in them."""
        for _, directory in self.own:
            with contextlib.suppress(OSError):
                directory.rmdir()


def sweep(base: Path) -> None:
    """Remove the groups of an agentroll that is gone (runs' groups first)."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            pid = entry.name.removeprefix(PREFIX)
            if entry.name.startswith(PREFIX) and pid.isdigit() and not alive(int(pid)):
                for child in list(entry.glob("run-*")):
                    _remove(child)
                _remove(entry)
