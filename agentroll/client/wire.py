"""vLLM's two token-in, token-out APIs on the wire: the request bodies we send and the answers we accept.

- `completions`: `POST /v1/completions` with a token-id prompt, `return_token_ids` and `"token_id:N"` token
  strings. Text comes from the server.
- `generate`: vLLM's native `POST /inference/v1/generate` (served with `--enable-scale-out`): token ids in,
  integer token ids, logprobs with ranks and `weight_versions` out, no detokenization on the server. The
  response text is decoded locally by the caller.

Both are parsed into one `Completion`, index for index with the server's own values; anything malformed is a
`WireError` (the client retries it as a failed call, never records it).

`reader` gives the JSON decoder of an answer. A `/v1/completions` answer without alternatives is decoded by
msgspec into only the fields `parse_completions` reads: the per-token `tokens`, `text_offset` and `top_logprobs`
(most of the answer, and a third of the client's work when decoded whole) are skipped, not built. Anything that
decoder does not take as it stands (malformed, other types, ids without `return_token_ids`) is decoded whole by
orjson, so what is accepted, and the values and types given, are the same either way.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
import orjson

APIS = ("completions", "generate")
PATHS = {"completions": "/v1/completions", "generate": "/inference/v1/generate"}
TOKEN_ID_PREFIX = "token_id:"
INT, NUMBER = frozenset({int}), frozenset({int, float})  # exact types: JSON true/false (bool) is neither


class WireError(Exception):
    """An answer that is not a usable completion: no choices, misaligned ids and logprobs, wrong types."""


@dataclass(slots=True)
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str | None  # None from the generate API: the caller decodes the ids
    finish_reason: str | None
    stop_reason: int | str | None
    endpoint: str = ""
    latency_s: float = 0.0
    attempts: int = 1
    ranks: list[int | None] | None = None
    top_token_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    weight_versions: list[dict[str, Any]] | None = None
    routed_experts: bytes | None = field(default=None, repr=False)
    sampling_mask: list[list[int]] | None = field(default=None, repr=False)  # per token: the ids kept, ascending

    def to_json(self) -> dict[str, Any]:
        """Every field but the prompt's ids, JSON-able (routes as base64): what the call journal keeps of an answer.
        The prompt is the request's, which the journal's digest holds already: `from_json` is given it back."""
        out = {name: getattr(self, name) for name in JOURNALED}
        if self.routed_experts is not None:
            out["routed_experts"] = base64.b64encode(self.routed_experts).decode()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], prompt_token_ids: list[int]) -> Completion:
        values = {name: data[name] for name in JOURNALED if name in data}
        if values.get("routed_experts") is not None:
            values["routed_experts"] = base64.b64decode(values["routed_experts"])
        return cls(prompt_token_ids, **values)


JOURNALED = tuple(name for name in Completion.__slots__ if name != "prompt_token_ids")


# orjson gives an integer past 64 bits as a float: the lean decoder leaves any integer past 63 bits to orjson
Int64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


class _LeanLogprobs(msgspec.Struct):
    token_logprobs: list[Int64 | float] | None = None


class _LeanChoice(msgspec.Struct):
    token_ids: list[Int64] | None = None
    logprobs: _LeanLogprobs | None = None
    text: Any = None
    finish_reason: Any = None
    stop_reason: Any = None
    prompt_token_ids: Any = None
    weight_versions: Any = None
    routed_experts: Any = None


class _LeanAnswer(msgspec.Struct):
    choices: list[_LeanChoice]


_lean = msgspec.json.Decoder(_LeanAnswer)


def _lean_completion(body: bytes) -> Any:
    """A `/v1/completions` answer as `parse_completions` reads it (alternatives: 0), or decoded whole by orjson."""
    try:
        answer = _lean.decode(body)
    except msgspec.DecodeError:  # malformed, or other types than a usable answer's: as orjson gives it
        return orjson.loads(body)
    choices = []
    for c in answer.choices:
        if c.token_ids is None:  # ids only in logprobs.tokens (no return_token_ids): read from there
            return orjson.loads(body)
        lp = None if c.logprobs is None else {"token_logprobs": c.logprobs.token_logprobs}
        choices.append(
            {
                "token_ids": c.token_ids,
                "logprobs": lp,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "prompt_token_ids": c.prompt_token_ids,
                "weight_versions": c.weight_versions,
                "routed_experts": c.routed_experts,
            }
        )
    return {"choices": choices}


def reader(api: str, alternatives: int) -> Callable[[bytes], Any]:
    """The decoder of an answer to a call on `api` with `alternatives`: raises `orjson.JSONDecodeError` for a body
    that is not JSON."""
    return _lean_completion if api == "completions" and not alternatives else orjson.loads


def request_body(
    api: str, model: str, prompt_ids: list[int], params: dict[str, Any], alternatives: int, priority: int | None = None
) -> dict[str, Any]:
    """The body of one call. `params` are vLLM SamplingParams names (temperature, top_p, max_tokens, seed...).

    `alternatives` (k): /v1/completions answers the sampled token plus the k most likely; /generate answers the
    first k entries of that same list, so it is asked for k + 1 to always hold ranks 1..k. `priority`: vLLM's
    request priority (lower first under `--scheduling-policy priority`), sent only when given."""
    extra = {} if priority is None else {"priority": priority}
    if api == "generate":
        sampling = {**params, "logprobs": alternatives + 1 if alternatives else 0}
        return {"model": model, "token_ids": prompt_ids, "sampling_params": sampling, **extra}
    return {
        "model": model,
        "prompt": prompt_ids,
        **params,
        "logprobs": alternatives,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        **extra,
    }


def _reasons(choice: dict[str, Any]) -> tuple[str | None, int | str | None]:
    """`finish_reason` (a string or null) and `stop_reason` (null, a token id or a stop string) as vLLM sends
    them; anything else is a malformed answer (`WireError`: retried, never recorded)."""
    finish, stop = choice.get("finish_reason"), choice.get("stop_reason")
    if finish is not None and not isinstance(finish, str):
        raise WireError(f"finish_reason is {finish!r}, not a string")
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int | str)):
        raise WireError(f"stop_reason is {stop!r}, not a token id or a string")
    return finish, stop


def _first_choice(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise WireError(f"response is not a JSON object but {type(payload).__name__}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise WireError("response has no choices")
    return choices[0]


def _check(ids: Any, logprobs: Any) -> None:
    # Type checks in C (`map(type, ...)`): a per-token Python loop here cost a third of the client's CPU.
    if not isinstance(ids, list) or not set(map(type, ids)) <= INT:
        raise WireError("token_ids is not a list of integers")
    if len(ids) != len(logprobs):
        raise WireError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
    if not set(map(type, logprobs)) <= NUMBER:
        raise WireError("a response logprob is null or not a number")


def _extras(choice: dict[str, Any], out: Completion) -> Completion:
    """weight_versions, routed_experts and sampling_mask (only /generate sends one): the same fields on both
    APIs."""
    spans = choice.get("weight_versions")
    if spans is not None:
        if not isinstance(spans, list) or not all(
            isinstance(s, dict) and type(s.get("start")) is int and type(s.get("end")) is int for s in spans
        ):
            raise WireError("weight_versions is not a list of {version, start, end} spans")
        out.weight_versions = [{"version": s.get("version"), "start": s["start"], "end": s["end"]} for s in spans]
    routes = choice.get("routed_experts")
    if routes is not None:
        if not isinstance(routes, str):
            raise WireError("routed_experts is not a base64 string")
        try:
            out.routed_experts = base64.b64decode(routes, validate=True)
        except (binascii.Error, ValueError):
            raise WireError("routed_experts is not valid base64") from None
        from agentroll.folder.routes import checked, decode

        try:
            checked(decode(out.routed_experts))  # an integer (tokens, layers, k) .npy, or the call is retried
        except ValueError as exc:
            raise WireError(f"routed_experts: {exc}") from None
    mask = choice.get("sampling_mask")
    if mask is not None:
        out.sampling_mask = _mask(mask, out.token_ids)
    return out


def _mask(mask: Any, token_ids: list[int]) -> list[list[int]]:
    """vLLM's `sampling_mask`: one list of kept vocabulary ids per output token, ascending (`WireError`
    otherwise: the call is retried). Whether each sampled token is in its set is `validate`'s to say."""
    if not isinstance(mask, list) or len(mask) != len(token_ids):
        size = len(mask) if isinstance(mask, list) else type(mask).__name__
        raise WireError(f"sampling_mask has {size} entries for {len(token_ids)} token ids")
    for step in mask:
        if not isinstance(step, list) or not all(type(t) is int and t >= 0 for t in step):
            raise WireError("sampling_mask is not a list of lists of token ids")
    return mask


