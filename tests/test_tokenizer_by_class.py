"""The tokenizer loaded by the class its config names is AutoTokenizer's (same text, same ids), needs no torch,
and leaves to AutoTokenizer what it cannot load that way; the server check gives AutoTokenizer its turn."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import transformers

import agentroll
from agentroll.engine.parity import check_parity
from agentroll.errors import UsageError
from agentroll.process.resources import sim_tokenizer_dir
from agentroll.render.chat import AUTO_DECIDES, ChatEncoder, load_by_class, load_first, load_tokenizer
from agentroll.render.templates import Templates
from agentroll.sim.server import SimServer

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


def _make(tmp_path: Path, name: str, changes: dict[str, Any] | None = None, model_type: str | None = None) -> Path:
    """The bundled tokenizer with `tokenizer_config.json` changed (`...` drops a key), and optionally the
    `config.json` of a model of `model_type` beside it, as in a model's folder."""
    folder = tmp_path / name
    shutil.copytree(SIM, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key, value in (changes or {}).items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if model_type:
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


def _added_decoder() -> dict[str, Any]:
    added = json.loads((SIM / "tokenizer.json").read_text())["added_tokens"]
    return {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}


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
        # Qwen2Tokenizer rebuilds its backend from the vocabulary and merges: both loaders do
        _make(
            tmp_path,
            "qwen2-class",
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "chat_template": QWEN_STYLE,
                "added_tokens_decoder": _added_decoder(),
            },
            model_type="qwen2",
        ),
        _make(
            tmp_path,
            "template-dict",
            {"chat_template": templates, "split_special_tokens": True, "tokenizer_class": "TokenizersBackend"},
        ),
    ]
    jinja = _make(tmp_path, "jinja-file", {"chat_template": "ignored {{ messages }}"})
    (jinja / "chat_template.jinja").write_text(LLAMA_STYLE)
    legacy = _make(tmp_path, "legacy-map", {"eos_token": ...})
    (legacy / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>"})
    )
    return [*out, jinja, legacy]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> list[tuple[Path, Any, Any]]:
    out = []
    for folder in variants(tmp_path_factory.mktemp("tokenizers")):
        by_class = load_by_class(str(folder))
        assert by_class is not None, folder.name
        out.append((folder, by_class, load_tokenizer(str(folder))))
    return out


def test_the_class_named_by_the_config_renders_and_encodes_as_auto_tokenizer_does(pairs):
    compared = 0
    for folder, by_class, auto in pairs:
        assert type(by_class) is type(auto), folder.name
        assert by_class.special_tokens_map == auto.special_tokens_map, folder.name
        assert (by_class.eos_token_id, by_class.pad_token_id, by_class.bos_token_id) == (
            auto.eos_token_id,
            auto.pad_token_id,
            auto.bos_token_id,
        ), folder.name
        for messages, kwargs in CONVERSATIONS:
            for generation_prompt in (True, False):
                want = auto.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
                got = by_class.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
                assert got == want, (folder.name, messages)
                assert by_class.encode(got, add_special_tokens=False) == auto.encode(want, add_special_tokens=False)
                compared += 1
            template_kwargs = {k: v for k, v in kwargs.items() if k != "tools"}
            assert ChatEncoder(by_class, template_kwargs).encode(messages) == ChatEncoder(auto, template_kwargs).encode(
                messages
            ), folder.name
        ids = by_class.encode("Hello <|im_end|> world <think>", add_special_tokens=False)
        for skip in (True, False):
            assert by_class.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
        assert by_class.get_vocab() == auto.get_vocab() and len(by_class) == len(auto)
        # the same backend, so the recorded tokenizer_sha256 does not depend on the loader
        assert by_class.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str(), folder.name
    assert compared == len(pairs) * len(CONVERSATIONS) * 2 == 98


FAKE_TORCH = "raise ImportError('torch is switched off for this test')\n"

CHILD = """
import json, sys
from agentroll.render.chat import ChatEncoder, load_first
loaded = [load_first([name], by_class=True) for name in sys.argv[1:]]
ids = [ChatEncoder(t).encode([{"role": "user", "content": "What is 17 + 25?"}])[1] for _, t in loaded]
torch = "torch" in sys.modules
try:
    from transformers import AutoTokenizer  # the control: this import needs torch
    auto = "loaded"
except ImportError as exc:
    auto = str(exc)
print(json.dumps({"types": [type(t).__name__ for _, t in loaded], "ids": ids, "torch": torch,
                  "auto": auto}))
"""


