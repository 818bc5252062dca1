"""The tokenizer loaded without transformers gives transformers' own text and ids, or is not used at all
(restored from 9c3bb80 for issue 46's start-up, checked against the transformers installed now)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentroll.engine.parity import check_parity
from agentroll.process.resources import sim_tokenizer_dir
from agentroll.render import tokenizer_lite
from agentroll.render.chat import ChatEncoder, load_first, load_tokenizer
from agentroll.render.tokenizer_lite import QWEN2_REGEX, LiteTokenizer

SIM = sim_tokenizer_dir()

# Templates written for this test in the styles of widely used models: tools and JSON, think blocks and
# reasoning fields, namespaces, loop controls, raise_exception, strftime_now, dict(), the generation tag.
QWEN_STYLE = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages|length - 1) - loop.index0 %}
{%- if message.role == "user" and message.content is string %}{%- set ns.last_query = index %}{%- break %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == "system" and loop.first %}{%- continue %}{%- endif %}
{%- if message.role == "user" or message.role == "system" %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == "assistant" %}
{%- set content = message.content or '' %}
{%- set reasoning = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_query %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}{{- '<|im_start|>assistant\n' + content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{%- set call = call.function if call.function else call %}
{{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + (call.arguments if call.arguments is string
    else call.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}{{- raise_exception('unknown role ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
"""

