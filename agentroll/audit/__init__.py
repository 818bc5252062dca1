"""`agentroll audit`: recompute a folder's recorded logprobs with the trainer's own model and compare (docs/audit.md).

Logprob mismatch between the inference engine and the trainer is a silent fault of RL for LLMs: a different
chat template, a wrong logprobs mode, another dtype or kernel. The audit loads the model with transformers,
teacher-forces each audited conversation (prompt + response ids; a multi-turn conversation whole, from its last
turn) and compares the logprob of every sampled token with the recorded one, applying how it was sampled
(`logprobs.py`). It also checks each first-turn prompt against a fresh rendering with the model's chat template
(`template.py`), and how each response ended against its own tokens (`units.record_faults`). What fails or
warns about the folder as a whole (another chat template than the model's, prompts that cannot be re-rendered,
shards edited after the run, nothing compared at all) is `gates.py`.

    from agentroll.audit import AuditOptions, audit
    report = audit("out", AuditOptions(model="Qwen/Qwen3-0.6B", sample=200))

Needs `pip install 'agentroll[torch]'`; importing this package does not import torch (`audit` does).
"""

from __future__ import annotations

from typing import Any

from .options import AuditOptions, Tolerance

__all__ = ["AuditOptions", "Tolerance", "audit"]


def audit(folder: Any, options: AuditOptions, progress: Any = None) -> dict[str, Any]:
    """The audit's report as a dict (`ok`: every audited record within tolerance). See `run.audit`."""
    from .run import audit as run

    return run(folder, options, progress)
