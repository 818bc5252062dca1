"""`generate --policy`: two simulated models of different strength answer the same prompts in one run; the records
name their policy, the head-to-head table matches a count by hand, pairs go across policies, and the run survives
a kill, a policy's server going down, and a resume."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentroll
from agentroll.folder import Layout
from agentroll.sim.faults import Faults
from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import SimServer
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, generations, read_records, run_cli, user_env, write_problems

K = 3


def server(problems: Path, model: str, correct: float, seed: int = 0, latency: float = 0.0) -> SimServer:
    """A simulated model whose answers are right with `correct` (in one form: `--reward exact` can judge)."""
    behavior = Behavior(correct=correct, equivalent_form=0.0, truncate=0.0)
    return SimServer(
        script=Script.from_jsonl(problems, behavior), model=model, seed=seed, faults=Faults(latency_s=latency)
    )


@pytest.fixture
def duel(tmp_path: Path) -> Iterator[tuple[Path, SimServer, SimServer]]:
    """20 problems, a strong model (90 % right) and a weak one (25 %), each on its own server."""
    problems = write_problems(tmp_path / "problems.jsonl", 20)
    strong, weak = server(problems, "strong", 0.9), server(problems, "weak", 0.25, seed=1)
    strong.start()
    weak.start()
    yield problems, strong, weak
    strong.stop()
    weak.stop()


def policy_args(problems: Path, out: Path, strong: str, weak: str, *extra: str) -> list[str]:
    return [
        "generate",
        str(problems),
        "-o",
        str(out),
        "--policy",
        f"new={strong},tokenizer={TOKENIZER}",
        "--policy",
        f"old={weak},tokenizer={TOKENIZER}",
        "--samples-per-prompt",
        str(K),
        "--num-parallel",
        "2",
        "--reward",
        "exact",
        "--seed",
        "5",
        *extra,
    ]


def executions(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["rollout_id"], []).append(r)
    return out


def by_hand(records: list[dict], key: str | None = None) -> dict[str, dict]:
    """The head-to-head table counted from the records, with none of agentroll's code: per problem each
    policy's mean final reward over its executions, then new's wins, ties and losses against old."""
    finals: dict[tuple[str, str], list[float]] = defaultdict(list)
    split: dict[str, str] = {}
    for rows in executions(records).values():
        head = rows[0]
        finals[(head["problem_id"], head["policy"])].append(head["final_reward"])
        split[head["problem_id"]] = "all" if key is None else str(head["metadata"].get(key))
    tables: dict[str, dict] = {}
    for pid in sorted({p for p, _ in finals}):
        new, old = (sum(finals[(pid, n)]) / len(finals[(pid, n)]) for n in ("new", "old"))
        for part in {"all", split[pid]}:
            t = tables.setdefault(part, {"problems": 0, "wins": 0, "ties": 0, "losses": 0, "difference": 0.0})
            t["problems"] += 1
            t["difference"] += new - old
            t["wins" if new > old else "losses" if new < old else "ties"] += 1
    return tables


def test_a_head_to_head_run_gives_each_policy_its_k_executions_on_its_own_server(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    proc = run_cli(*policy_args(problems, out, strong.url, weak.url))
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert {r["policy"] for r in records} == {"new", "old"}
    for r in records:  # each policy's model, on its own server, numbered policy by policy
        assert r["model"] == ("strong" if r["policy"] == "new" else "weak")
        assert r["endpoint"] == (strong.url if r["policy"] == "new" else weak.url)
        assert r["group_size"] == 2 * K
        assert (r["sample_index"] < K) == (r["policy"] == "new")
    per = Counter((rows[0]["problem_id"], rows[0]["policy"]) for rows in executions(records).values())
    assert set(per.values()) == {K} and len(per) == 20 * 2
    asked_strong = {tuple(e["request"]["prompt"]) for e in generations(strong)}
    assert {tuple(r["prompt_token_ids"]) for r in records if r["policy"] == "new"} == asked_strong
    assert len(generations(strong)) == sum(r["policy"] == "new" for r in records)
    assert len(generations(weak)) == sum(r["policy"] == "old" for r in records)
    # the group figures and GRPO baselines are each policy's own
    for rows in executions(records).values():
        head = rows[0]
        mine = {
            rid: rs[0]["final_reward"]
            for rid, rs in executions(records).items()
            if rs[0]["problem_id"] == head["problem_id"] and rs[0]["policy"] == head["policy"]
        }
        assert math.isclose(head["group_reward_mean"], sum(mine.values()) / K)
    assert validate(out).ok
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(p["name"], p["model"]) for p in manifest["settings"]["policies"]] == [("new", "strong"), ("old", "weak")]
    assert manifest["servers"][-1]["prompt_ids"] == "alike"
    assert set(manifest["servers"][-1]["policies"]) == {"new", "old"}
    # the summary names each policy and the pair's verdict
    said = proc.stderr.decode()
    assert "policy new:" in said and "policy old:" in said and "new vs old over 20 problems" in said
    tree = run_cli("inspect", str(out), "--problem", "p000").stdout.decode()
    assert tree.count("policy new (strong)") == K and tree.count("policy old (weak)") == K
    assert "new: group reward mean" in tree and "old: group reward mean" in tree


def test_the_head_to_head_table_matches_a_count_by_hand(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    halves = tmp_path / "halves.jsonl"  # the same problems, each with a field to split by (--by half)
    rows = [json.loads(line) for line in problems.read_text().splitlines()]
    halves.write_text(
        "".join(json.dumps({**r, "half": "low" if i < 10 else "high"}) + "\n" for i, r in enumerate(rows))
    )
    assert run_cli(*policy_args(halves, out, strong.url, weak.url, "-q")).returncode == 0
    records = read_records(out)
    hand = by_hand(records, "half")
    proc = run_cli("stats", str(out), "--by", "half", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(proc.stdout)
    parts = {"all": data["all"], **data["split"]}
    assert set(parts) == set(hand) == {"all", "low", "high"}
    for name, part in parts.items():
        (pair,) = part["head_to_head"]["pairs"]
        want = hand[name]
        assert (pair["a"], pair["b"]) == ("new", "old")
        assert [pair[k] for k in ("problems", "wins", "ties", "losses")] == [
            want[k] for k in ("problems", "wins", "ties", "losses")
        ]
        assert math.isclose(pair["mean_difference"], want["difference"] / want["problems"], abs_tol=1e-12)
        low, high = pair["mean_difference_ci"]
        assert low <= pair["mean_difference"] <= high
    whole = data["all"]["head_to_head"]["pairs"][0]
    assert whole["wins"] > whole["losses"] and whole["verdict"] == "new better"  # 90 % against 25 %
    # each policy's own figures: its executions only
    for policy in ("new", "old"):
        mine = [rs[0] for rs in executions(records).values() if rs[0]["policy"] == policy]
        figures = data["all"]["policies"][policy]
        assert figures["executions"] == len(mine) == 20 * K
        assert math.isclose(figures["mean_final_reward"], sum(r["final_reward"] for r in mine) / len(mine))
        solved = sum(r["final_reward"] == 1.0 for r in mine) / len(mine)  # pass@1: over the executions' outcomes
        assert math.isclose(figures["pass_at_k"][0]["value"], solved)
    # the run's summary counted the same (the manifest keeps its counts)
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    (counted,) = stats["head_to_head"]["pairs"]
    assert [counted[k] for k in ("wins", "ties", "losses")] == [hand["all"][k] for k in ("wins", "ties", "losses")]
    # the same intervals again (seeded), and from the viewer's entry point
    from agentroll.tools.headtohead import compare
    from agentroll.tools.headtohead import problems as per_problem

    assert compare(out, "half")["head_to_head"] == data["all"]["head_to_head"]
    rows = list(per_problem(out))
    assert len(rows) == 20
    assert sum(r["best"] == "new" for r in rows) == hand["all"]["wins"]
    assert sum(r["best"] == "old" for r in rows) == hand["all"]["losses"]
    # the tables and the report page show them
    table = run_cli("stats", str(out))
    assert b"head to head" in table.stdout and b"new vs old" in table.stdout
    page = run_cli("report", str(out), "-o", str(tmp_path / "r.html"))
    assert page.returncode == 0
    html = (tmp_path / "r.html").read_text()
    assert "Head to head" in html and f"{hand['all']['wins']} / {hand['all']['ties']} / {hand['all']['losses']}" in html


def test_pairs_across_policies_are_their_responses_to_one_prompt(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    assert run_cli(*policy_args(problems, out, strong.url, weak.url, "-q")).returncode == 0
    pairs = tmp_path / "pairs"
    proc = run_cli("convert", str(out), "--to", "dpo", "--across-policies", "--layout", "standard", "-o", str(pairs))
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [json.loads(line) for line in (pairs / "dpo.jsonl").read_text().splitlines()]
    records = read_records(out)
    by_response: dict[tuple, dict[str, dict]] = defaultdict(dict)  # two policies may answer word for word alike
    for r in records:
        by_response[(tuple(r["prompt_token_ids"]), tuple(r["response_token_ids"]))][r["policy"]] = r
    for row in rows:
        assert row["chosen_policy"] != row["rejected_policy"]
        chosen = by_response[(tuple(row["prompt_token_ids"]), tuple(row["chosen_token_ids"]))][row["chosen_policy"]]
        rejected = by_response[(tuple(row["prompt_token_ids"]), tuple(row["rejected_token_ids"]))][
            row["rejected_policy"]
        ]
        assert chosen["problem_id"] == rejected["problem_id"] == row["problem_id"]
        assert chosen["stage"] == rejected["stage"] == row["stage"] and chosen["reward"] > rejected["reward"]
    # every pair there is, counted by hand: two policies' samples of a (problem, stage), one prompt, unequal rewards
    want = 0
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["problem_id"], r["stage"], tuple(r["prompt_token_ids"]))].append(r)
    for members in groups.values():
        want += sum(a["policy"] != b["policy"] and a["reward"] > b["reward"] for a in members for b in members)
    assert len(rows) == want and want > 0
    assert Counter(r["chosen_policy"] for r in rows)["new"] > Counter(r["chosen_policy"] for r in rows)["old"]
    # within a policy (no flag) the pairs never cross, and each policy's RL groups are its own
    within = tmp_path / "within"
    assert run_cli("convert", str(out), "--to", "dpo", "--layout", "standard", "-o", str(within)).returncode == 0
    assert all(
        r["chosen_policy"] == r["rejected_policy"]
        for r in map(json.loads, (within / "dpo.jsonl").read_text().splitlines())
    )
    verl = tmp_path / "verl"
    assert run_cli("convert", str(out), "--to", "verl", "-o", str(verl)).returncode == 0
    uids = Counter(json.loads(line)["uid"] for line in (verl / "verl.jsonl").read_text().splitlines())
    assert uids["p000/new/solver"] == K * 2 and uids["p000/old/solver"] == K * 2  # N = 2 solvers per execution
    one = tmp_path / "one"
    proc = run_cli("convert", str(out), "--to", "sft", "--layout", "standard", "--policy", "old", "-o", str(one))
    assert proc.returncode == 0, proc.stderr.decode()
    assert {json.loads(line)["problem_id"] for line in (one / "sft.jsonl").read_text().splitlines()}
    assert json.loads(run_cli("stats", str(out), "--json").stdout)  # unchanged by conversions


def other_template(tmp_path: Path) -> Path:
    """The simulated model's tokenizer with a chat template that renders a line more before every prompt."""
    folder = tmp_path / "other-tokenizer"
    shutil.copytree(TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'Answer briefly.\\n' }}" + config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_policies_rendering_prompts_otherwise_are_said_and_never_paired(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    args = policy_args(problems, out, strong.url, weak.url, "--chat-render", "local", "--limit", "4")
    args[args.index(f"old={weak.url},tokenizer={TOKENIZER}")] = f"old={weak.url},tokenizer={other_template(tmp_path)}"
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"do not render prompts alike" in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["servers"][-1]["prompt_ids"] == "differ"
    records = read_records(out)
    first = {
        r["policy"]: tuple(r["prompt_token_ids"])
        for r in records
        if r["problem_id"] == "p000" and r["stage"] == "solver"
    }
    assert first["new"] != first["old"]  # each as it was sent
    refused = run_cli(
        "convert", str(out), "--to", "dpo", "--across-policies", "--layout", "standard", "-o", str(tmp_path / "x")
    )
    assert refused.returncode == 2 and b"render prompts differently" in refused.stderr, refused.stderr.decode()
    assert len(refused.stderr.decode().strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    # the figures still compare them
    assert json.loads(run_cli("stats", str(out), "--json").stdout)["all"]["head_to_head"]["pairs"][0]["problems"] == 4


def test_pairs_whose_first_prompts_differ_are_refused_with_the_reason(duel, tmp_path):
    """A folder that does not say so (made otherwise, or merged): the records' own prompt ids decide."""
    problems, strong, weak = duel
    out = tmp_path / "out"
    assert run_cli(*policy_args(problems, out, strong.url, weak.url, "-q", "--limit", "2")).returncode == 0
    from agentroll.convert.common import Problem, StageGroup
    from agentroll.convert.dpo import across_policies
    from agentroll.errors import UsageError

    records = read_records(out)
    solvers = [r for r in records if r["problem_id"] == "p000" and r["stage"] == "solver"]
    for r in solvers:
        if r["policy"] == "old":
            r["prompt_token_ids"] = [*r["prompt_token_ids"][:5], 7, *r["prompt_token_ids"][5:]]
    groups = [StageGroup("p000", "solver", [r for r in solvers if r["policy"] == p], policy=p) for p in ("new", "old")]
    with pytest.raises(UsageError, match="problem p000: policies new and old were given different solver prompt ids"):
        list(across_policies([Problem(0, "p000", groups)], "solver"))


def popen(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "agentroll", *args], env=user_env(), stderr=subprocess.PIPE)


