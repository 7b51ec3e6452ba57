"""Constrained decoding for the in-process backend, through xgrammar (the grammar engine SGLang
and vLLM use), so a constraint means the same thing on every backend.

Why: small or untrained models drift out of the protocol (a 135M lead never writes a tool call,
subagents cut their JSON mid-evidence). `SamplingParams.json_schema` / `.regex` restrict each
step to the tokens that keep the output inside the language; once it is complete only the stop
tokens remain. Matchers are per request; compiled grammars are kept in xgrammar's cache, held
under `GRAMMAR_CACHE_BYTES`. Unbounded (xgrammar's default) it leaked: every lead turn under
`distinct_queries` compiles a regex no turn compiled before, with Qwen2.5's 151K-token vocabulary
each held ~280 MB, and a 32-question comparison run was OOM-killed at 24 GB. xgrammar's own
`cache_limit_bytes` still grew ~18 MB per Qwen2.5 grammar it evicted, so the cache is cleared
when it passes the bound; it is not turned off, because its shared state makes a compile 4-40x
faster (Qwen2.5 lead regex: 0.7-6.7 s cached, 27-29 s without). A constraint that carries a
`QueryExclusion` (`SamplingParams.exclusion`, the lead under `distinct_queries`) is not compiled
whole: its `base`, the same every turn, comes from the cache, and `ExcludingMatcher` forbids the
excluded queries while matching, so a lead turn costs no compile after the episode's first.

    grammars = Grammars(tokenizer, vocab_size=model.config.vocab_size, stop_ids={2})
    matcher = grammars.matcher(("regex", r"<answer>[^<]+</answer>"))
    matcher.mask(logits)          # in place: -inf outside the grammar
    matcher.accept(token_id)
    grammars.matcher(("regex", full), exclusion)   # compiles exclusion.base, applies the rest itself
"""
from __future__ import annotations

import bisect
from typing import Any, Iterable

import torch

from parser.serving.types import BackendError
from parser.text.actions import QueryExclusion


GRAMMAR_CACHE_BYTES = 1 << 30  # compiled grammars kept for reuse per tokenizer (cleared beyond)


class Grammars:
    """Grammar compiler for one tokenizer (building its vocabulary table takes ~0.2 s)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], cache_bytes: int = GRAMMAR_CACHE_BYTES):
        try:
            import xgrammar
        except ImportError as error:  # pragma: no cover - xgrammar is in the cpu extra
            raise BackendError("constrained decoding in process needs xgrammar (pip install xgrammar)",
                               retryable=False) from error
        self._xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids))
        self._compiler = xgrammar.GrammarCompiler(self.info, cache_limit_bytes=cache_bytes)
        self._tokens: _Vocab | None = None  # the tokens' bytes, indexed for ExcludingMatcher
        self._splitting: dict[tuple[str, tuple[str, ...]], bool] = {}  # `_splits_calls`, per shape

    def cache_bytes(self) -> int:
        """What the compiled grammars kept for reuse hold now (for tests and benchmarks)."""
        return self._compiler.get_cache_size_bytes()

    def _compile(self, kind: str, spec: str) -> Any:
        try:  # a spec compiled before comes from xgrammar's cache
            if kind == "json_schema":
                # compact JSON (no free whitespace): what a budgeted reply should spend tokens on
                compiled = self._compiler.compile_json_schema(spec, any_whitespace=False)
            else:
                compiled = self._compiler.compile_regex(spec)
        except Exception as error:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            raise BackendError(f"constraint {kind} does not compile: {error}", retryable=False) from error
        if self.cache_bytes() > self._compiler.cache_limit_bytes:
            self._compiler.clear_cache()  # `compiled` lives on in its matchers
        return compiled

    def matcher(self, constraint: tuple[str, str], exclusion: QueryExclusion | None = None) -> "Matcher":
        """A matcher for `constraint`; with its `exclusion`, one for the exclusion's base grammar
        that applies the exclusion itself (the constraint's own regex is then not compiled)."""
        if exclusion is None or not self._splits_calls(exclusion):
            return Matcher(self._xgr, self._compile(*constraint), self.info.vocab_size)
        return ExcludingMatcher(self._xgr, self._compile("regex", exclusion.base), self.info.vocab_size,
                                exclusion, self._vocab())

    def _splits_calls(self, exclusion: QueryExclusion) -> bool:
        """True when no token ends the thinking and holds a whole call's opener: the matcher
        finds where the thinking ends before it masks, so such a token (none in the tokenizers
        used here) could write a call unchecked; with one, the full regex is compiled instead."""
        key = (exclusion.body_after, exclusion.openers)
        if key not in self._splitting:
            tail = exclusion.body_after[-1:]
            self._splitting[key] = not tail or not any(self._vocab().any_holds((tail + o).encode())
                                                      for o in exclusion.openers)
        return self._splitting[key]

    def _vocab(self) -> "_Vocab":
        if self._tokens is None:  # once per tokenizer: ~0.1 s for 151K tokens
            self._tokens = _Vocab(self.info.decoded_vocab)
        return self._tokens


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int):
        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of tokens the grammar forbids next to -inf (in place)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        self._xgr.apply_token_bitmask_inplace(logits, self._bitmask.to(logits.device))

    def accept(self, token: int) -> None:
        if not self._matcher.accept_token(token):
            raise BackendError(f"constrained decoding: token {token} rejected by the grammar", retryable=False)

    @property
    def finished(self) -> bool:
        return self._matcher.is_terminated()


