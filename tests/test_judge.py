"""`--reward judge`: an LLM judge's verdict is the reward, and a judge that fails is never one (docs/rewards.md)."""

from __future__ import annotations

import json
import socket

import pytest

from agentroll.errors import UsageError
from agentroll.rewards.components import parse_component
from agentroll.rewards.judge import DEFAULT_PATTERN, JudgeSettings, group_verdict, load_template, render, verdict
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, read_records, run_cli
from .judge_double import JudgeDouble, grade


def generate(sim, problems, out, judge_url, *extra):
    return run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--samples-per-prompt",
        "2",
        "--reward",
        "judge",
        "--judge-url",
        judge_url,
        "--judge-model",
        "judge-1",
        "--judge-prompt",
        "correctness",
        *extra,
    )


def labels(problems):
    return {json.loads(line)["id"]: json.loads(line)["label"] for line in problems.read_text().splitlines()}


def closed_port_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: every request is refused
    return f"http://127.0.0.1:{port}/v1"


def judged(records):
    return [r for r in records if r["stage"] in ("solver", "rewriter")]


def test_against_a_judge_failing_a_fifth_of_its_requests_every_reward_is_its_verdict(sim, problems, tmp_path):
    with JudgeDouble(fail_every=5, no_score_every=7) as judge:
        proc = generate(sim, problems, tmp_path / "out", judge.url, "--judge-retries", "6")
    assert proc.returncode == 0, proc.stderr.decode()
    assert judge.failed >= 5 and judge.unscored >= 3  # the faults did happen
    records = read_records(tmp_path / "out")
    assert len({r["problem_id"] for r in records}) == 8
    label = labels(problems)
    asked = 0
    for r in judged(records):
        if r["content"] is None:
            assert r["raw_reward"] == 0.0 and r["reward_info"] == "no answer content" and r["judge"] is None
            continue
        asked += 1
        assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]])  # the judge's own verdict
        assert r["judge"]["model"] == "judge-1" and r["judge"]["score"] == r["raw_reward"]
        assert r["judge"]["verdict"].endswith(f"Score: {r['raw_reward']:g}") and r["judge"]["prompt_tokens"] > 0
    assert asked > 20
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    stats = manifest["last_run"]["stats"]
    assert stats["judge_failed"] == 0 and stats["judge_retried"] >= judge.failed + judge.unscored
    assert stats["judge_requests"] == len(judge.requests)
    assert manifest["settings"]["judge"]["model"] == "judge-1"
    assert b"judge: requests" in proc.stderr
    assert validate(tmp_path / "out").ok


def test_the_judge_gets_the_templates_messages_and_its_key_from_a_file(sim, problems, tmp_path):
    template = tmp_path / "mine.txt"
    template.write_text(
        "--- system ---\nGrade {topic} answers.\n--- user ---\nProblem:\n{problem}\n\nReference answer:\n{label}"
        "\n\nAnswer to grade:\n{answer}"
    )
    key = tmp_path / "key"
    key.write_text("sk-judge\n")
    with JudgeDouble() as judge:
        proc = generate(
            sim,
            problems,
            tmp_path / "out",
            judge.url,
            "--judge-prompt",
            str(template),
            "--judge-api-key-file",
            str(key),
        )
    assert proc.returncode == 0, proc.stderr.decode()
    first = judge.requests[0]
    assert first["model"] == "judge-1" and first["temperature"] == 0.0 and first["max_tokens"] == 1024
    assert first["messages"][0] == {"role": "system", "content": "Grade addition answers."}  # a metadata field
    assert first["messages"][1]["role"] == "user" and "Reference answer:\n" in first["messages"][1]["content"]
    assert set(judge.keys) == {"Bearer sk-judge"}
    assert 1 <= judge.peak_in_flight <= 2  # its own client's cap


