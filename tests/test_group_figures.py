"""One group, in every system and every format (issue 40): a group is a problem's K executions (each policy's K
in a head-to-head folder), an execution's outcome its final reward, and a baseline is over the K executions'
conversations, never over calls. For every built-in system (tool use and the agent with executions of
different numbers of calls, the agent with branches) the figures are recomputed here from the records, by each
trainer's own rule, and compared with what the records, `stats`, `inspect` and each exporter say."""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from agentroll.convert import convert
from agentroll.folder import read_groups
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.inspect import rollout_tree
from agentroll.tools.report import stats

from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .test_tool_use import behavior

K = 4
SYSTEMS = ("three-stage", "single", "critique-revise", "tool-use", "agent", "head-to-head")
# the formats that write an advantage, each with the rule its trainer takes (docs/convert.md): kind, std, and the
# epsilon its GRPO adds to the std (TRL's _generate_and_score_completions 1e-4, slime's _post_process_rewards 1e-6,
# OpenRLHF's group_norm 1e-9); prime-rl's and verifiers' rule is reward minus the mean
RULES = {"trl": ("grpo", "sample", 1e-4), "openrlhf": ("grpo", "sample", 1e-9), "verifiers": ("mean", None, 0.0)}
RULES |= {"prime-rl": ("mean", None, 0.0), "slime": ("grpo", "sample", 1e-6)}
SAID: dict[str, str] = {}  # each run's summary