def parse(api: str, payload: Any, sent_ids: list[int], alternatives: int) -> Completion:
    return (
        parse_generate(payload, sent_ids, alternatives)
        if api == "generate"
        else parse_completions(payload, sent_ids, alternatives)
    )


def parse_completions(payload: Any, sent_ids: list[int], alternatives: int = 0) -> Completion:
    choice = _first_choice(payload)
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise WireError("response has no logprobs.token_logprobs (is `logprobs` supported by this server?)")
    logprobs = lp["token_logprobs"]
    ids = choice.get("token_ids")
    if ids is None:
        try:
            ids = [int(t[len(TOKEN_ID_PREFIX) :]) for t in lp["tokens"] if t.startswith(TOKEN_ID_PREFIX)]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WireError(f"cannot read token ids from logprobs.tokens: {exc}") from None
        if len(ids) != len(lp["tokens"]):
            raise WireError("logprobs.tokens are not 'token_id:N' strings (return_tokens_as_token_ids ignored?)")
    _check(ids, logprobs)
    if not isinstance(choice.get("text", ""), str | None):
        raise WireError("choices[0].text is not a string")
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and echoed != sent_ids:
        raise WireError("the server's prompt_token_ids differ from the ids sent")
    out = Completion(sent_ids, ids, logprobs, choice.get("text") or "", *_reasons(choice))
    if alternatives:
        _completions_top(lp.get("top_logprobs"), out, alternatives)
    return _extras(choice, out)


