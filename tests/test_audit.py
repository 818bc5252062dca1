"""`agentroll audit`, piece by piece: vLLM's processed logprobs against a plain re-statement of its rules, the
checks of how a response ended, the template check, the units of a multi-turn folder and the stratified sample."""

from __future__ import annotations

import math
import random

import pytest

from agentroll.audit.options import AuditOptions
from agentroll.audit.template import MATCH, MISMATCH, UNRECOVERABLE, TemplateCheck
from agentroll.audit.units import Selection, build, index, record_faults, stratified
from agentroll.errors import UsageError
from agentroll.render.chat import ChatEncoder

from . import synthetic
from .conftest import TOKENIZER

torch = pytest.importorskip("torch")

from agentroll.audit import logprobs as lp  # noqa: E402


def oracle(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> dict[int, float]:
    """vLLM's processed logprobs, said the plain way (most likely first), of the tokens its filters keep: min-p
    keeps a token whose probability is at least min_p times the top one's; top-k keeps the k largest logits;
    top-p keeps a token while the mass of the tokens more likely than it is below top_p."""
    s = [x / temperature for x in logits]
    kept = set(range(len(s)))
    if min_p > 0:
        top = max(s)
        kept = {i for i in kept if math.exp(s[i] - top) >= min_p}
    if 0 < top_k < len(s):
        kept = set(sorted(kept, key=lambda i: -s[i])[:top_k])
    if top_p < 1:
        z = sum(math.exp(s[i]) for i in kept)
        above, nucleus = 0.0, set()
        for i in sorted(kept, key=lambda i: -s[i]):
            if above < top_p:
                nucleus.add(i)
            above += math.exp(s[i]) / z
        kept = nucleus
    top = max(s[i] for i in kept)
    log_z = top + math.log(sum(math.exp(s[i] - top) for i in kept))
    return {i: s[i] - log_z for i in kept}


SAMPLINGS = [
    (1.0, -1, 1.0, 0.0),
    (0.7, -1, 1.0, 0.0),
    (1.0, 5, 1.0, 0.0),
    (0.5, 8, 0.9, 0.0),
    (1.3, -1, 0.8, 0.0),
    (1.0, -1, 1.0, 0.05),
    (0.6, 20, 0.95, 0.02),
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), SAMPLINGS)
def test_processed_logprobs_are_vllms_rules(temperature, top_k, top_p, min_p):
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(64, 50, generator=gen, dtype=torch.float64) * 2.5
    sampling = lp.Sampling(temperature, top_p, top_k, min_p)
    checked = outside = 0
    for row in range(logits.shape[0]):
        row_logits = logits[row].tolist()
        tokens = torch.arange(50)
        values, codes = lp.processed(logits[row].expand(50, -1), tokens, sampling, cut_noise=0.0, ambiguity=1e-6)
        kept = oracle(row_logits, temperature, top_k, top_p, min_p)
        for t in range(50):
            want = kept.get(t)
            if want is None:
                assert codes[t] == lp.OUTSIDE and values[t] == -math.inf, (row, t)
                outside += 1
            else:
                assert codes[t] == lp.OK, (row, t)
                assert values[t].item() == pytest.approx(want, abs=1e-5), (row, t)
                checked += 1
    assert checked > 64  # every row keeps at least its top token
    assert (outside > 0) == sampling.filters(50)


def test_raw_logprobs_ignore_the_sampling_and_plain_processed_ones_only_scale():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([0, 4, 9])
    raw, codes = lp.sampled_logprobs(logits, tokens, "raw_logprobs", lp.Sampling(0.5, 0.9, 3, 0.1), 0.0, 0.0)
    assert torch.allclose(raw, torch.log_softmax(logits, -1)[torch.arange(3), tokens]) and codes.eq(lp.OK).all()
    scaled, _ = lp.sampled_logprobs(logits, tokens, "processed_logprobs", lp.Sampling(0.5), 0.0, 0.0)
    assert torch.allclose(scaled, torch.log_softmax(logits / 0.5, -1)[torch.arange(3), tokens])


