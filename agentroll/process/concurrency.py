"""`gather_or_cancel`: the one way calls of an execution run side by side."""

from __future__ import annotations

import asyncio
from typing import Any


async def gather_or_cancel(*aws: Any) -> list[Any]:
    """`gather`, but the first failure cancels the rest: a failed execution's other calls are not worth paying
    for, and vLLM frees their KV cache when their connections close."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
