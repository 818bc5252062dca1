"""`agentroll.convert`: each format field by field against its target's published source, token-exact against the
records, and loaded with the target's own code where it is pip-installable (`datasets`, `trl`; `torch` for slime).

Sources checked (cited again where used):
- TRL: huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8, and the installed trl 1.16.0 when present:
  trl/trainer/grpo_trainer.py (`rollout_func`), trl/trainer/dpo_trainer.py (`DataCollatorForPreference`,
  `_prepare_dataset`), trl/trainer/sft_trainer.py (`DataCollatorForLanguageModeling`), trl/data_utils.py.
- slime: THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515, slime/utils/types.py (`Sample`, `to_dict`,
  `from_dict`) and slime/observability/rollout_data_utils.py (`load_debug_rollout_data`).
- Megatron-LM: the seed ../shared/seeds/megatron_rl_agent_api.py.txt (= NVIDIA/Megatron-LM
  megatron/rl/agent/api.py near dde4701ea21bd928625c44308254db2702241166), and megatron/rl/rl_utils.py at
  d98e8a64ddf34856e74b24714e3bedb2f5a39553 (`single_turn_termination_ok`, `align_unpacked_inference_logprobs`).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from agentroll.convert import convert
from agentroll.errors import OutputError, UsageError
from agentroll.record.schema import STAGES

from . import convert_support, synthetic
from .conftest import TOKENIZER
from .convert_support import EOS, edited_copy, lines, stage_groups

folder, records, tokenizer = convert_support.folder, convert_support.records, convert_support.tokenizer  # fixtures


def render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


# ---------------------------------------------------------------------------------------------------------- dpo

DPO_FIELDS = [
    "problem_id",
    "stage",
    "prompt",
    "prompt_token_ids",
    "chosen",
    "chosen_token_ids",
    "chosen_logprobs",
    "chosen_reward",
    "rejected",
    "rejected_token_ids",
    "rejected_logprobs",
    "rejected_reward",
]


def available_pairs(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    """(problem, stage) -> the reward gap of every pair with identical prompt ids, counted here independently."""
    gaps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for key, members in stage_groups(records).items():
        for a in members:
            for b in members:
                if a["prompt_token_ids"] == b["prompt_token_ids"] and a["reward"] > b["reward"]:
                    gaps[key].append(a["reward"] - b["reward"])
    return gaps


def find(records: list[dict[str, Any]], row: dict[str, Any], side: str) -> dict[str, Any]:
    """The record a pair's side was copied from: same problem, stage, prompt ids, response ids, logprobs, reward."""
    hits = [
        r
        for r in records
        if r["problem_id"] == row["problem_id"]
        and r["stage"] == row["stage"]
        and r["prompt_token_ids"] == row["prompt_token_ids"]
        and r["response_token_ids"] == row[f"{side}_token_ids"]
        and r["response_logprobs"] == row[f"{side}_logprobs"]
        and r["reward"] == row[f"{side}_reward"]
    ]
    assert hits, f"no record has the {side} side of {row['problem_id']}/{row['stage']}"
    return hits[0]


def test_dpo_pairs_share_prompt_ids_prefer_the_higher_reward_and_are_token_exact(folder, records, tokenizer, tmp_path):
    summary = convert(folder, "dpo", tmp_path / "o")
    rows = lines(tmp_path / "o" / "dpo.jsonl")
    gaps = available_pairs(records)
    assert summary["records"] == len(records) and summary["rows"] == len(rows)
    assert len(rows) == sum(len(g) for g in gaps.values()) > 0  # every pair, none invented
    assert {r["stage"] for r in rows} >= {"solver", "rewriter"}
    for row in rows:
        assert list(row) == DPO_FIELDS
        chosen, rejected = find(records, row, "chosen"), find(records, row, "rejected")
        assert chosen["prompt_token_ids"] == rejected["prompt_token_ids"] == row["prompt_token_ids"]
        assert row["chosen_reward"] > row["rejected_reward"]
        # TRL's conversational preference layout (trl/data_utils.py is_conversational and apply_chat_template's
        # "preference" keys): lists of {"role", "content"}; the prompt renders to exactly the record's prompt
        # text, whose ids are prompt_token_ids
        assert render(tokenizer, row["prompt"]) == chosen["prompt"]
        assert row["prompt"][-1]["role"] == "user"
        assert row["chosen"] == [{"role": "assistant", "content": chosen["response"]}]
        assert row["rejected"] == [{"role": "assistant", "content": rejected["response"]}]