def test_a_token_at_the_edge_of_a_cut_is_not_compared():
    # top-k 2: the 2nd and 3rd logits 1e-6 apart, so another engine's logits could keep either
    logits = torch.tensor([[3.0, 1.0, 1.0 - 1e-6, -2.0]] * 4)
    tokens = torch.tensor([0, 1, 2, 3])
    values, codes = lp.processed(logits, tokens, lp.Sampling(1.0, 1.0, 2, 0.0), cut_noise=1e-3, ambiguity=1e-3)
    assert codes.tolist() == [lp.AMBIGUOUS, lp.AMBIGUOUS, lp.AMBIGUOUS, lp.OUTSIDE]
    clear = torch.tensor([[3.0, 1.0, 0.5, -2.0]] * 4)  # a clear gap: nothing ambiguous
    values, codes = lp.processed(clear, tokens, lp.Sampling(1.0, 1.0, 2, 0.0), cut_noise=1e-3, ambiguity=1e-3)
    assert codes.tolist() == [lp.OK, lp.OK, lp.OUTSIDE, lp.OUTSIDE]
    assert values[0].item() == pytest.approx(3.0 - math.log(math.exp(3) + math.exp(1)), abs=1e-6)


def test_greedy_with_filters_is_not_compared_without_them_it_is_raw():
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(3))
    tokens = logits.argmax(-1)
    _, codes = lp.processed(logits, tokens, lp.Sampling(0.0, 0.9, -1, 0.0), 1e-4, 1e-4)
    assert codes.eq(lp.UNCOMPARABLE).all()
    values, codes = lp.processed(logits, tokens, lp.Sampling(0.0), 1e-4, 1e-4)
    assert codes.eq(lp.OK).all() and torch.allclose(
        values, torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]
    )


def ended(ids: list[int], finish: str, stop: object = None, max_tokens: int = 8, prompt: int = 4) -> dict:
    record = synthetic.call("p", "r", 0, 1, "solver", list(range(prompt)), ids)
    record.update(
        finish_reason=finish,
        stop_reason=stop,
        status={"stop": "completed", "length": "truncated"}[finish],
        sampling={"max_tokens": max_tokens},
    )
    return record


EOS = frozenset({2})


@pytest.mark.parametrize(
    ("record", "kinds"),
    [
        (ended([5, 6, 2], "stop"), []),
        (ended([5, 6, 7], "stop"), ["eos"]),  # stop, no stop_reason: must end on EOS
        (ended([5, 2, 7, 2], "stop"), ["eos"]),  # an EOS before the end
        (ended([5, 6, 9], "stop", stop=9), []),  # a stop token id
        (ended([5, 6, 8], "stop", stop=9), ["eos"]),
        (ended([5, 6], "stop", stop="###"), []),  # a stop string: its tokens are not in the ids
        (ended([5] * 8, "length"), []),
        (ended([5] * 5, "length"), ["length"]),  # cut short of max_tokens with room left
        (ended([5] * 4, "length", max_tokens=8, prompt=12), []),  # ...but the context (16) is full
        (ended([5] * 7 + [2], "length"), ["eos"]),  # vLLM says stop on EOS
        (ended([5, 6, 2], "length", max_tokens=3) | {"status": "completed"}, ["eos", "status"]),
        (ended([5, 6, 2], "stop", prompt=0), ["lengths"]),  # no logit predicts the first token
    ],
    ids=lambda x: "" if isinstance(x, list) else None,
)
def test_how_a_response_ended_is_checked_against_its_tokens(record, kinds):
    assert sorted(kind for kind, _ in record_faults(record, EOS, 16)) == kinds


def test_a_misaligned_record_is_one_fault():
    record = ended([5, 6, 2], "stop")
    record["response_logprobs"] = [0.0]
    assert record_faults(record, EOS, None) == [("lengths", "3 response tokens but 1 logprobs")]


def test_the_template_check_recovers_the_messages_and_compares_ids():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    text, ids = ChatEncoder(tokenizer).encode(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 3?"}]
    )
    check = TemplateCheck(tokenizer, {})
    assert check.check({"prompt": text, "prompt_token_ids": ids}) == (MATCH, None)
    # the same text in other ids (a word split in two pieces): what a foreign tokenizer or template would give
    split = ids.copy()
    at = next(i for i, t in enumerate(ids) if len(tokenizer.decode([t])) > 2)
    piece = tokenizer.decode([ids[at]])
    split[at : at + 1] = tokenizer.encode(piece[:1], add_special_tokens=False) + tokenizer.encode(
        piece[1:], add_special_tokens=False
    )
    assert tokenizer.decode(split) == tokenizer.decode(ids) and split != ids
    verdict, detail = check.check({"prompt": text, "prompt_token_ids": split})
    assert verdict == MISMATCH and f"at token {at}" in detail
    assert check.check({"prompt": "no template here", "prompt_token_ids": [1]}) == (UNRECOVERABLE, None)


