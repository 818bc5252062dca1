"""Each branch of the agent-system semantics, against the simulated server with answers scripted per call."""

from __future__ import annotations

import asyncio

import pytest

from agentroll.client import CompletionClient
from agentroll.engine.pipeline import AgentSystem, ExecutionFailed, SystemConfig, call_seed
from agentroll.errors import InputError
from agentroll.inputs import Problem
from agentroll.record.stats import RunStats
from agentroll.render.chat import ChatEncoder, load_tokenizer
from agentroll.render.templates import Templates
from agentroll.rewards import RewardSet, RewardSettings
from agentroll.settings.sampling import Sampling
from agentroll.sim.script import Scripted
from agentroll.sim.server import HTTPFailure, SimServer, error_body

from .conftest import TOKENIZER, settings

SEED = 7
PROBLEM = Problem(id="p1", prompt="What is 40 plus 2?", label="42", metadata={"k": "v"}, line=1)
RIGHT = "<think>ok</think>The answer is \\boxed{42}."
WRONG = "<think>ok</think>The answer is \\boxed{41}."
OPEN = "<think>never closes"
FAIL = HTTPFailure(400, error_body("simulated bad request", "BadRequestError", 400))


class PerCall:
    """Answers keyed by (stage, worker), found through the per-call seed the pipeline sends."""

    def __init__(self, answers: dict[tuple[str, int], object]) -> None:
        self.answers = answers
        self.by_seed = {call_seed(SEED, PROBLEM.id, 0, stage, w): (stage, w) for stage, w in answers}

    def answer(self, prompt, rng, request=None):
        value = self.answers[self.by_seed[request["seed"]]]
        if isinstance(value, HTTPFailure):
            raise value
        return value if isinstance(value, Scripted) else Scripted(str(value))


def run(
    answers: dict[tuple[str, int], object],
    n: int = 3,
    max_context_len: int | None = None,
    stats: RunStats | None = None,
):
    server = SimServer(script=PerCall(answers))  # type: ignore[arg-type]
    server.start()
    stats = stats if stats is not None else RunStats()

    async def go():
        client = CompletionClient([server.url], settings(concurrency=8, max_retries=0))
        config = SystemConfig(
            model=server.model,
            num_parallel=n,
            seed=SEED,
            correct_reward_weight=2.0,
            incorrect_reward_weight=-1.0,
            sampling=Sampling(max_tokens=256),
            max_context_len=max_context_len,
        )
        rewards = RewardSet(RewardSettings("exact"))
        system = AgentSystem(client, ChatEncoder(load_tokenizer(TOKENIZER)), Templates(), rewards, config, stats)
        try:
            return await system.run(PROBLEM, 0)
        finally:
            await client.aclose()

    try:
        return asyncio.run(go()), stats, server.log
    finally:
        server.stop()


def solvers(*texts):
    return {("solver", w): t for w, t in enumerate(texts)}


def rewriters(*texts):
    return {("rewriter", w): t for w, t in enumerate(texts)}


def shape(samples):
    return [(s.stage, s.worker, s.raw_reward, s.reward) for s in samples]


def test_no_solver_answer_stops_after_the_solvers_with_the_incorrect_weight():
    cut = Scripted("<think>" + "step " * 300 + "</think>\\boxed{42}", truncate=True)
    samples, _stats, log = run(solvers(OPEN, "<think>x</think>  ", cut))
    assert [s.stage for s in samples] == ["solver"] * 3 and len(log) == 3
    assert all(s.content is None and s.reward == 0.0 for s in samples)
    assert samples[2].status == "truncated" and samples[0].status == "completed"


def test_rewriters_see_exactly_the_solver_answers_and_none_answering_stops_there():
    samples, _, _log = run({**solvers(RIGHT, OPEN, WRONG), **rewriters(OPEN, OPEN, OPEN)})
    assert shape(samples) == [
        ("solver", 0, 1.0, -1.0),
        ("solver", 1, 0.0, -0.0),
        ("solver", 2, 0.0, -0.0),
        ("rewriter", 0, 0.0, -0.0),
        ("rewriter", 1, 0.0, -0.0),
        ("rewriter", 2, 0.0, -0.0),
    ]
    rewriter_prompt = samples[3].prompt
    assert "### Solution 1\nThe answer is \\boxed{42}.\n\n### Solution 2\nThe answer is \\boxed{41}." in rewriter_prompt
    assert "### Solution 3" not in rewriter_prompt and "never closes" not in rewriter_prompt