def test_dpo_cap_keeps_the_largest_gaps_per_group(folder, records, tmp_path):
    convert(folder, "dpo", tmp_path / "o", max_pairs_per_group=2, layout="standard")
    rows = lines(tmp_path / "o" / "dpo.jsonl")
    kept: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        kept[row["problem_id"], row["stage"]].append(row["chosen_reward"] - row["rejected_reward"])
        assert row["prompt"] == find(records, row, "chosen")["prompt"]  # standard layout: the text as rendered
        assert row["chosen"] == find(records, row, "chosen")["response"]
    gaps = available_pairs(records)
    assert any(len(g) > 2 for g in gaps.values())  # the cap bites somewhere
    for key, available in gaps.items():
        assert sorted(kept[key], reverse=True) == sorted(available, reverse=True)[:2]
    # within a group, the two pairs kept do not repeat one (chosen, rejected) sample pair
    pairs = [(tuple(r["chosen_logprobs"]), tuple(r["rejected_logprobs"])) for r in rows]
    assert len(set(pairs)) == len(pairs)


def test_dpo_output_goes_through_trls_own_data_code(folder, records, tokenizer, tmp_path):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl.data_utils import apply_chat_template, is_conversational
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    convert(folder, "dpo", tmp_path / "o")
    ds = datasets.load_dataset(
        "json", data_files=str(tmp_path / "o" / "dpo.jsonl"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert len(ds) > 0 and is_conversational(ds[0])
    for example in ds:
        source = find(records, example, "chosen")
        # what DPOTrainer._prepare_dataset does with a conversational example: the prompt through the chat template
        # with add_generation_prompt=True; TRL's text and ids are the record's, token for token
        text = apply_chat_template({k: example[k] for k in ("prompt", "chosen", "rejected")}, tokenizer)
        assert text["prompt"] == source["prompt"]
        ids = tokenizer.apply_chat_template(
            example["prompt"], tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        assert list(ids) == example["prompt_token_ids"]
    # token-exact DPO: the recorded ids straight into TRL's preference collator
    batch_rows = [ds[i] for i in range(min(4, len(ds)))]
    collator = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)
    batch = collator(
        [
            {
                "prompt_ids": r["prompt_token_ids"],
                "chosen_ids": r["chosen_token_ids"],
                "rejected_ids": r["rejected_token_ids"],
            }
            for r in batch_rows
        ]
    )
    n = len(batch_rows)
    for i, r in enumerate(batch_rows):
        for j, side in ((i, "chosen"), (n + i, "rejected")):
            full = r["prompt_token_ids"] + r[f"{side}_token_ids"]
            assert batch["input_ids"][j][: len(full)].tolist() == full
            assert int(batch["completion_mask"][j].sum()) == len(r[f"{side}_token_ids"])


# ---------------------------------------------------------------------------------------------------------- sft


def test_sft_keeps_correct_finished_samples_of_the_stages_asked_with_the_prompt_masked(
    folder, records, tokenizer, tmp_path
):
    summary = convert(folder, "sft", tmp_path / "o", stages=["solver", "rewriter"])
    rows = lines(tmp_path / "o" / "sft.jsonl")
    expected = [
        r
        for group in stage_groups(records).values()
        for r in group
        if r["stage"] in ("solver", "rewriter") and r["raw_reward"] == 1.0 and r["status"] == "completed"
    ]
    assert any(r["raw_reward"] == 1.0 and r["reward"] != 1.0 for r in expected)  # correct, in a failed execution
    assert summary["rows"] == len(rows) == len(expected) > 0
    for row, source in zip(rows, expected, strict=True):
        assert list(row) == ["problem_id", "stage", "messages", "input_ids", "labels"]
        assert (row["problem_id"], row["stage"]) == (source["problem_id"], source["stage"])
        prompt, response = source["prompt_token_ids"], source["response_token_ids"]
        assert row["input_ids"] == prompt + response
        assert row["labels"] == [-100] * len(prompt) + response
        assert row["messages"][-1] == {"role": "assistant", "content": source["response"]}
        assert render(tokenizer, row["messages"][:-1]) == source["prompt"]


def test_sft_leaves_out_a_correct_truncated_sample_and_masks_what_the_loss_mask_does(folder, tmp_path):
    marks: dict[str, Any] = {}

    def edit(found: list[dict[str, Any]]) -> None:
        correct = [r for r in found if r["raw_reward"] == 1.0 and r["status"] == "completed"]
        correct[0]["status"] = "truncated"  # answered right, then ran out of tokens
        correct[1]["loss_mask"][-1] = 0  # a response token that is not the model's own
        marks["truncated"], marks["masked"] = correct[0]["response_logprobs"], correct[1]["response_token_ids"]

    edited = edited_copy(folder, tmp_path / "edited", edit)
    convert(edited, "sft", tmp_path / "o", layout="standard")
    rows = lines(tmp_path / "o" / "sft.jsonl")
    masked = [r for r in rows if r["input_ids"][-len(marks["masked"]) :] == marks["masked"]]
    assert len(masked) == 1 and masked[0]["labels"][-1] == -100 and masked[0]["labels"][-2] == marks["masked"][-2]
    original = lines(Path(convert(folder, "sft", tmp_path / "o2", layout="standard")["files"][0]))
    assert len(rows) == len(original) - 1
    convert(edited, "megatron", tmp_path / "m")
    rollouts = [t for g in lines(tmp_path / "m" / "megatron.jsonl") for t in g["rollouts"] if t["trajectory"]]
    hit = [t for t in rollouts if t["trajectory"][0][-len(marks["masked"]) :] == marks["masked"]]
    assert hit[0]["generation_mask"][0][-2:] == [True, False]
    truncated = [t for t in rollouts if t["logprobs"][0] == marks["truncated"]]
    assert truncated[0]["generation_cap"] == len(truncated[0]["logprobs"][0])


def test_sft_rows_go_through_trls_language_modeling_collator(folder, tmp_path):
    pytest.importorskip("trl")
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    convert(folder, "sft", tmp_path / "o", layout="standard")
    rows = lines(tmp_path / "o" / "sft.jsonl")
    assert list(rows[0]) == ["problem_id", "stage", "prompt", "completion", "input_ids", "labels"]
    # SFTTrainer._prepare_dataset takes a dataset with "input_ids" as processed and keeps its "labels" as they are;
    # the collator pads them with -100
    batch = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{k: r[k] for k in ("input_ids", "labels")} for r in rows[:4]]
    )
    for i, row in enumerate(rows[:4]):
        width = len(row["labels"])
        assert batch["labels"][i].tolist() == row["labels"] + [-100] * (batch["labels"].shape[1] - width)
        assert batch["input_ids"][i][:width].tolist() == row["input_ids"]


