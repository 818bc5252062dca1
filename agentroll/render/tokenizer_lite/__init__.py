"""A tokenizer and its chat template without transformers: `tokenizers` + jinja2, as transformers 5 sets them up.

Importing transformers imports torch when torch is installed: two seconds and a gigabyte before the first
request. For the tokenizers transformers loads exactly as their `tokenizer.json` says (`PreTrainedTokenizerFast`,
and `Qwen2Tokenizer` when the file has the shape that class rebuilds), `LiteTokenizer` gives the same ids:

- the backend is `tokenizer.json`, with truncation and padding off (as `encode` turns them off), its added
  tokens exactly those `tokenizer_config.json` lists, every named special token among them;
- the chat template is rendered in transformers' sandbox (`ImmutableSandboxedEnvironment`, `trim_blocks`,
  `lstrip_blocks`, loop controls, the `generation` tag, `raise_exception`, `strftime_now`, its `tojson`, its
  `dict` and `namespace`), with the same inputs (`None` values dropped, reasoning fields aliased, the special
  tokens map as variables);
- anything else (`load` returns None): another tokenizer class, remote code, extra template files, a template
  dict without a default, `clean_up_tokenization_spaces`: transformers loads it, as before.

`--chat-render auto` keeps a `LiteTokenizer` only when the server's `/tokenize` proves its ids on the stage
prompts (`parity.check_parity`); otherwise (a difference, or no /tokenize to ask) the transformers tokenizer
(`full()`, loaded as without this class) takes its place and is checked in its turn. Restored from 9c3bb80 (issue
46: start-up), where transformers' import was not yet paid before the first request. What this class
does not do itself (batched or tokenized chats, `continue_final_message`, attributes it lacks) goes to that
tokenizer too, loaded on first use. tests/test_tokenizer_lite.py compares both on many templates and messages.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from agentroll.render.tokenizer_lite.template import _alias_reasoning, _plain, compile_template

AS_IS = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
QWEN2 = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast"})
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# What Qwen2Tokenizer.__init__ builds (transformers 5): checked against the file, never applied blindly
QWEN2_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_DEFAULTS = {
    "unk_token": "<|endoftext|>",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}


class Unsupported(Exception):
    """This tokenizer needs transformers to load exactly."""


def load(name_or_path: str) -> LiteTokenizer | None:
    """A `LiteTokenizer` for a folder (or a hub id already in the hub cache), or None when transformers must
    load it."""
    folder = _folder(name_or_path)
    if folder is None:
        return None
    try:
        return LiteTokenizer(folder, name_or_path)
    except (Unsupported, OSError, ValueError, ImportError, KeyError, TypeError, AttributeError):
        return None  # transformers loads it, and says what is wrong if anything is


def _folder(name_or_path: str) -> Path | None:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if name_or_path.count("/") != 1 or name_or_path.startswith(("/", ".", "~")):
        return None
    # the hub cache, as transformers reads it with local_files_only (revision "main")
    cache = (
        os.environ.get("HF_HUB_CACHE")
        or os.environ.get("HUGGINGFACE_HUB_CACHE")
        or os.path.join(
            os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"),
            "hub",
        )
    )
    repo = Path(cache).expanduser() / f"models--{name_or_path.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(token, dict):
        if "content" not in token:
            raise Unsupported(f"special token {token!r}")
        return str(token["content"])
    return token if isinstance(token, str) else None


class LiteTokenizer:
    """The parts of a transformers tokenizer that agentroll uses, without transformers (see the module)."""

    def __init__(self, folder: Path, name_or_path: str) -> None:
        from tokenizers import Tokenizer

        self.name_or_path = name_or_path
        self.folder = folder
        config = orjson.loads((folder / "tokenizer_config.json").read_bytes())
        kind = config.get("tokenizer_class")  # absent: transformers picks a class by the model's type
        if kind not in AS_IS | QWEN2:
            raise Unsupported(f"tokenizer class {kind}")
        unsupported = {
            "auto_map",
            "fast_tokenizer_files",
            "fix_mistral_regex",
            "tokenizer_file",
            "vocab_file",
            "model_specific_special_tokens",
        }
        if (
            unsupported & config.keys()
            or (folder / "added_tokens.json").exists()
            or (folder / "additional_chat_templates").exists()
        ):
            raise Unsupported("options transformers applies at load time")
        raw = orjson.loads((folder / "tokenizer.json").read_bytes())
        if raw.get("truncation") or raw.get("padding"):
            raise Unsupported("truncation or padding in tokenizer.json")
        if kind in QWEN2:
            _check_qwen2(raw, config)
            _as_qwen2_builds(raw)
        import jinja2

        if tuple(int(x) for x in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
            raise Unsupported("transformers refuses jinja2 before 3.1.6")
        if config.get("clean_up_tokenization_spaces") and (
            raw.get("model", {}).get("type") != "BPE"
            or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")
        ):
            raise Unsupported("clean_up_tokenization_spaces")
        self.special_tokens_map = self._special_tokens(config, kind, folder)
        added = {t["content"]: t for t in raw.get("added_tokens", [])}
        self._check_added(config, added, raw.get("model", {}).get("vocab") if kind in QWEN2 else None)
        self.chat_template = self._template(config, folder)
        self._tokenizer = Tokenizer.from_str(json.dumps(raw))
        self._tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
        if self._tokenizer.post_processor is None:  # what transformers sets (add_bos/eos_token are dropped)
            from tokenizers.processors import TemplateProcessing

            self._tokenizer.post_processor = TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
        self._full: Any = None
        self._lock = threading.Lock()
        self.loader: Callable[[], Any] | None = None

    # -- loading ------------------------------------------------------------------------------------------------
    def _special_tokens(self, config: dict[str, Any], kind: str, folder: Path) -> dict[str, str]:
        """`special_tokens_map` as transformers builds it: class defaults, the config, the legacy map file, and
        model-specific `*_token` entries."""
        values: dict[str, Any] = dict(QWEN2_DEFAULTS) if kind in QWEN2 else {}
        values.update({k: v for k, v in config.items() if k.endswith("_token")})
        for key, value in values.items():
            if isinstance(value, dict) and value.get("__type") != "AddedToken":
                raise Unsupported(f"{key} is neither a string nor an AddedToken")
        legacy = folder / "special_tokens_map.json"
        if "added_tokens_decoder" not in config and legacy.exists():
            listed = orjson.loads(legacy.read_bytes())
            if set(listed) - {*NAMED, "additional_special_tokens", "extra_special_tokens"}:
                raise Unsupported("special_tokens_map.json names model-specific tokens")
            values.update(listed)
        extra = (
            values.pop("extra_special_tokens", None)
            or values.pop("additional_special_tokens", None)
            or config.get("extra_special_tokens")
            or config.get("additional_special_tokens")
        )
        named = {k: _content(v) for k, v in values.items() if k in NAMED}
        specific = {
            k: _content(v)
            for k, v in values.items()
            if k not in NAMED and (isinstance(v, str) or (isinstance(v, dict) and "content" in v))
        }
        if isinstance(extra, dict):
            specific.update({k: _content(v) for k, v in extra.items()})
            extra = []
        self.extra_special_tokens = [t for t in map(_content, extra or []) if t is not None]
        return {k: v for k, v in {**named, **specific}.items() if v is not None}

    def _check_added(
        self, config: dict[str, Any], added: dict[str, dict[str, Any]], rebuilt_vocab: dict[str, int] | None
    ) -> None:
        """transformers adds tokens the file lacks (new ids) and marks special tokens special: neither may
        change anything here. A rebuilt backend (`rebuilt_vocab`: its model's vocabulary) gets the config's added
        tokens again, in index order: each must land on the id the file gives it."""
        fields = ("content", "lstrip", "rstrip", "normalized", "single_word", "special")
        next_id = len(rebuilt_vocab) if rebuilt_vocab is not None else 0
        for index, token in sorted((config.get("added_tokens_decoder") or {}).items(), key=lambda kv: int(kv[0])):
            known = added.get(token.get("content"))
            if (
                known is None
                or known["id"] != int(index)
                or any(known.get(f) != token.get(f) for f in fields if f in token)
            ):
                raise Unsupported(f"added token {token.get('content')!r} differs from tokenizer.json")
            if rebuilt_vocab is not None:
                lands = rebuilt_vocab.get(known["content"], next_id)
                if lands != known["id"]:
                    raise Unsupported(f"added token {known['content']!r} would get another id")
                next_id = max(next_id, lands + 1)
        for token in [*self.special_tokens_map.values(), *self.extra_special_tokens]:
            if token not in added or not added[token].get("special"):
                raise Unsupported(f"special token {token!r} is not a special added token of tokenizer.json")

    @staticmethod
    def _template(config: dict[str, Any], folder: Path) -> str | dict[str, str] | None:
        jinja = folder / "chat_template.jinja"
        if jinja.exists():
            return jinja.read_text(encoding="utf-8")
        template = config.get("chat_template")
        if isinstance(template, list):
            return {t["name"]: t["template"] for t in template}
        return template if isinstance(template, str | dict) else None

    def full(self) -> Any:
        """The transformers tokenizer of the same files: `loader`'s (`chat.load_first` sets it: as the run loads
        one without this class), else `AutoTokenizer`'s; imported and loaded once, on first use."""
        with self._lock:
            if self._full is None:
                if self.loader is not None:
                    self._full = self.loader()
                else:
                    from transformers import AutoTokenizer

                    self._full = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
            return self._full

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_full", "_lock", "_tokenizer", "folder", "loader"):
            raise AttributeError(name)
        return getattr(self.full(), name)

    # -- what agentroll uses --------------------------------------------------------------------------------------
    @property
    def backend_tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    def _token_id(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self.convert_tokens_to_ids(token)

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        token = self.special_tokens_map.get("unk_token")
        return None if token is None else self._tokenizer.token_to_id(token)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        if isinstance(tokens, str):
            index = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return self.full().convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs or not isinstance(text, str):
            return list(self.full().encode(text, add_special_tokens=add_special_tokens, **kwargs))
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if kwargs or not isinstance(token_ids, list) or (token_ids and not isinstance(token_ids[0], int)):
            return self.full().decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def get_chat_template(self, chat_template: str | None = None, tools: list[Any] | None = None) -> str:
        template = self.chat_template
        if isinstance(template, dict):
            if chat_template is not None and chat_template in template:
                return template[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in template:
                    return template["tool_use"]
                if "default" in template:
                    return template["default"]
                return str(self.full().get_chat_template(chat_template, tools))  # transformers says why
        elif chat_template is None:
            if template is None:
                return str(self.full().get_chat_template(chat_template, tools))  # transformers says why
            return template
        return chat_template

    def apply_chat_template(
        self,
        conversation: Any,
        tools: list[Any] | None = None,
        documents: list[Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> Any:
        """`transformers`' `apply_chat_template(..., tokenize=False)` for one conversation of plain JSON data;
        every other use goes to the transformers tokenizer."""
        options = {
            "tools": tools,
            "documents": documents,
            "chat_template": chat_template,
            "add_generation_prompt": add_generation_prompt,
            "tokenize": tokenize,
        }
        special = {
            "continue_final_message",
            "sanitize_control_tokens",
            "padding",
            "truncation",
            "max_length",
            "return_tensors",
            "return_dict",
            "return_assistant_tokens_mask",
            "tokenizer_kwargs",
        }
        if (
            tokenize
            or special & kwargs.keys()
            or not _plain(conversation)
            or not _plain(kwargs)
            or not _plain(tools)
            or not _plain(documents)
            or not isinstance(conversation, list | tuple)
            or not conversation
            or not all(isinstance(m, dict) for m in conversation)
            or (documents is not None and not all(isinstance(d, dict) for d in documents))
        ):
            return self.full().apply_chat_template(conversation, **options, **kwargs)
        source = self.get_chat_template(chat_template, tools)
        chat = _alias_reasoning([{k: v for k, v in m.items() if v is not None} for m in conversation])
        return compile_template(source).render(
            messages=chat,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )


def _check_qwen2(raw: dict[str, Any], config: dict[str, Any]) -> None:
    """Qwen2Tokenizer rebuilds its backend from the vocabulary and merges: NFC, a split on its regex, byte-level
    BPE. The file is used as it is only when it says exactly that."""
    prefix = bool(config.get("add_prefix_space") or False)
    want_pre = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": prefix, "use_regex": False},
        ],
    }
    pre = raw.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") or []
    seen = {
        "type": pre.get("type"),
        "pretokenizers": [{k: p.get(k) for k in w} for p, w in zip(parts, want_pre["pretokenizers"], strict=False)],
    }
    model = raw.get("model") or {}
    if (
        raw.get("normalizer") != {"type": "NFC"}
        or seen != want_pre
        or len(parts) != 2
        or (raw.get("decoder") or {}).get("type") != "ByteLevel"
        or model.get("type") != "BPE"
        or model.get("dropout") is not None
        or model.get("unk_token") is not None
        or model.get("continuing_subword_prefix") not in (None, "")
        or model.get("end_of_word_suffix") not in (None, "")
        or model.get("fuse_unk")
        or model.get("byte_fallback")
        or model.get("ignore_merges")
    ):
        raise Unsupported("tokenizer.json is not what Qwen2Tokenizer builds")


def _as_qwen2_builds(raw: dict[str, Any]) -> None:
    """The settings Qwen2Tokenizer writes that change no id (offsets, unused affixes, the decoder's flags), as it
    writes them: the backend, and so its recorded hash, are then transformers' own."""
    raw["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = True
    raw["model"].update(continuing_subword_prefix="", end_of_word_suffix="")
    raw["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