LLAMA_STYLE = r"""{{- bos_token if bos_token is defined else '' }}
{%- if not date_string is defined %}{%- set date_string = strftime_now("%Y") %}{%- endif %}
{%- set extra = dict(year=date_string, eos=eos_token) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
<|im_start|>system
Year: {{ extra.year }}
{% if tools is not none %}Tools:
{% for t in tools %}{{ t | tojson(indent=4) }}
{% endfor %}{% endif %}
{{ system_message }}<|im_end|>
{% for message in messages %}
  {% if message['role'] == 'assistant' %}
<|im_start|>assistant
{% generation %}{{ message['content'] | trim }}{% endgeneration %}<|im_end|>
  {% else %}
<|im_start|>{{ message['role'] }}
{{ message['content'] | trim }}<|im_end|>
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two numbers, e.g. «2 + 3»",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]

CONVERSATIONS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"role": "user", "content": "What is 17 + 25?"}], {}),
    (
        [
            {"role": "system", "content": "You are a careful mathematician. "},
            {"role": "user", "content": "Solve x² = 4 — résumé, 数学 and emoji 🧮."},
        ],
        {},
    ),
    (
        [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\nThe answer is \\boxed{4}."},
            {"role": "user", "content": "Check once more."},
        ],
        {"enable_thinking": False},
    ),
    (
        [
            {"role": "user", "content": "Think first."},
            {"role": "assistant", "content": "It is 4.", "reasoning_content": "2 + 2 is 4", "tool_calls": None},
        ],
        {},
    ),
    (
        [
            {"role": "user", "content": "Add 2 and 3."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
            },
            {"role": "tool", "content": "5"},
        ],
        {"tools": TOOLS},
    ),
    ([{"role": "user", "content": "A literal <|im_end|> and <think> inside a message."}], {}),
    ([{"role": "user", "content": "long " * 3000}], {"date_string": "2026"}),
]


def _make(
    tmp_path: Path,
    name: str,
    config_changes: dict[str, Any] | None = None,
    tokenizer_changes: dict[str, Any] | None = None,
) -> Path:
    folder = tmp_path / name
    shutil.copytree(SIM, folder)
    for file, changes in (("tokenizer_config.json", config_changes), ("tokenizer.json", tokenizer_changes)):
        data = json.loads((folder / file).read_text())
        for key, value in (changes or {}).items():
            if value is None and key in data and file == "tokenizer.json":
                data[key] = None
            elif value is ...:
                data.pop(key, None)
            else:
                data[key] = value
        (folder / file).write_text(json.dumps(data))
    return folder


def _added_decoder() -> dict[str, Any]:
    added = json.loads((SIM / "tokenizer.json").read_text())["added_tokens"]
    return {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}


QWEN2_FILE = {
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    },
}


def variants(tmp_path: Path) -> list[Path]:
    """The bundled tokenizer, and tokenizers shaped like those of real models, built from it."""
    templates = [{"name": "default", "template": QWEN_STYLE}, {"name": "tool_use", "template": LLAMA_STYLE}]
    out = [
        SIM,
        _make(tmp_path, "qwen-style", {"chat_template": QWEN_STYLE, "added_tokens_decoder": _added_decoder()}),
        _make(
            tmp_path,
            "llama-style",
            {
                "chat_template": LLAMA_STYLE,
                "bos_token": {
                    "__type": "AddedToken",
                    "content": "<|endoftext|>",
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                    "special": True,
                },
                "image_token": "<|im_start|>",
                "add_bos_token": True,
                "clean_up_tokenization_spaces": True,
            },
        ),
        _make(
            tmp_path,
            "qwen2-class",
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "chat_template": QWEN_STYLE,
                "added_tokens_decoder": _added_decoder(),
            },
            QWEN2_FILE,
        ),
        _make(tmp_path, "template-dict", {"chat_template": templates, "split_special_tokens": True}),
    ]
    jinja = _make(tmp_path, "jinja-file", {"chat_template": "ignored {{ messages }}"})
    (jinja / "chat_template.jinja").write_text(LLAMA_STYLE)
    legacy = _make(tmp_path, "legacy-map", {"eos_token": ...})
    (legacy / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>"})
    )
    return [*out, jinja, legacy]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> list[tuple[Path, LiteTokenizer, Any]]:
    out = []
    for folder in variants(tmp_path_factory.mktemp("tokenizers")):
        lite = tokenizer_lite.load(str(folder))
        assert lite is not None, folder.name
        out.append((folder, lite, load_tokenizer(str(folder))))
    return out


def test_rendered_text_and_ids_are_transformers_own(pairs):
    compared = 0
    for folder, lite, full in pairs:
        assert lite.special_tokens_map == full.special_tokens_map, folder.name
        assert (lite.eos_token_id, lite.pad_token_id, lite.bos_token_id) == (
            full.eos_token_id,
            full.pad_token_id,
            full.bos_token_id,
        ), folder.name
        for messages, kwargs in CONVERSATIONS:
            for generation_prompt in (True, False):
                want = full.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
                got = lite.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
                assert got == want, (folder.name, messages)
                assert lite.encode(got, add_special_tokens=False) == full.encode(want, add_special_tokens=False)
                compared += 1
            template_kwargs = {k: v for k, v in kwargs.items() if k != "tools"}
            assert ChatEncoder(lite, template_kwargs).encode(messages) == ChatEncoder(full, template_kwargs).encode(
                messages
            ), folder.name
        ids = lite.encode("Hello <|im_end|> world <think>", add_special_tokens=False)
        for skip in (True, False):
            assert lite.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
        assert lite.get_vocab() == full.get_vocab() and len(lite) == len(full)
    assert compared == len(pairs) * len(CONVERSATIONS) * 2


def test_the_backend_is_transformers_own_so_the_recorded_tokenizer_hash_does_not_change(pairs):
    for folder, lite, full in pairs:
        full.encode("x")  # transformers switches truncation and padding off on the first encode
        assert lite.backend_tokenizer.to_str() == full.backend_tokenizer.to_str(), folder.name


def test_template_errors_are_transformers_own(pairs):
    _, lite, full = next(p for p in pairs if p[0].name == "qwen-style")
    bad = [{"role": "robot", "content": "hi"}]
    for tokenizer in (lite, full):
        with pytest.raises(Exception, match="unknown role robot") as caught:
            tokenizer.apply_chat_template(bad, tokenize=False)
        assert type(caught.value).__name__ == "TemplateError"


def test_what_it_does_not_do_itself_goes_to_transformers(pairs):
    _, lite, full = pairs[0]
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    assert lite.apply_chat_template(messages, tokenize=False, continue_final_message=True) == full.apply_chat_template(
        messages, tokenize=False, continue_final_message=True
    )
    assert list(lite.apply_chat_template(messages, tokenize=True)["input_ids"]) == list(
        full.apply_chat_template(messages, tokenize=True)["input_ids"]
    )
    assert lite.model_max_length == full.model_max_length  # an attribute it lacks


def test_tokenizers_transformers_would_load_otherwise_are_left_to_it(tmp_path):
    decoder = _added_decoder()
    decoder["1080"] = {**decoder["1080"], "special": True}
    refused = {
        "another-class": ({"tokenizer_class": "LlamaTokenizerFast"}, None),
        "no-class": ({"tokenizer_class": ...}, None),
        "remote-code": ({"auto_map": {"AutoTokenizer": ["x.Tok", None]}}, None),
        "added-token-differs": ({"added_tokens_decoder": decoder}, None),
        "special-token-not-added": ({"eos_token": "hello"}, None),
        "qwen2-class-other-file": ({"tokenizer_class": "Qwen2Tokenizer"}, None),
        "truncation-in-file": (
            {},
            {"truncation": {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}},
        ),
    }
    for name, (config, tokenizer) in refused.items():
        assert tokenizer_lite.load(str(_make(tmp_path, name, config, tokenizer))) is None, name
    extra = _make(tmp_path, "extra-templates")
    (extra / "additional_chat_templates").mkdir()
    assert tokenizer_lite.load(str(extra)) is None
    assert tokenizer_lite.load("no/such-model") is None
    name, tokenizer = load_first(
        [str(_make(tmp_path, "fallback", {"tokenizer_class": "LlamaTokenizerFast"}))], lite=True
    )
    assert not isinstance(tokenizer, LiteTokenizer) and tokenizer.chat_template


def test_a_hub_id_in_the_hub_cache_loads_without_transformers(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    shutil.copytree(SIM, repo / "snapshots" / "abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    name, tokenizer = load_first(["org/tiny"], lite=True)
    assert name == "org/tiny" and isinstance(tokenizer, LiteTokenizer)


class FakeServer:
    """`/tokenize` as a server would answer it: with transformers' ids, or absent (None)."""

    def __init__(self, ids_of: Any) -> None:
        self.ids_of = ids_of
        self.asked = 0

    async def post_with_retries(self, path: str, body: dict[str, Any], absent: frozenset[int] = frozenset()) -> Any:
        self.asked += 1
        return None if self.ids_of is None else {"tokens": self.ids_of(body["messages"])}