def test_against_a_judge_down_for_good_no_record_carries_a_reward_and_a_rerun_regenerates_nothing(
    sim, problems, tmp_path
):
    out = tmp_path / "out"
    down = closed_port_url()
    proc = generate(sim, problems, out, down, "--judge-retries", "1", "-q")
    assert proc.returncode == 8, proc.stderr.decode()
    said = proc.stderr.decode()
    assert "8 of 8 groups could not be produced" in said and "the judge gave no verdict" in said
    assert "after 2 attempts" in said
    assert read_records(out) == []
    made = len(sim.log)
    with JudgeDouble() as judge:  # back up, elsewhere: only the verdicts are asked, every answer replayed
        proc = generate(sim, problems, out, judge.url)
    assert proc.returncode == 0, proc.stderr.decode()

    def prompts(log):
        return [json.dumps(e["request"]["prompt"]) for e in log if e["request"].get("max_tokens") != 1]

    before = set(prompts(sim.log[:made]))
    assert before and not before & set(prompts(sim.log[made:]))  # not one call made again (later stages: new)
    records = read_records(out)
    assert len({r["problem_id"] for r in records}) == 8
    label = labels(problems)
    for r in judged(records):
        if r["content"] is not None:
            assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]])


def test_a_rerun_asks_the_judge_only_what_has_no_verdict(sim, problems, tmp_path):
    out = tmp_path / "out"
    one = ("--samples-per-prompt", "1")  # one execution a group: none cancelled with its judge's reply in flight
    with JudgeDouble(no_score_every=3) as judge:  # every third reply has no score; no retry to mend it
        proc = generate(sim, problems, out, judge.url, "--judge-retries", "0", "-q", *one)
    assert proc.returncode == 8 and judge.unscored
    given = {json.dumps(body, sort_keys=True) for body in judge.verdicts}
    with JudgeDouble() as again:
        proc = generate(sim, problems, out, again.url, "-q", *one)
    assert proc.returncode == 0, proc.stderr.decode()
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["judge_replayed"] > 0  # the verdicts of the first run were kept
    asked = [json.dumps(body, sort_keys=True) for body in again.requests]
    assert not given & set(asked)  # not asked again
    unscored = [json.dumps(b, sort_keys=True) for b in judge.requests if json.dumps(b, sort_keys=True) not in given]
    assert set(unscored) & set(asked)  # what had no verdict is asked again


def test_judge_failures_keep_writes_the_group_held_back_and_rescore_failed_only_judges_it(sim, problems, tmp_path):
    out, fixed = tmp_path / "out", tmp_path / "fixed"
    with JudgeDouble(no_score_every=4) as judge:
        proc = generate(sim, problems, out, judge.url, "--judge-retries", "0", "--judge-failures", "keep")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    unjudged = [r for r in records if r["judge"] and r["judge"].get("failed")]
    assert unjudged and all(r["reward_info"].startswith("judge failed: no score in the reply") for r in unjudged)
    held = {r["problem_id"] for r in unjudged}
    for r in records:
        assert (r["trainable"] is False) == (r["problem_id"] in held)  # a held group trains nothing
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["groups_held"] == len(held) and stats["judge_failed"] == len(unjudged)
    first = sorted(held)[0]
    tree = run_cli("inspect", str(out), "--problem", first).stdout.decode()
    assert "judge-1: no verdict (no score in the reply" in " ".join(tree.split())  # what the judge said, shown
    assert "score 1.0" in tree or "score 0.0" in tree
    with JudgeDouble() as again:
        proc = run_cli(
            "rescore",
            str(out),
            "-o",
            str(fixed),
            "--reward",
            "judge",
            "--judge-url",
            again.url,
            "--judge-model",
            "judge-1",
            "--judge-prompt",
            "correctness",
            "--failed-only",
        )
    assert proc.returncode == 0, proc.stderr.decode()
    # only what had no verdict: each distinct answer of a problem at least once, no sample twice (a repeat the
    # journal already holds is served from it, one asked at the same moment is asked again)
    assert len({(r["problem_id"], r["content"]) for r in unjudged}) <= len(again.requests) <= len(unjudged)
    label = labels(problems)
    after = read_records(fixed)
    assert len(after) == len(records)
    for r in after:
        assert r["trainable"] is True and "held back" not in (r["reward_info"] or "")
        if r["stage"] != "selector" and r["content"] is not None:
            assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]])


