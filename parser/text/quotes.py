"""Whether a reader's quote verifies its answer: the rule behind `parser ask`'s evidence check.

Why it exists: a quote occurring verbatim in its chunk was printed as "quote found in the chunk",
and read as verification, even when it was "a", "the" or "in 1997": words that occur in almost any
chunk and say nothing about the answer. A quote verifies a finding only when

  1. it occurs verbatim in the chunk the finding came from,
  2. it carries the finding's answer (the normalised answer occurs in the normalised quote, on
     word boundaries), and
  3. it says something about it: at least `MIN_CONTEXT_WORDS` informative words besides the
     answer's own (an informative word is not in `STOP_WORDS`), so "in 1997" for "1997" is not
     verification while "founded in 1997" is, and "1997 1997 1997 1997" is not either; or, for a
     long answer quoted as it stands, the answer itself holds at least `MIN_INFORMATIVE_WORDS`
     informative words (a sentence, not a name or a date).

An answer of common words only ("yes", "no", "in", "it") is never verified by a quote: such words
occur in almost any quote. The check says so rather than pass it. Pure functions over text: no model, no I/O.

    check_quote("founded in 1997", "1997", chunk_text).verifies   # True when the chunk holds it
"""
from __future__ import annotations

import dataclasses

from parser.text.reward import normalize_answer

MIN_CONTEXT_WORDS = 1  # informative words a verifying quote holds besides the answer's
MIN_INFORMATIVE_WORDS = 4  # ... or in all, when the answer is itself a statement
STOP_WORDS = frozenset(
    "a an the and or but of in on at to for from by with as is are was were be been being it its this that these those "
    "he she they we you i his her their our your him them us me my there here then than so not no yes do does did has "
    "have had will would can could may might shall should into onto over under about after before during".split())


@dataclasses.dataclass(frozen=True)
class QuoteCheck:
    in_chunk: bool  # the quote occurs verbatim in its chunk
    verifies: bool  # ... and carries the answer with something said about it (module docstring)
    label: str  # what `parser ask` prints beside the finding


def informative_words(text: str) -> list[str]:
    """The words of `text` (normalised as the scorer does) that are not `STOP_WORDS` and hold a
    letter or a digit: a zero-width joiner, a right-to-left mark or a soft hyphen is no word."""
    return [word for word in normalize_answer(text).split() if word not in STOP_WORDS and any(ch.isalnum() for ch in word)]


def check_quote(quote: str, answer: str, chunk_text: str) -> QuoteCheck:
    """The verdict on one finding's quote (rules 1-3 of the module docstring)."""
    if not quote.strip():
        return QuoteCheck(False, False, "no quote")
    if quote not in chunk_text:
        return QuoteCheck(False, False, "quote NOT in the chunk")
    said, target = f" {normalize_answer(quote)} ", normalize_answer(answer)
    if not target or f" {target} " not in said:
        return QuoteCheck(True, False, "quote in the chunk, but it does not state the answer: not verification")
    answer_words, answer_informative = set(target.split()), informative_words(answer)
    if not answer_informative:  # "in", "yes", "it": found in almost any quote, stating nothing
        return QuoteCheck(True, False, "quote in the chunk, but the answer is only common words: not verification")
    context = [word for word in informative_words(quote) if word not in answer_words]
    if len(context) < MIN_CONTEXT_WORDS and len(answer_informative) < MIN_INFORMATIVE_WORDS:
        return QuoteCheck(True, False, "quote in the chunk, but it holds nothing besides the answer: not verification")
    return QuoteCheck(True, True, "quote found in the chunk")
