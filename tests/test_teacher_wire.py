"""A teacher's scores on the wire: vLLM 0.32's `prompt_logprobs` (captured from a real server), read into the
scores of the response ids, and the simulator answering them in the same shape, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentroll.client.wire import WireError, parse_scores, score_body

from .test_sim_wire import captured, post, shape

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_reads_the_own_token_and_the_top_k_from_a_real_vllm_answer():
    answer = captured("vllm032_prompt_logprobs_2.json")
    sent = answer["choices"][0]["prompt_token_ids"]
    (done,) = parse_scores(answer, [sent], [8], 2)  # the last three ids as a response
    entries = answer["choices"][0]["prompt_logprobs"]
    assert done.token_ids == sent[8:]
    assert done.logprobs == [entries[i][str(sent[i])]["logprob"] for i in (8, 9, 10)]
    assert done.ranks == [entries[i][str(sent[i])]["rank"] for i in (8, 9, 10)]
    for j, i in enumerate((8, 9, 10)):
        ranked = sorted((v["rank"], int(t), v["logprob"]) for t, v in entries[i].items() if v["rank"] <= 2)
        assert done.top_token_ids[j] == [t for _, t, _ in ranked] and len(ranked) == 2
        assert done.top_logprobs[j] == [v for _, _, v in ranked]
        assert done.top_logprobs[j][0] >= done.top_logprobs[j][1]
    assert done.finish_reason == "length"
    (plain,) = parse_scores(captured("vllm032_prompt_logprobs_0.json"), [sent], [1], 0)  # k 0: the own token alone
    assert plain.logprobs[7:] == done.logprobs and plain.top_token_ids is None


def test_parse_refuses_an_answer_that_is_not_aligned_with_the_ids_sent():
    answer = captured("vllm032_prompt_logprobs_0.json")
    sent = answer["choices"][0]["prompt_token_ids"]
    with pytest.raises(WireError, match="does not hold the token sent"):
        parse_scores(answer, [[*sent[:-1], sent[-1] + 1]], [5], 0)
    with pytest.raises(WireError, match="one entry per prompt token"):
        parse_scores(answer, [[*sent, 7]], [5], 0)
    with pytest.raises(WireError, match="1 choices for 2 sequences"):
        parse_scores(answer, [sent, sent], [5, 5], 0)
    no_scores = json.loads(json.dumps(answer))
    no_scores["choices"][0]["prompt_logprobs"] = None
    with pytest.raises(WireError):
        parse_scores(no_scores, [sent], [5], 0)


def test_the_simulator_scores_in_vllms_shape_the_same_whatever_k(sim):
    ids = [1, 320, 285, 17, 400, 2, 55, 66, 901]
    answers = {}
    for k in (0, 2, 5):
        status, body = post(
            f"{sim.url}/v1/completions", {**score_body("agentroll-sim", [ids], k), "return_token_ids": True}
        )
        assert status == 200
        answers[k] = body
    theirs = captured("vllm032_prompt_logprobs_2.json")
    ours = answers[2]
    assert set(ours) == set(theirs) and set(ours["choices"][0]) == set(theirs["choices"][0])
    entries = ours["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    real = next(iter(theirs["choices"][0]["prompt_logprobs"][1].values()))
    assert all(shape(v) == shape(real) for entry in entries[1:] for v in entry.values())
    for i in range(1, len(ids)):
        own = entries[i][str(ids[i])]
        assert next(iter(entries[i])) == str(ids[i])  # the own token first, as vLLM lists it
        assert len(entries[i]) in (2, 3) and own["logprob"] < 0
        assert sorted(v["rank"] for v in entries[i].values() if v["rank"] <= 2) == [1, 2]
    scored = {k: parse_scores(a, [ids], [1], k)[0] for k, a in answers.items()}
    assert scored[0].logprobs == scored[2].logprobs == scored[5].logprobs  # one distribution, however many listed
    assert scored[2].top_token_ids == [t[:2] for t in scored[5].top_token_ids]
    batch = [ids[:4], ids, ids[2:]]  # several sequences, one request: a choice each, scored alike
    status, body = post(f"{sim.url}/v1/completions", score_body("agentroll-sim", batch, 5))
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    first, again, _ = parse_scores(body, batch, [1, 1, 1], 5)
    assert first.logprobs == scored[5].logprobs[:3]
    assert again.logprobs == scored[5].logprobs and again.top_logprobs == scored[5].top_logprobs
    for r, lp, top, top_lp in zip(
        scored[5].ranks, scored[5].logprobs, scored[5].top_token_ids, scored[5].top_logprobs, strict=True
    ):
        assert len(set(top)) == 5 and top_lp == sorted(top_lp, reverse=True)
        if r <= 5:
            assert top_lp[r - 1] == lp
        else:
            assert lp < top_lp[-1]


def test_the_simulator_refuses_prompt_logprobs_as_vllm_does(sim):
    status, body = post(f"{sim.url}/v1/completions", score_body("agentroll-sim", [[1, 2, 3]], 21))
    assert status == 400
    assert body["error"]["message"].startswith("Requested prompt logprobs of 21, which is greater than max allowed: 20")
    status, body = post(f"{sim.url}/v1/completions", score_body("agentroll-sim", [[1, 2, 3]], -2))
    assert status == 400 and "must be a positive value or -1" in body["error"]["message"]
    status, body = post(
        f"{sim.url}/v1/completions", {**score_body("agentroll-sim", [[1, 2, 3]], 0), "prompt_logprobs": "a"}
    )
    assert status == 400 and "must be an integer" in body["error"]["message"]