def test_loading_by_class_works_with_a_torch_that_fails_on_import_from_a_folder_and_the_hub_cache(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text(FAKE_TORCH)
    hub = tmp_path / "hub"
    repo = hub / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    shutil.copytree(SIM, repo / "snapshots" / "abc123")
    qwen2 = _make(tmp_path, "qwen2", {"tokenizer_class": "Qwen2TokenizerFast"})
    want = ChatEncoder(load_tokenizer(str(SIM))).encode([{"role": "user", "content": "What is 17 + 25?"}])[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "HF_"))}
    base.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")
    for pythonpath, torch_works in ((str(fake), False), ("", True)):  # a torch that fails, then the real one
        env = {**base, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, base.get("PYTHONPATH", "")) if p)}
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(SIM), "org/tiny", str(qwen2)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        assert seen["types"] == ["TokenizersBackend", "TokenizersBackend", "Qwen2Tokenizer"]
        assert seen["ids"][:2] == [want, want] and seen["ids"][2]
        assert seen["torch"] is False  # nothing imported torch, though it is installed
        assert (seen["auto"] == "loaded") is torch_works, seen["auto"]


def test_what_cannot_load_by_its_class_name_is_left_to_auto_tokenizer(tmp_path):
    text = "Hello world, 12345 — résumé"
    left = {
        "no-class": {"tokenizer_class": ...},
        "unknown-class": {"tokenizer_class": "NoSuchTokenizer"},
        "not-a-tokenizers-backend": {"tokenizer_class": "PreTrainedTokenizer"},
        "remote-code": {"auto_map": {"AutoTokenizer": [None, "tok.Tok"]}},
        **{f"named-{name}": {"tokenizer_class": name} for name in AUTO_DECIDES},
    }
    for name, changes in left.items():
        folder = str(_make(tmp_path, name, changes))
        assert load_by_class(folder) is None, name
        found, tokenizer = load_first([folder], by_class=True)
        auto = load_tokenizer(folder)
        assert found == folder and type(tokenizer) is type(auto), name
        assert tokenizer.encode(text, add_special_tokens=False) == auto.encode(text, add_special_tokens=False)
    # why Llama's names go to AutoTokenizer: that class, loaded by its name, builds a pipeline of its own
    llama = str(tmp_path / "named-LlamaTokenizerFast")
    assert transformers.LlamaTokenizer.from_pretrained(llama).encode(text, add_special_tokens=False) != load_tokenizer(
        llama
    ).encode(text, add_special_tokens=False)
    assert load_by_class("no/such-model") is None and load_by_class(str(tmp_path / "absent")) is None
    broken = _make(tmp_path, "broken")
    (broken / "tokenizer.json").write_text("{")
    assert load_by_class(str(broken)) is None
    with pytest.raises(UsageError, match=f"cannot load tokenizer '{broken}'"):
        load_first([str(broken)], by_class=True)
    untemplated = str(_make(tmp_path, "untemplated", {"chat_template": ...}))
    with pytest.raises(UsageError, match="has no chat template"):
        load_by_class(untemplated)
    assert load_first([untemplated, str(SIM)], by_class=True)[0] == str(SIM)  # the next candidate


class FakeServer:
    """`/tokenize` as a server would answer it: with the ids `ids_of` gives, or absent (None)."""

    def __init__(self, ids_of: Any) -> None:
        self.ids_of = ids_of

    async def post_with_retries(self, path: str, body: dict[str, Any], absent: frozenset[int] = frozenset()) -> Any:
        return None if self.ids_of is None else {"tokens": self.ids_of(body["messages"])}


def parity_of(server: FakeServer, encoder: ChatEncoder, conversations: list[Any], fallback: Any) -> Any:
    return asyncio.run(check_parity(server, encoder, "m", conversations, fallback))  # type: ignore[arg-type]


CHECKED = [
    [{"role": "user", "content": "Solve x² = 4 — résumé, 数学 and 12345."}],
    [{"role": "user", "content": "What is 17 + 25?"}],
]


