"""Answer normalization, EM and Sub_EM: the one definition used by training and eval.

Training rewards the lead with binary `exact_match` (paper §2.3); tables report `sub_em`, the
bidirectional-substring variant that MemAgent's and ReMemR1's open-source eval code implements
(paper Appendix E.6, footnote 10). Both return 1.0 / 0.0 and take the max over gold answers.

`compat=True` reproduces the reference code (MemAgent's eval) exactly: a falsy raw prediction
scores 0 (its caller's `if pred else 0` guard), but a prediction that only *normalizes* to the
empty string ("the", "...") counts as a hit under Sub_EM ("" is a substring of everything). Use
it only to compare with published numbers; the default scores any empty prediction 0.

A gold answer that normalizes to "" ("", "the", "?") never scores, in either mode: "" is a
substring of every prediction, so it would be free accuracy. Data prep refuses such records
(`data_prep.records`); this guards what reaches scoring anyway.
"""
from __future__ import annotations

import re
import string
from typing import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, replace articles by a space, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    """The normalized golds that can score (never an empty one)."""
    raw = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    return [g for g in map(normalize_answer, raw) if g]


def exact_match(prediction: str | None, golds: str | Iterable[str], compat: bool = False) -> float:
    if not prediction:
        return 0.0
    pred = normalize_answer(prediction)
    if not pred and not compat:
        return 0.0
    return float(any(pred == g for g in _golds(golds)))


def sub_em(prediction: str | None, golds: str | Iterable[str], compat: bool = False) -> float:
    """Correct if the normalized prediction and a normalized gold contain one another."""
    if not prediction:
        return 0.0
    pred = normalize_answer(prediction)
    if not pred and not compat:
        return 0.0
    for g in _golds(golds):
        if g in pred or pred in g:
            return 1.0
    return 0.0
