import asyncio

import pytest

from agentroll.errors import RewardError
from agentroll.rewards import ExactReward, MathReward, RewardRequest, make_reward


def score(reward, *pairs):
    requests = [RewardRequest(content, label, "problem", "solver") for content, label in pairs]
    try:
        return [r.value for r in asyncio.run(reward.score(requests))]
    finally:
        asyncio.run(reward.aclose())


def test_math_counts_equal_values_in_other_forms():
    got = score(MathReward(), ("so \\boxed{\\frac{84}{2}}", "42"), ("\\boxed{\\frac12}", "0.5"),
                ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}"), ("\\boxed{\\{2,1\\}}", "\\{1,2\\}"), ("\\boxed{41}", "42"),
                ("first \\boxed{42} then \\boxed{7}", "42"), ("42 without a box", "42"), (None, "42"),
                ("\\boxed{50\\%}", "0.5"), ("\\boxed{0.5}", "\\frac{1}{2}"))
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_math_explains_a_zero():
    reward = MathReward()
    try:
        results = asyncio.run(reward.score([RewardRequest("no box", "1", "p", "solver"),
                                            RewardRequest(None, "1", "p", "solver")]))
    finally:
        asyncio.run(reward.aclose())
    assert [r.info for r in results] == ["no \\boxed{} answer", "no answer content"]


def test_exact_normalizes_case_space_and_dollars():
    assert score(ExactReward(), ("\\boxed{ Paris }", "paris"), ("$x  +1$", "X +1"), ("\\boxed{1/2}", "0.5")) == [
        1.0, 1.0, 0.0]


def test_unknown_reward_is_an_error():
    with pytest.raises(RewardError):
        make_reward("nope")
