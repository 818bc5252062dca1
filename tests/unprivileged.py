"""The unprivileged half of the sandbox tests: agentroll run as an ordinary user, from tests that run as root (CI
does). `setpriv` drops to `UID`, a uid of no account, with a home of its own; the user runs an interpreter and the
code it can reach: this one if the user may run it, else the system's of the same version (a pyenv under /root is
out of an ordinary user's reach); the source and the packages are linked (or copied) into a folder the user can
read when they are not readable where they are. Where that cannot be done, the test skips saying exactly why.

When the tests already run as an ordinary user, that user is the unprivileged half: it runs as it is.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UID = 4242
SETPRIV = shutil.which("setpriv")
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def is_root() -> bool:
    return os.geteuid() == 0


def drop(argv: list[str]) -> list[str]:
    """`argv` as the user `UID` (no supplementary groups, no capabilities left after the change of uid). The
    program is started by `env` as that user: setpriv's own exec may reach a file the user could not."""
    if not is_root():
        return argv
    assert SETPRIV is not None
    return [SETPRIV, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "/usr/bin/env", "--", *argv]


def home(prefix: str = "agentroll-user-") -> Path:
    """A fresh home directory only the user may enter (in the system's temp directory: pytest's own is root's)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if is_root():
        os.chown(path, UID, UID)
    path.chmod(0o700)
    return path


def give(path: Path) -> Path:
    """Hand a file or folder made by the test (as root) to the user."""
    if is_root():
        for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
            os.lchown(item, UID, UID)
    return path


def _can(argv: list[str], env: dict[str, str]) -> str | None:
    """None when `argv` runs as the user and exits 0; else what it said."""
    try:
        done = subprocess.run(drop(argv), capture_output=True, text=True, timeout=120, env=env)
    except OSError as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def _link_tree(source: Path, into: Path) -> Path:
    """A copy of `source` the user can read: hard links where the file system allows them, else copies."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    target = into / source.name
    shutil.copytree(source, target, copy_function=link, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for item in [target, *target.rglob("*")]:
        if not item.is_symlink():
            item.chmod(item.stat().st_mode | 0o444 | (0o111 if item.is_dir() else 0))
    target.parent.chmod(0o755)
    return target


@functools.lru_cache(maxsize=1)
def interpreter() -> tuple[str, str]:
    """(python, PYTHONPATH) the user can import agentroll and its dependencies with; skips saying why not."""
    if is_root() and SETPRIV is None:
        pytest.skip("the unprivileged half needs setpriv (util-linux) to drop to an ordinary user")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/"}
    made = Path(tempfile.mkdtemp(prefix="agentroll-user-code-"))
    made.chmod(0o755)
    paths = [ROOT, *(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())]
    reachable = []
    for path in paths:
        if _can(["/bin/sh", "-c", f"test -r '{path}' && test -x '{path}'"], env) is None:
            reachable.append(str(path))
        elif path == ROOT:  # only the package: the tests themselves stay here
            reachable.append(str(_link_tree(ROOT / "agentroll", made / "src").parent))
        else:
            reachable.append(str(_link_tree(path, made / f"packages{len(reachable)}")))
    env["PYTHONPATH"] = os.pathsep.join(reachable)
    why = []
    candidates = [sys.executable, *[p for p in SYSTEM_PYTHONS if os.path.exists(p)]]
    for python in dict.fromkeys(candidates):
        failure = _can([python, "-I", "-c", "pass"], env)  # can it start at all
        if failure is None:
            version = f"import sys; assert sys.version_info[:2] == {tuple(sys.version_info[:2])}, sys.version"
            failure = _can([python, "-c", f"{version}\nimport agentroll.cli, aiohttp, orjson, psutil"], env)
        if failure is None:
            return python, env["PYTHONPATH"]
        why.append(f"{python}: {failure}")
    pytest.skip(f"no interpreter uid {UID} can run agentroll with ({'; '.join(why)})")


def environment(user_home: Path, **extra: str) -> dict[str, str]:
    _, pythonpath = interpreter()
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user_home),
        "PYTHONPATH": pythonpath,
        "HF_HUB_OFFLINE": "1",
        "LANG": "C.UTF-8",
        **extra,
    }


def tokenizer() -> str:
    """The simulator's tokenizer where the user's copy of the package has it."""
    _, pythonpath = interpreter()
    for base in pythonpath.split(os.pathsep):
        found = Path(base) / "agentroll" / "sim" / "tokenizer"
        if found.is_dir():
            return str(found)
    raise AssertionError("the package is on the user's path")


def agentroll(user_home: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`agentroll ARGS` run by the user, from its home."""
    python, _ = interpreter()
    return subprocess.run(
        drop([python, "-m", "agentroll", *args]),
        capture_output=True,
        timeout=timeout,
        env=environment(user_home, **env),
        cwd=user_home,
    )


RUNNER = """import asyncio, json, sys
from agentroll.sandbox import SandboxSettings, make_sandbox
given = json.loads(sys.argv[1])
async def main():
    sandbox = make_sandbox(SandboxSettings(**given["settings"]))
    try:
        result = await sandbox.run(given["code"], given["stdin"], given["timeout"])
        return {"status": result.status, "stdout": result.stdout, "stderr": result.stderr,
                "exit_code": result.exit_code, "described": await sandbox.describe()}
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    finally:
        await sandbox.aclose()
print(json.dumps(asyncio.run(main())))
"""


def sandbox_run(user_home: Path, code: str, stdin: str | None, timeout_s: float, settings: dict) -> dict:
    """One `agentroll.sandbox` run made by the user: its result's fields, or what it raised."""
    python, _ = interpreter()
    given = json.dumps({"settings": settings, "code": code, "stdin": stdin, "timeout": timeout_s})
    done = subprocess.run(
        drop([python, "-c", RUNNER, given]),
        capture_output=True,
        text=True,
        timeout=timeout_s + 120,
        env=environment(user_home),
        cwd=user_home,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