def test_rescore_with_a_judge_down_writes_no_group_and_exits_8_then_resumes(sim, problems, tmp_path):
    src = tmp_path / "src"
    proc = run_cli(
        "generate", str(problems), "-o", str(src), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--reward", "exact"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    args = ["--reward", "judge", "--judge-model", "judge-1", "--judge-prompt", "correctness", "-q"]
    proc = run_cli(
        "rescore",
        str(src),
        "-o",
        str(tmp_path / "new"),
        *args,
        "--judge-url",
        closed_port_url(),
        "--judge-retries",
        "0",
    )
    assert proc.returncode == 8
    assert "groups could not be rescored" in proc.stderr.decode() and "no verdict" in proc.stderr.decode()
    assert read_records(tmp_path / "new") == []
    with JudgeDouble() as judge:
        proc = run_cli("rescore", str(src), "-o", str(tmp_path / "new"), *args, "--judge-url", judge.url)
    assert proc.returncode == 0, proc.stderr.decode()
    label = labels(problems)
    for r in judged(read_records(tmp_path / "new")):
        if r["content"] is not None:
            assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]]) and r["judge"]["score"] is not None


def test_components_weigh_math_a_judge_and_a_function_and_keep_each_part(sim, problems, tmp_path):
    penalty = tmp_path / "penalty.py"
    penalty.write_text("def long(request):\n    return len(request.response) / 1000\n")
    with JudgeDouble(scale=10) as judge:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            sim.url,
            "--tokenizer",
            TOKENIZER,
            "--system",
            "single",
            "--reward-component",
            "correct=math",
            "--reward-component",
            "style=judge*0.5",
            "--reward-component",
            f"length={penalty}:long*-0.1",
            "--judge-url",
            judge.url,
            "--judge-model",
            "judge-1",
            "--judge-prompt",
            "correctness",
            "--judge-scale",
            "0:10",
        )
    assert proc.returncode == 0, proc.stderr.decode()
    label = labels(problems)
    records = read_records(tmp_path / "out")
    assert records
    for r in records:
        parts = r["reward_components"]
        assert [parts[n]["weight"] for n in ("correct", "style", "length")] == [1.0, 0.5, -0.1]
        assert parts["length"]["value"] == pytest.approx(len(r["response"]) / 1000)
        if r["content"] is not None:
            right = grade(r["content"], label[r["problem_id"]])
            assert parts["correct"]["value"] == right and parts["style"]["value"] == right
            assert r["judge"]["score"] == right * 10  # as it wrote it, on its own scale
        total = sum(p["value"] * p["weight"] for p in parts.values())
        assert r["raw_reward"] == pytest.approx(total)
        assert "style" in r["reward_info"] and "length" in r["reward_info"]
    stats = json.loads((tmp_path / "out" / "manifest.json").read_text())["last_run"]["stats"]
    means = stats["reward_components"]
    assert means["correct"] == pytest.approx(
        sum(r["reward_components"]["correct"]["value"] for r in records) / len(records)
    )
    assert b"reward components (mean over samples): correct" in proc.stderr
    table = run_cli("stats", str(tmp_path / "out"), "--json")
    assert table.returncode == 0, table.stderr.decode()
    assert json.loads(table.stdout)["all"]["reward_components"]["correct"] == pytest.approx(means["correct"])
    done = run_cli("convert", str(tmp_path / "out"), "--to", "verifiers", "-o", str(tmp_path / "vf"))
    assert done.returncode == 0, done.stderr.decode()
    rows = [json.loads(line) for line in next((tmp_path / "vf").glob("*.jsonl")).read_text().splitlines()]
    by_rollout = {r["rollout_id"]: r for r in records}
    for row in rows:  # each reward function's own score, as a verifiers rubric's metrics hold them
        record = by_rollout[row["info"]["rollout_id"]]
        assert row["metrics"]["style"] == record["reward_components"]["style"]["value"]
        assert row["metrics"]["raw_reward"] == record["raw_reward"]