# an agent that goes on calling while the model calls its tool (so executions differ in calls), and now and
# then asks its question again, edited: a branch that continues nothing, yet belongs to the same attempt
AGENT = """
import json, os, random, sys, urllib.request
row = json.load(sys.stdin)
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
TOOL = {"type": "function", "function": {"name": "python", "description": "Run Python.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}

def chat(messages):
    body = {"model": os.environ["AGENTROLL_MODEL"], "messages": messages, "tools": [TOOL], "max_tokens": 120}
    request = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(), method="POST")
    request.add_header("Authorization", "Bearer " + key)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())["choices"][0]["message"]

messages = [{"role": "user", "content": row["prompt"]}]
if random.random() < 0.5:
    chat([{"role": "user", "content": row["prompt"] + " Be brief."}])
for _ in range(4):
    message = chat(messages)
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        code = json.loads(call["function"]["arguments"])["code"]
        printed = code.split('"')[1] if '"' in code else ""
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": printed})
print(message.get("content") or "")
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("groups")
    problems = write_problems(tmp / "problems.jsonl", 3)
    (tmp / "agent.py").write_text(AGENT)
    plain = SimServer(script=Script.from_jsonl(problems))
    tools = SimServer(script=Script.from_jsonl(problems, behavior(tool_call=0.6, correct=0.5)))
    weak = SimServer(script=Script.from_jsonl(problems, behavior(tool_call=0.3, correct=0.3)))
    for server in (plain, tools, weak):
        server.start()
    common = ["--samples-per-prompt", str(K), "--seed", "7", "--max-tokens", "200"]
    one = ["--tokenizer", TOKENIZER, "--base-url"]
    agent = f"command={sys.executable} {tmp / 'agent.py'}"
    new, old = (f"{n}={s.url},tokenizer={TOKENIZER}" for n, s in (("new", tools), ("old", weak)))
    runs = {
        "three-stage": [*one, plain.url, "--system", "three-stage"],
        "single": [*one, plain.url, "--system", "single"],
        "critique-revise": [*one, plain.url, "--system", "critique-revise"],
        "tool-use": [*one, tools.url, "--system", "tool-use"],
        "agent": [*one, tools.url, "--system", "agent", "--system-option", agent, "--reward", "exact"],
        "head-to-head": ["--system", "tool-use", "--policy", new, "--policy", old],
    }
    out = {}
    try:
        for name, args in runs.items():
            done = run_cli("generate", str(problems), "-o", str(tmp / name), *args, *common)
            assert done.returncode == 0, (name, done.stderr.decode()[-3000:])
            out[name], SAID[name] = tmp / name, done.stderr.decode()
    finally:
        for server in (plain, tools, weak):
            server.stop()
    return out


# -- the figures, recomputed from the records alone -------------------------------------------------------------


def executions_of(records: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for r in records:
        if not out or out[-1][0]["rollout_id"] != r["rollout_id"]:
            out.append([])
        out[-1].append(r)
    return out


def groups_of(records: list[dict]) -> dict[tuple[str, str | None], list[list[dict]]]:
    """(problem, policy) -> its K executions."""
    out: dict[tuple[str, str | None], list[list[dict]]] = {}
    for e in executions_of(records):
        out.setdefault((e[0]["problem_id"], e[0].get("policy")), []).append(e)
    return out


def conversations(execution: list[dict], system: str) -> list[list[int]]:
    """Positions per conversation: one stage's records linked by `continues`; the agent's whole execution."""
    if system == "agent":
        return [list(range(len(execution)))]
    parent = list(range(len(execution)))
    for i, r in enumerate(execution):
        c = r.get("continues")
        if c is not None and execution[c]["stage"] == r["stage"]:
            parent[i] = parent[c]
    found: dict[int, list[int]] = {}
    for i, root in enumerate(parent):
        found.setdefault(root, []).append(i)
    return list(found.values())


def expected(records: list[dict], system: str, kind: str, eps: float = 0.0) -> dict[tuple[str, int], float]:
    """(rollout_id, position) -> the advantage of the conversation the record is in, by the trainer's rule over
    the (problem, policy, stage) group's conversations; also checks that they sum to 0 over each group."""
    out = {}
    for executions in groups_of(records).values():
        stages: dict[str, list[tuple[str, list[int], float]]] = {}
        for e in executions:
            for chat in conversations(e, system):
                stages.setdefault(e[chat[0]]["stage"], []).append((e[0]["rollout_id"], chat, e[chat[-1]]["reward"]))
        for chats in stages.values():
            rewards = [r for _, _, r in chats]
            mean = sum(rewards) / len(rewards)
            spread = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
            values = [(r - mean) / (spread + eps) if kind == "grpo" and spread > 0 else r - mean for r in rewards]
            assert math.isclose(sum(values), 0.0, abs_tol=1e-9)
            for (rid, chat, _), value in zip(chats, values, strict=True):
                out.update({(rid, i): value for i in chat})
    return out


def system_of(name: str) -> str:
    return "tool-use" if name == "head-to-head" else name


# -- the records, stats and inspect ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SYSTEMS)
def test_the_records_group_figures_are_the_k_executions_outcomes(folders, name):
    records = read_records(folders[name])
    system = system_of(name)
    for (problem, policy), executions in groups_of(records).items():
        assert len(executions) == K
        outcomes = [e[0]["final_reward"] for e in executions]
        mean = sum(outcomes) / K
        std = math.sqrt(sum((o - mean) ** 2 for o in outcomes) / K)
        solved = float(any(o == 1.0 for o in outcomes))
        stages: dict[str, list[float]] = {}
        for e in executions:
            for chat in conversations(e, system):
                stages.setdefault(e[chat[0]]["stage"], []).append(e[chat[-1]]["reward"])
        for r in (r for e in executions for r in e):
            assert r["group_reward_mean"] == pytest.approx(mean) and r["group_reward_std"] == pytest.approx(std)
            assert r["group_pass_at_k"] == solved, (problem, policy, r["stage"])
            own = stages[r["stage"]]
            assert r["stage_group_size"] == len(own)
            assert r["stage_group_reward_mean"] == pytest.approx(sum(own) / len(own))
            assert r["stage_group_reward_std"] == pytest.approx(statistics.pstdev(own))
    assert any(r["group_pass_at_k"] == 1.0 for r in records)  # some group was solved: the figure was exercised