def test_a_correct_pick_is_matched_by_position_among_listed_rewrites_and_pays_everyone():
    answers = {
        **solvers(RIGHT, RIGHT, RIGHT),
        **rewriters(WRONG, OPEN, RIGHT),
        ("selector", 0): "<think>hm</think>Judgment: 2",
    }
    samples, _, _ = run(answers)
    selector = samples[-1]
    assert (selector.judgment, selector.raw_reward, selector.reward) == (2, 1.0, 2.0)
    assert [s.listed_as for s in samples if s.stage == "rewriter"] == [1, None, 2]
    assert "### Solution 2\nThe answer is \\boxed{42}." in selector.prompt and "### Solution 3" not in selector.prompt
    assert [s.reward for s in samples] == [2.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert {s.rollout_id for s in samples} == {samples[0].rollout_id}
    assert {(s.rollout_size, s.final_reward) for s in samples} == {(7, 1.0)}


def test_selection_is_by_index_not_by_substring():
    # Rewrite 2's text is contained in rewrite 1's; a substring match would credit rewrite 1 (wrong).
    answers = {
        **solvers(RIGHT, RIGHT, RIGHT),
        **rewriters("<think>a</think>\\boxed{42} or rather \\boxed{1}", "<think>b</think>\\boxed{42}", OPEN),
        ("selector", 0): "<think>c</think>Judgment: 2",
    }
    samples, _, _ = run(answers)
    assert [s.raw_reward for s in samples if s.stage == "rewriter"] == [0.0, 1.0, 0.0]
    assert samples[-1].raw_reward == 1.0


@pytest.mark.parametrize(
    ("text", "info"),
    [
        ("<think>c</think>Judgment: 3", "judgment 3 out of range 1..2"),
        ("<think>c</think>I like both.", "no judgment"),
        ("<think>Judgment: 1", "no content"),
    ],
)
def test_a_pick_that_names_nothing_scores_zero_and_shapes_with_the_incorrect_weight(text, info):
    answers = {**solvers(RIGHT, RIGHT, RIGHT), **rewriters(RIGHT, RIGHT, OPEN), ("selector", 0): text}
    samples, _, _ = run(answers)
    assert (samples[-1].raw_reward, samples[-1].reward_info) == (0.0, info)
    assert [s.reward for s in samples] == [-1.0] * 5 + [-0.0, -0.0]


@pytest.mark.parametrize("failing", [("solver", 1), ("rewriter", 2), ("selector", 0)])
def test_a_call_that_fails_for_good_fails_the_execution_instead_of_shaping_it(failing):
    answers = {**solvers(RIGHT, RIGHT, RIGHT), **rewriters(RIGHT, RIGHT, RIGHT), ("selector", 0): "Judgment: 1"}
    answers[failing] = FAIL
    stats = RunStats()
    with pytest.raises(ExecutionFailed, match=f"{failing[0]} call failed: HTTP 400: simulated bad request"):
        run(answers, stats=stats)
    assert stats.stages[failing[0]].failed_calls == 1


def test_a_solver_prompt_that_leaves_no_room_is_a_bad_row_and_is_not_sent():
    stats = RunStats()
    with pytest.raises(InputError, match=r":1: field 'prompt': the rendered prompt has \d+ tokens: no room"):
        run(solvers(RIGHT, RIGHT, RIGHT), max_context_len=10, stats=stats)
    assert stats.stages["solver"].skipped_calls == 0


def test_records_are_token_exact_and_keep_the_eos_token():
    samples, _, log = run(solvers(OPEN, OPEN, OPEN))
    by_seed = {entry["request"]["seed"]: entry for entry in log}
    for sample in samples:
        entry = by_seed[call_seed(SEED, PROBLEM.id, 0, "solver", sample.worker)]
        choice = entry["response"]["choices"][0]
        assert sample.prompt_token_ids == entry["request"]["prompt"] == choice["prompt_token_ids"]
        assert sample.response_token_ids == choice["token_ids"]
        assert sample.response_logprobs == choice["logprobs"]["token_logprobs"]
        assert sample.loss_mask == [1] * len(sample.response_token_ids)
        assert sample.response_token_ids[-1] == 2 and sample.finish_reason == "stop"  # <|im_end|>
        assert sample.metadata == {"k": "v"} and sample.label == "42"
