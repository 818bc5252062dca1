"""`--system-option sampling=run`: the agent proxy sends the run's sampling whatever the agent asks, and each
record keeps what the agent asked (`agent_sampling`) beside what was sent (`sampling`); the default honours the
agent's own parameters, as before."""

from __future__ import annotations

from typing import Any

import pytest

from agentroll.errors import UsageError

from .conftest import generations
from .test_agent_proxy import USER, run, serve  # noqa: F401 - `serve` is a fixture

RUN = {"temperature": 0.7, "top_p": 0.95, "top_k": 12, "max_tokens": 256}
HARD_CODED = {"temperature": 0.0, "top_p": 0.5, "max_tokens": 20}  # a harness's own, as a title generator's


async def harness(client: Any, problem: dict) -> None:
    await client.chat.completions.create(model="m", messages=USER, **HARD_CODED)
    await client.chat.completions.create(model="m", messages=USER)  # asks nothing: the run's
    await client.completions.create(model="m", prompt="2 plus 2 is", temperature=0.2, max_tokens=5)


def sent(server: Any) -> list[dict[str, Any]]:
    return [e["request"] for e in generations(server)]


@pytest.mark.parametrize("mode", ["agent", "run"])
def test_a_pinned_agent_run_sends_the_run_sampling_and_records_what_the_agent_asked(serve, mode):  # noqa: F811
    server = serve()
    options = {k: v for k, v in RUN.items() if k != "max_tokens"}
    _, group = run(server, harness, system_option=[f"sampling={mode}"], **options)
    samples = group.executions[0]
    requests = sent(server)
    assert len(samples) == len(requests) == 3
    if mode == "run":
        for request in requests:
            assert {k: request[k] for k in RUN} == RUN, request
        asked = sorted((s.agent_sampling for s in samples), key=len)
        assert asked == [{}, {"temperature": 0.2, "max_tokens": 5}, HARD_CODED]
        assert all({k: s.sampling[k] for k in RUN} == RUN for s in samples)
    else:  # as before: what the agent set is sent
        got = sorted((request["temperature"], request["max_tokens"]) for request in requests)
        assert got == [(0.0, 20), (0.2, 5), (0.7, 256)]
        assert all(s.agent_sampling is None for s in samples)


def test_sampling_takes_agent_or_run(serve):  # noqa: F811
    with pytest.raises(UsageError, match="sampling='fixed': must be agent or run"):
        run(serve(), harness, system_option=["sampling=fixed"])