def _completions_top(entries: Any, out: Completion, k: int) -> None:
    """The k most likely tokens per position from `top_logprobs` ({"token_id:N": logprob}, the sampled token
    first, then the top k). The sampled token's rank is known when it is among them."""
    if not isinstance(entries, list) or len(entries) != len(out.token_ids):
        raise WireError("logprobs.top_logprobs does not hold one entry per token")
    ids_out, lps_out, ranks = [], [], []
    for entry, sampled in zip(entries, out.token_ids, strict=True):
        if not isinstance(entry, dict):
            raise WireError("a top_logprobs entry is not an object")
        try:
            pairs = sorted(((int(t[len(TOKEN_ID_PREFIX) :]), v) for t, v in entry.items()), key=lambda p: -p[1])[:k]
        except (TypeError, ValueError):
            raise WireError("top_logprobs keys are not 'token_id:N' strings with numeric logprobs") from None
        ids_out.append([p[0] for p in pairs])
        lps_out.append([p[1] for p in pairs])
        ranks.append(next((r for r, p in enumerate(pairs, 1) if p[0] == sampled), None))
    out.top_token_ids, out.top_logprobs, out.ranks = ids_out, lps_out, ranks


def parse_generate(payload: Any, sent_ids: list[int], alternatives: int = 0) -> Completion:
    choice = _first_choice(payload)
    ids = choice.get("token_ids")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
        raise WireError("response has no logprobs.content (was sampling_params.logprobs sent?)")
    try:
        logprobs = [c["logprob"] for c in content]
        echoed = [c["token_id"] for c in content]
    except KeyError as exc:
        raise WireError(f"a logprobs.content entry has no {exc}") from None
    _check(ids, logprobs)
    if echoed != ids:
        raise WireError("logprobs.content token ids differ from token_ids")
    prompt = payload.get("prompt_token_ids")
    if prompt is not None and prompt != sent_ids:
        raise WireError("the server's prompt_token_ids differ from the ids sent")
    ranks = [c.get("rank") for c in content]
    if not set(map(type, ranks)) <= {int, type(None)}:
        raise WireError("a logprobs rank is not an integer")
    out = Completion(sent_ids, ids, logprobs, None, *_reasons(choice), ranks=ranks)
    if alternatives:
        ids_out, lps_out = [], []
        for c in content:
            top = c.get("top_logprobs")
            if not isinstance(top, list) or not all(isinstance(t, dict) for t in top):
                raise WireError("a logprobs.content entry has no top_logprobs list")
            ranked = sorted(
                (t for t in top if type(t.get("rank")) is int and 1 <= t["rank"] <= alternatives),
                key=lambda t: t["rank"],
            )
            try:
                ids_out.append([t["token_id"] for t in ranked])
                lps_out.append([t["logprob"] for t in ranked])
            except KeyError as exc:
                raise WireError(f"a top_logprobs entry has no {exc}") from None
        out.top_token_ids, out.top_logprobs = ids_out, lps_out
    return _extras(choice, out)


