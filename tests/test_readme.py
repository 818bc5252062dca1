import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readmes_test_command_word_for_word():
    ci_command = ROOT.joinpath(".ci", "run").read_text().strip().splitlines()[-1]
    readme = ROOT.joinpath("README.md").read_text()
    assert ci_command.startswith("pip install") and f"\n{ci_command}\n" in readme


def test_the_readme_documents_every_generate_flag():
    from typer.main import get_command

    from agentroll.cli import app

    generate = get_command(app).commands["generate"]  # type: ignore[attr-defined]
    readme = ROOT.joinpath("README.md").read_text()
    missing = [opt for p in generate.params for opt in p.opts if opt.startswith("--") and f"`{opt}" not in readme]
    assert missing == []


@pytest.mark.parametrize("made", ["run", "merged"])
def test_the_training_example_runs_on_a_real_folder(sim, problems, tmp_path, made):
    """As written, on a run's own folder and on a merged one made as the Slurm recipe makes it (no --copy: its
    shards lie in the parts' folders)."""
    import os
    import re
    import subprocess
    import sys

    from .conftest import TOKENIZER, run_cli

    args = ["--base-url", sim.url, "--tokenizer", TOKENIZER, "--num-parallel", "2", "--reward", "exact"]
    args += ["--compression", "zstd"]
    if made == "run":
        done = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), *args)
        assert done.returncode == 0, done.stderr.decode()
    else:
        for i in range(2):
            part = run_cli(
                "generate", str(problems), "-o", str(tmp_path / f"parts/part-{i}"), "--partition", f"{i}/2", *args
            )
            assert part.returncode == 0, part.stderr.decode()
        merged = run_cli("merge", *(str(tmp_path / f"parts/part-{i}") for i in range(2)), "-o", str(tmp_path / "out"))
        assert merged.returncode == 0, merged.stderr.decode()
        assert not list((tmp_path / "out").glob("rollouts-*"))  # nothing to glob: the shards are the parts'
    section = ROOT.joinpath("README.md").read_text().split("## Training on the output", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    check = "\nprint(len(rows))\n"
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    ran = subprocess.run([sys.executable, "-c", code + check], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    records = json.loads((tmp_path / "out" / "manifest.json").read_text())["records"]
    assert ran.stdout.decode().split()[-1] == str(records) != "0"  # datasets read every record of the zstd shards
    consumed = json.loads((tmp_path / "out" / ".agentroll" / "consumers" / "trainer").read_text())
    assert consumed["groups"] == 8  # the follower read all 8 groups and recorded it


def test_the_pytorch_example_runs_on_a_real_folder(sim, problems, tmp_path):
    import os
    import re
    import subprocess
    import sys

    import pytest

    pytest.importorskip("torch")
    from .conftest import TOKENIZER, run_cli

    made = run_cli(
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
        "--shard-size",
        "10",
    )
    assert made.returncode == 0, made.stderr.decode()
    section = ROOT.joinpath("README.md").read_text().split("## Training on the output", 1)[1]
    code = next(c for c in re.findall(r"```python\n(.*?)```", section, re.S) if "RolloutDataset" in c)
    check = (
        "\nbatches = list(loader)\nprint(sum(len(b['reward']) for b in batches), batches[0]['input_ids'].shape[0])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code + check],
        cwd=tmp_path,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # a 1-core machine warns about workers
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    solvers = sum(
        1
        for shard in (tmp_path / "out").glob("rollouts-*.jsonl")
        for line in shard.read_text().splitlines()
        if json.loads(line)["stage"] == "solver"
    )
    total, first_batch = ran.stdout.decode().split()
    assert int(total) == solvers and int(first_batch) <= 8


def block_after(heading: str, index: int = 0) -> str:
    """The README's `index`-th fenced block after `heading`, as written."""
    import re

    section = ROOT.joinpath("README.md").read_text().split(heading, 1)[1]
    return re.findall(r"```[a-z]*\n(.*?)```", section, re.S)[index]


def command(line: str, optional: bool = True, **values: str) -> list[str]:
    """A README command line (its continuation backslashes joined, its `[optional]` parts kept as options, or
    left out) as argv, its example values replaced by this test's."""
    import re
    import shlex

    text = line.replace("\\\n", " ")
    text = text.replace("[", "").replace("]", "") if optional else re.sub(r"\[[^]]*\]", "", text)
    for old, new in values.items():
        text = text.replace(old, new)
    return shlex.split(text)


def test_the_usage_command_and_its_input_rows_run_as_written_against_the_simulator(tmp_path, monkeypatch):
    """The Usage section's rows as prompts.jsonl, `vllm serve` played by the simulator with them as its answer
    key, and the generate command word for word but for the server's address."""
    from agentroll.sim.script import Script
    from agentroll.sim.server import SimServer

    from .conftest import run_cli

    rows = tmp_path / "prompts.jsonl"
    rows.write_text(block_after("Input rows"))
    server = SimServer(script=Script.from_jsonl(rows), record=False)
    server.start()
    monkeypatch.chdir(tmp_path)
    try:
        usage = [line for line in block_after("## Usage").split("\n") if line.startswith("agentroll")]
        argv = command(block_after("## Usage").split("\n", 1)[1], **{"http://127.0.0.1:8000": server.url})
        assert usage and argv[:3] == ["agentroll", "generate", "prompts.jsonl"]
        done = run_cli(*argv[1:])
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["groups"] == 2 and manifest["settings"]["samples_per_prompt"] == 8
    assert manifest["last_run"]["stats"]["report"]["system_accuracy"] > 0  # the answer key was given: not 0.000


def test_serve_sim_doctor_and_demo_run_as_the_readme_writes_them(tmp_path):
    """`agentroll demo` (the first command) in a fresh folder; the simulator's command with its options; doctor
    against it, each as its own process, as a user runs them."""
    import re
    import subprocess
    import sys

    from .conftest import user_env

    agentroll = [sys.executable, "-m", "agentroll"]
    demo = subprocess.run(
        [*agentroll, "demo"], cwd=tmp_path, capture_output=True, text=True, env=user_env(), timeout=300
    )
    assert demo.returncode == 0 and (tmp_path / "demo-output" / "manifest.json").exists(), demo.stderr[-2000:]
    text = ROOT.joinpath("README.md").read_text()
    sim = re.search(r"`(agentroll serve-sim --port 8000 --answers samples/math\.jsonl\s*\[[^`]*\])`", text, re.S)
    assert sim is not None
    argv = command(" ".join(sim.group(1).split()), **{"--port 8000": "--port 0"})
    with subprocess.Popen(
        [*agentroll, *argv[1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env()
    ) as server:
        try:
            assert server.stdout is not None
            url = server.stdout.readline().split("listening on ")[1].strip()
            doctor = command(block_after("## Before a long job").strip(), False, **{"http://127.0.0.1:8000": url})
            checked = subprocess.run(
                [*agentroll, *doctor[1:]], capture_output=True, text=True, env=user_env(), timeout=300
            )
        finally:
            server.terminate()
        _, said = server.communicate(timeout=60)
    assert "no --answers" not in said  # the README gives the simulator its answer key
    verdicts = checked.stdout.splitlines()
    assert checked.returncode == 0 and len(verdicts) >= 6 and all(v.startswith(("ok ", "warn ")) for v in verdicts)


def test_the_slurm_recipe_and_its_merge_run_as_written(sim, problems, tmp_path):
    """The Slurm array's command for each task (its `$SLURM_ARRAY_TASK_ID` and `$VLLM_URLS` as Slurm and the user
    set them), then the merge line, in bash."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path as P

    from .conftest import user_env

    script = block_after("A Slurm array")
    body = [line for line in script.split("\n") if line and not line.startswith("#")]
    merge = re.search(r"`(agentroll merge [^`]+)`", ROOT.joinpath("README.md").read_text()).group(1)  # type: ignore[union-attr]
    (tmp_path / "prompts.jsonl").write_text(problems.read_text())
    env = {**user_env(), "VLLM_URLS": sim.url, "PATH": f"{P(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    tasks = [
        subprocess.Popen(
            ["bash", "-c", "\n".join(body)],
            cwd=tmp_path,
            env={**env, "SLURM_ARRAY_TASK_ID": str(task)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for task in range(8)
    ]  # the array's tasks run at once, as Slurm runs them
    for task in tasks:
        _, said = task.communicate(timeout=300)
        assert task.returncode == 0, said[-2000:]
    merged = subprocess.run(["bash", "-c", merge], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stderr
    manifest = json.loads((tmp_path / "out" / "all" / "manifest.json").read_text())
    assert manifest["groups"] == 8 and manifest["complete"] is True and len(manifest["merged_from"]) == 8
