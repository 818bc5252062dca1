"""The garbage collector, set for a long run in one process (`agentroll generate`, `agentroll serve-sim`).

Once a run has started, what is loaded lives until the process ends: transformers' modules (it lists some 1,700
model files at import), the tokenizer, the templates, the client. CPython's full collections walk every object
the collector tracks, and the run's churn of small containers (parsed answers, token id lists) sets one off about
every second: ~70 ms each on these machines, during which the event loop answers nothing, so completion slots sit
idle and throughput drops (docs/performance.md, "Garbage collection"). `settle` collects once, then moves what
is there out of the collector's sight (`gc.freeze`), and lets more young objects pile up before a collection runs.
It acts only in a process the command line owns (`agentroll ...`, whose `main` calls `own`): a library caller's
process, or a test runner's, is its own business.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # allocations (less deallocations) of tracked objects before a young collection; CPython's is 700
_owned = False


def own() -> None:
    """The process is agentroll's command line (`agentroll.cli.main`): `settle` may set its collector."""
    global _owned
    _owned = True


def settle() -> None:
    """Freeze what is loaded now, and collect young objects in larger batches (call once the run has started)."""
    if not _owned:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