class _Vocab:
    """Every token's bytes, and the tokens sorted by them (prefix look-ups for `ExcludingMatcher`)."""

    def __init__(self, decoded: list[bytes]):
        self.bytes = decoded
        order = sorted(range(len(decoded)), key=decoded.__getitem__)
        self._keys = [decoded[t] for t in order]
        self._ids = order

    def starting_with(self, prefix: bytes) -> list[int]:
        at = bisect.bisect_left(self._keys, prefix)
        found = []
        while at < len(self._keys) and self._keys[at].startswith(prefix):
            found.append(self._ids[at])
            at += 1
        return found

    def exactly(self, text: bytes) -> list[int]:
        return [t for t in self.starting_with(text) if self.bytes[t] == text]

    def any_holds(self, text: bytes) -> bool:
        return any(text in token for token in self.bytes)


class ExcludingMatcher(Matcher):
    """A matcher of `exclusion.base` that also applies the exclusion (`QueryExclusion`'s rule).

    Each step, for each excluded query `q` the text so far could still grow into, it masks the
    tokens that would write the rest of `opener + q` and then its closer, and, for a `q` of
    `max_chars` characters, the tokens that would end exactly on it. A token may complete the
    opener and close the query at once (byte-level BPE merges `": "` with what follows), so the
    rule reads the whole `opener + q`, not only the query. It works in bytes (a token may end
    inside a character; the closer is ASCII, which no multi-byte character's bytes contain).
    Per step: a binary search per excluded query while a call is being written, none otherwise."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int, exclusion: QueryExclusion, vocab: _Vocab):
        super().__init__(xgr, compiled, vocab_size)
        self._vocab = vocab
        self._closer = exclusion.closer.encode()
        self._after = exclusion.body_after.encode()
        self._calls = [(o.encode() + q.encode(), len(q) >= exclusion.max_chars)
                       for o in exclusion.openers for q in exclusion.queries]
        self._text = bytearray()
        self._body: int | None = None if self._after else 0  # where the text after the thinking starts
        self._scanned = 0  # the thinking so far holds no `body_after` before this offset

    def mask(self, logits: torch.Tensor) -> None:
        super().mask(logits)
        body = self._body_so_far()
        if body is None:
            return
        banned = []
        for call, longest in self._calls:
            if call.startswith(body):
                rest = call[len(body):]
                banned += self._vocab.starting_with(rest + self._closer)
                if longest:  # it could be neither closed nor extended: never reach it
                    banned += self._vocab.exactly(rest)
        if banned:
            logits[..., banned] = float("-inf")

    def accept(self, token: int) -> None:
        super().accept(token)
        self._text += self._vocab.bytes[token]

    def _body_so_far(self) -> bytes | None:
        """The text after the thinking (all of it without one); None while thinking goes on."""
        if self._body is None:
            at = self._text.find(self._after, self._scanned)
            if at < 0:  # only the end of the text may still start it
                self._scanned = max(0, len(self._text) - len(self._after) + 1)
                return None
            self._body = at + len(self._after)
        return bytes(self._text[self._body:])
