"""Token ids as the text a person reads, one piece per token, with the run's own tokenizer.

A token's piece is what it adds to the text decoded so far: the decoding of a few tokens before it and itself,
less the decoding of those few alone (so a SentencePiece word's leading space, or a byte-level space, lands on
the token that carries it). A character split over several tokens (byte-level BPE cuts UTF-8 anywhere) is given
to the token that completes it; the tokens before it show as empty pieces. Special tokens are kept (the EOS the
model stopped on is a token it is trained on). The pieces of a response join into its decoding exactly.

Which tokenizer: `--tokenizer`, else the one the run used (the manifest's `settings.tokenizer`), loaded from
disk (or the hub cache) without torch where it can be. When none loads (the run's was a path on another
machine, the hub is out of reach), the page says why and shows each token as its id: the ids, logprobs and
masks are all still there, and the record's `response` text beside them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("agentroll")
CONTEXT = 4  # tokens decoded before each one: enough for a character of up to 4 UTF-8 bytes
REPLACEMENT = "\ufffd"


def _common(a: str, b: str) -> int:
    """The length of the longest common prefix of two texts."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


class Decoder:
    """Loads a tokenizer once (in the background, `start`) and turns ids into pieces; `pieces` is None when it
    could not be loaded (`error` says why)."""

    def __init__(self, name: str | None, tokenizer: Any = None) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.error: str | None = None if name or tokenizer is not None else "the folder's manifest names none"
        self.special: frozenset[int] = frozenset()
        self.ready = threading.Event()
        self._loading = threading.Lock()
        if tokenizer is not None or not name:
            self._settle()

    def start(self) -> None:
        """Load it in a thread: the page comes up at once; a group's tokens wait for it."""
        if not self.ready.is_set():
            threading.Thread(target=self.load, name="agentroll-view-tokenizer", daemon=True).start()

    def load(self) -> None:
        """Load it now (or wait for the load under way)."""
        with self._loading:
            if not self.ready.is_set():
                self._load()

    def _load(self) -> None:
        from ...errors import UsageError
        from ...render.chat import load_by_class, load_tokenizer

        assert self.name is not None
        try:
            self.tokenizer = load_by_class(self.name) or load_tokenizer(self.name)
        except UsageError as exc:
            self.error = str(exc)
            log.warning("the tokens are shown as ids: %s (pass --tokenizer)", exc)
        except Exception as exc:  # transformers may raise anything for a tokenizer it half reads
            self.error = f"cannot load tokenizer {self.name!r}: {type(exc).__name__}: {exc}"
            log.warning("the tokens are shown as ids: %s", self.error)
        self._settle()

    def _settle(self) -> None:
        if self.tokenizer is not None:
            self.special = frozenset(int(i) for i in getattr(self.tokenizer, "all_special_ids", ()) or ())
        self.ready.set()

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "loaded": self.tokenizer is not None,
            "loading": not self.ready.is_set(),
            "error": self.error,
        }

    def _decode_all(self, windows: list[list[int]]) -> list[str]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the tokenizers library: the whole batch in Rust
            return list(backend.decode_batch(windows, skip_special_tokens=False))
        return [self.tokenizer.decode(w, skip_special_tokens=False) for w in windows]

    def pieces(self, ids: Sequence[int]) -> list[str] | None:
        """One piece per id, joining into the ids' decoding (see the module's docstring); None without a
        tokenizer."""
        self.load()
        if self.tokenizer is None:
            return None
        ids = [int(i) for i in ids]
        if not ids:
            return []
        before = [ids[max(0, i - CONTEXT) : i] for i in range(len(ids))]
        upto = [ids[max(0, i - CONTEXT) : i + 1] for i in range(len(ids))]
        try:
            decoded = self._decode_all(before + upto)
        except Exception:  # an id outside the vocabulary (another tokenizer than the run's): say so per token
            return [self._one(i) for i in ids]
        prefixes, wholes = decoded[: len(ids)], decoded[len(ids) :]
        out: list[str] = []
        for prefix, whole in zip(prefixes, wholes, strict=True):
            common = _common(prefix, whole)
            out.append(whole[common:])
            rest = prefix[common:]
            owed = len(rest) if rest and not rest.strip(REPLACEMENT) else 0  # a character this token completes
            for j in range(len(out) - 2, -1, -1):  # the tokens before showed it as U+FFFD: it is this one's now
                if not owed:
                    break
                cut = min(owed, len(out[j]) - len(out[j].rstrip(REPLACEMENT)))
                out[j], owed = out[j][: len(out[j]) - cut], owed - cut
                if out[j]:
                    break
        return out

    def _one(self, token: int) -> str:
        try:
            return str(self._decode_all([[token]])[0])
        except Exception:
            return f"⟨{token}?⟩"

    def vocabulary(self, ids: set[int]) -> dict[int, str]:
        """Each id decoded alone (the alternatives of a top-k list)."""
        self.load()
        if self.tokenizer is None or not ids:
            return {}
        order = sorted(ids)
        try:
            return dict(zip(order, self._decode_all([[i] for i in order]), strict=True))
        except Exception:
            return {i: self._one(i) for i in order}
