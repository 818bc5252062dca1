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