@pytest.mark.parametrize("name", SYSTEMS)
def test_stats_and_inspect_say_the_same_group(folders, name):
    records = read_records(folders[name])
    found = stats(folders[name])
    by_policy: dict[str | None, list[list[float]]] = {}
    for (_, policy), executions in groups_of(records).items():
        by_policy.setdefault(policy, []).append([e[0]["final_reward"] for e in executions])
    sections = found["all"]["policies"] if name == "head-to-head" else {None: found["all"]}
    assert len(sections) == len(by_policy)
    for policy, section in sections.items():
        groups = by_policy[policy]
        at = {e["k"]: e["value"] for e in section["pass_at_k"]}
        assert sorted(at) == list(range(1, K + 1))
        assert at[1] == pytest.approx(sum(sum(o == 1.0 for o in g) / K for g in groups) / len(groups))
        assert at[K] == pytest.approx(sum(any(o == 1.0 for o in g) for g in groups) / len(groups))
    if name == "head-to-head":  # nothing pools the two models' samples, in stats nor in the run's summary
        assert SAID[name].count("accuracy:") == 2 and "mean raw reward (new)" in SAID[name]
        assert "mean raw reward (old)" in SAID[name]
        whole = found["all"]
        assert whole["pass_at_k"] == [] and whole["mean_final_reward"] is None
        assert all(v is None for k, v in whole["report"].items() if not k.endswith("_tokens"))
    info = json.loads((folders[name] / "manifest.json").read_text())["settings"]["system"]
    for group in read_groups(folders[name]):
        shown = Console(file=io.StringIO(), width=400)
        shown.print(rollout_tree(group, system=info))
        head = shown.file.getvalue().splitlines()[0]  # type: ignore[attr-defined]
        for (_, policy), executions in groups_of(group.records()).items():
            solved = int(any(e[0]["final_reward"] == 1.0 for e in executions))
            assert f"{'' if policy is None else policy + ': '}group reward mean" in head
            assert f"pass@all {solved}" in head, head


# -- every format that writes an advantage --------------------------------------------------------------------