def stop_all(run: subprocess.Popen[bytes], *servers: SimServer) -> None:
    """However a test ends: its run and its servers are stopped."""
    if run.poll() is None:
        run.kill()
        run.communicate()
    for each in servers:
        each.stop()


def journal_lines(out: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in Layout(out).journal.glob("calls-*.jsonl"))


def journaled(out: Path, url: str) -> int:
    """Calls a server answered that the run's journal holds (a torn last line, being written, is passed over)."""
    found = 0
    for path in Layout(out).journal.glob("calls-*.jsonl"):
        for line in path.read_bytes().split(b"\n"):
            try:
                found += json.loads(line)["c"]["endpoint"] == url
            except (ValueError, KeyError, TypeError):
                continue
    return found


def calls(server: SimServer) -> dict[tuple, dict]:
    return {(tuple(e["request"]["prompt"]), e["request"]["seed"]): e["response"] for e in generations(server)}


def test_killed_with_sigkill_then_resumed_gives_every_policys_executions_exactly_once(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", 12)
    strong, weak = server(problems, "strong", 0.9, latency=0.05), server(problems, "weak", 0.25, seed=1, latency=0.05)
    strong.start()
    weak.start()
    out = tmp_path / "out"
    args = policy_args(problems, out, strong.url, weak.url, "--concurrency", "4", "--shard-size", "20", "-q")
    run = popen(*args)
    try:
        deadline = time.monotonic() + 120
        while journal_lines(out) < 12 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # another process's progress: its files are what there is to watch
        assert run.poll() is None, "the run ended before the journal held calls"
        run.send_signal(signal.SIGKILL)
        run.communicate(timeout=60)
        first = {**calls(strong), **calls(weak)}
        strong.log.clear()
        weak.log.clear()
        rerun = run_cli(*args)
        assert rerun.returncode == 0, rerun.stderr.decode()
        second = {**calls(strong), **calls(weak)}
    finally:
        stop_all(run, strong, weak)
    records = read_records(out)
    per = Counter(
        (rows[0]["problem_id"], rows[0]["policy"], rows[0]["sample_index"]) for rows in executions(records).values()
    )
    assert len(per) == 12 * 2 * K and set(per.values()) == {1}
    assert json.loads((out / "manifest.json").read_text())["last_run"]["stats"]["calls_replayed"] > 0
    asked_again = set(first) & set(second)
    assert len(asked_again) <= 4  # in flight when it was killed: at most --concurrency calls
    for r in records:  # a call not asked again is the first run's answer, by the policy's own server
        call = (tuple(r["prompt_token_ids"]), r["sampling"]["seed"])
        if call not in second:
            assert r["response_token_ids"] == first[call]["choices"][0]["token_ids"]
    assert validate(out).ok
    assert journal_lines(out) == 0


def test_a_policys_server_down_holds_back_only_its_own_calls(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", 12)
    strong, weak = server(problems, "strong", 0.9, latency=0.05), server(problems, "weak", 0.25, seed=1)
    strong.start()
    weak.start()
    out = tmp_path / "out"
    run = popen(*policy_args(problems, out, strong.url, weak.url, "--probe-interval", "0.2", "-q"))
    try:
        assert weak.wait_until(lambda: len(generations(weak)) > 0, timeout=120), "the run never asked the weak model"
        weak.stop()  # the old checkpoint's server goes away in the middle of the run
        before = journaled(out, strong.url)
        # the other policy's calls go on meanwhile, each kept in the journal (the run is still up, waiting for the
        # weak server to come back)
        deadline = time.monotonic() + 120
        while journaled(out, strong.url) < before + 4 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # another process's progress: its files are what there is to watch
        assert journaled(out, strong.url) >= before + 4, "the strong policy was held back"
        assert run.poll() is None
        run.send_signal(signal.SIGTERM)
        _, said = run.communicate(timeout=60)
        assert run.returncode == 143, said.decode()[-2000:]
        made = calls(strong)
        strong.log.clear()
        back = server(problems, "weak", 0.25, seed=1)  # back, on another port: where a policy runs is no setting
        back.start()
        try:
            rerun = run_cli(*policy_args(problems, out, strong.url, back.url, "-q"))
        finally:
            back.stop()
        assert rerun.returncode == 0, rerun.stderr.decode()
    finally:
        stop_all(run, strong, weak)
    records = read_records(out)
    assert Counter(r["policy"] for r in records if r["stage"] == "selector")  # whole groups, both policies
    assert len({(rs[0]["problem_id"], rs[0]["sample_index"]) for rs in executions(records).values()}) == 12 * 2 * K
    replayed = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]["calls_replayed"]
    asked_again = set(made) & set(calls(strong))
    assert replayed >= len(made) - len(asked_again) > 0  # the strong calls made while weak was down are not asked again
    assert validate(out).ok


# -- flags ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policies", "extra", "message"),
    [
        (["a=URL"], [], "compares two or more policies"),
        (["a=URL", "a=URL2"], [], "the name 'a' is given twice"),
        (["a=URL", "b=URL,system=single"], [], "'system' is not a policy's own setting"),
        (["a=URL", "b=URL,temperature=hot"], [], "temperature must be a number"),
        (["a=URL", "b=URL,top_p=2"], [], "--top-p must be in (0, 1]"),
        (["a=URL", "b=model=x"], [], "no server URL"),
        (["a=URL", "b c=URL"], [], "expected NAME=URL"),
        (["a=URL", "b=URL"], ["--model", "m"], "--model does not go with --policy"),
        (["a=URL", "b=URL"], ["--base-url", "http://127.0.0.1:9"], "--base-url does not go with --policy"),
    ],
)
def test_bad_policy_flags_are_one_line_usage_errors(duel, tmp_path, policies, extra, message):
    problems, strong, weak = duel
    urls = {"URL": strong.url, "URL2": weak.url}
    flags = [x for p in policies for x in ("--policy", p.replace("URL2", urls["URL2"]).replace("URL", urls["URL"]))]
    proc = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), *flags, *extra)
    assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr.decode()
    assert len(proc.stderr.decode().strip().splitlines()) == 1
    assert not generations(strong) and not generations(weak) and not (tmp_path / "out").exists()