def test_group_judging_shows_the_judge_the_k_answers_together(sim, problems, tmp_path):
    with JudgeDouble() as judge:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            sim.url,
            "--tokenizer",
            TOKENIZER,
            "--system",
            "single",
            "--samples-per-prompt",
            "4",
            "--reward",
            "judge",
            "--judge-url",
            judge.url,
            "--judge-model",
            "judge-1",
            "--judge-prompt",
            "group",
            "--judge-mode",
            "group",
        )
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    label = labels(problems)
    shown = [r for r in records if r["content"] is not None]
    assert len(judge.requests) == len({r["problem_id"] for r in shown})  # one request per problem
    for request in judge.requests:
        assert "Answer 1:\n" in request["messages"][-1]["content"]
    for r in shown:
        assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]])
        assert r["judge"]["of"] == sum(1 for s in shown if s["problem_id"] == r["problem_id"])


def test_the_verdict_parse_reads_the_last_score_another_scale_a_pattern_and_json():
    s = JudgeSettings(url="http://x", model="m", prompt="p", messages=(("user", "{answer}"),))
    assert verdict("Score: 0.2 at first... on reflection\nScore: **0.75**", s) == (0.75, 0.75)
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        verdict("Score: 7", s)
    with pytest.raises(ValueError, match="no score"):
        verdict("I like it", s)
    ten = JudgeSettings(url="http://x", model="m", prompt="p", messages=(), scale=(1.0, 10.0))
    assert verdict("Score: 10", ten) == (1.0, 10.0)
    rating = JudgeSettings(url="http://x", model="m", prompt="p", messages=(), pattern=r"Rating: \[\[(\d+)\]\]")
    assert verdict("Rating: [[1]]", rating) == (1.0, 1.0)
    as_json = JudgeSettings(url="http://x", model="m", prompt="p", messages=(), parse="json")
    assert verdict('thinking {"draft": 1} then {"score": 0.5, "why": "ok"}', as_json) == (0.5, 0.5)
    with pytest.raises(ValueError, match="no JSON object"):
        verdict('{"grade": 1}', as_json)
    assert group_verdict("Score 1: 1\nScore 2: 0\nScore 1: 0.5", 2, s) == [(0.5, 0.5), (0.0, 0.0)]
    with pytest.raises(ValueError, match="answer 3"):
        group_verdict("Score 1: 1\nScore 2: 0", 3, s)
    assert DEFAULT_PATTERN


def test_templates_render_fields_and_refuse_what_the_row_lacks(tmp_path):
    messages = load_template("correctness")
    assert [role for role, _ in messages] == ["system", "user"]
    out = render((("user", "{problem} {{literal}} {n}"),), {"problem": "P", "n": 3})
    assert out == [{"role": "user", "content": "P {literal} 3"}]
    with pytest.raises(KeyError):
        render((("user", "{missing}"),), {})
    with pytest.raises(UsageError, match="built-in: correctness, group"):
        load_template(str(tmp_path / "nope.txt"))
    assert parse_component("length=my.py:f*-0.1").weight == -0.1
    assert parse_component("correct=math").spec == "math"
    with pytest.raises(UsageError, match="NAME=SPEC"):
        parse_component("math")


