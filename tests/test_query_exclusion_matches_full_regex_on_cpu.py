"""The lead constraint compiled once: the in-process matcher (base grammar + the exclusion applied
per step, `parser.serving.backends.grammar.ExcludingMatcher`) allows exactly the tokens the full
regex (`action_regex(..., exclude=...)`, what a server compiles) allows, at every step.

Both run on the real xgrammar. For random and adversarial query sets (prefixes of each other,
multi-byte characters, a query of `MAX_QUERY_CHARS` characters, padded and illegal ones), each
candidate output is tokenised and walked token by token; at each step the two next-token masks
over the whole vocabulary must be equal, until the candidate leaves the language (then both
reject it) or ends (then both allow the stop token, or neither). The Qwen3 tokenizer's 151K-token
vocabulary merges `": "` with the query's first word, the case a query-only rule would miss.

    .venv/bin/pytest tests/test_query_exclusion_matches_full_regex_on_cpu.py -q
"""
from __future__ import annotations

import random

import pytest
import torch

from parser.serving.backends.grammar import ExcludingMatcher, Grammars
from parser.serving.types import SamplingParams
from parser.text.actions import MAX_QUERY_CHARS, action_constraint

TOOLS = [{"type": "function", "function": {"name": "query_agents", "description": "ask every chunk",
                                           "parameters": {"properties": {"query": {"type": "string"}}}}}]
CALL = {"json": ('<tool_call>{"name": "query_agents", "arguments": {"query": "', '"}}</tool_call>'),
        "xml": ("<tool_call>\n<function=query_agents>\n<parameter=query>\n", "\n</parameter>\n</function>\n</tool_call>")}
LONG = "Who directed " + "x" * (MAX_QUERY_CHARS - 14) + "?"  # as long as a query may be
ADVERSARIAL = ["Who directed Film X?", "Who", "Who directed", "W", "日本の首都は?", "Qué é?", LONG,
               LONG[:-1] + "?", " padded", "has a \" quote", "a  b"]
ALPHABET = "Wwho d?é日 ab"


def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer, len(tokenizer), {tokenizer.convert_tokens_to_ids("<|im_end|>")})


def allowed(matcher, size: int) -> torch.Tensor:
    logits = torch.zeros(size)
    matcher.mask(logits)
    return torch.isfinite(logits)


def walk(g: Grammars, tokenizer, full: str, exclusion, text: str) -> bool:
    """Walk `text` (then the stop token) through both matchers, asserting equal masks at every
    step; True when both accept it whole."""
    reference, ours = g.matcher(("regex", full)), g.matcher(("regex", full), exclusion)
    assert isinstance(ours, ExcludingMatcher)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    walked: list[int] = []
    for token in [*tokenizer.encode(text, add_special_tokens=False), stop]:
        expected, got = allowed(reference, g.info.vocab_size), allowed(ours, g.info.vocab_size)
        differ = (expected != got).nonzero().flatten().tolist()
        assert not differ, (f"after {tokenizer.decode(walked)!r}: masks differ on "
                            f"{[tokenizer.decode([t]) for t in differ[:8]]} (full regex allows: {expected[differ[0]]})")
        if not expected[token]:
            return False
        reference.accept(token)
        ours.accept(token)
        walked.append(token)
    return True


def candidates(queries: list[str], dialect: str, thinking: bool, rng: random.Random) -> list[str]:
    opener, closer = CALL[dialect]
    head = 'plan: "query": "x" <parameter=query>\n</think>\n\n' if thinking else ""
    values = [q for base in queries for q in (base, base[:-1], base + "x", base + " ", base[:rng.randint(1, 4)])]
    values += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(4)]
    return [head + opener + v + closer for v in values if v] + [head + "<answer>Who</answer>"]


@pytest.mark.parametrize("dialect", ["json", "xml"])
def test_adversarial_and_random_query_sets_match_the_full_regex_on_the_tiny_tokenizer(tiny_tokenizer, dialect):
    g = grammars(tiny_tokenizer)
    rng = random.Random(57)
    sets = [ADVERSARIAL] + [["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 6))) for _ in range(3)]
                            for _ in range(3)]
    verdicts = {}
    for queries in sets:
        for thinking in (False, True):
            full, exclusion = action_constraint(TOOLS, dialect, thinking=thinking, exclude=queries)
            for text in candidates(queries, dialect, thinking, rng):
                verdicts[text] = walk(g, tiny_tokenizer, full, exclusion, text)
    opener, closer = CALL[dialect]
    assert not verdicts[opener + "Who directed Film X?" + closer]  # a repeat is refused by both
    assert verdicts[opener + "Who directed Film X?x" + closer] and verdicts[opener + "Who directed Film X" + closer]
    assert not verdicts[opener + LONG + closer] and verdicts[opener + LONG[:-1] + closer]


def test_the_qwen3_vocabulary_matches_the_full_regex_where_tokens_span_the_opener(qwen3_tokenizer):
    g = grammars(qwen3_tokenizer)
    rng = random.Random(5)
    queries = [*ADVERSARIAL, ".", ",", "-"]  # ` "."` is one Qwen3 token: the opener's end, the query, its closer
    full, exclusion = action_constraint(TOOLS, "json", exclude=queries)
    opener, closer = CALL["json"]
    assert qwen3_tokenizer.convert_tokens_to_ids('Ġ"."') in g.matcher(("regex", full), exclusion)._vocab.exactly(b' "."')
    verdicts = {text: walk(g, qwen3_tokenizer, full, exclusion, text) for text in candidates(queries, "json", False, rng)}
    assert not verdicts[opener + "Who" + closer] and verdicts[opener + "Whox" + closer]
    assert not verdicts[opener + "." + closer] and verdicts[opener + ".x" + closer]


def test_the_engine_sends_the_full_regex_with_its_exclusion_apart():
    full, exclusion = action_constraint(TOOLS, "json", exclude=["Who", "Who"])
    sampling = SamplingParams(max_new_tokens=8, regex=full, exclusion=exclusion)
    assert sampling.constraint == ("regex", full) and exclusion.queries == ("Who",)  # servers get `regex` whole
    assert exclusion.base == action_constraint(TOOLS, "json")[0] != full
    assert action_constraint(TOOLS, "json", exclude=["Who"], call=False)[1] is None  # an answer excludes nothing
    with pytest.raises(ValueError, match="exclusion belongs to a regex"):
        SamplingParams(max_new_tokens=8, exclusion=exclusion)
