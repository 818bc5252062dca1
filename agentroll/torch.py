"""A PyTorch `IterableDataset` over an output folder (or a merged one), for a plain training loop.

    from torch.utils.data import DataLoader
    from agentroll.torch import RolloutDataset, collate

    data = RolloutDataset("out", stages=["solver"])
    loader = DataLoader(data, batch_size=8, num_workers=2, collate_fn=collate)

Each item is one record (one LLM call) laid out as the trainer sees it: `input_ids` is the prompt followed by the
response, and `loss_mask` and `logprobs` are aligned with it position for position (0 on the prompt), so the
loss of token `t` is read at the same index in all three (and in `teacher_logprobs`, an item's when a teacher
scored it: `--teacher`, `agentroll distill`; 0.0 where nothing was scored). The unit of work split among
DataLoader workers (and distributed ranks) is the shard, so that no record is read twice and groups stay whole
and in order; a folder should have at least as many shards as workers times ranks (`generate --shard-size`), or
some stay idle.

Stages are the folder's system's (`settings.system.stages`; three-stage for a folder without one). Records
marked `trainable: false` (a frozen stage, e.g. a judge served by another model) are left out unless
`include_frozen=True`, which trains them as generated tokens (mask 1 on their response, although their own
`loss_mask` is 0: a sample kept only to be masked out would train nothing).

**Multi-turn trajectories** (`trajectory=True`): a record that continues an earlier call of its execution holds
the whole conversation so far in its prompt, with `history_mask` / `history_logprobs` over it. With
`trajectory=True` each item is one whole conversation, from its last turn: `input_ids` = that record's prompt +
response (every turn's tokens, token-exact), `loss_mask` = `history_mask` + `loss_mask` (1 on every token the
model sampled, in any turn; 0 on what the template, the system or the user injected), `logprobs` =
`history_logprobs` + `response_logprobs`, and `reward`, `stage`, `rollout_id` of the last turn. The records
that a later turn continues are not items of their own (they are inside it); a record nothing continues is its
own one-turn item, exactly as without the option (so a three-stage folder gives the same items). Unless
`include_frozen`, a frozen turn's tokens are masked out (mask 0, logprob 0.0) of the conversation that holds
them, and a conversation ends at its last trainable turn (one that ends on a frozen turn is the trainable part
before it). `stages` then selects by the stage of that last turn. The items
have the same keys and shapes either way, so `collate` serves both.

**Sampling masks** (a folder made with `--return-sampling-mask`): each item also has `sampling_mask`, int64 of
shape (len(input_ids), K), the ids the sampler kept when the token at that position was sampled, -1-padded (all
-1 on the prompt and where the loss mask is 0); `collate` pads it to (B, T, K) with -1. A loss that renormalises
its logits over it (`logits.masked_fill` of everything else with -inf, at the position that predicts the token)
computes the sampling policy's logprobs, as prime-rl's sampling replay does.

torch is optional: `import agentroll` never imports it, and importing this module without it says how to get it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .convert.masks import kept_sets
from .convert.teacher import aligned
from .convert.trajectory import Trajectory, executions, own_mask, trainable, trajectories
from .errors import OutputError, UsageError
from .folder import ShardFile, load_manifest, shard_files, shard_records
from .folder.masks import load as load_mask
from .folder.routes import Sidecar
from .tools.system import system_of

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    raise ModuleNotFoundError(
        "agentroll.torch needs PyTorch, which agentroll does not install by default: "
        "pip install 'agentroll[torch]' (or pip install torch)",
        name="torch",
    ) from exc

__all__ = ["RolloutDataset", "collate", "to_tensors"]

Item = dict[str, Any]
_STRINGS = ("problem_id", "stage", "rollout_id")


def to_tensors(record: dict[str, Any]) -> Item:
    """One record as a training item: `input_ids` (prompt + response, int64), `loss_mask` (int64: 0 on the
    prompt, the record's mask on the response), `logprobs` (float32: 0.0 on the prompt, the server's logprobs on
    the response), `reward` (0-d float32: the shaped reward), `baseline` (0-d float32: the record's
    `stage_group_reward_mean`, its group's mean over the K executions' conversations, `agentroll.record.group`: the same
    for every call of one conversation) and `problem_id`, `stage`, `rollout_id` (str)."""
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    logprobs, mask = record["response_logprobs"], record["loss_mask"]
    if not len(response) == len(logprobs) == len(mask):
        # a misaligned record would silently shift the loss onto the wrong tokens: refuse it
        raise OutputError(
            f"record {record.get('rollout_id')} ({record.get('stage')}): {len(response)} response "
            f"tokens, {len(logprobs)} logprobs, {len(mask)} loss mask entries"
        )
    pad = [0] * len(prompt)
    teacher = record.get("teacher_logprobs")
    return {
        "input_ids": torch.tensor(prompt + response, dtype=torch.long),
        "loss_mask": torch.tensor(pad + mask, dtype=torch.long),
        "logprobs": torch.tensor(pad + logprobs, dtype=torch.float32),
        "reward": torch.tensor(float(record["reward"]), dtype=torch.float32),
        "baseline": _baseline(record),
        **{key: str(record[key]) for key in _STRINGS},
        **({} if teacher is None else {"teacher_logprobs": torch.tensor(pad + teacher, dtype=torch.float32)}),
        **_kept([[] for _ in prompt] + mask_of(record) if isinstance(record.get("sampling_mask"), list) else None),
    }


def mask_of(record: dict[str, Any]) -> list[list[int]]:
    """A record's sampling mask over its response, [] where its loss mask is 0."""
    return [list(step) if m else [] for step, m in zip(record["sampling_mask"], record["loss_mask"], strict=True)]


