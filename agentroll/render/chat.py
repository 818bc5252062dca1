"""Local prompt rendering: the model's chat template applied with its own `transformers` tokenizer.

Two ways to load it. `load_tokenizer` is `AutoTokenizer`, which reads the model's config through modules that
import torch (two seconds and 200 MB with torch installed). `load_by_class` loads the class that the
tokenizer's `tokenizer_config.json` names, from transformers' top level, which does not import torch; it is the
class `AutoTokenizer` picks except where transformers' model-type tables say otherwise (the parity check with the
server catches that: docs/performance.md, "Tokenizers loaded by their class").
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from agentroll.errors import UsageError

# AutoTokenizer overrides these names (a byte-level tokenizer.json declared as Llama's gets the generic backend,
# while the class itself builds a pipeline of its own): AutoTokenizer decides.
AUTO_DECIDES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast"})


def _hub_reachable(timeout_s: float = 1.5) -> str | None:
    """None when the hub answers a TCP connect quickly, else why not. transformers alone spends ~50 s retrying
    an unreachable hub before it gives up; a user offline deserves one line at once."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:  # in a thread: a hanging DNS resolver is not bounded by the socket timeout
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"cannot reach {host}:{port} ({exc.strerror or exc})")

    probe = threading.Thread(target=connect, name="agentroll-hub-probe", daemon=True)
    probe.start()
    probe.join(timeout_s + 0.5)
    return outcome[0] if outcome else f"no answer from {host}:{port} within {timeout_s:g}s"


HINT = "pass --tokenizer with a local folder or a hub id"  # said only when the user did not name one


def load_tokenizer(name_or_path: str) -> Any:
    """`AutoTokenizer.from_pretrained`: from disk (a path or the hub cache) first, from the hub only if it is
    reachable; a one-line `UsageError` in our words instead of a hub traceback."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # hides the "PyTorch was not found" advisory
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # AutoTokenizer imports torch: a broken torch install breaks it
        raise UsageError(
            f"cannot load tokenizer {name_or_path!r}: transformers' AutoTokenizer does not import here ({_whole(exc)})"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors...
        local = _local_fault(name_or_path)
        if local is not None:
            raise UsageError(f"cannot load tokenizer {name_or_path!r}: {local or _whole(exc)}") from exc
        offline = _hub_reachable()
        if offline is not None:
            raise UsageError(
                f"cannot load tokenizer {name_or_path!r}: not on disk, and the hub is out of reach: {offline}"
            ) from exc
        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        except Exception as exc2:
            raise UsageError(f"cannot load tokenizer {name_or_path!r}: {_whole(exc2)}") from exc2
    return _with_template(tokenizer, name_or_path)


def _local_fault(name: str) -> str | None:
    """Why `name` cannot be a tokenizer on disk nor a hub id, in our words; "" when it is a folder transformers
    could not read (its message says why); None when it may be a hub id to fetch."""
    path = Path(name).expanduser()
    if path.is_dir():
        files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
        return "" if any((path / f).exists() for f in files) else f"the folder holds none of {', '.join(files)}"
    if path.exists():
        return "it is a file; --tokenizer takes the folder that holds the tokenizer's files"
    if name.startswith(("/", "./", "../", "~")):
        return "no such folder"
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(name)
    except Exception:  # HFValidationError: neither a path here nor NAMESPACE/NAME
        return "no such folder, and not a hub id (NAME or NAMESPACE/NAME)"
    return None


def _whole(exc: BaseException) -> str:
    """transformers' reason on one line, whole (a first line alone can stop mid-sentence)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_by_class(name_or_path: str) -> Any | None:
    """The tokenizer as the class its `tokenizer_config.json` names (`tokenizer_class`), taken from transformers'
    top level and loaded from disk only: a folder, or a hub id already in the hub cache. None, for
    `AutoTokenizer` to load, when the files are not on disk, the config names no class, asks for remote code or
    names a class that is not a `tokenizers` backend (or one of `AUTO_DECIDES`), or when loading it fails."""
    config = _tokenizer_config(name_or_path)
    kind = config.get("tokenizer_class")
    if not isinstance(kind, str) or kind in AUTO_DECIDES or "auto_map" in config:
        return None
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers

        backend = transformers.TokenizersBackend
        # a legacy "...Fast" name is the class itself in transformers 5 (PreTrainedTokenizerFast is the backend)
        found = (getattr(transformers, name, None) for name in (kind, kind.removesuffix("Fast")))
        cls = next((c for c in found if isinstance(c, type) and issubclass(c, backend)), None)
        if cls is None:
            return None
        tokenizer = cls.from_pretrained(name_or_path, local_files_only=True)
    except Exception:  # whatever the reason, AutoTokenizer loads it, or says in one line why it cannot
        return None
    return _with_template(tokenizer, name_or_path)


