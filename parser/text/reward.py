r"""Answer normalization, EM and Sub_EM: the one definition used by training and eval.

Training rewards the lead with binary `exact_match` (paper §2.3); tables report `sub_em`, the
bidirectional-substring variant that MemAgent's and ReMemR1's open-source eval code implements
(paper Appendix E.6, footnote 10). Both return 1.0 / 0.0 and take the max over gold answers.

`MEMAGENT_SCORER` (`empty_prediction=True, empty_golds=True`) is the reference's *string scorer*
(MemAgent's and ReMemR1's eval). `empty_prediction`: a falsy raw prediction scores 0 (its
caller's `if pred else 0` guard), but a prediction that only *normalizes* to the empty string
("the", "...") is scored, a hit under Sub_EM ("" is a substring of everything). What it scores is
the method's extraction (`parser.methods.memagent.rules` for MemAgent/ReMemR1); their skipping of
empty outputs is not reproduced (docs/fidelity.md, row 35). Use it only to compare with published
numbers; the default scores any empty prediction 0.

`release_normalize` / `release_exact_match` are the authors' *training* reward (release
train/scripts/reward.py; `parser.engine.protocol.ReleaseProtocol` trains with it): articles are replaced
*before* punctuation is removed, and punctuation is Unicode (`[^\w\s]`, so "¿", "–", "·" go and
"_" stays). Their eval scorer uses this project's normalizer; `release_sub_em` is their eval Sub_EM.

A gold answer that normalizes to "" ("", "the", "?") never scores by default: "" is a substring
of every prediction, so it would be free accuracy. Data prep refuses such records
(`data_prep.records`) except under `compat` (the authors' readers keep them), and this guards what
reaches scoring anyway. `empty_golds=True` keeps them as MemAgent's and ReMemR1's scorer does
(`update_answer`): Sub_EM 1 for every non-empty prediction, EM 1 for one that normalizes to "".
`release_sub_em` scores empty predictions as the reference does (`empty_prediction`) but keeps the
default rule for empty golds. (The release would let an empty normalized prediction equal an empty
normalized gold; that quirk is not kept.)
"""
from __future__ import annotations

import re
import string
from typing import Callable, Iterable

from parser.text.release import NO_ANSWER, extract_answer

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_UNICODE_PUNCTUATION = re.compile(r"[^\w\s]")
_BOLD = re.compile(r"\*\*(.*?)\*\*")
# MemAgent's and ReMemR1's string scorer (`update_answer`): the `_compat` metrics, the comparisons with their numbers
MEMAGENT_SCORER = {"empty_prediction": True, "empty_golds": True}


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, replace articles by a space, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def release_normalize(text: str) -> str:
    """The release's training normaliser: articles first, then Unicode punctuation."""
    if not text:
        return ""
    text = _ARTICLES.sub(" ", text.lower())
    return " ".join(_UNICODE_PUNCTUATION.sub("", text).split())


def _golds(golds: str | Iterable[str], normalize: Callable[[str], str] = normalize_answer,
           empty_golds: bool = False) -> list[str]:
    """The normalized golds that can score: never an empty one, unless `empty_golds` (the authors' scorer)."""
    raw = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    return [g for g in (normalize(r) for r in raw) if g or empty_golds]


def exact_match(prediction: str | None, golds: str | Iterable[str], *, empty_prediction: bool = False,
                empty_golds: bool = False) -> float:
    """Correct if the normalized prediction equals a normalized gold. `empty_prediction`: a prediction
    that normalizes to "" is scored, not 0; `empty_golds`: a gold that normalizes to "" is kept
    (both: `MEMAGENT_SCORER`, module docstring)."""
    if not prediction:
        return 0.0
    pred = normalize_answer(prediction)
    if not pred and not empty_prediction:
        return 0.0
    return float(any(pred == g for g in _golds(golds, empty_golds=empty_golds)))


def release_exact_match(prediction: str | None, golds: str | Iterable[str]) -> float:
    """The release's training EM (`release_normalize` on both sides; empty golds never score)."""
    if not prediction:
        return 0.0
    pred = release_normalize(prediction)
    return float(any(pred == g for g in _golds(golds, release_normalize)))


def sub_em(prediction: str | None, golds: str | Iterable[str], *, empty_prediction: bool = False,
           empty_golds: bool = False) -> float:
    """Correct if the normalized prediction and a normalized gold contain one another; the two
    switches as `exact_match`'s."""
    if not prediction:
        return 0.0
    pred = normalize_answer(prediction)
    if not pred and not empty_prediction:
        return 0.0
    for g in _golds(golds, empty_golds=empty_golds):
        if g in pred or pred in g:
            return 1.0
    return 0.0


def release_sub_em(completion: str, golds: str | Iterable[str]) -> float:
    """The release's eval Sub_EM (release eval/eval.py) over a whole completion (every lead turn,
    thinking included): the last `<answer>` block, scored as the string "No answer found" when
    there is none, or — if that scores higher — the last `**bold**` span; reference Sub_EM."""
    golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]  # read once: scored for two candidates
    answer = extract_answer(completion) or NO_ANSWER
    bold = _BOLD.findall(completion)
    candidates = [answer] + ([bold[-1].strip() or NO_ANSWER] if bold else [NO_ANSWER])
    return max(sub_em(c, golds, empty_prediction=True) for c in candidates)  # a gold that normalizes to "" never scores
