"""Issue 23, the last findings: samples dropped by `--overlong-filter drop` are never converted (a dropped sample
is not a frozen stage), the conversational layout judges a prompt by its template's own markup only, verl's
routed experts as its replay loop takes them, and a refused conversion leaves no `-o` folder behind."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentroll.convert import FORMATS, convert
from agentroll.errors import UsageError
from agentroll.folder import read_records
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from . import convert_support, synthetic
from .conftest import TOKENIZER, run_cli, write_problems
from .convert_support import doc_code, edited_copy, executions_of, lines, rewrite
from .test_convert_trainers import VIEWS, WHOLE

DROP_NOTE = "overlong filter: drop"
folder, tokenizer = convert_support.folder, convert_support.tokenizer  # the fixtures


@pytest.fixture(scope="module")
def dropped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`--system single --overlong-filter drop` with a budget some responses reach: truncated samples marked
    `trainable: false` by the filter, next to completed ones of both rewards in the same groups."""
    tmp = tmp_path_factory.mktemp("dropped")
    problems = write_problems(tmp / "problems.jsonl", 3)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        out = tmp / "rollouts"
        result = run_cli(
            *("generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER),
            *("--system", "single", "--samples-per-prompt", "8", "--reward", "exact", "--overlong-filter", "drop"),
            *("--max-tokens", "60", "--seed", "3"),
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    finally:
        server.stop()
    found = list(read_records(out))
    cut = [r for r in found if r["status"] == "truncated"]
    assert cut and all(r["trainable"] is False and DROP_NOTE in r["reward_info"] for r in cut)
    # a group holds a dropped sample and a better one: the old dpo paired them
    assert any(
        r["reward"] > c["reward"] and r["problem_id"] == c["problem_id"] and r["status"] == "completed"
        for r in found
        for c in cut
    )
    return out


def sequences(records: list[dict[str, Any]]) -> Counter[tuple[int, ...]]:
    return Counter(tuple(r["prompt_token_ids"] + r["response_token_ids"]) for r in records)


@pytest.mark.parametrize("include_frozen", [True, None])
@pytest.mark.parametrize("to", WHOLE)
def test_a_dropped_sample_is_never_converted_not_even_with_include_frozen(dropped, tmp_path, to, include_frozen):
    found = list(read_records(dropped))
    kept = [r for r in found if r["status"] != "truncated"]
    summary = convert(dropped, to, tmp_path / "o", include_frozen=include_frozen)
    assert summary["dropped_overlong"] == len(found) - len(kept)
    assert not summary.get("skipped_frozen")  # nothing here is a frozen stage
    assert Counter(tuple(v["tokens"]) for v in VIEWS[to](tmp_path / "o")) == sequences(kept)


def test_verl_include_frozen_gives_no_dropped_row_a_trained_token(dropped, tmp_path):
    convert(dropped, "verl", tmp_path / "o", include_frozen=True)
    rows = lines(tmp_path / "o" / "verl.jsonl")
    assert rows and all(row["extra_fields"]["status"] != "truncated" for row in rows)


@pytest.mark.parametrize("to", ["trl", "slime"])
def test_per_call_formats_leave_dropped_samples_out(dropped, tmp_path, to):
    found = list(read_records(dropped))
    kept = [r for r in found if r["status"] != "truncated"]
    summary = convert(dropped, to, tmp_path / "o", include_frozen=True)
    assert summary["rows"] == len(kept)
    rows = lines(tmp_path / "o" / f"{to}.jsonl")
    got = Counter(tuple(r["prompt_ids"] + r["completion_ids"]) if to == "trl" else tuple(r["tokens"]) for r in rows)
    assert got == sequences(kept)


@pytest.mark.parametrize("to", ["dpo", "nemo-rl-dpo"])
def test_dpo_pairs_never_hold_a_dropped_response(dropped, tmp_path, to):
    options: dict[str, Any] = {"layout": "standard"} if to == "dpo" else {}
    summary = convert(dropped, to, tmp_path / "o", **options)
    cut = {tuple(r["response_token_ids"]) for r in read_records(dropped) if r["status"] == "truncated"}
    rows = lines(tmp_path / "o" / ("dpo.jsonl" if to == "dpo" else "nemo_rl_dpo.jsonl"))
    assert rows and summary["dropped_overlong"] == len(cut)
    for row in rows:
        assert tuple(row["chosen_token_ids"]) not in cut and tuple(row["rejected_token_ids"]) not in cut


def test_every_format_counts_the_dropped_samples_it_left_out(dropped, tmp_path):
    cut = sum(r["status"] == "truncated" for r in read_records(dropped))
    for to in FORMATS:
        options: dict[str, Any] = {"layout": "standard"} if to in ("dpo", "sft") else {}
        assert convert(dropped, to, tmp_path / to, **options)["dropped_overlong"] == cut, to


def test_the_convert_command_names_the_dropped_samples(dropped, tmp_path):
    result = run_cli("convert", str(dropped), "--to", "verl", "-o", str(tmp_path / "o"), "--include-frozen")
    assert result.returncode == 0, result.stderr.decode()
    cut = sum(r["status"] == "truncated" for r in read_records(dropped))
    assert f"{cut} dropped overlong" in " ".join(result.stderr.decode().split())


def test_a_dropped_earlier_turn_stays_untrained_inside_a_conversation_with_include_frozen(tmp_path):
    """The overlong filter drops a call a later turn continues: its tokens in the conversation are not the
    policy's to train (mask 0), frozen stages or not; a frozen critic's are trained with --include-frozen."""
    folder = synthetic.critique_revise(tmp_path / "cr")
    first = executions_of(folder)[0]
    assert first[1]["continues"] == 0

    def drop_first_call(found: list[dict[str, Any]]) -> None:
        record = found[0]
        record["status"], record["trainable"] = "truncated", False
        record["loss_mask"] = [0] * len(record["response_token_ids"])
        record["reward_info"] = f"exact; {DROP_NOTE}"

    rewrite(folder, drop_first_call)
    begin = len(first[0]["prompt_token_ids"])
    end = begin + len(first[0]["response_token_ids"])
    convert(folder, "verl", tmp_path / "o", include_frozen=True)
    every = lines(tmp_path / "o" / "verl.jsonl")
    rows = [r for r in every if r["extra_fields"]["rollout_id"] == first[0]["rollout_id"]]
    assert rows and all(len(r["prompt_ids"]) == begin for r in rows)  # conversations that go on past it
    assert all(r["response_mask"][: end - begin] == [0] * (end - begin) for r in rows)
    others = [r for r in every if r["extra_fields"]["rollout_id"] != first[0]["rollout_id"]]
    assert any(r["response_mask"][: end - begin] != [0] * (end - begin) for r in others)  # the others train theirs


# ---------------------------------------------------------------- 2. the conversational layout's multi-turn check


THINKING = "<|im_start|>user\nWhat do <think> and </think> mark in a reply?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("to", ["sft", "dpo", "nemo-rl-dpo"])
def test_a_single_message_mentioning_an_added_token_the_frame_never_uses_is_one_message(folder, tmp_path, to):
    """The sim tokenizer (like Qwen3's) has `<think>` and `</think>` as added tokens; its chat template's frame
    uses only `<|im_start|>` / `<|im_end|>`. A user asking about `<think>` wrote one message."""

    def edit(found: list[dict[str, Any]]) -> None:
        for r in found:
            if r["stage"] == "solver":
                r["prompt"] = THINKING

    edited = edited_copy(folder, tmp_path / "edited", edit)
    summary = convert(edited, to, tmp_path / "o", stages="solver")
    assert summary["rows"] > 0
    row = lines(next((tmp_path / "o").glob("*.jsonl")))[0]
    messages = row.get("messages") or row.get("prompt") or row.get("context")
    assert messages[0] == {"role": "user", "content": "What do <think> and </think> mark in a reply?"}


def test_tokens_only_the_generation_prompt_holds_are_not_message_markup(tokenizer):
    """Qwen3 with thinking off ends its generation prompt with an empty `<think></think>`: a user's `<think>` is
    still one message, a rendered conversation still several."""
    from agentroll.convert.messages import ChatMessages

    qwen3ish = copy.copy(tokenizer)
    qwen3ish.chat_template = tokenizer.chat_template.replace(
        "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
    )
    assert qwen3ish.chat_template != tokenizer.chat_template
    chat = ChatMessages(qwen3ish, {})
    message = [{"role": "user", "content": "Is <think> a tag?"}]
    assert chat(chat.render(message)) == message
    several = [*message, {"role": "assistant", "content": "yes"}, {"role": "user", "content": "And </think>?"}]
    assert chat(chat.render(several)) is None


# ------------------------------------------------------------------------------- 3. OpenRLHF's own class in CI


def test_ci_installs_openrlhf_so_its_replay_test_runs_there():
    """tests/test_convert_trainers.py's replay executor test skips without openrlhf; CI installs it `--no-deps`
    (its full install needs CUDA) before the README's test command, which stays the script's last line."""
    steps = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text().strip().splitlines()
    install = [i for i, line in enumerate(steps) if line.startswith("pip install") and "openrlhf==" in line]
    assert install and install[0] < len(steps) - 1
    assert "--no-deps" in steps[install[0]] and "pylatexenc" in steps[install[0]]


# ------------------------------------------------------------------------------------------ 4. verl routed experts


def test_the_documented_verl_row_gives_routed_experts_as_verls_postprocess_reads_them(tmp_path):
    """verl's `_agent_loop_postprocess` (agent_loop.py at b178a3c, ~589-611) unpacks `routed_experts.shape` into
    (length, layers, topk), takes an np.ndarray or a torch.Tensor, and copies it into a zero (1, total, layers,
    topk) tensor from the left-padded prompt's first position. JSON holds nested lists, which have no shape."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from .test_convert_defects import routed_folder
    from .test_convert_trainers import AgentLoopOutput

    folder = routed_folder(tmp_path / "routed")
    convert(folder, "verl", tmp_path / "o")
    rows = lines(tmp_path / "o" / "verl.jsonl")
    source = {tuple(r["prompt_token_ids"] + r["response_token_ids"]): r for r in read_records(folder, routes=True)}
    assert rows and all(isinstance(row["routed_experts"], list) for row in rows)
    with pytest.raises(AttributeError):
        AgentLoopOutput.model_validate(rows[0]).routed_experts.shape  # noqa: B018 (what verl reads)
    namespace: dict[str, Any] = {}
    exec(doc_code("verl-output"), namespace)
    # verl pads the prompt on the left, the response on the right, to its configured lengths
    prompt_width = max(len(row["prompt_ids"]) for row in rows) + 3
    response_width = max(len(row["response_ids"]) for row in rows) + 5
    for row in rows:
        output = AgentLoopOutput.model_validate(namespace["agent_loop_output"](row))
        length, layers, topk = output.routed_experts.shape
        assert isinstance(output.routed_experts, np.ndarray)
        experts = torch.from_numpy(output.routed_experts)
        padded = torch.zeros(1, prompt_width + response_width, layers, topk, dtype=experts.dtype)
        start = prompt_width - len(output.prompt_ids)
        padded[:, start : start + length] = experts.unsqueeze(0)
        record = source[tuple(output.prompt_ids + output.response_ids)]
        assert length == len(output.prompt_ids) + len(output.response_ids) - 1  # vLLM's P + R - 1 rows
        assert np.array_equal(padded[0, start : start + length].numpy(), record["routed_experts"].astype(np.int32))


# ------------------------------------------------------------------------------ 5. a refusal leaves no -o folder


@pytest.mark.parametrize("nested", [False, True])
def test_a_conversion_refused_while_reading_leaves_no_output_folder(tmp_path, nested):
    """critique-revise's later turns are multi-turn prompts, which the conversational layout refuses once it
    reaches one: the folder the conversion made for its output (and the parents it made) must not stay behind."""
    folder = synthetic.critique_revise(tmp_path / "cr")
    out = tmp_path / "new" / "deeper" / "out" if nested else tmp_path / "out"
    result = run_cli("convert", str(folder), "--to", "sft", "-o", str(out), "--tokenizer", TOKENIZER)
    assert result.returncode == 2, result.stderr.decode()
    assert "--layout standard" in result.stderr.decode()
    assert not out.exists() and not (tmp_path / "new").exists()


def test_a_refused_conversion_leaves_an_existing_output_folder_and_its_files_alone(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run_cli("convert", str(folder), "--to", "sft", "-o", str(out), "--tokenizer", TOKENIZER)
    assert result.returncode == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("to", ["slime", "prime-rl"])
def test_a_step_written_before_a_refusal_is_taken_away_again(tmp_path, to):
    """slime and prime-rl write each step as it fills: a refusal in a later problem (a broken conversation)
    leaves none of the format's files, and nothing else in OUT is touched."""
    folder = synthetic.critique_revise(tmp_path / "cr")

    def break_last_problem(found: list[dict[str, Any]]) -> None:
        last = [r for r in found if r["problem_id"] == found[-1]["problem_id"] and r["continues"] is not None]
        last[-1]["continues"] = 99  # no earlier record of its execution

    rewrite(folder, break_last_problem)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="continues 99"):
        convert(folder, to, out, groups_per_file=1)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------------------------------------ 6. the docs


def test_verifiers_rollouts_per_example_is_what_verifiers_computes_from_the_outputs(folder, tmp_path):
    """verifiers (legacy/envs/environment.py at a60a606) sets `rollouts_per_example` to outputs // examples. One
    stage's groups are all alike here (K selectors): that size; mixed stages: the floor of the mean size."""
    import json

    convert(folder, "verifiers", tmp_path / "sel", stages="selector")
    metadata = json.loads((tmp_path / "sel" / "metadata.json").read_text())
    rows = lines(tmp_path / "sel" / "results.jsonl")
    sizes = Counter(row["example_id"] for row in rows)
    assert set(sizes.values()) == {3} and metadata["rollouts_per_example"] == 3
    convert(folder, "verifiers", tmp_path / "all")
    metadata = json.loads((tmp_path / "all" / "metadata.json").read_text())
    rows = lines(tmp_path / "all" / "results.jsonl")
    assert metadata["rollouts_per_example"] == len(rows) // metadata["num_examples"]


def nemo_rl_baselines(prompts: list[tuple[int, ...]], rewards: list[float]) -> list[float]:
    """calculate_baseline_and_std_per_prompt (nemo_rl/algorithms/utils.py at 7ea279a) with every sample valid and
    its default leave-one-out baseline: a prompt seen once keeps its reward as baseline (advantage 0)."""
    out = []
    for i, prompt in enumerate(prompts):
        others = [r for j, (p, r) in enumerate(zip(prompts, rewards, strict=True)) if p == prompt and j != i]
        out.append(rewards[i] if not others else sum(others) / len(others))
    return out


def test_nemo_rl_never_trains_a_prompt_seen_once_as_the_docs_say(folder, tmp_path):
    convert(folder, "nemo-rl", tmp_path / "o")
    rows = lines(tmp_path / "o" / "nemo_rl.jsonl")
    prompts = [tuple(row["message_log"][0]["token_ids"]) for row in rows]
    rewards = [row["total_reward"] for row in rows]
    advantages = [r - b for r, b in zip(rewards, nemo_rl_baselines(prompts, rewards), strict=True)]
    selectors = [a for a, row in zip(advantages, rows, strict=True) if row["task_name"] == "agentroll/selector"]
    assert selectors and all(a == 0.0 for a in selectors)  # every selector's prompt is its own
    assert any(a != 0.0 for a in advantages)  # solvers share their prompt: they do train
    text = " ".join((convert_support.ROOT / "docs" / "convert.md").read_text().lower().split())
    assert "a prompt seen once" in text and "never train" in text


def test_slime_metadata_raw_reward_is_described_as_what_slime_does_with_it(folder, tmp_path):
    """slime (ray/rollout.py at 624b824): `raw_reward` of the train data is `get_reward_value`, the sample's
    `reward` (our advantage with --advantage), unless a sample's metadata has `raw_reward`, which then replaces it;
    rollout-side figures (zero-std counts) read `reward`."""
    convert(folder, "slime", tmp_path / "o", advantage="grpo")
    samples = lines(tmp_path / "o" / "slime.jsonl")
    train_raw = [s["metadata"]["raw_reward"] if "raw_reward" in s["metadata"] else s["reward"] for s in samples]
    assert train_raw == [s["metadata"]["agentroll"]["reward"] for s in samples]
    assert any(s["reward"] != s["metadata"]["raw_reward"] for s in samples)  # the advantage is elsewhere
    from agentroll.convert import slime

    for text in (slime.__doc__ or "", (convert_support.ROOT / "docs" / "convert.md").read_text()):
        flat = " ".join(text.split())
        assert "logs as the raw reward" not in flat and "slime logs it as the raw reward" not in flat
        assert "get_reward_value" in flat


def test_docs_show_a_convert_command_line_for_every_format_and_each_runs(folder, tmp_path):
    import re

    text = (convert_support.ROOT / "docs" / "convert.md").read_text()
    found = dict(re.findall(r"`agentroll convert out --to (\S+) -o (\S+?)[` ]", text))
    assert set(found) == set(FORMATS)
    for to, out in found.items():
        result = run_cli("convert", str(folder), "--to", to, "-o", str(tmp_path / out))
        assert result.returncode == 0, (to, result.stderr.decode())


def test_the_documented_areal_versions_follow_weight_versions():
    namespace: dict[str, Any] = {}
    exec(doc_code("areal-versions"), namespace)
    record = {
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [4, 5, 6, 7, 8],
        "weight_versions": [{"version": "3", "start": 0, "end": 2}, {"version": 4, "start": 2, "end": 5}],
    }
    assert namespace["areal_versions"](record) == [-1, -1, -1, 3, 3, 4, 4, 4]
    assert namespace["areal_versions"]({**record, "weight_versions": None}) is None
