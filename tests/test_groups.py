"""Groups: filtering uniform groups (DAPO-style), resampling with a cap, per-group figures, the system's report."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

from agentroll.sim.script import Scripted
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, generations, read_records, run_cli

RIGHT = "<think>ok</think>\\boxed{{{label}}}"
WRONG = "<think>ok</think>\\boxed{{{label}1}}"


class Outcomes:
    """Problems named `right-*` always end right, `wrong-*` always wrong, `mixed-*` once right and once wrong
    in every group of two (the selector alternates between a valid and an out-of-range pick)."""

    def __init__(self) -> None:
        self.selections: Counter[str] = Counter()

    def answer(self, prompt, rng, request=None):
        found = re.search(r"Problem (\w+-\d+): the answer is (\d+)", prompt)
        if found is None:  # agentroll's own start-up probes (the logprobs mode): any answer will do
            return Scripted("ok")
        pid, label = found.groups()
        if "Judgment:" in prompt:
            self.selections[pid] += 1
            pick = 1 if pid.startswith("right") or self.selections[pid] % 2 else 9
            return Scripted(f"<think>hm</think>Judgment: {pick}")
        text = WRONG if pid.startswith("wrong") else RIGHT
        return Scripted(text.format(label=label))


def write(path, names):
    path.write_text(
        "".join(
            json.dumps({"id": n, "prompt": f"Problem {n}: the answer is {i + 3}.", "label": str(i + 3)}) + "\n"
            for i, n in enumerate(names)
        )
    )
    return path


def test_uniform_groups_are_left_out_after_the_resample_cap_and_remembered(tmp_path):
    problems = write(tmp_path / "p.jsonl", ["right-1", "wrong-1", "mixed-1", "mixed-2", "right-2"])
    script = Outcomes()
    server = SimServer(script=script)  # type: ignore[arg-type]
    server.start()
    try:
        out = tmp_path / "out"
        args = [
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--reward",
            "exact",
            "--seed",
            "1",
            "--filter-uniform-groups",
            "--resample-uniform",
            "2",
        ]
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr.decode()
        records = read_records(out)
        assert {r["problem_id"] for r in records} == {"mixed-1", "mixed-2"}
        for r in records:
            assert (r["group_reward_mean"], r["group_reward_std"], r["group_pass_at_k"]) == (0.5, 0.5, 1.0)
        finals = defaultdict(set)
        for r in records:
            finals[r["problem_id"]].add((r["sample_index"], r["final_reward"]))
        assert all(sorted(f) == [(0, 0.0), (1, 1.0)] or sorted(f) == [(0, 1.0), (1, 0.0)] for f in finals.values())
        manifest = json.loads((out / "manifest.json").read_text())
        stats = manifest["last_run"]["stats"]
        assert manifest["filtered_groups"] == stats["groups_filtered"] == 3
        assert stats["groups_resampled"] == 3 * 2 and stats["groups_written"] == 2
        assert stats["executions"] == (2 + 3) * 2  # the settled runs only: resampled attempts are not counted
        # each uniform problem ran 1 + 2 times, two executions each time; a mixed one once
        assert script.selections["right-1"] == script.selections["wrong-1"] == 6 and script.selections["mixed-1"] == 2
        calls = len(generations(server))
        assert run_cli(*args).returncode == 0 and len(generations(server)) == calls  # nothing generated again
    finally:
        server.stop()


def test_without_the_filter_every_group_is_written_with_its_figures_and_the_report_adds_up(tmp_path):
    problems = write(tmp_path / "p.jsonl", ["right-1", "wrong-1", "mixed-1"])
    server = SimServer(script=Outcomes())  # type: ignore[arg-type]
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--reward",
            "exact",
        )
        assert proc.returncode == 0, proc.stderr.decode()
        figures = {r["problem_id"]: (r["group_reward_mean"], r["group_pass_at_k"]) for r in read_records(out)}
        assert figures == {"right-1": (1.0, 1.0), "wrong-1": (0.0, 0.0), "mixed-1": (0.5, 1.0)}
        report = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]["report"]
        assert report["solver_accuracy"] == 4 / 6 and report["best_of_n_accuracy"] == 4 / 6
        assert report["majority_vote_accuracy"] == 4 / 6 and report["rewriter_accuracy"] == 4 / 6
        assert report["selector_pick_accuracy"] == 3 / 6 and report["system_accuracy"] == 3 / 6
        assert report["solver_tokens"] > 0 and b"majority vote 0.667" in proc.stderr
    finally:
        server.stop()