def test_a_policys_server_problem_names_that_policy_or_its_server(duel, tmp_path):
    """A model a policy's server does not serve is said of that policy (exit 4, one line); a server whose recorded
    logprobs are not those sampled from is named in the warning, not said of "the server" as if there were one."""
    problems, strong, weak = duel
    flags = ["--policy", f"new={strong.url}", "--policy", f"old={weak.url},model=nosuch"]
    proc = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), *flags)
    said = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 4 and len(said) == 1 and "--policy old: model 'nosuch' is not served" in said[0], said
    proc = run_cli(
        *policy_args(problems, tmp_path / "warm", strong.url, weak.url, "--temperature", "0.7", "--limit", "2")
    )
    assert proc.returncode == 0, proc.stderr.decode()
    warned = [line for line in proc.stderr.decode().splitlines() if "returns raw_logprobs" in line]
    assert len(warned) == 2 and any(strong.url in w for w in warned) and any(weak.url in w for w in warned), warned


def test_a_policy_samples_otherwise_when_told_and_a_rerun_with_other_policies_is_refused(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    args = policy_args(problems, out, strong.url, weak.url, "--limit", "2", "-q")
    args[args.index(f"old={weak.url},tokenizer={TOKENIZER}")] += ",temperature=0.5,max_tokens=300"
    assert run_cli(*args).returncode == 0
    records = read_records(out)
    assert {(r["policy"], r["sampling"]["temperature"]) for r in records} == {("new", 1.0), ("old", 0.5)}
    assert all(r["sampling"]["max_tokens"] <= 300 for r in records if r["policy"] == "old")
    assert {e["request"]["temperature"] for e in generations(weak)} == {0.5}
    changed = policy_args(problems, out, strong.url, weak.url, "--limit", "4", "-q")
    refused = run_cli(*changed)
    assert refused.returncode == 6 and b"policies" in refused.stderr, refused.stderr.decode()


def test_target_groups_and_uniform_groups_count_whole_groups_of_every_policy(duel, tmp_path):
    problems, strong, weak = duel
    out = tmp_path / "out"
    assert run_cli(*policy_args(problems, out, strong.url, weak.url, "--target-groups", "5", "-q")).returncode == 0
    groups = list(agentroll.read_groups(out))
    assert len(groups) == 5
    assert all(Counter(e[0].policy for e in g.executions) == {"new": K, "old": K} for g in groups)
    more = run_cli(*policy_args(problems, out, strong.url, weak.url, "--target-groups", "8", "-q"))
    assert more.returncode == 0 and len(list(agentroll.read_groups(out))) == 8
    filtered = tmp_path / "filtered"
    proc = run_cli(*policy_args(problems, filtered, strong.url, weak.url, "--filter-uniform-groups", "-q"))
    assert proc.returncode == 0, proc.stderr.decode()
    for group in agentroll.read_groups(filtered):  # uniform over both policies' executions, or it is left out
        assert len({e[0].final_reward for e in group.executions}) > 1
    manifest = json.loads((filtered / "manifest.json").read_text())
    assert manifest["groups"] + manifest["filtered_groups"] == 20


def test_a_policy_whose_server_renders_its_prompts_is_compared_by_the_ids_it_sends(duel, tmp_path):
    """Its local template differs, so --chat-render auto lets its server's /tokenize render (as the other
    policy's): the ids sent are alike, and pairs across the policies are made."""
    problems, strong, weak = duel
    out = tmp_path / "out"
    args = policy_args(problems, out, strong.url, weak.url, "--limit", "3")
    args[args.index(f"old={weak.url},tokenizer={TOKENIZER}")] = f"old={weak.url},tokenizer={other_template(tmp_path)}"
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"rendered by the server" in proc.stderr and b"do not render prompts alike" not in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["servers"][-1]["prompt_ids"] == "alike"
    assert [p["prompt_rendering"] for p in manifest["settings"]["policies"]] == ["local", "server"]
    pairs = tmp_path / "pairs"
    done = run_cli("convert", str(out), "--to", "dpo", "--across-policies", "--layout", "standard", "-o", str(pairs))
    assert done.returncode == 0, done.stderr.decode()
