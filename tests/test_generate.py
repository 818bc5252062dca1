"""`agentroll generate` end to end: a real subprocess, real HTTP to the simulated vLLM, real files.

The checks below recompute everything from the records and the server's own log, without the pipeline's code:
what each stage was shown, token exactness, and every reward.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict

import pytest
from math_verify import parse, verify

from agentroll.errors import UsageError
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, generations, read_records, run_cli, write_problems

BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
SECTION = re.compile(r"### Solution (\d+)\n(.*?)(?=\n\n### Solution \d+\n|<\|im_end\|>)", re.S)


def content_of(response: str) -> str | None:
    if "</think>" not in response:
        return None
    return response.split("</think>", 1)[1].strip() or None


def correct(content: str | None, label: str) -> float:
    boxed = BOXED.findall(content or "")
    if not boxed:
        return 0.0
    return 1.0 if verify(parse(f"${label}$"), parse(f"${boxed[-1]}$")) else 0.0


def listed(prompt: str) -> list[str]:
    sections = SECTION.findall(prompt)
    assert [int(n) for n, _ in sections] == list(range(1, len(sections) + 1))
    return [text.strip() for _, text in sections]


@pytest.fixture
def big(tmp_path):
    problems = write_problems(tmp_path / "forty.jsonl", 40)
    server = SimServer(script=Script.from_jsonl(problems), seed=3)
    server.start()
    yield server, problems
    server.stop()


def generate(server, problems, out, *extra):
    return run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        server.url + "/v1",
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "3",
        "--samples-per-prompt",
        "2",
        "--max-tokens",
        "300",
        "--correct-reward-weight",
        "1.5",
        "--incorrect-reward-weight",
        "-0.5",
        "--shard-size",
        "100",
        *extra,
    )


def test_forty_prompts_hold_exactly_the_records_the_semantics_require(big, tmp_path):
    server, problems = big
    out = tmp_path / "out"
    proc = generate(server, problems, out)
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)

    # Token exactness: every record is one exchange the server logged, ids and logprobs as sent, each used once.
    def key(prompt, ids, logprobs):
        return (tuple(prompt), tuple(ids), tuple(logprobs))

    served = Counter(
        key(
            e["request"]["prompt"],
            e["response"]["choices"][0]["token_ids"],
            e["response"]["choices"][0]["logprobs"]["token_logprobs"],
        )
        for e in generations(server)
    )
    written = Counter(key(r["prompt_token_ids"], r["response_token_ids"], r["response_logprobs"]) for r in records)
    assert written == served

    # Records of one execution are contiguous, and every (problem, sample) execution appears once.
    order = [r["rollout_id"] for r in records]
    assert len(set(order)) == sum(1 for i, rid in enumerate(order) if i == 0 or order[i - 1] != rid) == 80
    executions = defaultdict(list)
    for r in records:
        executions[r["rollout_id"]].append(r)
    assert (
        sorted(Counter((rs[0]["problem_id"], rs[0]["sample_index"]) for rs in executions.values()).values()) == [1] * 80
    )

    seen = Counter()
    for rs in executions.values():
        label = rs[0]["label"]
        stages = [r["stage"] for r in rs]
        solvers = [r for r in rs if r["stage"] == "solver"]
        rewriters = [r for r in rs if r["stage"] == "rewriter"]
        selectors = [r for r in rs if r["stage"] == "selector"]
        assert [r["worker"] for r in solvers] == [0, 1, 2]
        assert all(len(r["response_logprobs"]) == len(r["loss_mask"]) == len(r["response_token_ids"]) for r in rs)
        assert all(r["rollout_size"] == len(rs) and r["group_size"] == 2 for r in rs)
        for r in rs:
            assert r["content"] == content_of(r["response"])
            assert r["status"] == {"stop": "completed", "length": "truncated"}[r["finish_reason"]]
            if r["stage"] != "selector":
                assert r["raw_reward"] == correct(r["content"], label), r
            seen["truncated"] += r["status"] == "truncated"
            seen["no close"] += r["finish_reason"] == "stop" and "</think>" not in r["response"]
            fraction = "\\frac" in (r["content"] or "")
            seen["equal form"] += r["raw_reward"] == 1.0 and fraction and r["stage"] != "selector"
        solver_answers = [content_of(r["response"]) for r in solvers if content_of(r["response"])]
        if not solver_answers:
            assert stages == ["solver"] * 3
            won = False
        else:
            assert [r["worker"] for r in rewriters] == [0, 1, 2]
            assert all(listed(r["prompt"]) == solver_answers for r in rewriters)
            rewrites = [r for r in rewriters if content_of(r["response"])]
            if not rewrites:
                assert stages == ["solver"] * 3 + ["rewriter"] * 3
                won = False
            else:
                (selector,) = selectors
                assert listed(selector["prompt"]) == [content_of(r["response"]) for r in rewrites]
                found = re.search(r"Judgment\s*:\s*(\d+)", selector["content"] or "")
                k = int(found.group(1)) if found else None
                expected = rewrites[k - 1]["raw_reward"] if k and 1 <= k <= len(rewrites) else 0.0
                assert selector["raw_reward"] == expected and selector["judgment"] == k
                seen["out of range"] += k is not None and k > len(rewrites)
                won = expected == 1.0
        for r in rs:
            assert r["reward"] == r["raw_reward"] * (1.5 if won else -0.5)
    assert min(seen.values()) >= 1 and len(seen) == 4, seen

    # The manifest describes the shards exactly, and its report adds up from the records.
    manifest = json.loads((out / "manifest.json").read_text())
    report = manifest["last_run"]["stats"]["report"]
    solvers = [r for r in records if r["stage"] == "solver"]
    assert report["solver_accuracy"] == pytest.approx(sum(r["raw_reward"] for r in solvers) / len(solvers))
    best = sum(any(r["raw_reward"] == 1 for r in rs if r["stage"] == "solver") for rs in executions.values())
    assert report["best_of_n_accuracy"] == pytest.approx(best / 80)
    assert report["system_accuracy"] == pytest.approx(sum(rs[0]["final_reward"] for rs in executions.values()) / 80)
    assert manifest["complete"] is True and manifest["records"] == len(records) and manifest["executions"] == 80
    for shard in manifest["shards"]:
        data = (out / shard["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and data.count(b"\n") == shard["records"]
    assert len(manifest["shards"]) > 1 and not list(out.glob("*.partial"))
    assert b"selector" in proc.stderr and b"requests/s" in proc.stderr  # the summary table


def test_rerunning_the_same_command_makes_no_calls_and_changed_settings_are_refused(sim, problems, tmp_path):
    out = tmp_path / "out"
    args = [
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
    ]
    assert run_cli(*args).returncode == 0
    calls, before = len(generations(sim)), (out / "rollouts-00000.jsonl").read_bytes()
    again = run_cli(*args)
    assert again.returncode == 0 and len(generations(sim)) == calls
    assert (out / "rollouts-00000.jsonl").read_bytes() == before and not (out / "rollouts-00001.jsonl").exists()
    changed = run_cli(*args, "--temperature", "0.5")
    assert changed.returncode == 6 and b"temperature: 1.0 -> 0.5" in changed.stderr
    assert run_cli(*args, "--temperature", "0.5", "--overwrite").returncode == 0
    assert len(read_records(out)) > 0 and len(generations(sim)) > calls


def test_stdout_streams_records_and_logs_go_to_stderr(sim, problems):
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        "-",
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
        "--limit",
        "3",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {r["problem_id"] for r in records} == {"p000", "p001", "p002"}
    assert b"requests/s" in proc.stderr and b"requests/s" not in proc.stdout


def test_stdin_input_and_the_models_default_name(sim, problems, tmp_path):
    proc = run_cli(
        "generate",
        "-",
        "-o",
        str(tmp_path / "o"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--quiet",
        stdin=problems.read_bytes(),
    )
    assert proc.returncode == 0 and proc.stderr == b""
    assert {r["model"] for r in read_records(tmp_path / "o")} == {"agentroll-sim"}


def test_a_bad_line_stops_with_one_line_naming_it_and_keeps_what_was_written(sim, problems, tmp_path):
    lines = problems.read_text().splitlines()
    lines[3] = '{"prompt": "broken", "label": '
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    proc = run_cli(
        "generate",
        str(bad),
        "-o",
        str(tmp_path / "o"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
    )
    message = proc.stderr.decode()
    assert proc.returncode == 3
    assert f"{bad}:4: malformed JSON" in message and "Traceback" not in message
    out = tmp_path / "o"
    if out.exists():  # the bad line came after rows were taken: what was written is kept, and listed
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] is False
        assert manifest["records"] == len(read_records(out))
    # else it was read with the first rows, before the folder was touched: nothing was written, nothing made


def test_a_dead_server_fails_fast_with_a_clear_message(problems, tmp_path):
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "o"),
        "--base-url",
        "http://127.0.0.1:9",
        "--tokenizer",
        TOKENIZER,
    )
    assert proc.returncode == 4
    assert b"cannot reach http://127.0.0.1:9/v1/models" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_tokenizer_that_cannot_load_is_a_clear_error(sim, problems, tmp_path):
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "o"),
        "--base-url",
        sim.url,
        "--tokenizer",
        str(tmp_path / "nowhere"),
    )
    assert proc.returncode == 2 and b"cannot load tokenizer" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_missing_input_file_is_named_before_anything_is_created(sim, tmp_path):
    proc = run_cli(
        "generate",
        str(tmp_path / "nope.jsonl"),
        "-o",
        str(tmp_path / "o"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
    )
    assert proc.returncode == 3 and f"{tmp_path / 'nope.jsonl'}: no such file".encode() in proc.stderr
    assert not (tmp_path / "o").exists() and sim.log == []


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("{tmp}/nowhere", "no such folder"),
        ("{tmp}/empty", "the folder holds none of tokenizer.json, tokenizer_config.json"),
        ("{tmp}/p.jsonl", "it is a file; --tokenizer takes the folder"),
        ("no/such thing//", "no such folder, and not a hub id"),
    ],
)
def test_a_tokenizer_named_but_unusable_is_told_in_our_words_without_advice_to_name_one(sim, tmp_path, given, why):
    (tmp_path / "empty").mkdir()
    write_problems(tmp_path / "p.jsonl", 1)
    name = given.format(tmp=tmp_path)
    proc = run_cli(
        "generate", str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "o"), "--base-url", sim.url, "--tokenizer", name
    )
    line = proc.stderr.decode().strip()
    assert proc.returncode == 2 and len(line.splitlines()) == 1, line
    assert line.startswith(f"error: cannot load tokenizer {name!r}: {why}"), line
    assert "--tokenizer with" not in line and "Repo id" not in line  # no transformers text, no advice to pass it
    assert not (tmp_path / "o").exists()  # nothing touched


def test_a_guessed_tokenizer_that_cannot_load_says_to_name_one(tmp_path):
    from agentroll.render.chat import HINT, load_first

    with pytest.raises(UsageError, match=re.escape(f"'{tmp_path}/absent': no such folder ({HINT})")):
        load_first([str(tmp_path / "absent")])
    with pytest.raises(UsageError) as raised:
        load_first([str(tmp_path / "absent")], hint=False)
    assert HINT not in str(raised.value)