# ---------------------------------------------------------------------------------------------------------- trl

# trl/trainer/grpo_trainer.py `_generate`: `required_keys = {"prompt_ids", "completion_ids", "logprobs"}`; an
# optional "env_mask" becomes the tool mask (1: the model's tokens); other keys go to the reward functions.
TRL_REQUIRED = {"prompt_ids", "completion_ids", "logprobs"}


def test_trl_rows_are_what_a_rollout_func_returns_token_for_token(folder, records, tmp_path):
    convert(folder, "trl", tmp_path / "o")
    rows = lines(tmp_path / "o" / "trl.jsonl")
    expected = [r for group in stage_groups(records).values() for r in group]
    assert len(rows) == len(expected)
    for row, source in zip(rows, expected, strict=True):
        assert set(row) >= TRL_REQUIRED and "advantage" not in row
        assert list(row) == [
            "problem_id",
            "stage",
            "prompt",
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "reward",
        ]
        assert row["prompt_ids"] == source["prompt_token_ids"]
        assert row["completion_ids"] == source["response_token_ids"]
        assert row["logprobs"] == source["response_logprobs"] and len(row["logprobs"]) == len(row["completion_ids"])
        assert row["env_mask"] == source["loss_mask"]
        assert (row["reward"], row["prompt"]) == (source["reward"], source["prompt"])


def test_trl_required_keys_are_the_installed_trls():
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    found = re.search(r"required_keys = (\{[^}]*\})", inspect.getsource(trl_grpo))
    assert found and ast.literal_eval(found.group(1)) == TRL_REQUIRED


