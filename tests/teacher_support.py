"""What the teacher tests share: a simulated teacher, another vocabulary for one, and the scores a record's ids
should get from a simulated teacher (its `Scorer`, asked directly)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agentroll.process.resources import sim_tokenizer_dir
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer


def teacher_server(problems: Path, tokenizer_dir: Path | None = None, **kwargs: Any) -> SimServer:
    """A second simulated server, another model (`big`, another seed), serving as a teacher."""
    extra = {"tokenizer_dir": tokenizer_dir} if tokenizer_dir is not None else {}
    server = SimServer(script=Script.from_jsonl(problems), model="big", seed=5, **extra, **kwargs)
    server.start()
    return server


def other_vocabulary(folder: Path, how: str) -> Path:
    """The simulator's tokenizer changed: `larger` has one more added token at the end; `swapped` gives two
    common pieces each other's ids (every probe with them tokenizes otherwise)."""
    shutil.copytree(sim_tokenizer_dir(), folder)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    if how == "larger":
        top = max(t["id"] for t in data["added_tokens"])
        data["added_tokens"].append(
            {
                "id": top + 1,
                "content": "<extra>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    else:
        vocab = data["model"]["vocab"]
        vocab["e"], vocab["t"] = vocab["t"], vocab["e"]
    path.write_text(json.dumps(data))
    return folder


def expected(server: SimServer, record: dict[str, Any], k: int) -> dict[str, Any]:
    """The teacher fields `server` (a simulated teacher) gives `record`'s response, computed without HTTP."""
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    sequence = prompt + response
    entries = server.engine.scorer.prompt_logprobs(sequence, k)[len(prompt) :]
    own = [e[str(t)] for e, t in zip(entries, response, strict=True)]
    out: dict[str, Any] = {
        "teacher_logprobs": [o["logprob"] for o in own],
        "teacher_ranks": [o["rank"] for o in own],
        "teacher_top_ids": None,
        "teacher_top_logprobs": None,
    }
    if k:
        ranked = [sorted((v["rank"], int(t), v["logprob"]) for t, v in e.items() if v["rank"] <= k) for e in entries]
        out["teacher_top_ids"] = [[t for _, t, _ in r] for r in ranked]
        out["teacher_top_logprobs"] = [[v for _, _, v in r] for r in ranked]
    return out


def teacher_fields(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in ("teacher_logprobs", "teacher_ranks", "teacher_top_ids", "teacher_top_logprobs")}