def _tokenizer_config(name_or_path: str) -> dict[str, Any]:
    """`tokenizer_config.json` of a folder, or of a hub id in the hub cache (revision main); {} if not on disk."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        path: Any = folder / "tokenizer_config.json"
    elif name_or_path.startswith(("/", ".", "~")):
        return {}
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(name_or_path, "tokenizer_config.json")
        except Exception:  # not a valid repo id
            return {}
        if not isinstance(path, str):  # not cached, or cached as missing
            return {}
    try:
        config = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def _with_template(tokenizer: Any, name_or_path: str) -> Any:
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"tokenizer {name_or_path!r} has no chat template")
    return tokenizer


def tokenizer_candidates(explicit: str | None, model: str, root: str | None) -> list[str]:
    """--tokenizer; else the server's model root when it is a folder here (vLLM names the model path there),
    else the model name, else the root as a hub id."""
    if explicit:
        return [explicit]
    local_root = [root] if root and os.path.isdir(root) else []
    return list(dict.fromkeys([*local_root, model, *([root] if root else [])]))


def load_first(candidates: list[str], by_class: bool = False, hint: bool = True, lite: bool = False) -> tuple[str, Any]:
    """The first candidate that loads, with its name; the first candidate's error when none does, with `HINT`
    when `hint` (the candidates were guessed, not named by --tokenizer). With `by_class`, each candidate is first
    loaded by its config's class name (`load_by_class`: no torch import), then by `AutoTokenizer`. With `lite`,
    a tokenizer that loads exactly without transformers is first a `tokenizer_lite.LiteTokenizer` (no import of
    transformers at all): `check_parity` keeps it only when the server proves its ids."""
    error: UsageError | None = None
    for name in candidates:
        if lite:
            from agentroll.render import tokenizer_lite

            fast = tokenizer_lite.load(name)
            if fast is not None and getattr(fast, "chat_template", None):
                fast.loader = partial(_loaded, name)  # its stand-in, should the server disown it
                return name, fast
        try:
            tokenizer = load_by_class(name) if by_class else None
            return name, tokenizer if tokenizer is not None else load_tokenizer(name)
        except UsageError as exc:
            error = error or exc
    assert error is not None
    if hint:
        raise UsageError(f"{error} ({HINT})") from error
    raise error


def _loaded(name: str) -> Any:
    """The tokenizer `name` as `load_first` loads it without `lite`."""
    return load_first([name], by_class=True, hint=False)[1]


def vllm_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Tools as vLLM 0.32 passes them to a chat template: `ChatCompletionToolsParam.model_dump()`, so `type` then
    `function` {`name`, `description`, `parameters`}, the two last null when not given, `strict` only when set."""
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or tool.get("type", "function") != "function"
        ):
            raise ValueError(f"tools.{i}: expected {{'type': 'function', 'function': {{'name': ...}}}}")
        dumped = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        out.append({"type": "function", "function": dumped})
    return out


class ChatEncoder:
    """Messages -> (rendered text, token ids), exactly as vLLM renders a chat request: the template with
    `add_generation_prompt=True`, then tokenized without adding special tokens a second time."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template_kwargs: dict[str, Any] | None = None,
        server_render: Callable[..., Awaitable[list[int]]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.server_render = server_render  # set: prompts are rendered by the server's /tokenize instead

    async def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int]]:
        """The prompt of one call: rendered here, or by the server when its template differs from ours (the
        text is then the local decoding of the server's ids). `tools`: the template's `tools` argument."""
        if self.server_render is None:
            return self.encode(messages, tools)
        ids = await (self.server_render(messages, tools) if tools else self.server_render(messages))
        return self.tokenizer.decode(ids, skip_special_tokens=False), ids

    def decode_response(
        self,
        ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        prompt_ids: list[int] | None = None,
    ) -> str:
        """A response's text from its ids, as vLLM's /v1/completions writes it: the stop token that ended it
        (EOS or a stop token id; both stay in the ids) left out, special tokens skipped, and decoded as vLLM's
        detokenizer does, a token at a time after the prompt (`tokenizers`' DecodeStream primed with the prompt
        ids: a SentencePiece token's leading space is kept), holding back a trailing incomplete character. A stop
        string (`stop_reason` a string) cuts the text where it begins, as vLLM cuts it; the ids keep every token."""
        if ids and finish_reason == "stop" and not isinstance(stop_reason, str):
            ids = ids[:-1]
        text = self.decoded(ids, prompt_ids)
        if finish_reason == "stop" and isinstance(stop_reason, str) and stop_reason in text:
            text = text[: text.index(stop_reason)]
        return text

    def decoded(self, ids: list[int], prompt_ids: list[int] | None = None) -> str:
        """`ids` as vLLM's detokenizer writes them after `prompt_ids` (special tokens skipped), nothing cut."""
        backend = getattr(self.tokenizer, "_tokenizer", None)  # a fast tokenizer's `tokenizers.Tokenizer`
        if backend is not None and prompt_ids is not None:
            try:
                return _stream_decode(backend, prompt_ids, ids)
            except (ImportError, TypeError):  # tokenizers without DecodeStream(ids=...): decoded whole below
                pass
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        while text.endswith("\ufffd") and ids:
            ids = ids[:-1]
            text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        return text

    def encode(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int]]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **({"tools": tools} if tools else {}), **self.kwargs
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text, list(ids)


def _stream_decode(backend: Any, prompt_ids: list[int], ids: list[int]) -> str:
    """vLLM's FastIncrementalDetokenizer: a DecodeStream primed with the prompt, stepped a token at a time (a
    step that ends inside a character gives nothing until the character completes), reset as vLLM resets it when
    the tokenizer reports an invalid prefix."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=True)
    parts = []
    for token in ids:
        try:
            piece = stream.step(backend, token)
        except Exception as exc:
            if "Invalid prefix" not in str(exc):
                raise
            stream = DecodeStream(skip_special_tokens=True)
            piece = stream.step(backend, token)
        parts.append(piece or "")
    return "".join(parts)