def test_a_multi_turn_folder_is_one_unit_per_conversation(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    selection = Selection(None, False, None)
    listed = index(folder, selection)
    # a: a 3-turn and a 1-turn execution; b: a 2-turn and a 3-turn one
    assert [(n, end, stage) for n, end, stage in listed] == [
        (0, 2, "reviser"),
        (1, 0, "solver"),
        (2, 1, "critic"),
        (3, 2, "reviser"),
    ]
    units = list(build(folder, listed, selection))
    assert [len(u.turns) for u in units] == [3, 1, 2, 3]
    for unit in units:
        last = unit.turns[-1].record
        assert unit.tokens == last["prompt_token_ids"] + last["response_token_ids"]
        for turn in unit.turns:  # each turn's response sits at its place in the conversation
            ids = turn.record["response_token_ids"]
            assert unit.tokens[turn.begin : turn.begin + len(ids)] == ids
            assert turn.faults == []


def test_frozen_turns_are_context_only_and_counted(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    selection = Selection(None, False, None)
    units = list(build(folder, index(folder, selection), selection))
    assert all(t.record["stage"] != "critic" for u in units for t in u.turns)
    assert selection.skipped == {"critic": {"frozen (trainable: false)": 3}}  # one per execution that got that far
    everything = Selection(None, True, None)  # --include-frozen
    units = list(build(folder, index(folder, everything), everything))
    assert sum(t.record["stage"] == "critic" for u in units for t in u.turns) == 3 and everything.skipped == {}


def test_a_history_that_disagrees_with_its_turn_is_a_fault(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")

    def damage(records):
        reviser = next(r for r in records if r["stage"] == "reviser")
        p = next(i for i, m in enumerate(reviser["history_mask"]) if m)
        reviser["history_logprobs"][p] += 0.5

    synthetic.edit(folder, damage)
    selection = Selection(None, False, None)
    faults = [f for u in build(folder, index(folder, selection), selection) for t in u.turns for f in t.faults]
    assert len(faults) == 1 and faults[0][0] == "history" and "history_logprobs" in faults[0][1]


def test_a_conversation_that_does_not_extend_its_turns_is_split(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")

    def damage(records):
        critic = next(r for r in records if r["stage"] == "critic")
        critic["prompt_token_ids"][0] += 1  # no longer starts with the solver's prompt

    synthetic.edit(folder, damage)
    selection = Selection(None, False, None)
    units = list(build(folder, index(folder, selection), selection))
    # the first execution's three turns (the damaged critic breaks the reviser's chain too) are one unit each
    assert [len(u.turns) for u in units] == [1, 1, 1, 1, 2, 3]


def test_the_sample_is_stratified_by_stage_and_deterministic():
    units = (
        [(i, 0, "solver") for i in range(60)]
        + [(60 + i, 0, "rewriter") for i in range(30)]
        + [(90 + i, 0, "selector") for i in range(3)]
    )
    chosen = stratified(units, 10, seed=5)
    assert chosen == stratified(units, 10, seed=5) != stratified(units, 10, seed=6)
    by_stage = {s: sum(u[2] == s for u in chosen) for s in ("solver", "rewriter", "selector")}
    assert by_stage == {"solver": 6, "rewriter": 3, "selector": 1}  # 6.45, 3.23, 0.32: one each at least
    assert len(set(chosen)) == 10 and chosen == sorted(chosen)
    assert stratified(units, None, 0) == units and stratified(units, 500, 0) == units
    rng = random.Random(0)
    for n in range(1, 93):
        assert len(stratified(rng.sample(units, 93), n, 1)) == n


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="--dtype"):
        AuditOptions(model="m", dtype="float8")
    with pytest.raises(UsageError, match="--logprobs-mode"):
        AuditOptions(model="m", logprobs_mode="raw_logits")
    with pytest.raises(UsageError, match="--sample 0"):
        AuditOptions(model="m", sample=0)
    with pytest.raises(UsageError, match="--max-abs"):
        AuditOptions(model="m", overrides={"max_abs": -1.0})
    options = AuditOptions(model="m", overrides={"threshold": 0.5})
    assert options.tolerance("bfloat16").threshold == 0.5 and options.preset("bfloat16") == "bfloat16"
    assert AuditOptions(model="m", precision="bfloat16").preset("float32") == "bfloat16"


def test_an_audit_of_nothing_is_refused_before_any_model_loads(tmp_path):
    from agentroll.audit import audit

    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    with pytest.raises(UsageError, match=r"no record to audit \(.*critic: 3 frozen \(trainable: false\)"):
        audit(
            folder,
            AuditOptions(model=str(tmp_path / "no-model"), stages=frozenset({"critic"}), logprobs_mode="raw_logprobs"),
        )