def _kept(sets: list[list[int]] | None) -> Item:
    """`sampling_mask` (int64, (len(input_ids), K), -1-padded): the ids the sampler kept at each position
    (`--return-sampling-mask`; all -1 where there is none), so a loss renormalises over them as the sampler did."""
    if sets is None:
        return {}
    out = torch.full((len(sets), max([len(s) for s in sets] + [1])), -1, dtype=torch.long)
    for at, kept in enumerate(sets):
        out[at, : len(kept)] = torch.tensor(kept, dtype=torch.long)
    return {"sampling_mask": out}


def _baseline(record: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(float(record.get("stage_group_reward_mean") or 0.0), dtype=torch.float32)


def trajectory_tensors(found: Trajectory) -> Item:
    """A whole conversation as a training item (see the module's docstring): the keys of `to_tensors`, over the
    last turn's prompt + response, with the history mask and logprobs on the earlier turns."""
    record = found.record
    scores = aligned(found)
    return {
        "input_ids": torch.tensor(found.tokens, dtype=torch.long),
        "loss_mask": torch.tensor(found.mask, dtype=torch.long),
        "logprobs": torch.tensor(found.logprobs, dtype=torch.float32),
        "reward": torch.tensor(float(record["reward"]), dtype=torch.float32),
        "baseline": _baseline(record),
        **{key: str(record[key]) for key in _STRINGS},
        **({} if scores is None else {"teacher_logprobs": torch.tensor(scores.logprobs, dtype=torch.float32)}),
        **_kept(kept_sets(found)),
    }


class RolloutDataset(IterableDataset[Item]):
    """The records of an output folder as `to_tensors` items, in manifest order, each exactly once per epoch.

    The shard list is read from the manifest here, once, so every worker and rank splits the same list: worker
    `w` of `W` on rank `r` of `R` reads shards `r * W + w`, stepping by `R * W`. `rank` and `world_size` default
    to `torch.distributed`'s when it is initialized at construction (construct the dataset after
    `init_process_group`, or pass them): read in a DataLoader worker they would be lost under `spawn`. Ranks may
    get unequal record counts; a DDP loop must tolerate that (e.g. `Join`) or stop at the shortest rank.

    `stages` keeps only those stages' records (e.g. `["solver"]`); a name the folder's system does not have is
    a `UsageError`. `include_frozen` keeps the records marked `trainable: false`. `trajectory` makes each item a
    whole multi-turn conversation (the module's docstring). `shuffle_shards` shuffles the shard order by `seed`
    and the epoch (`set_epoch`, as with `DistributedSampler`); records inside a shard keep their order, so a
    problem's group stays contiguous. The folder must be finished: to train on a live run, use
    `agentroll.read_groups(path, follow=True)`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stages: Iterable[str] | str | None = None,
        trajectory: bool = False,
        include_frozen: bool = False,
        shuffle_shards: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        manifest = load_manifest(self.path)
        files = shard_files(self.path, manifest)  # each there and of its size, or one OutputError line
        self._files: dict[Path, ShardFile] = {f.path: f for f in files}
        self.shards: list[Path] = [f.path for f in files]
        self.system = system_of(manifest)
        if isinstance(stages, str):
            stages = [stages]
        self.stages = None if stages is None else frozenset(stages)
        if self.stages is not None and not all(isinstance(s, str) and s for s in self.stages):
            raise UsageError(f"stages {sorted(map(repr, self.stages))}: a stage is a non-empty string")
        known = self.system.stages
        if self.stages is not None and known is not None and not self.stages <= set(known):
            # a typo would otherwise yield nothing, silently
            raise UsageError(
                f"stages {sorted(self.stages - set(known))}: the {self.system.name} system's stages "
                f"are {', '.join(known)}"
            )
        self.trajectory, self.include_frozen = trajectory, include_frozen
        self.shuffle_shards, self.seed, self.epoch = shuffle_shards, seed, 0
        if (rank is None) != (world_size is None):
            raise UsageError("give both rank and world_size, or neither")
        if rank is None or world_size is None:
            rank, world_size = _distributed()
        if not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is not in 0..{world_size - 1}")
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        """The epoch that seeds the shard shuffle. Call it before iterating; workers started with
        `persistent_workers=True` keep the epoch they were started with."""
        self.epoch = epoch

    def shard_order(self) -> list[Path]:
        """All shards in this epoch's order (identical in every worker and rank: the split depends on it)."""
        shards = list(self.shards)
        if self.shuffle_shards:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(shards)
        return shards

    def my_shards(self) -> list[Path]:
        """The shards this worker of this rank reads."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.shard_order()[self.rank * workers + worker :: self.world_size * workers]

    def __iter__(self) -> Iterator[Item]:
        for shard in self.my_shards():
            if self.trajectory:
                yield from self._trajectories(shard)
                continue
            for number, record in self._records(shard):
                if self.stages is not None and record["stage"] not in self.stages:
                    continue
                if not trainable(record):
                    if not self.include_frozen:
                        continue
                    record = {**record, "loss_mask": own_mask(record, True)}  # kept to be trained: as generated
                try:
                    yield to_tensors(record)
                except OutputError as exc:
                    raise OutputError(f"{shard}:{number}: {exc}") from None

    def _records(self, shard: Path) -> Iterator[tuple[int, dict[str, Any]]]:
        """The shard's records, each sampling mask read from its sidecar (routed experts are left there)."""
        with Sidecar(self._files[shard].routes, shard) as sidecar:
            for number, record in shard_records(self._files[shard]):
                ref = record.get("sampling_mask")
                if isinstance(ref, dict):
                    try:
                        record = {**record, "sampling_mask": load_mask(ref, sidecar.read)}
                    except (ValueError, OSError) as exc:
                        raise OutputError(f"{shard}:{number}: sampling_mask: {exc}") from None
                yield number, record

    def _trajectories(self, shard: Path) -> Iterator[Item]:
        """One item per conversation, an execution (consecutive records of one rollout) at a time."""
        first: dict[int, int] = {}  # id(an execution's first record) -> its line, for the error message

        def records() -> Iterator[dict[str, Any]]:
            start = rollout = object()
            for number, record in self._records(shard):
                if rollout is start or record.get("rollout_id") != rollout:
                    rollout = record.get("rollout_id")
                    first[id(record)] = number
                yield record

        for execution in executions(records()):
            line = first.pop(id(execution[0]), None)
            try:
                found = trajectories(execution, self.include_frozen)
            except ValueError as exc:
                raise OutputError(f"{shard}:{line}: {exc}") from None
            for item in found:
                if self.stages is None or item.record["stage"] in self.stages:
                    yield trajectory_tensors(item)


def collate(batch: Sequence[Item], pad_id: int = 0) -> Item:
    """Items padded on the right to the batch's longest: `input_ids` with `pad_id`, `attention_mask` (1 on real
    tokens), `loss_mask` and `logprobs` with 0 (so padding never counts in a loss), `reward` and `baseline` stacked
    to shape (B,), and the string fields as lists. Pass your tokenizer's pad id with `functools.partial(collate,
    pad_id=...)`: the masks already exclude padding, so any id the model can embed will do."""
    if not batch:
        raise ValueError("collate: an empty batch")

    def pad(key: str, value: float) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence([item[key] for item in batch], batch_first=True, padding_value=value)

    taught = [item.get("teacher_logprobs") for item in batch]  # an item no teacher scored: 0.0, as padding
    kept = [item.get("sampling_mask") for item in batch]
    return {
        "input_ids": pad("input_ids", pad_id),
        "attention_mask": torch.nn.utils.rnn.pad_sequence(
            [torch.ones_like(item["input_ids"]) for item in batch], batch_first=True, padding_value=0
        ),
        "loss_mask": pad("loss_mask", 0),
        "logprobs": pad("logprobs", 0.0),
        "reward": torch.stack([item["reward"] for item in batch]),
        "baseline": torch.stack([item["baseline"] for item in batch]),
        **{key: [item[key] for item in batch] for key in _STRINGS},
        **(
            {
                "teacher_logprobs": torch.nn.utils.rnn.pad_sequence(
                    [
                        t if t is not None else torch.zeros(len(item["input_ids"]))
                        for t, item in zip(taught, batch, strict=True)
                    ],
                    batch_first=True,
                    padding_value=0.0,
                )
            }
            if any(t is not None for t in taught)
            else {}
        ),
        **(
            {"sampling_mask": _pad_kept(kept, [len(item["input_ids"]) for item in batch])}
            if any(k is not None for k in kept)
            else {}
        ),
    }


def _pad_kept(kept: list[torch.Tensor | None], lengths: list[int]) -> torch.Tensor:
    """Items' `sampling_mask` as (B, T, K), -1 where nothing was kept (padding, items without one)."""
    width = max(k.shape[1] for k in kept if k is not None)
    out = torch.full((len(kept), max(lengths), width), -1, dtype=torch.long)
    for b, k in enumerate(kept):
        if k is not None:
            out[b, : k.shape[0], : k.shape[1]] = k
    return out


def _distributed() -> tuple[int, int]:
    """(rank, world size) of an initialized `torch.distributed` process group, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
