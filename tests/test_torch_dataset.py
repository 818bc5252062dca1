"""`agentroll.torch.RolloutDataset` over a real folder: every record exactly once across DataLoader workers and
ranks, token-exact against the JSONL, masks and logprobs at the right offsets; and `collate`'s padding."""

from __future__ import annotations

import functools
import json
import shutil
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import agentroll.torch as agentroll_torch  # noqa: E402
from agentroll import read_records  # noqa: E402
from agentroll.errors import OutputError, UsageError  # noqa: E402
from agentroll.sim.script import Script  # noqa: E402
from agentroll.sim.server import SimServer  # noqa: E402
from agentroll.torch import RolloutDataset, collate  # noqa: E402

from . import synthetic  # noqa: E402
from .conftest import TOKENIZER, run_cli, write_problems  # noqa: E402

# a hint about this machine's core count, not a fault: CI runners may have fewer cores than the 2 workers here
MANY_WORKERS = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def generate(tmp: Path, name: str, *extra: str) -> Path:
    """A real folder of several shards (8 problems, N=2, K=2), the simulator stopped again before any DataLoader
    forks, so that no server thread is copied into a worker."""
    problems = write_problems(tmp / f"{name}.jsonl", 8)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        out = tmp / name
        result = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--reward",
            "exact",
            "--shard-size",
            "10",
            *extra,
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    finally:
        server.stop()
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("torch"), "out")


