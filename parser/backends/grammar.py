"""Constrained decoding for the in-process backend, through xgrammar (the grammar engine SGLang
and vLLM use), so a constraint means the same thing on every backend.

Why: small or untrained models drift out of the protocol (a 135M lead never writes a tool call,
subagents cut their JSON mid-evidence). `SamplingParams.json_schema` / `.regex` restrict each
step to the tokens that keep the output inside the language; once it is complete only the stop
tokens remain. Compiled grammars are cached per (kind, spec), matchers are per request.

    grammars = Grammars(tokenizer, vocab_size=model.config.vocab_size, stop_ids={2})
    matcher = grammars.matcher(("regex", r"<answer>[^<]+</answer>"))
    matcher.mask(logits)          # in place: -inf outside the grammar
    matcher.accept(token_id)
"""
from __future__ import annotations

import functools
from typing import Any, Iterable

import torch

from parser.backends.base import BackendError


class Grammars:
    """Grammar compiler for one tokenizer (building its vocabulary table takes ~0.2 s)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int]):
        try:
            import xgrammar
        except ImportError as error:  # pragma: no cover - xgrammar is in the cpu extra
            raise BackendError("constrained decoding in process needs xgrammar (pip install xgrammar)",
                               retryable=False) from error
        self._xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids))
        self._compiler = xgrammar.GrammarCompiler(self.info)
        self._compiled = functools.lru_cache(maxsize=64)(self._compile)

    def _compile(self, kind: str, spec: str) -> Any:
        try:
            if kind == "json_schema":
                # compact JSON (no free whitespace): what a budgeted reply should spend tokens on
                return self._compiler.compile_json_schema(spec, any_whitespace=False)
            return self._compiler.compile_regex(spec)
        except Exception as error:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            raise BackendError(f"constraint {kind} does not compile: {error}", retryable=False) from error

    def matcher(self, constraint: tuple[str, str]) -> "Matcher":
        return Matcher(self._xgr, self._compiled(*constraint), self.info.vocab_size)


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