def test_the_simulator_serves_as_a_judge_through_faults_and_agrees_with_math_verify(sim, problems, tmp_path):
    """A simulated judge that fails a fifth of its requests (500/503, dropped connections) and answers some
    without a score: every judged sample's verdict is the simulator's (right iff its boxed answer is the label,
    as math-verify says), and the run exits 0."""
    from agentroll.sim.faults import Faults
    from agentroll.sim.script import Behavior, Script
    from agentroll.sim.server import SimServer

    judge = SimServer(
        script=Script.from_jsonl(problems, Behavior(judge_no_score=0.15)),
        faults=Faults(error_rate=0.1, drop_rate=0.1),
        record=True,
    )
    judge.start()
    try:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            sim.url,
            "--tokenizer",
            TOKENIZER,
            "--reward-component",
            "judged=judge",
            "--reward-component",
            "checked=math*0",
            "--judge-url",
            judge.url,
            "--judge-model",
            judge.model,
            "--judge-prompt",
            "correctness",
            "--judge-retries",
            "10",
        )
    finally:
        judge.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    records = judged(read_records(tmp_path / "out"))
    verdicts = [r for r in records if r["judge"] is not None]
    assert len(verdicts) > 20
    for r in records:
        parts = r["reward_components"]
        assert parts["judged"]["value"] == parts["checked"]["value"]  # the simulated judge agrees with math-verify
        assert r["raw_reward"] == parts["judged"]["value"]  # math weighs 0
    answered = [e["response"] for e in judge.log]
    assert any("Score" not in a["choices"][0]["message"]["content"] for a in answered)  # it did say no score
    stats = json.loads((tmp_path / "out" / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["judge_retried"] > 0 and stats["judge_failed"] == 0


def test_the_simulators_chat_completion_has_vllms_fields():
    """The body's fields as vLLM 0.32 writes them (`/work/shared/vllm-wire/d_chat.json`'s, a request that asked
    for no token ids), the messages rendered with the chat template."""
    import urllib.request

    from agentroll.sim.script import Script
    from agentroll.sim.server import SimServer

    server = SimServer(script=Script(answers={"What is 2 plus 2?": "4"}), record=True)
    server.start()
    try:
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": "What is 2 plus 2? \\boxed{4}\nEnd with `Score: X`."}],
            "max_tokens": 64,
            "temperature": 0,
        }
        request = urllib.request.Request(
            server.url + "/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answered:
            reply = json.loads(answered.read())
        bad = dict(body, logprobs=True)
        refused = urllib.request.Request(
            server.url + "/v1/chat/completions", json.dumps(bad).encode(), {"content-type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(refused, timeout=30)
        assert caught.value.code == 400
        caught.value.close()
    finally:
        server.stop()
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert list(reply) == [
        *("id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage"),
        *("prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics"),
    ]
    choice = reply["choices"][0]
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
    assert choice["message"]["content"].endswith("Score: 1") and choice["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] > 10


def test_group_judging_waits_for_no_execution_that_stopped_early(problems, tmp_path):
    """Three-stage stops an execution whose solvers wrote no content before its rewriters are scored: the other
    executions' rewriters are judged together without it (the run ends, every group written)."""
    from agentroll.sim.script import Behavior, Script
    from agentroll.sim.server import SimServer

    policy = SimServer(script=Script.from_jsonl(problems, Behavior(empty_after_think=0.6)))
    policy.start()
    try:
        with JudgeDouble() as judge:
            proc = run_cli(
                "generate",
                str(problems),
                "-o",
                str(tmp_path / "out"),
                "--base-url",
                policy.url,
                "--tokenizer",
                TOKENIZER,
                "--samples-per-prompt",
                "3",
                "--reward",
                "judge",
                "--judge-url",
                judge.url,
                "--judge-model",
                "judge-1",
                "--judge-prompt",
                "group",
                "--judge-mode",
                "group",
                timeout=300,
            )
    finally:
        policy.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert len({r["problem_id"] for r in records}) == 8
    stages = {}
    for r in records:
        stages.setdefault(r["rollout_id"], set()).add(r["stage"])
    assert any(s == {"solver"} for s in stages.values())  # an execution stopped after its solvers
    assert any("rewriter" in s for s in stages.values())  # and others went on, their rewriters judged
    label = labels(problems)
    for r in judged(records):
        if r["content"] is not None:
            assert r["raw_reward"] == grade(r["content"], label[r["problem_id"]])


def test_a_judge_set_up_wrong_stops_the_run_and_says_what_is_missing(sim, problems, tmp_path):
    proc = run_cli(
        "generate", str(problems), "-o", str(tmp_path / "a"), "--base-url", sim.url, "--tokenizer", TOKENIZER,
        "--reward", "judge", "--judge-url", "http://127.0.0.1:9/v1",
    )  # fmt: skip
    assert proc.returncode == 2 and "--reward judge needs --judge-model, --judge-prompt" in proc.stderr.decode()
    proc = generate(sim, problems, tmp_path / "b", "http://127.0.0.1:9/v1", "--judge-scale", "10:1")
    assert proc.returncode == 2 and "--judge-scale '10:1' must be LO:HI with LO < HI" in proc.stderr.decode()
    with JudgeDouble(key="right") as judge:  # a wrong key is no outage: no retry mends it
        proc = generate(sim, problems, tmp_path / "c", judge.url, "-q")
        asked = len(judge.requests)
    assert proc.returncode == 5, proc.stderr.decode()
    assert "answered HTTP 401" in proc.stderr.decode() and asked < 40


def test_a_label_is_checked_against_each_component_not_the_unused_reward():
    from agentroll.rewards import label_fault

    tests = {"inputs": ["1\n"], "outputs": ["2\n"]}
    assert label_fault("math", tests) is not None  # --reward math alone: a bad row
    assert label_fault("math", tests, ["passes=code", "style=judge*0.2"]) is None  # the components can score it
    fault = label_fault("math", tests, ["correct=math", "style=judge"])
    assert fault is not None and fault.startswith("component correct:")


def test_rescore_weighs_components_with_a_group_judge(sim, problems, tmp_path):
    src = tmp_path / "src"
    proc = run_cli(
        "generate", str(problems), "-o", str(src), "--base-url", sim.url, "--tokenizer", TOKENIZER,
        "--system", "single", "--samples-per-prompt", "3", "--reward", "exact",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    with JudgeDouble() as judge:
        proc = run_cli(
            "rescore", str(src), "-o", str(tmp_path / "new"), "--reward", "math",
            "--reward-component", "correct=math*0.5", "--reward-component", "judged=judge*0.5",
            "--judge-url", judge.url, "--judge-model", "judge-1", "--judge-prompt", "group", "--judge-mode", "group",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "new")
    assert len(records) == len(read_records(src))
    shown = {r["problem_id"] for r in records if r["content"] is not None}
    assert len(judge.requests) == len(shown)  # one group request per problem with an answer
    label = labels(problems)
    for r in records:
        parts = r["reward_components"]
        if r["content"] is not None:
            assert parts["judged"]["value"] == grade(r["content"], label[r["problem_id"]])
        assert r["raw_reward"] == pytest.approx(0.5 * parts["correct"]["value"] + 0.5 * parts["judged"]["value"])
    settings = json.loads((tmp_path / "new" / "manifest.json").read_text())["settings"]
    assert settings["reward_components"] == [["correct", "math", 0.5], ["judged", "judge", 0.5]]
    assert settings["judge"]["mode"] == "group"


def meetings(records):
    """Each judged record's meeting as the judge saw it: (problem, stage, its number, how many were shown)."""
    return sorted(
        (r["problem_id"], r["stage"], r["sample_index"], r["worker"], r["judge"]["answer"], r["judge"]["of"])
        for r in records
        if r["stage"] in ("solver", "rewriter") and r["content"] is not None
    )


def test_a_three_stage_rescore_meets_a_group_judge_as_generate_did_answers_in_execution_order(sim, problems, tmp_path):
    """A group judge sees a problem's solvers together, then its rewriters together, the answers numbered in the
    order of the executions, whether generate or rescore asks (before, rescore showed solvers and rewriters in one
    request, and the numbering followed the order the executions happened to finish in)."""
    group = ("--judge-prompt", "group", "--judge-mode", "group")
    with JudgeDouble() as judge:
        made = generate(sim, problems, tmp_path / "out", judge.url, "--limit", "3", *group)
        proc = run_cli(
            "rescore", str(tmp_path / "out"), "-o", str(tmp_path / "new"), "--reward", "judge", "--judge-url",
            judge.url, "--judge-model", "judge-1", *group,
        )  # fmt: skip
    assert made.returncode == 0 and proc.returncode == 0, (made.stderr.decode(), proc.stderr.decode())
    generated, rescored = read_records(tmp_path / "out"), read_records(tmp_path / "new")
    assert meetings(rescored) == meetings(generated)
    for records in (generated, rescored):
        for r in judged(records):
            if r["content"] is None:
                continue
            same = [s for s in judged(records) if (s["problem_id"], s["stage"]) == (r["problem_id"], r["stage"])]
            shown = sorted((s["sample_index"], s["worker"]) for s in same if s["content"] is not None)
            assert r["judge"]["of"] == len(shown)  # one stage's answers of the problem's executions, no other's
            before = [s for s in shown if s[0] < r["sample_index"]]
            assert r["judge"]["answer"] > len(before)  # an earlier execution's answers come first


def test_an_agents_answer_without_a_verdict_holds_its_group_and_its_components_are_on_its_records(
    sim, problems, tmp_path
):
    """The agent system scores a copy of its last call: the judge's word and the reward's parts were left on the
    copy, so a missing verdict held nothing back (a placeholder 0 trained as an outcome) and no agent record had
    its components."""
    from . import agents_support as support

    async def plan(client, problem):  # one call, its answer the agent's
        reply = await client.chat.completions.create(model="m", messages=problem["messages"])
        return reply.choices[0].message.content

    support.PLAN = plan
    out = tmp_path / "out"
    agent = ("--system", "agent", "--system-option", "agent=tests.agents_support:probe", "--limit", "6")
    with JudgeDouble(no_score_every=3) as judge:
        proc = generate(
            sim, problems, out, judge.url, *agent, "--judge-retries", "0", "--judge-failures", "keep",
            "--reward-component", "judged=judge*0.5", "--reward-component", "correct=math*0.5",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    unjudged = {r["rollout_id"] for r in records if r["judge"] and r["judge"].get("failed")}
    assert unjudged  # a third of the verdicts missing
    held = {r["problem_id"] for r in records if r["rollout_id"] in unjudged}
    for r in records:
        assert (r["trainable"] is False) == (r["problem_id"] in held)
        assert set(r["reward_components"]) == {"judged", "correct"}
        parts = r["reward_components"]
        assert r["raw_reward"] == pytest.approx(0.5 * parts["judged"]["value"] + 0.5 * parts["correct"]["value"])
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["groups_held"] == len(held)
    for to in ("verifiers", "dpo", "sft"):  # no format takes a held group: its outcomes are not known
        done = run_cli("convert", str(out), "--to", to, "-o", str(tmp_path / to))
        assert done.returncode == 0, done.stderr.decode()
        assert "held by judge" in done.stderr.decode(), to
        written = b"".join(p.read_bytes() for p in (tmp_path / to).rglob("*") if p.is_file())
        for problem in held:
            assert f'"{problem}"'.encode() not in written, (to, problem)


def test_a_group_held_back_is_never_filtered_as_uniform_on_its_placeholder(sim, problems, tmp_path):
    """--filter-uniform-groups judged a held group by its outcomes, a placeholder 0 among them: a group made
    uniform (or not) by the missing verdict was filtered (or written) on a reward nobody gave."""
    out = tmp_path / "out"
    with JudgeDouble(no_score_every=2) as judge:
        proc = generate(
            sim, problems, out, judge.url, "--system", "single", "--samples-per-prompt", "3", "--judge-retries", "0",
            "--judge-failures", "keep", "--filter-uniform-groups",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    records = read_records(out)
    held = {r["problem_id"] for r in records if r["trainable"] is False}
    assert stats["groups_held"] == len(held) > 0
    written = {r["problem_id"] for r in records}
    assert held <= written
    for problem in written - held:  # the groups whose outcomes are all known: filtered as the flag says
        assert len({r["final_reward"] for r in records if r["problem_id"] == problem}) > 1


def test_outcomes_off_the_0_to_1_scale_have_no_pass_at_k(sim, problems, tmp_path):
    """Components weighted to more than 1: a solved execution's outcome is 1.5, so counting outcomes of 1 gave
    pass@k 0 on every record and in stats; it is none, said as such."""
    out = tmp_path / "out"
    proc = run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--system",
        "single", "--samples-per-prompt", "2", "--reward", "math", "--reward-component", "correct=math",
        "--reward-component", "again=math*0.5",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert any(r["final_reward"] == 1.5 for r in records)
    assert all(r["group_pass_at_k"] is None for r in records)
    report = json.loads(run_cli("stats", str(out), "--json").stdout)
    assert report["all"]["pass_at_k"] == []
    assert validate(out).ok
