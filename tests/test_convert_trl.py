"""The documented TRL recipes run the way TRL runs them: real `GRPOTrainer`, `DPOTrainer` and `SFTTrainer` steps
of the installed trl (1.16.0; source huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8) on a tiny random
model built here, on CPU. Each recipe is the code block of docs/convert.md under its marker, executed as it is.

- GRPO replay (issue 23, defect 1): GRPOTrainer passes each prompt `num_generations` times; the replay gives one
  recorded row per copy, and the rewards TRL logs are the recorded ones.
- Token-exact DPO (defect 3): `DPOTrainer._prepare_dataset` tokenizes the text again (every completion gains the
  template's `\\n`, a truncated response gains an EOS); the recipe's trainer takes the recorded ids as they are.
- Recorded logprobs (defect 4): without vLLM, GRPOTrainer never reads the logprobs a `rollout_func` returns for
  its loss: a step with the recorded logprobs and one with other logprobs update the model identically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentroll.convert import convert

from . import convert_support
from .convert_support import ROOT, doc_code, lines, stage_groups

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

folder, records, tokenizer, tiny_model = (
    convert_support.folder,
    convert_support.records,
    convert_support.tokenizer,
    convert_support.tiny_model,
)

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's experimental-feature notice


def cpu_args(config: Any, tmp_path: Path, **kwargs: Any) -> Any:
    return config(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        max_steps=kwargs.pop("max_steps", 1),
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        **kwargs,
    )


def replay(tmp_path: Path) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(doc_code("replay").replace("out-trl/trl.jsonl", str(tmp_path / "o" / "trl.jsonl")), namespace)
    return namespace


def grpo(
    model: Path, tmp_path: Path, rollout_func: Any, keys: list[str], size: int, tokenizer: Any, max_steps: int = 2
) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    args = cpu_args(
        GRPOConfig,
        tmp_path,
        max_steps=max_steps,
        per_device_train_batch_size=size,
        num_generations=size,
        max_completion_length=256,
        shuffle_dataset=False,
    )
    return GRPOTrainer(
        model=str(model),
        reward_funcs=[lambda completions, reward, **kwargs: reward],
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": keys}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def test_grpo_trains_on_the_replayed_groups_one_row_per_prompt_copy(folder, records, tokenizer, tiny_model, tmp_path):
    convert(folder, "trl", tmp_path / "o", stages="solver")
    namespace = replay(tmp_path)
    groups = stage_groups([r for r in records if r["stage"] == "solver"])
    keys = [f"{pid}/{stage}" for pid, stage in list(groups)[:2]]
    size = len(next(iter(groups.values())))
    assert size == 9 and all(len(g) == size for g in groups.values())
    seen: list[tuple[list[str], dict[str, Any]]] = []

    def recording(prompts: list[str], trainer: Any) -> dict[str, Any]:
        output = namespace["rollout_func"](prompts, trainer)
        seen.append((list(prompts), output))
        return output

    trainer = grpo(tiny_model, tmp_path, recording, keys, size, tokenizer)
    result = trainer.train()
    assert result.global_step == 2 and len(seen) == 2
    logged = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    for (prompts, output), want_mean in zip(seen, logged, strict=True):
        assert len(set(prompts)) == 1 and len(prompts) == size  # TRL's copies of one prompt
        group = groups[tuple(prompts[0].rsplit("/", 1))]  # type: ignore[index]
        assert output["completion_ids"] == [r["response_token_ids"] for r in group]
        assert output["reward"] == [r["reward"] for r in group]
        assert want_mean == pytest.approx(sum(r["reward"] for r in group) / size, abs=1e-4)


def test_grpo_without_vllm_ignores_the_recorded_logprobs_as_the_docs_say(
    folder, records, tokenizer, tiny_model, tmp_path
):
    convert(folder, "trl", tmp_path / "o", stages="solver")
    namespace = replay(tmp_path)
    groups = stage_groups([r for r in records if r["stage"] == "solver"])
    keys = [f"{pid}/{stage}" for pid, stage in list(groups)[:1]]

    def perturbed(prompts: list[str], trainer: Any) -> dict[str, Any]:
        output = namespace["rollout_func"](prompts, trainer)
        return {**output, "logprobs": [[-50.0] * len(lp) for lp in output["logprobs"]]}

    weights = []
    for i, func in enumerate((namespace["rollout_func"], perturbed)):
        torch.manual_seed(0)
        trainer = grpo(tiny_model, tmp_path / str(i), func, keys, 9, tokenizer, max_steps=1)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train()
        after = list(trainer.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))  # the step did train
        weights.append([p.detach().clone() for p in after])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))
    doc = " ".join((ROOT / "docs" / "convert.md").read_text().split())
    assert "an offline replay ignores the recorded logprobs" in doc


def test_the_token_exact_dpo_recipe_trains_dpotrainer_on_the_recorded_ids(
    folder, records, tokenizer, tiny_model, tmp_path
):
    from trl import DPOConfig, DPOTrainer

    convert(folder, "dpo", tmp_path / "o", max_pairs_per_group=2)
    rows = lines(tmp_path / "o" / "dpo.jsonl")
    namespace: dict[str, Any] = {}
    exec(doc_code("dpo-token-exact"), namespace)
    dataset = namespace["token_exact_dataset"](str(tmp_path / "o" / "dpo.jsonl"))
    args = cpu_args(DPOConfig, tmp_path, per_device_train_batch_size=4, max_length=None)
    trainer = namespace["TokenExactDPOTrainer"](
        model=str(tiny_model), args=args, train_dataset=dataset, processing_class=tokenizer
    )
    prepared = trainer.train_dataset
    assert len(prepared) == len(rows) > 0
    truncated = {tuple(r["response_token_ids"]) for r in records if r["status"] == "truncated"}
    assert any(tuple(r["rejected_token_ids"]) in truncated for r in rows)  # the case TRL got wrong is here
    for example, row in zip(prepared, rows, strict=True):
        assert example["prompt_ids"] == row["prompt_token_ids"]
        assert example["chosen_ids"] == row["chosen_token_ids"]
        assert example["rejected_ids"] == row["rejected_token_ids"]
    batch = trainer.data_collator([prepared[i] for i in range(2)])
    assert (
        batch["input_ids"][0][: len(rows[0]["prompt_token_ids"] + rows[0]["chosen_token_ids"])].tolist()
        == rows[0]["prompt_token_ids"] + rows[0]["chosen_token_ids"]
    )
    assert trainer.train().global_step == 1
    # why the recipe: TRL's own preparation of the same rows tokenizes the text again and changes the ids
    stock = DPOTrainer(
        model=str(tiny_model),
        args=cpu_args(DPOConfig, tmp_path / "stock", max_length=None),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    assert any(e["chosen_ids"] != r["chosen_token_ids"] for e, r in zip(stock.train_dataset, rows, strict=True))


def test_the_sft_recipe_trains_sfttrainer_on_the_recorded_ids_and_labels(folder, tiny_model, tmp_path):
    convert(folder, "sft", tmp_path / "o", layout="standard")
    rows = lines(tmp_path / "o" / "sft.jsonl")
    namespace: dict[str, Any] = {}
    exec(doc_code("sft-train"), namespace)
    from trl import SFTConfig

    args = cpu_args(SFTConfig, tmp_path, per_device_train_batch_size=4, max_length=None)
    trainer = namespace["sft_trainer"](str(tiny_model), args, str(tmp_path / "o" / "sft.jsonl"))
    prepared = trainer.train_dataset
    assert [e["input_ids"] for e in prepared] == [r["input_ids"] for r in rows]
    batch = trainer.data_collator([prepared[i] for i in range(2)])
    for i in range(2):
        width = len(rows[i]["labels"])
        assert batch["labels"][i][:width].tolist() == rows[i]["labels"]  # -100 on the prompt, kept as written
    assert trainer.train().global_step == 1
