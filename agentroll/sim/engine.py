"""The simulated model behind the HTTP layer: scripted text, real token ids, vLLM's stopping rules and bodies.

A `Script` writes the text, the bundled tiny tokenizer turns it into token ids, and the engine then applies what
vLLM's engine would to that token stream: EOS and `stop_token_ids` end it (the stop token stays in `token_ids`,
not in `text`), `stop` strings cut the text, `max_tokens` and the context limit cut it to `length`, an abort
cuts it short. Logprobs are shaped like vLLM's (the sampled token first, then the top k).

What vLLM refuses before scheduling a request is `checks`; the logprob values of an answer are those the teacher
side scores (`scoring.Scorer`, one function of the ids before a position and the id at it).
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .checks import check_model, check_prompt, check_stop, vllm_tools
from .faults import Faults
from .logprobs import completion_logprobs, generate_logprobs, processed, routed_experts
from .masks import check_replay, kept_sets
from .scoring import Scorer, check_prompt_logprobs
from .validation import (
    COMPLETION,
    DETOKENIZE,
    GENERATE,
    TOKENIZE_CHAT,
    TOKENIZE_PROMPT,
    completion_prompt,
    validate,
    validate_params,
)
from .wire import VLLM_VERSION, bad_request

STOP_TOKEN = "<|endoftext|>"  # the extra end-of-text id that `stop_token_rate` emits (Qwen-style chat models)


@dataclass
class Choice:
    """One finished sequence, before it is rendered into a choice."""

    ids: list[int]
    finish: str
    stop_reason: int | str | None
    text: str


class Engine:
    def __init__(
        self,
        script: Any,
        model: str,
        max_model_len: int,
        tokenizer_dir: Path,
        faults: Faults,
        seed: int,
        logprobs_mode: str = "raw_logprobs",
        moe: tuple[int, int, int] | None = None,
        weight_version: str = "default",
        sampling_mask: bool = False,
    ) -> None:
        from tokenizers import Tokenizer

        self.script, self.model, self.max_model_len, self.faults = script, model, max_model_len, faults
        self.logprobs_mode, self.moe, self.weight_version = logprobs_mode, moe, weight_version
        self.sampling_mask = sampling_mask  # like --return-sampling-mask: /generate sends each token's kept set
        self.tokenizer_dir = Path(tokenizer_dir).resolve()
        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json"))
        self.vocab_size = self.tokenizer.get_vocab_size()
        config = orjson.loads((self.tokenizer_dir / "tokenizer_config.json").read_bytes())
        self.eos_id: int = self.tokenizer.token_to_id(config.get("eos_token") or "<|im_end|>") or 0
        self.stop_token_id: int = self.tokenizer.token_to_id(STOP_TOKEN) or 0
        self._chat_source: str = config["chat_template"]
        self._prompt_texts: dict[tuple[int, ...], str] = {}
        self._filler = list(self.tokenizer.encode(" and so on", add_special_tokens=False).ids)
        self._id_strings = [f"token_id:{i}" for i in range(self.vocab_size)]
        self.scorer = Scorer(seed, self.vocab_size, [self._decode_one(i) for i in range(self.vocab_size)])
        self._encoded: dict[str, list[int]] = {}
        self.rng = random.Random(seed)
        self._fault_rng = random.Random(seed + 3)  # stop tokens and abort points: faults leave the answers as they were

    # -- /v1/models, /tokenize, /detokenize ------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        """`root` is the model's path on disk, as vLLM names it: here the bundled tokenizer's folder, so a
        client that loads its tokenizer from `root` finds one."""
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": str(self.tokenizer_dir),
                    "parent": None,
                    "max_model_len": self.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                            "object": "model_permission",
                            "created": created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            ],
        }

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        template: str | None = None,
        kwargs: dict[str, Any] | None = None,
        tools: list[Any] | None = None,
    ) -> str:
        """The chat template as vLLM applies it: through transformers' template environment, `tools` as vLLM
        hands them over (validated, then dumped in its field order)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        offered: list[Any] | None = None if tools is None else vllm_tools(tools)
        rendered: Any = render_jinja_template(
            [messages],
            tools=offered,
            add_generation_prompt=add_generation_prompt,
            chat_template=template if template is not None else self._chat_source,
            **(kwargs or {}),
        )
        return str(rendered[0][0])  # (one rendering per conversation, generation indices)

    def warm(self) -> None:
        """Render the chat template once, as vLLM has its tokenizer and template loaded before it listens: the
        first /tokenize of a cold simulator would wait for transformers' import (~0.7 s here), a delay a real
        server never shows (and that start-up benchmarks would count as the client's)."""
        self.render_chat([{"role": "user", "content": "warm-up"}], add_generation_prompt=True)

    def tokenize(self, data: Any) -> dict[str, Any]:
        kind, body = validate(data, TOKENIZE_PROMPT, TOKENIZE_CHAT)
        check_model(self.model, body.get("model"))
        if kind == 1:
            try:
                text = self.render_chat(
                    body["messages"],
                    body.get("add_generation_prompt", True),
                    body.get("chat_template"),
                    body.get("chat_template_kwargs"),
                    body.get("tools"),
                )
            except Exception as exc:  # jinja2.TemplateError and friends: vLLM answers 400
                raise bad_request(str(exc)) from None
            ids = self.tokenizer.encode(text, add_special_tokens=body.get("add_special_tokens", False)).ids
        else:
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True)).ids
        strs = [self.tokenizer.id_to_token(i) for i in ids] if body.get("return_token_strs") else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    def detokenize(self, data: Any) -> dict[str, Any]:
        _, body = validate(data, DETOKENIZE)
        check_model(self.model, body.get("model"))
        ids = [t for t in body["tokens"] if t < self.vocab_size]  # vLLM decodes unknown ids to nothing
        return {"prompt": self.tokenizer.decode(ids, skip_special_tokens=False)}

    # -- /v1/completions ---------------------------------------------------------------------------------------
    def prompts(self, data: Any) -> tuple[dict[str, Any], list[list[int]]]:
        """Validate a completion body as vLLM does before scheduling it: its fields, then each prompt's ids."""
        _, request = validate(data, COMPLETION)
        check_stop(request.get("stop"))
        prompt = request.get("prompt")
        if prompt is None or prompt == "":
            raise bad_request(
                "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", "prompt"
            )
        batch = completion_prompt(prompt)
        if not batch:
            raise bad_request("You must pass at least one prompt")
        check_model(self.model, request.get("model"))
        if request.get("stream"):
            raise bad_request("the simulated server does not stream", "stream")
        ids_batch = [list(self.tokenizer.encode(p).ids) if isinstance(p, str) else p for p in batch]
        n = 1 if request.get("n") is None else request["n"]
        if n < 1:
            raise bad_request(f"n must be at least 1, got {n}.")
        for ids in ids_batch:
            check_prompt(ids, request, self.vocab_size, self.max_model_len)
        check_prompt_logprobs(request, self.vocab_size)
        if self.sampling_mask:
            check_replay(request)
        return request, ids_batch

    def complete(self, request: dict[str, Any], ids_batch: list[list[int]], abort: bool = False) -> dict[str, Any]:
        """The 200 body for a validated request; `abort` cuts every sequence short, as an engine-side abort does."""
        seed = request.get("seed")
        rng = random.Random(seed) if seed is not None else random.Random(self.rng.getrandbits(64))
        n = request.get("n") or 1
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for prompt_ids in ids_batch:
            prompt_tokens += len(prompt_ids)
            budget = min(request.get("max_tokens") or 16, self.max_model_len - len(prompt_ids))  # cut silently
            prompt_text = self._prompt_text(prompt_ids)
            for _ in range(n):
                seq = self._sequence(self.script.answer(prompt_text, rng, request), request, budget)
                if abort:  # aborted mid-generation: the tokens so far, with the text and logprobs they had
                    seq = self._abort(seq, request)
                completion_tokens += len(seq.ids)
                choices.append(self._render(len(choices), seq, request, prompt_ids))
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": f"vllm-{VLLM_VERSION}-simulated",
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def _prompt_text(self, ids: list[int]) -> str:
        """A prompt's text, for the script; cached (a problem's executions and workers send the same prompt)."""
        key = tuple(ids)
        text = self._prompt_texts.get(key)
        if text is None:
            if len(self._prompt_texts) > 4096:
                self._prompt_texts.clear()
            text = self._prompt_texts[key] = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    def _encode_answer(self, text: str) -> list[int]:
        """Token ids for an answer: the think block's encoding is cached (the script reuses think blocks), the
        rest encoded fresh. Two encodings joined are a valid token sequence that decodes to the joined text."""
        head, sep, tail = text.partition("</think>")
        ids = self._encoded.get(head)
        if ids is None:
            if len(self._encoded) > 4096:
                self._encoded.clear()
            ids = self._encoded[head] = list(self.tokenizer.encode(head, add_special_tokens=False).ids)
        if sep or tail:
            return ids + list(self.tokenizer.encode(sep + tail, add_special_tokens=False).ids)
        return list(ids)

    def _sequence(self, scripted: Any, request: dict[str, Any], budget: int) -> Choice:
        """Run the scripted token stream through vLLM's stopping rules."""
        stream = self._encode_answer(scripted.text)
        if scripted.truncate:  # a model that rambles on: filler past any budget, no EOS
            stream += self._filler * (budget // len(self._filler) + 1)
        else:
            if self.faults.stop_token_rate and self._fault_rng.random() < self.faults.stop_token_rate:
                stream.append(self.stop_token_id)  # an extra end-of-text token where the answer ends
            stream.append(self.eos_id)
            if request.get("ignore_eos"):
                stream += self._filler * (budget // len(self._filler) + 1)
        stop_ids = set(request.get("stop_token_ids") or ())
        ids, finish = stream[:budget], "length"
        reason: int | str | None = None
        # the first EOS (unless ignored) or stop token id ends it; searched in C (a per-token loop here was a
        # fifth of the simulator's CPU, which the benchmarks share with the client)
        eos_at = _find(ids, self.eos_id) if not request.get("ignore_eos") else len(ids)
        stop_at = min((_find(ids, t) for t in stop_ids), default=len(ids))
        if stop_at < eos_at:
            ids, finish, reason = ids[: stop_at + 1], "stop", ids[stop_at]  # a stop token id: stop_reason is it
        elif eos_at < len(ids):
            ids, finish = ids[: eos_at + 1], "stop"  # EOS: stop_reason stays null
        skip = request.get("skip_special_tokens", True)
        text_ids = ids[:-1] if finish == "stop" else ids  # the stop token is in token_ids, not in the text
        text = self.tokenizer.decode(text_ids, skip_special_tokens=skip)
        stop = request.get("stop")
        strings = [stop] if isinstance(stop, str) else list(stop or ())
        if any(s in text for s in strings):
            # vLLM checks the stop strings after each token: the first token whose text completes one ends the
            # sequence (token_ids hold it), the first of the list found then is the stop_reason, and the text
            # ends where that string begins
            lo, hi = 1, len(text_ids)
            while lo < hi:
                mid = (lo + hi) // 2
                decoded = self.tokenizer.decode(text_ids[:mid], skip_special_tokens=skip)
                if any(s in decoded for s in strings):
                    hi = mid
                else:
                    lo = mid + 1
            decoded = self.tokenizer.decode(text_ids[:lo], skip_special_tokens=skip)
            string = next(s for s in strings if s in decoded)
            ids, finish, reason, text = text_ids[:lo], "stop", string, decoded[: decoded.index(string)]
        return Choice(ids, finish, reason, text)

    def _abort(self, seq: Choice, request: dict[str, Any]) -> Choice:
        """vLLM's pause or abort: `finish_reason: "abort"`, `stop_reason: null`, a prefix of the sequence."""
        keep = self._fault_rng.randrange(len(seq.ids))
        text = self.tokenizer.decode(seq.ids[:keep], skip_special_tokens=request.get("skip_special_tokens", True))
        return Choice(seq.ids[:keep], "abort", None, text)

    def _render(self, index: int, seq: Choice, request: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
        want_ids = bool(request.get("return_token_ids"))
        k, k_prompt = request.get("logprobs"), check_prompt_logprobs(request, self.vocab_size)
        logprobs = None
        if k is not None:
            values, tops, _ = self._logprobs(prompt_ids, seq.ids, k, request)
            logprobs = completion_logprobs(seq.ids, values, tops, request, self._id_strings, self._decode_one)
        return {
            "index": index,
            "text": seq.text,
            "logprobs": logprobs,
            "finish_reason": seq.finish,
            "stop_reason": seq.stop_reason,
            "token_ids": seq.ids if want_ids else None,
            "prompt_logprobs": None if k_prompt is None else self.scorer.prompt_logprobs(prompt_ids, k_prompt),
            "prompt_token_ids": prompt_ids if want_ids else None,
            "routed_experts": self.routes(prompt_ids, seq),
        }

    def _logprobs(
        self, prompt_ids: list[int], ids: list[int], k: int, request: dict[str, Any]
    ) -> tuple[list[float], list[list[tuple[int, float, int]]], list[int]]:
        """An answer's logprobs: the scorer's (raw: what `prompt_logprobs` gives the same positions), or under
        `processed_logprobs` those after temperature (scaled) and top-k (the rest -inf)."""
        values, tops, ranks = self.scorer.sampled(prompt_ids, ids, k)
        if self.logprobs_mode == "processed_logprobs":
            values, tops = processed(values, tops, ranks, request)
        return values, tops, ranks

    def routes(self, prompt_ids: list[int], seq: Choice) -> str | None:
        return routed_experts(self.moe, prompt_ids, seq.ids)

    def _decode_one(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    # -- /inference/v1/generate --------------------------------------------------------------------------------
    def parse_generate(self, data: Any) -> dict[str, Any]:
        """A /generate body validated as vLLM does before scheduling it (`sampling_params` coerced in place)."""
        _, body = validate(data, GENERATE)
        check_model(self.model, body.get("model"))
        _, params = validate_params(body["sampling_params"])
        check_stop(params.get("stop"))
        check_prompt(body["token_ids"], params, self.vocab_size, self.max_model_len, generate=True)
        if params.get("n") not in (None, 1):
            raise bad_request("the simulated server answers one sequence per /generate request", "n")
        if self.sampling_mask:
            check_replay(params)
        return {**body, "sampling_params": params}

    def generate(self, body: dict[str, Any], abort: bool = False) -> dict[str, Any]:
        """vLLM's native token-in, token-out answer (output_mode "tokens"): no text, integer ids, ranks."""
        prompt_ids, params = body["token_ids"], body["sampling_params"]
        seed = params.get("seed")
        rng = random.Random(seed) if seed is not None else random.Random(self.rng.getrandbits(64))
        budget = min(params.get("max_tokens") or 16, self.max_model_len - len(prompt_ids))
        prompt_text = self._prompt_text(prompt_ids)
        seq = self._sequence(self.script.answer(prompt_text, rng, params), params, budget)
        if abort:
            seq = self._abort(seq, params)
        k = params.get("logprobs")
        logprobs = None
        kept = kept_sets(self.scorer, prompt_ids, seq.ids, params, rng) if self.sampling_mask else None
        if k is not None:
            values, tops, ranks = self._logprobs(prompt_ids, seq.ids, k, params)
            logprobs = generate_logprobs(seq.ids, values, tops, ranks, k)
        choice = {
            "index": 0,
            "finish_reason": seq.finish,
            "stop_reason": seq.stop_reason,
            "token_ids": seq.ids,
            "routed_experts": self.routes(prompt_ids, seq),
            "sampling_mask": None if kept is None else kept[: len(seq.ids)],
            "weight_versions": [{"version": self.weight_version, "start": 0, "end": len(seq.ids)}],
            "logprobs": logprobs,
        }
        completion = len(seq.ids)
        return {
            "request_id": f"generate-tokens-{uuid.uuid4().hex[:16]}",
            "model": self.model,
            "created": int(time.time()),
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": [choice],
        }


def _find(ids: list[int], token: int) -> int:
    """The first position of `token` in `ids`, or len(ids)."""
    try:
        return ids.index(token)
    except ValueError:
        return len(ids)
