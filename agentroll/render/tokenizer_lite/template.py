"""A chat template rendered as transformers renders one (`apply_chat_template(..., tokenize=False)`): its
sandboxed jinja2 environment with the same options, extension, globals and filter, and the same inputs (plain
JSON data, reasoning fields aliased). `LiteTokenizer` uses it only where the server's /tokenize then proves the
ids (`parity.check_parity`)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
JSON_SCALARS = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Plain JSON data (what transformers passes to a template unchanged); anything else goes to transformers."""
    if isinstance(value, JSON_SCALARS):
        return type(value) in JSON_SCALARS
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    return False


def _alias_reasoning(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in chat:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@lru_cache(maxsize=32)
def compile_template(source: str) -> Any:
    """The template in transformers' own jinja2 environment (utils/chat_template_utils.py)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: transformers marks assistant tokens with it; rendered as is."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not set {name!r} on a namespace: a name starting with an underscore"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)