# -- a teacher's scores: vLLM's prompt_logprobs over ids another model sampled ------------------------------------


def score_body(model: str, sequences: list[list[int]], alternatives: int) -> dict[str, Any]:
    """A scoring call: each sequence (a prompt + the ids to score) as a token-id prompt, several in one request
    (vLLM's batch of prompts: a choice each, by `index`), with `prompt_logprobs` (the sequence's own token at each
    position, plus the k most likely when k > 0) and one generated token, the least `/v1/completions` takes. The
    logprobs are those of the raw logits whatever the temperature (vLLM computes prompt logprobs before any
    sampling parameter), so it is sent as 1."""
    prompt: Any = sequences[0] if len(sequences) == 1 else sequences
    return {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": alternatives}


def parse_scores(payload: Any, sequences: list[list[int]], starts: list[int], alternatives: int) -> list[Completion]:
    """The scores of each `sequences[i][starts[i]:]` from a `score_body` answer, as `Completion`s (`token_ids` the
    scored ids, `logprobs` their logprobs, `ranks` their ranks, the top k when asked). vLLM's `prompt_logprobs` hold
    one entry per prompt position, the first null, each other `{"<id>": {"logprob", "rank", "decoded_token"}}` for
    the position's own token plus the top k (so k or k + 1 entries). An answer without a choice per sequence, or an
    entry that does not hold the id sent at its position, is misaligned: a `WireError`, retried, never recorded."""
    _first_choice(payload)
    choices = {c.get("index"): c for c in payload["choices"] if isinstance(c, dict)}
    if sorted(choices, key=str) != sorted(range(len(sequences)), key=str):
        raise WireError(f"{len(payload['choices'])} choices for {len(sequences)} sequences scored")
    return [
        _scores(choices[i], sequence, start, alternatives)
        for i, (sequence, start) in enumerate(zip(sequences, starts, strict=True))
    ]


def _scores(choice: dict[str, Any], sent_ids: list[int], start: int, alternatives: int) -> Completion:
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(sent_ids):
        raise WireError("response has no prompt_logprobs of one entry per prompt token (is prompt_logprobs supported?)")
    if not 0 < start <= len(sent_ids):
        raise ValueError(f"scores start at position {start} of {len(sent_ids)}: no logit predicts position 0")
    scored = sent_ids[start:]
    logprobs: list[float] = []
    ranks: list[int | None] = []
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []
    for entry, token in zip(entries[start:], scored, strict=True):
        own = entry.get(str(token)) if isinstance(entry, dict) else None
        if not isinstance(own, dict):
            raise WireError(f"a prompt_logprobs entry does not hold the token sent there ({token})")
        value: Any = own.get("logprob")
        rank = own.get("rank")
        if type(value) not in NUMBER or type(rank) is not int:
            raise WireError("a prompt_logprobs entry's logprob is not a number or its rank not an integer")
        logprobs.append(float(value))
        ranks.append(rank)
        if alternatives:
            try:
                ranked = sorted(
                    (v["rank"], int(t), v["logprob"]) for t, v in entry.items() if 1 <= v["rank"] <= alternatives
                )
            except (KeyError, TypeError, ValueError):
                raise WireError("prompt_logprobs keys are not token ids with a logprob and a rank") from None
            top_ids.append([t for _, t, _ in ranked])
            top_logprobs.append([v for _, _, v in ranked])
    out = Completion(sent_ids, scored, logprobs, None, *_reasons(choice), ranks=ranks)
    if alternatives:
        out.top_token_ids, out.top_logprobs = top_ids, top_logprobs
    return out