def jsonl(folder: Path) -> list[list[dict]]:
    """Each shard's records, read straight from the files the manifest names."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return [[json.loads(line) for line in (folder / s["file"]).read_text().splitlines()] for s in manifest["shards"]]


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def expected(record: dict) -> tuple:
    """What the item of a record must be, built from the JSON without torch."""
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    return (
        record["problem_id"],
        record["stage"],
        record["rollout_id"],
        tuple(prompt + response),
        tuple([0] * len(prompt) + record["loss_mask"]),
        tuple([0.0] * len(prompt) + [f32(x) for x in record["response_logprobs"]]),
        f32(record["reward"]),
    )


def key(item: dict) -> tuple:
    assert item["input_ids"].dtype == torch.long and item["loss_mask"].dtype == torch.long
    assert item["logprobs"].dtype == torch.float32 and item["reward"].dtype == torch.float32
    assert item["reward"].dim() == 0
    assert all(type(item[k]) is str for k in ("problem_id", "stage", "rollout_id"))
    return (
        item["problem_id"],
        item["stage"],
        item["rollout_id"],
        tuple(item["input_ids"].tolist()),
        tuple(item["loss_mask"].tolist()),
        tuple(item["logprobs"].tolist()),
        item["reward"].item(),
    )


def test_the_folder_has_several_shards_of_several_stages(folder):
    shards = jsonl(folder)
    assert len(shards) >= 4
    records = [r for shard in shards for r in shard]
    assert {r["stage"] for r in records} == {"solver", "rewriter", "selector"}
    assert len({r["reward"] for r in records}) > 1  # rewards that could be confused are not all equal


@pytest.mark.parametrize("workers", [0, 2])
@MANY_WORKERS
def test_every_record_once_token_exact_with_masks_and_logprobs_aligned(folder, workers):
    shards = jsonl(folder)
    items = list(DataLoader(RolloutDataset(folder), batch_size=None, num_workers=workers))
    assert Counter(map(key, items)) == Counter(expected(r) for shard in shards for r in shard)
    if workers == 0:
        assert [key(i) for i in items] == [expected(r) for shard in shards for r in shard]  # manifest order
    else:  # the loader takes from its workers in turn: the second item is the first of worker 1, shard 1
        assert key(items[0]) == expected(shards[0][0]) and key(items[1]) == expected(shards[1][0])
    for item in items:  # the offsets, spelled out once more on the tensors
        record = next(r for shard in shards for r in shard if expected(r) == key(item))
        p, n = len(record["prompt_token_ids"]), len(record["response_token_ids"])
        assert len(item["input_ids"]) == p + n
        assert item["input_ids"][p:].tolist() == record["response_token_ids"]
        assert not item["loss_mask"][:p].any() and item["loss_mask"][p:].tolist() == record["loss_mask"]
        assert not item["logprobs"][:p].any()
        assert torch.allclose(
            item["logprobs"][p:].double(), torch.tensor(record["response_logprobs"], dtype=torch.float64), atol=1e-6
        )


def test_workers_and_ranks_split_the_shards_into_a_partition(folder, monkeypatch):
    all_records = Counter(expected(r) for shard in jsonl(folder) for r in shard)
    for world in (1, 2):
        for workers in (1, 2, 3):
            seen: list[Path] = []
            got: Counter = Counter()
            for rank in range(world):
                data = RolloutDataset(folder, rank=rank, world_size=world, shuffle_shards=True, seed=3)
                for worker in range(workers):
                    monkeypatch.setattr(
                        agentroll_torch,
                        "get_worker_info",
                        lambda w=worker, n=workers: SimpleNamespace(id=w, num_workers=n),
                    )
                    seen += data.my_shards()
                    got.update(map(key, data))
            assert sorted(seen) == sorted(data.shards) and len(seen) == len(set(seen))
            assert got == all_records


def test_rank_and_world_size_come_from_torch_distributed_when_initialized(folder, monkeypatch):
    assert (RolloutDataset(folder).rank, RolloutDataset(folder).world_size) == (0, 1)
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    data = RolloutDataset(folder)
    assert (data.rank, data.world_size) == (1, 2)
    assert data.my_shards() == data.shards[1::2]
    with pytest.raises(UsageError):
        RolloutDataset(folder, rank=2, world_size=2)
    with pytest.raises(UsageError):
        RolloutDataset(folder, rank=0)


def test_shuffled_shards_are_the_same_shards_in_a_seeded_order_per_epoch(folder):
    data = RolloutDataset(folder, shuffle_shards=True, seed=7)
    orders = []
    for epoch in range(5):
        data.set_epoch(epoch)
        orders.append(data.shard_order())
        assert sorted(orders[-1]) == sorted(data.shards)
        assert RolloutDataset(folder, shuffle_shards=True, seed=7).shard_order() == orders[0]  # reproducible
    assert len({tuple(o) for o in orders}) > 1
    assert RolloutDataset(folder).shard_order() == data.shards  # unshuffled: manifest order


@MANY_WORKERS
def test_stages_filter(folder):
    records = [r for shard in jsonl(folder) for r in shard]
    for stages in (["solver"], "selector", ("rewriter", "selector")):
        wanted = {stages} if isinstance(stages, str) else set(stages)
        items = list(DataLoader(RolloutDataset(folder, stages=stages), batch_size=None, num_workers=2))
        assert Counter(map(key, items)) == Counter(expected(r) for r in records if r["stage"] in wanted)
        assert items
    with pytest.raises(UsageError, match="solvers"):
        RolloutDataset(folder, stages=["solvers"])


@MANY_WORKERS
def test_collate_pads_on_the_right_and_masks_the_padding(folder):
    items = Counter(map(key, RolloutDataset(folder)))
    loader = DataLoader(
        RolloutDataset(folder), batch_size=5, num_workers=2, collate_fn=functools.partial(collate, pad_id=-7)
    )
    batches = list(loader)
    padded, seen = 0, Counter()
    for batch in batches:
        size, width = batch["input_ids"].shape
        assert batch["attention_mask"].shape == batch["loss_mask"].shape == batch["logprobs"].shape == (size, width)
        assert batch["reward"].shape == (size,) and batch["reward"].dtype == torch.float32
        assert len(batch["problem_id"]) == len(batch["rollout_id"]) == size
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        assert max(lengths) == width
        for row, length in enumerate(lengths):
            assert batch["attention_mask"][row, :length].all() and not batch["attention_mask"][row, length:].any()
            assert (batch["input_ids"][row, length:] == -7).all()
            assert not batch["loss_mask"][row, length:].any() and not batch["logprobs"][row, length:].any()
            padded += width - length
            unpadded = {k: batch[k][row, :length] for k in ("input_ids", "loss_mask", "logprobs")}
            one = {
                **unpadded,
                "reward": batch["reward"][row],
                **{k: batch[k][row] for k in ("problem_id", "stage", "rollout_id")},
            }
            seen[key(one)] += 1
    assert seen == items  # each item in exactly one row, intact after unpadding
    assert padded > 0  # the batches did need padding
    with pytest.raises(ValueError):
        collate([])


@MANY_WORKERS
def test_spawned_workers_get_the_same_records(folder):
    """`spawn` (macOS, Windows; Linux's default from Python 3.14 is forkserver) pickles the dataset and the
    collate function into fresh interpreters."""
    loader = DataLoader(
        RolloutDataset(folder, stages=["solver"]),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=functools.partial(collate, pad_id=0),
    )
    got = Counter(rollout_id for batch in loader for rollout_id in batch["rollout_id"])
    solver = Counter(r["rollout_id"] for shard in jsonl(folder) for r in shard if r["stage"] == "solver")
    assert got == solver


def test_a_zstd_folder_gives_the_same_items(tmp_path):
    out = generate(tmp_path, "zst", "--compression", "zstd")
    shards = RolloutDataset(out).shards
    assert len(shards) > 1 and all(s.name.endswith(".jsonl.zst") for s in shards)
    assert Counter(map(key, RolloutDataset(out))) == Counter(map(expected, read_records(out)))


def test_a_misaligned_record_is_refused_with_its_shard_and_line(folder, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    shard = RolloutDataset(copy).shards[1]
    lines = shard.read_text().splitlines()
    record = json.loads(lines[2])
    record["loss_mask"].append(1)
    lines[2] = json.dumps(record)
    shard.write_text("\n".join(lines) + "\n")
    manifest = json.loads((copy / "manifest.json").read_text())  # written so: the file is what its entry says
    manifest["shards"][1]["bytes"] = shard.stat().st_size
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OutputError, match=rf"{shard.name}:3: .*{len(record['response_token_ids'])} response tokens"):
        list(RolloutDataset(copy))


def test_agentroll_never_imports_torch_and_its_absence_says_how_to_install():
    code = (
        "import sys; import agentroll; assert 'torch' not in sys.modules, 'agentroll imported torch'\n"
        "sys.modules['torch'] = None\n"
        "try:\n    import agentroll.torch\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'agentroll[torch]'" in result.stdout


# -- other systems, multi-turn trajectories (synthetic folders, tests/synthetic.py) ------------------------------


def flat(item: dict) -> tuple:
    return (
        item["stage"],
        item["rollout_id"],
        item["input_ids"].tolist(),
        item["loss_mask"].tolist(),
        [round(x, 5) for x in item["logprobs"].tolist()],
        item["reward"].item(),
    )


def spelled_out(records: list[dict], last: int, frozen: set[int] = frozenset()) -> tuple:
    """The trajectory ending at records[last], built here turn by turn from the responses (not from the history
    fields): each turn's prompt adds to the previous turn's tokens what the template injected (mask 0), then
    the turn's response: its loss mask, and its logprobs where that is 1 (0 for a turn in `frozen`); the last
    turn's logprobs as the server gave them, as for a single record."""
    chain = [last]
    while records[chain[-1]]["continues"] is not None:
        chain.append(records[chain[-1]]["continues"])
    tokens: list = []
    mask: list = []
    logprobs: list = []
    for i in reversed(chain):
        r = records[i]
        injected = r["prompt_token_ids"][len(tokens) :]
        masked = i in frozen
        tokens += injected + r["response_token_ids"]
        mask += [0] * len(injected) + ([0] * len(r["loss_mask"]) if masked else r["loss_mask"])
        logprobs += [0.0] * len(injected) + (
            r["response_logprobs"]
            if i == last
            else [0.0 if masked or not m else x for x, m in zip(r["response_logprobs"], r["loss_mask"], strict=True)]
        )
    r = records[last]
    assert tokens == r["prompt_token_ids"] + r["response_token_ids"]
    return (r["stage"], r["rollout_id"], tokens, mask, [round(f32(x), 5) for x in logprobs], f32(r["reward"]))


def executions_of(folder: Path) -> list[list[dict]]:
    out: list[list[dict]] = []
    for r in synthetic.records_of(folder):
        if not out or out[-1][0]["rollout_id"] != r["rollout_id"]:
            out.append([])
        out[-1].append(r)
    return out


def test_trajectories_are_whole_conversations_token_exact(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    a0, a1, b0, b1 = executions_of(folder)
    got = [flat(item) for item in RolloutDataset(folder, trajectory=True)]
    # each conversation once, from its last turn; the conversation that stopped after the solver is that call
    assert got == [spelled_out(a0, 2), spelled_out(a1, 0), spelled_out(b0, 1), spelled_out(b1, 2)]
    assert got[1] == flat(agentroll_torch.to_tensors(a1[0]))
    # the model's tokens of every turn are trained, the third solver token (outside its loss mask) and what the
    # template injected are not
    stage, _, tokens, mask, _, _ = got[0]
    assert stage == "reviser" and len(tokens) == 5 + 6 + 3 + 4 + 2 + 5
    assert mask == [0] * 5 + [1, 1, 0, 1, 1, 1] + [0] * 3 + [1] * 4 + [0] * 2 + [1] * 5
    # per record (the default): every call, its earlier turns in its prompt (mask 0)
    records = [flat(item) for item in RolloutDataset(folder)]
    assert len(records) == 9 and records[2][3][:20] == [0] * 20
    # the stage filter picks conversations by their last turn; collate pads them like any item
    last = [flat(item) for item in RolloutDataset(folder, trajectory=True, stages="reviser")]
    assert last == [got[0], got[3]]
    batch = collate(list(RolloutDataset(folder, trajectory=True)))
    assert batch["input_ids"].shape == (4, len(tokens)) and batch["loss_mask"].sum() == sum(sum(g[3]) for g in got)


def test_a_frozen_turn_is_masked_and_a_frozen_record_left_out(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    a0, a1, b0, b1 = executions_of(folder)
    per_record = [flat(item) for item in RolloutDataset(folder)]
    assert len(per_record) == 6 and all(stage != "critic" for stage, *_ in per_record)
    assert len(list(RolloutDataset(folder, include_frozen=True))) == 9
    got = [flat(item) for item in RolloutDataset(folder, trajectory=True)]
    # the critic's tokens are in the reviser's conversation but not trained; b0 ended on the frozen critic: its
    # conversation is the solver's call alone
    assert got == [spelled_out(a0, 2, {1}), spelled_out(a1, 0), spelled_out(b0, 0), spelled_out(b1, 2, {1})]
    assert got[0][3][14:18] == [0, 0, 0, 0] and spelled_out(a0, 2)[3][14:18] == [1, 1, 1, 1]
    everything = [flat(item) for item in RolloutDataset(folder, trajectory=True, include_frozen=True)]
    assert everything == [spelled_out(a0, 2), spelled_out(a1, 0), spelled_out(b0, 1), spelled_out(b1, 2)]


def test_a_three_stage_folder_gives_the_same_items_as_trajectories(folder):
    assert [key(i) for i in RolloutDataset(folder, trajectory=True)] == [key(i) for i in RolloutDataset(folder)]


def test_stages_are_the_systems(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    assert {flat(i)[0] for i in RolloutDataset(folder, stages=["critic"])} == {"critic"}
    with pytest.raises(UsageError, match="the critique-revise system's stages are solver, critic, reviser"):
        RolloutDataset(folder, stages=["rewriter"])
    debate = synthetic.debate(tmp_path / "debate")
    assert len(list(RolloutDataset(debate, stages="proposer"))) == 8
    assert list(RolloutDataset(debate, stages="judge")) == []  # frozen
    assert len(list(RolloutDataset(debate, stages="judge", include_frozen=True))) == 4
    legacy = synthetic.three_stage(tmp_path / "legacy")  # no system in its manifest: three-stage
    with pytest.raises(UsageError, match="the three-stage system's stages are solver, rewriter, selector"):
        RolloutDataset(legacy, stages="critic")


def test_a_conversation_whose_history_does_not_fit_is_refused_with_its_shard_and_line(tmp_path):
    folder = synthetic.edit(
        synthetic.critique_revise(tmp_path / "cr"), lambda rs: rs[8].update(history_mask=rs[8]["history_mask"][:-1])
    )
    shard = RolloutDataset(folder).shards[1]
    with pytest.raises(OutputError, match=rf"{shard.name}:3: .*record 2 \(reviser\) has a history_mask"):
        list(RolloutDataset(folder, trajectory=True))
    broken = synthetic.edit(synthetic.critique_revise(tmp_path / "cr2"), lambda rs: rs[2].update(continues=5))
    with pytest.raises(OutputError, match=r"rollouts-00000.jsonl:1: .*continues 5, not an earlier record"):
        list(RolloutDataset(broken, trajectory=True))