def exported(name: str, out: Path, records: list[dict]) -> list[tuple[tuple[str, int], float]]:
    """(rollout_id, position of the record a row ends on) and its advantage, for every row of the export."""
    where = {(r["rollout_id"], tuple(r["prompt_token_ids"] + r["response_token_ids"])): r for r in records}
    positions = {}
    for e in executions_of(records):
        positions.update({id(r): i for i, r in enumerate(e)})

    def at(rid: str, tokens: list[int]) -> tuple[str, int]:
        return rid, positions[id(where[(rid, tuple(tokens))])]

    rows: list[tuple[tuple[str, int], float]] = []
    if name == "trl":  # one row per call, no rollout id: found by its policy and tokens, in record order
        by_tokens: dict[tuple, list[dict]] = {}
        for r in records:
            by_tokens.setdefault((r.get("policy"), *r["prompt_token_ids"], -1, *r["response_token_ids"]), []).append(r)
        for line in (out / "trl.jsonl").read_text().splitlines():
            row = json.loads(line)
            record = by_tokens[(row.get("policy"), *row["prompt_ids"], -1, *row["completion_ids"])].pop(0)
            rows.append(((record["rollout_id"], positions[id(record)]), row["advantage"]))
    elif name == "openrlhf":
        for line in (out / "openrlhf.jsonl").read_text().splitlines():
            row = json.loads(line)
            rows.append((at(row["rollout_id"], row["observation_tokens"]), row["reward"]))
    elif name == "verifiers":
        for line in (out / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            last = row["trajectory"][-1]["tokens"]
            assert {s["advantage"] for s in row["trajectory"]} == {row["advantage"]}  # every step carries it
            rows.append((at(row["info"]["rollout_id"], last["prompt_ids"] + last["completion_ids"]), row["advantage"]))
    elif name == "prime-rl":
        owner = {tokens: rid for rid, tokens in where}
        for path in sorted(out.rglob("*.bin")):
            for batch in msgspec.msgpack.decode(path.read_bytes()):
                tokens, mask, advantages = batch[0], batch[1], batch[2]
                if not any(mask):
                    continue  # a zero-loss copy padding a rank
                (value,) = {a for a, m in zip(advantages, mask, strict=True) if m}
                rows.append((at(owner[tuple(tokens)], tokens), value))
    elif name == "slime":
        import torch

        for path in sorted(out.glob("*.pt")):
            for sample in torch.load(path, weights_only=False)["samples"]:
                rows.append((at(sample["metadata"]["agentroll"]["rollout_id"], sample["tokens"]), sample["reward"]))
    return rows


@pytest.mark.parametrize("fmt", list(RULES))
@pytest.mark.parametrize("name", SYSTEMS)
def test_every_export_carries_each_conversations_advantage_over_the_k_conversations(folders, name, fmt, tmp_path):
    kind, std, eps = RULES[fmt]
    records = read_records(folders[name])
    convert(folders[name], fmt, tmp_path / fmt, advantage=kind, std=std)
    want = expected(records, system_of(name), kind, eps)
    rows = exported(fmt, tmp_path / fmt, records)
    assert rows, fmt
    for key, value in rows:  # tight enough to tell the trainer's epsilon (OpenRLHF's 1e-9 moves an advantage ~1e-9)
        assert value == pytest.approx(want[key], rel=1e-12, abs=1e-12), (fmt, key)
    # over each group, one advantage per conversation: they sum to 0 (every conversation trained is in the export)
    system = system_of(name)
    shown = dict(rows)
    for executions in groups_of(records).values():
        stages: dict[str, list[list[float]]] = {}
        for e in executions:
            for chat in conversations(e, system):
                carried = [shown[(e[0]["rollout_id"], i)] for i in chat if (e[0]["rollout_id"], i) in shown]
                stages.setdefault(e[chat[0]]["stage"], []).append(carried)
        for stage, chats in stages.items():
            if not any(chats):
                continue  # a stage folded into a later one's conversation (critique-revise's solver and critic)
            assert all(chats), (fmt, stage)  # every conversation of the group is in the export...
            assert all(max(c) == pytest.approx(min(c)) for c in chats)  # ...with one advantage on all its rows
            assert abs(sum(c[0] for c in chats)) < 1e-6, (fmt, stage, chats)  # over the K conversations: sum 0
            if system in ("tool-use", "agent"):
                assert len(chats) == K  # one conversation per execution, whatever its calls


@pytest.mark.parametrize("name", ["tool-use", "agent", "head-to-head"])
def test_the_multi_call_folders_have_executions_of_different_numbers_of_calls(folders, name):
    """What the tests above rest on: K executions of a problem that made different numbers of calls (and, for
    the agent, branches that continue nothing)."""
    records = read_records(folders[name])
    calls = [{len(e) for e in executions} for executions in groups_of(records).values()]
    assert any(len(counts) > 1 for counts in calls), calls
    if name == "agent":  # a branch that continues nothing: the whole execution is one conversation all the same
        assert any(sum(r.get("continues") is None for r in e) > 1 for e in executions_of(records))


@pytest.mark.parametrize("trajectory", [False, True])
@pytest.mark.parametrize("name", SYSTEMS)
def test_the_torch_dataset_gives_each_item_its_groups_baseline_over_conversations(folders, name, trajectory):
    from agentroll.torch import RolloutDataset, collate

    records = read_records(folders[name])
    system = system_of(name)
    owner = {}
    baselines: dict[tuple, float] = {}
    for (problem, policy), executions in groups_of(records).items():
        stages: dict[str, list[float]] = {}
        for e in executions:
            owner[e[0]["rollout_id"]] = policy
            for chat in conversations(e, system):
                stages.setdefault(e[chat[0]]["stage"], []).append(e[chat[-1]]["reward"])
        baselines.update({(problem, policy, stage): sum(r) / len(r) for stage, r in stages.items()})
    items = list(RolloutDataset(folders[name], trajectory=trajectory))
    assert items
    for item in items:
        key = (item["problem_id"], owner[item["rollout_id"]], item["stage"])
        assert float(item["baseline"]) == pytest.approx(baselines[key], abs=1e-6)
    assert collate(items[:3])["baseline"].shape == (min(3, len(items)),)


def test_the_report_page_of_a_head_to_head_folder_draws_each_policy_never_the_two_pooled(folders):
    from agentroll.tools.figures import figures
    from agentroll.tools.html import columns, render

    data = figures(folders["head-to-head"])
    assert [name for name, _ in columns(data)] == ["new", "old"]
    assert all(chart["name"].endswith(("-new", "-old")) for chart in data["charts"])
    page = render(data)
    drawn = page[page.index('data-chart="pass-at-k"') :]
    drawn = drawn[: drawn.index("</svg>")]
    assert ">new<" in drawn and ">old<" in drawn and ">all<" not in drawn


# -- a head-to-head folder: every figure per policy, none pooling the two models ----------------------------------


def policy_executions(records: list[dict]) -> dict[str, list[list[dict]]]:
    out: dict[str, list[list[dict]]] = {}
    for e in executions_of(records):
        out.setdefault(e[0]["policy"], []).append(e)
    return out


def test_a_head_to_head_runs_live_line_and_manifest_report_are_each_policys(folders):
    from agentroll.record.stats import RunStats
    from agentroll.run.progress import outcome_phrase

    mine = policy_executions(read_records(folders["head-to-head"]))
    assert sorted(mine) == ["new", "old"]
    stats_ = json.loads((folders["head-to-head"] / "manifest.json").read_text())["last_run"]["stats"]
    # the run's report pools nothing: its figures are each policy's; the tokens (a cost) stay the run's
    assert stats_["report"] and all(v is None for k, v in stats_["report"].items() if not k.endswith("_tokens"))
    assert any(v for k, v in stats_["report"].items() if k.endswith("_tokens"))
    phrase = outcome_phrase(RunStats.from_dict(stats_))
    means, accuracies = [], []
    for name, executions in mine.items():
        finals = [e[0]["final_reward"] for e in executions]
        accuracy = sum(f == 1.0 for f in finals) / len(finals)
        assert stats_["policies"][name]["report"]["system_accuracy"] == pytest.approx(accuracy)
        means.append(f"{name} {sum(finals) / len(finals):.3f}")
        accuracies.append(f"{name} {accuracy:.3f}")
    assert phrase == f"mean reward {', '.join(means)}, system accuracy {', '.join(accuracies)}"
    # a one-policy run's line is as it was: the run's own figures
    records = read_records(folders["tool-use"])
    finals = [e[0]["final_reward"] for e in executions_of(records)]
    one = json.loads((folders["tool-use"] / "manifest.json").read_text())["last_run"]["stats"]
    assert one["report"]["system_accuracy"] == pytest.approx(sum(f == 1.0 for f in finals) / len(finals))
    assert outcome_phrase(RunStats.from_dict(one)) == (
        f"mean reward {sum(finals) / len(finals):.3f}, "
        f"system accuracy {sum(f == 1.0 for f in finals) / len(finals):.3f}"
    )


def test_the_report_pages_lengths_and_shaped_rewards_of_a_head_to_head_folder_are_each_policys(folders):
    from agentroll.tools.figures import figures
    from agentroll.tools.html import render

    records = read_records(folders["head-to-head"])
    data = figures(folders["head-to-head"])
    assert all(v is None for v in data["shaped_reward"].values())  # no pooled shaped reward
    for name in ("new", "old"):
        for stage in data["stats"]["system"]["stages"]:
            own = [r for r in records if r["policy"] == name and r["stage"] == stage]
            assert data["shaped_reward_by_policy"][name][stage] == pytest.approx(
                sum(r["reward"] for r in own) / len(own)
            )
            h = data["lengths"][f"{stage}-{name}"]
            assert h["samples"] == len(own)
            assert h["longest"] == max(len(r["response_token_ids"]) for r in own)
    assert all(key.endswith(("-new", "-old")) for key in data["lengths"])
    page = render(data)
    drawn = page[page.index('data-chart="reward"') :]
    drawn = drawn[: drawn.index("</svg>")]
    assert ">new raw reward<" in drawn and ">old shaped reward<" in drawn and ">shaped reward<" not in drawn
    # a one-policy folder's are as they were: per stage
    one = figures(folders["tool-use"])
    assert list(one["lengths"]) == ["solver"] and "shaped_reward_by_policy" not in one
    rewards = [r["reward"] for r in read_records(folders["tool-use"])]
    assert one["shaped_reward"]["solver"] == pytest.approx(sum(rewards) / len(rewards))


def test_the_viewers_rows_of_a_head_to_head_folder_hold_each_policys_group_mean_and_std(folders):
    from .view_support import index_of

    index = index_of(folders["head-to-head"], follow=False)
    index.run()
    records = read_records(folders["head-to-head"])
    assert index.rows
    for row in index.rows:
        assert row["mean"] is None and row["std"] is None  # never the two models' executions pooled
        for name, executions in policy_executions([r for r in records if r["problem_id"] == row["id"]]).items():
            finals = [e[0]["final_reward"] for e in executions]
            assert row["by_policy"][name]["mean"] == pytest.approx(statistics.fmean(finals))
            assert row["by_policy"][name]["std"] == pytest.approx(statistics.pstdev(finals))
    index = index_of(folders["tool-use"], follow=False)  # one policy: the group's own, as before
    index.run()
    records = read_records(folders["tool-use"])
    for row in index.rows:
        finals = [e[0]["final_reward"] for e in executions_of([r for r in records if r["problem_id"] == row["id"]])]
        assert row["mean"] == pytest.approx(statistics.fmean(finals))
        assert row["std"] == pytest.approx(statistics.pstdev(finals))


def test_convert_warns_once_where_a_trainer_would_count_an_agents_branches_once_per_row(folders, tmp_path):
    records = read_records(folders["agent"])

    def ends(execution: list[dict]) -> int:  # the rows a whole-conversation format writes: each trajectory's last
        continued = {r.get("continues") for r in execution}
        return sum(i not in continued for i in range(len(execution)))

    branched = sum(ends(e) > 1 for e in executions_of(records))
    assert branched > 0  # the fixture's agent asks again, now and then: an execution of several branches
    for fmt in ("verl", "skyrl", "megatron", "nemo-rl"):
        done = run_cli("convert", str(folders["agent"]), "--to", fmt, "-o", str(tmp_path / fmt))
        said = done.stderr.decode()
        assert done.returncode == 0, said
        assert said.count("warning:") == 1 and f"warning: {branched} conversations are written as several" in said
        summary = convert(folders["agent"], fmt, tmp_path / f"{fmt}-lib")
        assert summary["split_conversations"] == branched
    # where agentroll computes the advantage per conversation, or where no execution branches: no warning
    done = run_cli(
        "convert", str(folders["agent"]), "--to", "openrlhf", "-o", str(tmp_path / "o"), "--advantage", "grpo"
    )
    assert done.returncode == 0 and "warning" not in done.stderr.decode()
    done = run_cli("convert", str(folders["tool-use"]), "--to", "verl", "-o", str(tmp_path / "t"))
    assert done.returncode == 0 and "warning" not in done.stderr.decode()
    assert "split_conversations" not in convert(folders["tool-use"], "verl", tmp_path / "t2")