def test_the_server_check_gives_auto_tokenizer_its_turn_when_the_class_named_renders_otherwise(tmp_path):
    # transformers maps OLMo-2's model type to the generic backend: AutoTokenizer does not take the class the
    # tokenizer config names, and the ids differ
    folder = str(_make(tmp_path, "olmo2", {"tokenizer_class": "Qwen2Tokenizer"}, model_type="olmo2"))
    auto = load_tokenizer(folder)
    by_class = load_by_class(folder)
    assert type(by_class).__name__ == "Qwen2Tokenizer" and type(auto).__name__ == "TokenizersBackend"

    def served(messages: list[dict[str, Any]]) -> list[int]:  # vLLM loads its tokenizer with AutoTokenizer
        return ChatEncoder(auto).encode(messages)[1]

    assert any(ChatEncoder(by_class).encode(m)[1] != served(m) for m in CHECKED)
    encoder = ChatEncoder(by_class)
    parity = parity_of(FakeServer(served), encoder, CHECKED, partial(load_tokenizer, folder))
    assert parity.mismatch is None and parity.checked == 2 and type(encoder.tokenizer) is type(auto)

    unchecked = ChatEncoder(by_class)
    parity = parity_of(FakeServer(None), unchecked, CHECKED, partial(load_tokenizer, folder))
    assert not parity.supported and type(unchecked.tokenizer) is type(auto)  # unchecked: AutoTokenizer's choice


def test_the_server_check_keeps_an_agreeing_tokenizer_and_reports_a_template_both_loaders_share(tmp_path):
    calls: list[str] = []

    def auto_of(folder: str) -> Any:
        return lambda: calls.append(folder) or load_tokenizer(folder)

    tokenizer = load_by_class(str(SIM))

    def served(messages: list[dict[str, Any]]) -> list[int]:
        return ChatEncoder(tokenizer).encode(messages)[1]

    agreed = ChatEncoder(tokenizer)
    parity = parity_of(FakeServer(served), agreed, CHECKED, auto_of(str(SIM)))
    assert parity.mismatch is None and agreed.tokenizer is tokenizer and calls == []

    other = str(_make(tmp_path, "other", {"chat_template": "{{ messages[0]['content'] }}"}))
    differs = ChatEncoder(load_by_class(other))
    parity = parity_of(FakeServer(served), differs, CHECKED, auto_of(other))
    assert parity.mismatch and parity.mismatch.startswith("prompt 1:") and calls == [other]  # the server renders

    def broken() -> Any:
        raise UsageError("cannot load tokenizer: torch is broken here")

    kept = ChatEncoder(tokenizer)
    parity = parity_of(FakeServer(None), kept, CHECKED, broken)
    assert not parity.supported and kept.tokenizer is tokenizer  # ours stands when AutoTokenizer cannot load


def test_generate_under_auto_renders_locally_with_auto_tokenizers_class_when_the_named_one_differs(tmp_path):
    folder = _make(tmp_path, "olmo2", {"tokenizer_class": "Qwen2Tokenizer"}, model_type="olmo2")
    server = SimServer(tokenizer_dir=folder)  # renders /tokenize with tokenizer.json as it is, as AutoTokenizer
    server.start()
    row = {"id": "q1", "prompt": "What is 17 + 25, résumé?", "label": "42"}
    try:

        async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with agentroll.Generator(
                base_url=server.url, tokenizer=str(folder), reward="exact", samples_per_prompt=1, num_parallel=1
            ) as gen:
                return gen.settings, (await gen.run_group(row)).records()

        settings, records = asyncio.run(run())
        solver = next(r for r in records if r["stage"] == "solver")
        messages = Templates().messages("solver", row["prompt"])
        theirs = server.engine.tokenize({"messages": messages, "add_generation_prompt": True})["tokens"]
    finally:
        server.stop()
    by_name = ChatEncoder(load_by_class(str(folder))).encode(messages)[1]
    assert by_name != theirs  # the class the config names would have rendered other ids
    assert settings["prompt_rendering"] == "local" and solver["prompt_token_ids"] == theirs


def test_auto_tokenizer_under_a_torch_that_fails_on_import_is_a_one_line_usage_error(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text(FAKE_TORCH)
    child = (
        "import sys\nfrom agentroll.render.chat import load_tokenizer\nfrom agentroll.errors import UsageError\n"
        "try:\n    load_tokenizer(sys.argv[1])\nexcept UsageError as exc:\n    print(exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "HF_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", child, str(SIM)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(f"cannot load tokenizer '{SIM}': transformers' AutoTokenizer does not import here"), line