# ----------------------------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("kind", ["grpo", "mean"])
def test_advantages_are_per_problem_and_stage_recomputed_independently(folder, records, tmp_path, kind):
    convert(folder, "trl", tmp_path / "o", advantage=kind)
    rows = iter(lines(tmp_path / "o" / "trl.jsonl"))
    scaled = 0
    for members in stage_groups(records).values():
        rewards = [r["reward"] for r in members]
        mean = statistics.fmean(rewards)
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0  # TRL's std: Bessel-corrected, divisor n - 1
        for reward in rewards:
            # TRL's GRPO: divided by its std + 1e-4 (grpo_trainer.py)
            want = (reward - mean) / (std + 1e-4) if kind == "grpo" and std > 0 else reward - mean
            got = next(rows)["advantage"]
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
            scaled += kind == "grpo" and std > 0 and not math.isclose(std, 1.0) and reward != mean
    assert next(rows, None) is None
    assert kind == "mean" or scaled > 0  # the std division was exercised


def test_a_stage_filter_leaves_the_other_stages_advantages_alone(folder, tmp_path):
    convert(folder, "trl", tmp_path / "all", advantage="grpo")
    convert(folder, "trl", tmp_path / "sel", advantage="grpo", stages="selector")
    every = [r for r in lines(tmp_path / "all" / "trl.jsonl") if r["stage"] == "selector"]
    assert lines(tmp_path / "sel" / "trl.jsonl") == every and every


# ----------------------------------------------------------------------------------------------------- megatron


class TokenRollout(BaseModel):
    """Field names and types of the seed's `TokenRollout` (megatron/rl/agent/api.py), declared here to check ours;
    like Megatron's `AgentBaseModel`, extra fields are allowed."""

    model_config = ConfigDict(extra="allow")
    trajectory: list[list[int]]
    reward: list[float] | float
    generation_mask: list[list[bool]] | None = None
    logprobs: list[list[float]] | None = None
    env_id: str = ""
    problem_id: str | None = None
    policy_epoch: list[list[tuple[int, int]]]
    kv_cache_epoch: list[list[tuple[int, int]]]
    num_evictions: list[int]


class RolloutGroup(BaseModel):
    model_config = ConfigDict(extra="allow")
    rollouts: list[TokenRollout]
    batch_id: int = 0
    index_in_batch: int = 0


def test_megatron_lines_are_rollout_groups_of_token_rollouts(folder, records, tmp_path):
    summary = convert(folder, "megatron", tmp_path / "o")
    groups = stage_groups(records)
    rows = lines(tmp_path / "o" / "megatron.jsonl")
    size = max(len(m) for m in groups.values())
    assert summary["placeholders"] == sum(size - len(m) for m in groups.values()) > 0
    assert len(rows) == len(groups)
    problems = list(dict.fromkeys(pid for pid, _ in groups))
    for row, ((pid, stage), members) in zip(rows, groups.items(), strict=True):
        assert set(row) == {"rollouts", "batch_id", "index_in_batch", "uid"} and row["uid"] == f"{pid}/{stage}"
        group = RolloutGroup.model_validate(row)
        assert len(group.rollouts) == size  # padded: Megatron stacks a step's rewards as one array
        assert all(not t.trajectory for t in group.rollouts[len(members) :])  # placeholders
        assert group.batch_id == problems.index(pid)
        assert group.index_in_batch == [s for p, s in groups if p == pid].index(stage)
        for rollout, raw, source in zip(
            group.rollouts[: len(members)], row["rollouts"][: len(members)], members, strict=True
        ):
            prompt, response = source["prompt_token_ids"], source["response_token_ids"]
            assert rollout.trajectory == [prompt + response]
            assert rollout.generation_mask == [[False] * len(prompt) + [True] * len(response)]
            # logprobs cover the generated tokens only (rl_utils.align_unpacked_inference_logprobs)
            assert rollout.logprobs == [source["response_logprobs"]]
            assert (rollout.reward, rollout.problem_id, rollout.env_id) == (source["reward"], pid, f"agentroll/{stage}")
            assert rollout.policy_epoch == rollout.kv_cache_epoch == [[(0, 0)]] and rollout.num_evictions == [0]
            assert isinstance(raw["reward"], float) and all(isinstance(b, bool) for b in raw["generation_mask"][0])
            assert "advantage" not in raw  # Megatron computes it from reward
            # rl_utils.single_turn_termination_ok: a single turn ends in EOS, or stops at its stamped cap
            assert prompt + response and (response[-1] == EOS or raw["generation_cap"] == len(response))
            assert (raw["generation_cap"] is not None) == (source["status"] == "truncated")
    assert any(r["status"] == "truncated" for r in records)


