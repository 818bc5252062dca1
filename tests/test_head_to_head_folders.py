"""A head-to-head folder through the folder tools, where one policy's records could pass for the other's: `validate`
ties each execution to the policy of its `sample_index`."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from agentroll.tools.validate import validate

from . import synthetic
from .conftest import read_records, run_cli, write_problems
from .test_head_to_head import K, by_hand, duel, policy_args, server  # noqa: F401 (`duel` is a fixture)

FIGURES = ("group_reward_mean", "group_reward_std", "group_pass_at_k")


@pytest.fixture
def folder(duel, tmp_path: Path) -> Path:  # noqa: F811
    problems, strong, weak = duel
    out = tmp_path / "out"
    proc = run_cli(*policy_args(problems, out, strong.url, weak.url, "-q", "--limit", "8"))
    assert proc.returncode == 0, proc.stderr.decode()
    return out


def test_an_execution_named_for_the_other_policy_is_a_fault_even_where_the_figures_hold(folder, tmp_path):
    out = tmp_path / "swapped"
    shutil.copytree(folder, out)
    swapped = {}

    def swap(records: list[dict]) -> None:
        """In a problem where new's first execution and old's first ended alike, their policies are swapped, and
        their group figures with them: every figure describes the policy a record names, only the attribution
        is wrong."""
        heads: dict[tuple[str, int], dict] = {(r["problem_id"], r["sample_index"]): r for r in records}
        pid = next(p for (p, i), r in heads.items() if i == 0 and r["final_reward"] == heads[(p, K)]["final_reward"])
        swapped["problem"] = pid
        figures = {name: {f: heads[(pid, i)][f] for f in FIGURES} for name, i in (("new", 1), ("old", K + 1))}
        for r in records:
            if r["problem_id"] == pid and r["sample_index"] in (0, K):
                r["policy"] = "old" if r["sample_index"] == 0 else "new"
                r.update(figures[r["policy"]])

    synthetic.edit(out, swap)
    report = validate(out)
    assert not report.ok
    said = [f.message for f in report.faults]
    assert any(f"problem {swapped['problem']!r}" in m and "execution 0" in m and "'new'" in m for m in said), said
    assert {f.kind for f in report.faults} == {"group"}


def test_a_record_without_its_policy_in_a_head_to_head_folder_is_a_fault(folder, tmp_path):
    out = tmp_path / "unnamed"
    shutil.copytree(folder, out)

    def drop(records: list[dict]) -> None:
        for r in records:
            r.pop("policy")

    synthetic.edit(out, drop)
    report = validate(out)
    assert not report.ok and any("policy" in f.message for f in report.faults), report.lines()


def test_the_folders_table_counts_the_uniform_groups_filtered_out_as_the_ties_they_were(tmp_path):
    """--filter-uniform-groups leaves out of the records a group whose executions all ended alike over every
    policy: a problem where the policies tied. `stats` counts them (the manifest says how many), so its table is
    the run's summary's, not one over the problems where something differed (which overstates the difference)."""
    problems = write_problems(tmp_path / "problems.jsonl", 16)
    first, second = server(problems, "strong", 0.9), server(problems, "fair", 0.6, seed=1)
    first.start()
    second.start()
    out = tmp_path / "out"
    try:
        args = policy_args(problems, out, first.url, second.url, "--filter-uniform-groups", "-q")
        args[args.index("--samples-per-prompt") + 1] = "1"  # one execution each: many groups are uniform
        proc = run_cli(*args)
    finally:
        first.stop()
        second.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = json.loads((out / "manifest.json").read_text())
    filtered = manifest["filtered_groups"]
    assert filtered >= 2 and manifest["groups"] >= 2  # the seeded run has both kinds
    hand = by_hand(read_records(out))["all"]  # over the records: the groups kept
    data = json.loads(run_cli("stats", str(out), "--json").stdout)
    table = data["all"]["head_to_head"]
    (pair,) = table["pairs"]
    assert table["filtered_ties"] == filtered
    assert [pair[k] for k in ("problems", "wins", "ties", "losses")] == [
        hand["problems"] + filtered,
        hand["wins"],
        hand["ties"] + filtered,
        hand["losses"],
    ]
    assert pair["mean_difference"] == pytest.approx(hand["difference"] / (hand["problems"] + filtered))
    (counted,) = manifest["last_run"]["stats"]["head_to_head"]["pairs"]  # what the run's summary said
    assert [counted[k] for k in ("problems", "wins", "ties", "losses")] == [
        pair[k] for k in ("problems", "wins", "ties", "losses")
    ]
    shown = run_cli("stats", str(out)).stdout.decode()
    assert f"{filtered} uniform groups" in shown
    assert run_cli("report", str(out), "-o", str(tmp_path / "r.html")).returncode == 0
    assert f"{filtered} uniform groups filtered out" in (tmp_path / "r.html").read_text()


def test_nemo_rl_which_groups_by_prompt_ids_is_refused_across_policies_and_takes_one_policy(folder, tmp_path):
    """NeMo-RL's GRPO baselines are over the samples with identical prompt ids, which two policies of one chat
    template share: converted together, one model's samples would be the other's baseline."""
    mixed = run_cli("convert", str(folder), "--to", "nemo-rl", "-o", str(tmp_path / "mixed"))
    said = mixed.stderr.decode()
    assert mixed.returncode == 2 and "--policy NAME" in said and len(said.strip().splitlines()) == 1, said
    assert not (tmp_path / "mixed").exists()
    one = tmp_path / "one"
    proc = run_cli("convert", str(folder), "--to", "nemo-rl", "--policy", "new", "-o", str(one))
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [json.loads(line) for line in (one / "nemo_rl.jsonl").read_text().splitlines()]
    new = [r for r in read_records(folder) if r["policy"] == "new"]
    assert len(rows) == len(new) and {r["extra_env_info"]["problem_id"] for r in rows} == {r["problem_id"] for r in new}


def test_every_row_of_a_head_to_head_conversion_says_whose_model_made_it(folder, tmp_path):
    """The formats without a group id that names the policy (verl's uid and the like do) carry the record's
    `policy` where they keep the record's provenance; a folder of one model's rows are as they were."""
    records = read_records(folder)
    whose = {r["rollout_id"]: r["policy"] for r in records}
    found: dict[str, list[tuple[str | None, str]]] = {}  # format -> (the row's policy, its record's)
    for to, file, extra in (
        ("trl", "trl.jsonl", []),
        ("sft", "sft.jsonl", ["--layout", "standard"]),
        ("slime", "slime.jsonl", []),
        ("verifiers", "results.jsonl", []),
        ("nemo-rl", "nemo_rl.jsonl", ["--policy", "old"]),
    ):
        out = tmp_path / to
        proc = run_cli("convert", str(folder), "--to", to, "-o", str(out), *extra)
        assert proc.returncode == 0, proc.stderr.decode()
        rows = [json.loads(line) for line in (out / file).read_text().splitlines()]
        if to == "trl":  # a row per record, by its tokens (no rollout id)
            assert Counter(
                (row["problem_id"], row["stage"], tuple(row["completion_ids"]), row.get("policy")) for row in rows
            ) == Counter((r["problem_id"], r["stage"], tuple(r["response_token_ids"]), r["policy"]) for r in records)
            found[to] = [(row.get("policy"), None) for row in rows]
        elif to == "sft":
            found[to] = [(row.get("policy"), None) for row in rows]
        elif to == "slime":
            where = [row["metadata"]["agentroll"] for row in rows]
            found[to] = [(w.get("policy"), whose[w["rollout_id"]]) for w in where]
        else:
            where = [row["info"] if to == "verifiers" else row["extra_env_info"] for row in rows]
            found[to] = [(w.get("policy"), whose[w["rollout_id"]]) for w in where]
    for to, pairs in found.items():
        assert pairs and all(mine in ("new", "old") for mine, _ in pairs), to
        assert all(mine == want for mine, want in pairs if want is not None), to
    assert {mine for mine, _ in found["sft"]} == {"new", "old"} and {m for m, _ in found["nemo-rl"]} == {"old"}


def test_a_rescored_head_to_head_folder_says_who_won_under_the_new_reward(folder, tmp_path):
    out = tmp_path / "rescored"
    proc = run_cli("rescore", str(folder), "-o", str(out), "--reward", "math")
    assert proc.returncode == 0, proc.stderr.decode()
    (counted,) = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]["head_to_head"]["pairs"]
    (table,) = json.loads(run_cli("stats", str(out), "--json").stdout)["all"]["head_to_head"]["pairs"]
    assert counted["problems"] == 8
    assert [counted[k] for k in ("problems", "wins", "ties", "losses")] == [
        table[k] for k in ("problems", "wins", "ties", "losses")
    ]
    said = proc.stderr.decode()
    assert "policy new:" in said and "new vs old over 8 problems" in said, said


def test_a_rerun_with_other_policies_says_which_policy_changed_in_what(duel, folder):  # noqa: F811
    problems, strong, weak = duel
    swapped = policy_args(problems, folder, weak.url, strong.url, "-q", "--limit", "8")  # new on the weak server
    refused = run_cli(*swapped)
    said = refused.stderr.decode().strip()
    assert refused.returncode == 6 and len(said.splitlines()) == 1, said
    assert "policies.new.model: 'strong' -> 'weak'" in said and "policies.old.model: 'weak' -> 'strong'" in said
    assert "sampling" not in said and len(said) < 400, said  # what changed, not every policy's settings
    reordered = policy_args(problems, folder, strong.url, weak.url, "-q", "--limit", "8")
    at = reordered.index("--policy")
    reordered[at : at + 4] = [*reordered[at + 2 : at + 4], *reordered[at : at + 2]]  # old first, then new
    said = run_cli(*reordered).stderr.decode()
    assert "policies: ['new', 'old'] -> ['old', 'new']" in said, said
