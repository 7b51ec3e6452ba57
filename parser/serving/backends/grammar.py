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
faster (Qwen2.5 lead regex: 0.7-6.7 s cached, 27-29 s without).

    grammars = Grammars(tokenizer, vocab_size=model.config.vocab_size, stop_ids={2})
    matcher = grammars.matcher(("regex", r"<answer>[^<]+</answer>"))
    matcher.mask(logits)          # in place: -inf outside the grammar
    matcher.accept(token_id)
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from parser.serving.types import BackendError


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

    def matcher(self, constraint: tuple[str, str]) -> "Matcher":
        return Matcher(self._xgr, self._compile(*constraint), self.info.vocab_size)


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
