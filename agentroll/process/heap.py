"""The garbage collector, set for a long run in one process (`agentroll generate`, `agentroll serve-sim`).

Once a run has started, what is loaded lives until the process ends: transformers' modules (it lists some 1,700
model files at import), the tokenizer, the templates, the client. CPython's full collections walk every object
the collector tracks, and the run's churn of small containers (parsed answers, token id lists) sets one off about
every second: ~70 ms each on these machines, during which the event loop answers nothing, so completion slots sit
idle and throughput drops (docs/performance.md, "Garbage collection").

So the collector is off from the moment the command starts (`own`) until its run has started (`settle`):
start-up is imports, whose objects all live on, and CPython's default of a collection per 700 allocations walked
them ~200 times for 60-70 ms. `settle` then collects once, moves what is loaded out of the collector's sight
(`gc.freeze`), turns it back on and lets young objects pile up in larger batches. That one collection frees next
to nothing, but it sets CPython's count of long-lived objects, which holds later full collections back until a
quarter as many new ones have piled up (docs/performance.md, "Garbage collection"). A command with no run to
start settles as soon as it is chosen (`agentroll.cli.root`).

It acts only in a process the command line owns (`agentroll ...`, whose `main` calls `own`): a library caller's
process, or a test runner's, is its own business.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # allocations (less deallocations) of tracked objects before a young collection; CPython's is 700
_owned = False


def own() -> None:
    """The process is agentroll's command line (`agentroll.cli.main`): its collector is off until `settle`."""
    global _owned
    _owned = True
    gc.disable()


def settle() -> None:
    """Freeze what is loaded now and collect again, in larger batches (call once the run has started)."""
    if not _owned:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
    gc.enable()