# -------------------------------------------------------------------------------------------------------- slime

# slime/utils/types.py `Sample` (dataclass fields) and `Sample.Status` values at 624b824.
SLIME_FIELDS = {
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "multimodal_train_input_id",
    "apply_chat_template_kwargs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_routed_experts",
    "remove_sample",
    "teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "custom_rm_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
}
SLIME_STATUSES = {"pending", "completed", "truncated", "aborted", "failed"}


def test_slime_files_are_what_load_debug_rollout_data_reads(folder, records, tmp_path):
    torch = pytest.importorskip("torch")
    summary = convert(folder, "slime", tmp_path / "o", advantage="grpo", groups_per_file=4)
    pts = sorted((tmp_path / "o").glob("rollout_*.pt"))
    assert [p.name for p in pts] == ["rollout_0.pt", "rollout_1.pt"]  # 8 problems, 4 per file
    assert summary["files"] == [str(p) for p in pts] + [str(tmp_path / "o" / "slime.jsonl")]
    assert summary["left_over_problems"] == 0
    groups = stage_groups(records)
    expected = [(r, key) for key, members in groups.items() for r in members]
    samples = []
    for i, path in enumerate(pts):
        # load_debug_rollout_data: torch.load(path, weights_only=False)["samples"], each through Sample.from_dict
        data = torch.load(path, weights_only=False)
        assert set(data) == {"rollout_id", "samples"} and data["rollout_id"] == i
        assert torch.load(path, weights_only=True) == data  # plain lists and numbers only
        assert len({s["metadata"]["agentroll"]["problem_id"] for s in data["samples"]}) == 4
        samples += data["samples"]
    assert lines(tmp_path / "o" / "slime.jsonl") == samples
    assert len(samples) == len(expected)
    rollout_ids: dict[str, int] = {}
    for index, (sample, (source, key)) in enumerate(zip(samples, expected, strict=True)):
        assert set(sample) <= SLIME_FIELDS and sample["status"] in SLIME_STATUSES
        prompt, response = source["prompt_token_ids"], source["response_token_ids"]
        assert sample["tokens"] == prompt + response and sample["response_length"] == len(response)
        # Sample._validate_response_metadata_lengths
        assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == sample["response_length"]
        assert sample["rollout_log_probs"] == source["response_logprobs"] and sample["status"] == source["status"]
        assert sample["index"] == index and sample["group_index"] == list(groups).index(key)
        assert sample["rollout_id"] == rollout_ids.setdefault(source["rollout_id"], len(rollout_ids))
        assert isinstance(sample["label"], str) and isinstance(sample["prompt"], str)
        rewards = [r["reward"] for r in groups[key]]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)  # slime's torch.std: Bessel-corrected
        want = (source["reward"] - mean) / (std + 1e-6) if std > 0 else source["reward"] - mean  # + slime's 1e-6
        assert math.isclose(sample["reward"], want, rel_tol=1e-12, abs_tol=1e-12)
        assert sample["metadata"]["raw_reward"] == source["reward"]
        assert sample["metadata"]["source_name"] == f"agentroll/{source['stage']}"
        assert sample["metadata"]["topic"] == "addition"  # the row's own metadata
    # one file by default; an earlier conversion's extra files do not linger to be loaded as later steps
    convert(folder, "slime", tmp_path / "o", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["rollout_0.pt", "slime.jsonl"]
    assert len(torch.load(tmp_path / "o" / "rollout_0.pt", weights_only=True)["samples"]) == len(records)


def test_slime_without_torch_is_one_line_and_writes_nothing(folder, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(UsageError, match="pip install torch") as caught:
        convert(folder, "slime", tmp_path / "o")
    assert "\n" not in str(caught.value) and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------- datasets, options


@pytest.mark.parametrize("fmt", ["dpo", "sft", "trl", "megatron"])
def test_hf_datasets_loads_every_jsonl_format(folder, tmp_path, fmt):
    datasets = pytest.importorskip("datasets")
    summary = convert(folder, fmt, tmp_path / "o")
    ds = datasets.load_dataset("json", data_files=summary["files"], split="train", cache_dir=str(tmp_path / "c"))
    assert len(ds) == summary["rows"] > 0
    assert ds.to_list() == lines(Path(summary["files"][0]))  # nothing lost or retyped on the way in


@pytest.mark.parametrize(
    ("to", "options", "message"),
    [
        ("parquet", {}, "--to takes"),
        ("trl", {"advantage": "ppo"}, "--advantage takes"),
        ("dpo", {"advantage": "grpo"}, "--advantage is not for --to dpo"),
        ("sft", {"advantage": "mean"}, "--advantage is not for --to sft"),
        ("megatron", {"advantage": "mean"}, "--advantage is not for --to megatron"),
        ("prime-rl", {"advantage": "none"}, "needs an advantage"),
        ("trl", {"ranks": 2}, "--ranks is for --to prime-rl"),
        ("trl", {"trajectories": True}, "trajectories is for --to slime"),
        ("trl", {"max_pairs_per_group": 2}, "--max-pairs-per-group is for"),
        ("dpo", {"max_pairs_per_group": 0}, "at least 1"),
        ("dpo", {"max_pairs_per_group": True}, "at least 1"),
        ("slime", {"groups_per_file": 0}, "at least 1"),
        ("megatron", {"groups_per_file": 2}, "--groups-per-file is for"),
        ("trl", {"stages": ["solver", "judge"]}, "--stages takes"),
        ("trl", {"stages": ""}, "--stages takes"),
        ("dpo", {"layout": "chat"}, "--layout takes"),
        ("trl", {"layout": "standard"}, "--layout is for"),
        ("sft", {"layout": "standard", "tokenizer": TOKENIZER}, "--tokenizer is for --layout conversational"),
    ],
)
def test_bad_options_are_one_line_usage_errors(folder, tmp_path, to, options, message):
    with pytest.raises(UsageError, match=re.escape(message)) as caught:
        convert(folder, to, tmp_path / "o", **options)
    assert "\n" not in str(caught.value) and not (tmp_path / "o").exists()


def test_source_and_output_folders_are_checked(folder, tmp_path):
    with pytest.raises(OutputError, match="not an agentroll output folder"):  # a folder fault: exit 6
        convert(tmp_path, "trl", tmp_path / "o")
    with pytest.raises(UsageError, match="cannot be the source"):
        convert(folder, "trl", folder)
    convert(folder, "trl", tmp_path / "o")
    with pytest.raises(UsageError, match="--overwrite"):
        convert(folder, "trl", tmp_path / "o")
    assert convert(folder, "trl", tmp_path / "o", overwrite=True)["rows"] > 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["trl.jsonl"]  # no temporary file left


def test_a_prompt_the_tokenizer_cannot_have_rendered_is_refused_with_the_way_out(folder, tmp_path):
    other = tmp_path / "tok"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_bytes((Path(TOKENIZER) / name).read_bytes())
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="--layout standard") as caught:
        convert(folder, "dpo", tmp_path / "o", tokenizer=str(other))
    assert "\n" not in str(caught.value) and not (tmp_path / "o" / "dpo.jsonl").exists()
    assert convert(folder, "dpo", tmp_path / "o", layout="standard")["rows"] > 0


# ------------------------------------------------------------------------- other systems (tests/synthetic.py)


def conversation_of(records: list[dict[str, Any]], last: int, frozen: bool = False) -> dict[str, Any]:
    """What slime's own multi-turn rollouts would hold for the conversation ending at records[last] (an
    execution's records), built turn by turn from the responses: the first prompt, then each turn's injected
    tokens (mask 0, logprob 0.0) and response (its loss mask and logprobs; a frozen turn's 0 when `frozen`)."""
    chain = [last]
    while records[chain[-1]]["continues"] is not None:
        chain.append(records[chain[-1]]["continues"])
    start = len(records[chain[-1]]["prompt_token_ids"])
    tokens = list(records[chain[-1]]["prompt_token_ids"])
    mask: list[int] = []
    logprobs: list[float] = []
    for i in reversed(chain):
        r = records[i]
        injected = r["prompt_token_ids"][len(tokens) :]
        off = frozen and not r["trainable"]
        tokens += injected + r["response_token_ids"]
        mask += [0] * len(injected) + ([0] * len(r["loss_mask"]) if off else r["loss_mask"])
        logprobs += [0.0] * len(injected) + (
            r["response_logprobs"]
            if i == last
            else [0.0 if off or not m else x for x, m in zip(r["response_logprobs"], r["loss_mask"], strict=True)]
        )
    return {"tokens": tokens, "response_length": len(tokens) - start, "loss_mask": mask, "rollout_log_probs": logprobs}


def executions_of(folder: Path) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for r in synthetic.records_of(folder):
        if not out or out[-1][0]["rollout_id"] != r["rollout_id"]:
            out.append([])
        out[-1].append(r)
    return out


def test_slime_writes_a_conversation_as_one_multi_turn_sample(tmp_path):
    pytest.importorskip("torch")
    folder = synthetic.critique_revise(tmp_path / "cr")
    a0, a1, b0, b1 = executions_of(folder)
    summary = convert(folder, "slime", tmp_path / "o", advantage="grpo", std="population")
    samples = lines(tmp_path / "o" / "slime.jsonl")
    assert (summary["records"], summary["rows"], summary["folded_turns"], summary["skipped_frozen"]) == (9, 4, 5, 0)
    # (problem, stage) groups in the system's order, each conversation once, by its last turn
    ends = [(a1, 0), (a0, 2), (b0, 1), (b1, 2)]
    assert [(s["metadata"]["agentroll"]["rollout_id"], s["metadata"]["agentroll"]["stage"]) for s in samples] == [
        (e[i]["rollout_id"], e[i]["stage"]) for e, i in ends
    ]
    assert [s["group_index"] for s in samples] == [0, 1, 2, 3]
    for sample, (execution, i) in zip(samples, ends, strict=True):
        want = conversation_of(execution, i)
        assert {k: sample[k] for k in want} == want
        # Sample._validate_response_metadata_lengths
        assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == sample["response_length"]
        assert sample["prompt"] == execution[0]["prompt"]  # the first turn's
        assert sample["metadata"]["agentroll"].get("turns") == (i + 1 if i else None)
    assert samples[1]["loss_mask"] == [1, 1, 0, 1, 1, 1] + [0] * 3 + [1] * 4 + [0] * 2 + [1] * 5
    assert samples[0]["tokens"] == a1[0]["prompt_token_ids"] + a1[0]["response_token_ids"]  # one call: as before
    # advantages over the whole stage group, the turns folded away included: a1's solver against a0's and its own
    assert samples[0]["reward"] == pytest.approx(-0.5 / (0.5 + 1e-6), rel=1e-12)  # std 0.5, + slime's 1e-6
    assert samples[0]["metadata"]["raw_reward"] == 0.0
    # every call its own sample instead
    calls = convert(folder, "slime", tmp_path / "calls", trajectories=False)
    rows = lines(tmp_path / "calls" / "slime.jsonl")
    assert calls["rows"] == 9 and "folded_turns" not in calls
    assert sorted(r["tokens"] for r in rows) == sorted(
        r["prompt_token_ids"] + r["response_token_ids"] for r in synthetic.records_of(folder)
    )


def test_slime_masks_a_frozen_turn_and_ends_a_conversation_at_its_last_trainable_turn(tmp_path):
    pytest.importorskip("torch")
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    a0, a1, b0, b1 = executions_of(folder)
    summary = convert(folder, "slime", tmp_path / "o")
    samples = lines(tmp_path / "o" / "slime.jsonl")
    assert (summary["rows"], summary["skipped_frozen"], summary["folded_turns"]) == (4, 3, 2)
    ends = [(a1, 0), (b0, 0), (a0, 2), (b1, 2)]  # problem a: solver, reviser; b: solver, reviser
    order = [(s["metadata"]["agentroll"]["rollout_id"], s["metadata"]["agentroll"]["stage"]) for s in samples]
    assert order == [
        (a1[0]["rollout_id"], "solver"),
        (a0[2]["rollout_id"], "reviser"),
        (b0[0]["rollout_id"], "solver"),
        (b1[2]["rollout_id"], "reviser"),
    ]
    by_key = {(e[i]["rollout_id"], e[i]["stage"]): conversation_of(e, i, frozen=True) for e, i in ends}
    for sample, key in zip(samples, order, strict=True):
        want = by_key[key]
        assert {k: sample[k] for k in want} == want
    assert samples[1]["loss_mask"][6 + 3 : 6 + 3 + 4] == [0, 0, 0, 0]  # the critic's 4 tokens, after 6 + 3
    everything = convert(folder, "slime", tmp_path / "all", include_frozen=True)
    assert everything["rows"] == 4 and "skipped_frozen" not in everything  # b0 ends with its critic again
    kept = lines(tmp_path / "all" / "slime.jsonl")
    assert kept[1]["loss_mask"][9:13] == [1, 1, 1, 1]
    assert [s["metadata"]["agentroll"]["stage"] for s in kept] == ["solver", "reviser", "critic", "reviser"]


def test_rl_formats_leave_out_frozen_records_and_the_others_keep_them(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    critics = [r for r in synthetic.records_of(folder) if r["stage"] == "critic"]
    assert len(critics) == 3 and not any(r["trainable"] for r in critics)
    trl_rows = convert(folder, "trl", tmp_path / "trl")
    assert (trl_rows["rows"], trl_rows["skipped_frozen"]) == (6, 3)
    assert {r["stage"] for r in lines(tmp_path / "trl" / "trl.jsonl")} == {"solver", "reviser"}
    assert convert(folder, "trl", tmp_path / "trl-all", include_frozen=True)["rows"] == 9
    mega = convert(folder, "megatron", tmp_path / "m", trajectories=False)
    rollouts = [t for g in lines(tmp_path / "m" / "megatron.jsonl") for t in g["rollouts"] if t["trajectory"]]
    assert mega["skipped_frozen"] == 3 and len(rollouts) == 6
    assert {t["env_id"] for t in rollouts} == {"agentroll/solver", "agentroll/reviser"}
    # a later turn is a one-turn rollout of its own: the earlier turns are its prompt, not generated here
    reviser = next(r for r in synthetic.records_of(folder) if r["stage"] == "reviser")
    row = next(t for t in rollouts if t["logprobs"] == [reviser["response_logprobs"]])
    assert row["generation_mask"] == [[False] * 20 + [True] * 5]
    sft = convert(folder, "sft", tmp_path / "sft", layout="standard")
    assert "skipped_frozen" not in sft
    assert sum(r["stage"] == "critic" for r in lines(tmp_path / "sft" / "sft.jsonl")) == 2  # the correct ones
    assert convert(folder, "sft", tmp_path / "sft2", layout="standard", include_frozen=False)["skipped_frozen"] == 3


def test_stages_are_the_folders_systems(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    summary = convert(folder, "trl", tmp_path / "o", stages="critic,solver")
    assert summary["stages"] == ["solver", "critic"]
    assert [r["stage"] for r in lines(tmp_path / "o" / "trl.jsonl")] == [
        "solver",
        "solver",
        "critic",
        "solver",
        "solver",
        "critic",
        "critic",
    ]
    with pytest.raises(UsageError, match="--stages takes a comma-separated subset of solver, critic, reviser"):
        convert(folder, "trl", tmp_path / "o2", stages="rewriter")
    legacy = synthetic.three_stage(tmp_path / "legacy")
    with pytest.raises(UsageError, match="subset of solver, rewriter, selector, not 'critic'"):
        convert(legacy, "trl", tmp_path / "o3", stages="critic")
    assert convert(legacy, "trl", tmp_path / "o4")["stages"] == list(STAGES)
    blank = synthetic.critique_revise(tmp_path / "blank", system={"name": "f.py:s", "stages": [], "options": {}})
    assert convert(blank, "trl", tmp_path / "o5", stages="reviser,solver")["rows"] == 6
    assert convert(blank, "trl", tmp_path / "o6")["stages"] is None
    with pytest.raises(UsageError, match="trajectories is for --to slime"):
        convert(folder, "trl", tmp_path / "o7", trajectories=True)