def test_the_server_must_prove_the_lite_tokenizer_or_transformers_takes_its_place():
    full = load_tokenizer(str(SIM))
    conversations = [[{"role": "user", "content": "What is 17 + 25?"}], [{"role": "user", "content": "Again"}]]

    def served(messages: list[dict[str, Any]]) -> list[int]:
        return ChatEncoder(full).encode(messages)[1]

    proven = ChatEncoder(tokenizer_lite.load(str(SIM)))
    parity = asyncio.run(check_parity(FakeServer(served), proven, "m", conversations))  # type: ignore[arg-type]
    assert parity.mismatch is None and isinstance(proven.tokenizer, LiteTokenizer)

    differs = ChatEncoder(tokenizer_lite.load(str(SIM)))
    differs.tokenizer.chat_template = "{{ messages[0]['content'] }}"  # a lite rendering the server disowns
    turns = [differs.tokenizer.full]  # as the run passes them (handshake.renders_otherwise)
    parity = asyncio.run(check_parity(FakeServer(served), differs, "m", conversations, turns))  # type: ignore[arg-type]
    assert parity.mismatch is None and not isinstance(differs.tokenizer, LiteTokenizer)

    unchecked = ChatEncoder(tokenizer_lite.load(str(SIM)))
    turns = [unchecked.tokenizer.full]
    parity = asyncio.run(check_parity(FakeServer(None), unchecked, "m", conversations, turns))  # type: ignore[arg-type]
    assert not parity.supported and not isinstance(unchecked.tokenizer, LiteTokenizer)


def test_loading_it_imports_neither_transformers_nor_torch():
    import subprocess
    import sys

    code = (
        f"import sys; from agentroll.render.chat import load_first; n, t = load_first([{str(SIM)!r}], lite=True); "
        "t.apply_chat_template([{'role': 'user', 'content': 'x'}], tokenize=False); "
        "print(type(t).__name__, 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["LiteTokenizer", "False", "False"], out.stderr
