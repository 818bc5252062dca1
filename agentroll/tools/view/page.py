"""The page: our own HTML, CSS and script (`view.css`, `view*.js`, beside this module), inlined, nothing else.

Served, it reads its data from the server's `/api`; written with `-o`, the data is inlined too, as JSON in a
script element that is never run (every `<` in it escaped), and the page opens offline from a file. Its
Content-Security-Policy allows its own script only (by its sha256), inline styles, and no load at all but
the server's `/api` when served: a stray address in the data could not reach the network.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from html import escape
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent


@cache
def _asset(name: str) -> str:
    return (HERE / name).read_text(encoding="utf-8")


SCRIPT = ("view.js", "view-tokens.js", "view-group.js")  # parts of one function's body, in this order


def script_text() -> str:
    """The page's script: its parts inside one function, so that their names are the page's own."""
    return '"use strict";\n(() => {\n' + "".join(_asset(name) for name in SCRIPT) + "})();\n"


def csp(script: str, served: bool) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    connect = "'self'" if served else "'none'"
    return (
        f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; connect-src {connect}; "
        "base-uri 'none'; form-action 'none'"
    )


def inline_json(data: Any) -> str:
    """JSON that can sit in a script element: no `<` (so no `</script>`, no `<!--`) in it."""
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).replace(b"<", b"\\u003c").decode()


def page(data: dict[str, Any] | None, title: str = "agentroll view") -> tuple[str, str]:
    """(the page, its Content-Security-Policy): served (`data` None) or with its data inlined."""
    script = script_text()
    policy = csp(script, served=data is None)
    inlined = (
        "" if data is None else f'<script type="application/json" id="agentroll-data">{inline_json(data)}</script>'
    )
    html = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        + (f'<meta http-equiv="Content-Security-Policy" content="{policy}">' if data is not None else "")
        + "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{escape(title)}</title><style>{_asset('view.css')}</style></head><body>"
        "<header><h1>agentroll view</h1><p class='sub'>reading…</p></header><div id='filters'></div>"
        "<noscript>This page is drawn by its script: allow JavaScript for it.</noscript>"
        f"<div id='list'></div><div id='pager'></div><main></main>{inlined}<script>{script}</script></body></html>\n"
    )
    return html, policy
