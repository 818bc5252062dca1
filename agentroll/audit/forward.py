"""The trainer's side: the model loaded with transformers, teacher-forced over units in padded batches (needs
torch).

One forward pass per batch of units, right-padded, with `logits_to_keep` so that only the positions that
predict a compared token (and those after them) get logits: their memory is about batch tokens x vocabulary x
4 bytes. The logprob of token t is read from the logits at t - 1, as a trainer reads it.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UsageError, first_line
from .logprobs import Sampling, sampled_logprobs
from .units import Unit

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOGIT_ROWS = 1 << 25  # logits (rows x vocabulary) processed at once for processed logprobs


def pick_device(name: str) -> torch.device:
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise UsageError(f"--device {name!r}: {first_line(exc)}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {name}: this torch sees no CUDA device")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _pretrained(loader: Any, what: str, name: str, **kwargs: Any) -> Any:
    """`loader.from_pretrained(name)`: from disk (a path, or the hub cache) first, then from the hub; one
    `UsageError` line otherwise."""
    local = os.path.exists(name) or name.startswith(("/", "./", "../", "~"))
    try:
        return loader.from_pretrained(name, local_files_only=True, **kwargs)
    except Exception as exc:  # OSError, ValueError, hub errors...
        if local:
            raise UsageError(f"cannot load {what} {name!r}: {first_line(exc)}") from exc
        try:
            return loader.from_pretrained(name, **kwargs)
        except Exception as exc2:
            raise UsageError(f"cannot load {what} {name!r}: {first_line(exc2)}") from exc2


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def load_model(name: str, dtype: str, device: torch.device) -> Any:
    """`AutoModelForCausalLM` in eval mode on `device`, in `dtype` (`auto`: the checkpoint's own)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kind = "auto" if dtype == "auto" else DTYPES[dtype]
    key = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    return _pretrained(AutoModelForCausalLM, "model", name, **{key: kind}).to(device).eval()


def load_tokenizer(name: str) -> Any:
    """The model's tokenizer (a chat template is not required: a base model's prompts are not re-rendered)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return _pretrained(AutoTokenizer, "tokenizer", name)


@dataclass(slots=True)
class TurnResult:
    """One turn's compared tokens: recorded and recomputed logprobs and a code each (logprobs.OK, ...)."""

    recorded: list[float]
    recomputed: list[float]
    codes: list[int]


class TeacherForcing:
    """Recomputes the logprobs of units' turns with `model`, in batches of at most `batch_tokens` padded tokens."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        mode: str,
        cut_noise: float,
        ambiguity: float,
        batch_tokens: int,
        pad_id: int = 0,
        recorded: str = "response_logprobs",
    ) -> None:
        self.model, self.device, self.mode = model, device, mode
        self.recorded = recorded  # the record's field compared: the sampled logprobs, or a teacher's scores
        self.cut_noise, self.ambiguity = cut_noise, ambiguity
        self.batch_tokens, self.pad_id = batch_tokens, pad_id
        self.keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.vocab = int(model.get_output_embeddings().weight.shape[0])

    def batches(self, units: Iterable[Unit], buffer: int = 256) -> Iterator[list[Unit]]:
        """Units grouped by length (less padding): up to `buffer` at a time, sorted, cut at the token budget."""
        pending: list[Unit] = []

        def flush() -> Iterator[list[Unit]]:
            pending.sort(key=lambda u: len(u.tokens))
            batch: list[Unit] = []
            for unit in pending:
                if batch and (len(batch) + 1) * len(unit.tokens) > self.batch_tokens:
                    yield batch
                    batch = []
                batch.append(unit)
            if batch:
                yield batch
            pending.clear()

        for unit in units:
            pending.append(unit)
            if len(pending) >= buffer:
                yield from flush()
        yield from flush()

    @torch.inference_mode()
    def run(self, batch: list[Unit], on_turn: Callable[[Unit, int, TurnResult], None]) -> None:
        """Forward `batch`; `on_turn(unit, turn index, result)` for every turn of every unit."""
        width = max(len(u.tokens) for u in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, unit in enumerate(batch):
            ids[row, : len(unit.tokens)] = torch.tensor(unit.tokens, dtype=torch.long)
            mask[row, : len(unit.tokens)] = 1
        starts = [t.begin - 1 for u in batch for t in u.turns if t.record["response_token_ids"] and t.begin > 0]
        first = max(0, min(starts, default=width - 1))
        kwargs = {"logits_to_keep": width - first} if self.keep else {}
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs).logits
        offset = width - logits.shape[1]  # position of logits[:, 0]
        for row, unit in enumerate(batch):
            for i, turn in enumerate(unit.turns):
                record = turn.record
                tokens = record["response_token_ids"]
                if not tokens or turn.begin < 1:  # nothing to compare, or no logit predicts the first token
                    on_turn(unit, i, TurnResult([], [], []))
                    continue
                rows = logits[row, turn.begin - 1 - offset : turn.begin - 1 - offset + len(tokens)]
                target = torch.tensor(tokens, dtype=torch.long, device=rows.device)
                kept = record.get("sampling_mask") if self.recorded == "response_logprobs" else None
                kept = kept if isinstance(kept, list) and len(kept) == len(tokens) else None
                values, codes = self._logprobs(rows, target, Sampling.of(record), kept)
                on_turn(unit, i, TurnResult([float(x) for x in record[self.recorded]], values, codes))

    def _logprobs(
        self, rows: torch.Tensor, target: torch.Tensor, sampling: Sampling, kept: list[list[int]] | None = None
    ) -> tuple[list[float], list[int]]:
        step = max(1, LOGIT_ROWS // max(1, rows.shape[-1]))
        values: list[float] = []
        codes: list[int] = []
        for begin in range(0, rows.shape[0], step):
            v, c = sampled_logprobs(
                rows[begin : begin + step],
                target[begin : begin + step],
                self.mode,
                sampling,
                self.cut_noise,
                self.ambiguity,
                None if kept is None else kept[begin : begin + step],
            )
            values += v.double().cpu().tolist()
            codes += c.cpu().tolist()
        return values, codes
