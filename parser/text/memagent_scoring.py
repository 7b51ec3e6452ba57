r"""MemAgent's boxed-answer reader and math-string normaliser (BytedTsinghua-SIA/MemAgent @ 76b7a65:
`taskutils/memory_eval/utils/__init__.py` and `verl/utils/reward_score/hotpotqa.py`
`last_boxed_only_string`, `remove_boxed`, `strip_string`; its data filter's
`taskutils/memory_data/hotpotqa_verifier.py` is the same code).

Why here, below the methods: MemAgent's eval and RL reward (`parser.methods.memagent.rules`) and
its closed-book data filter (`data_prep.knowledge_filter`) read answers with the same functions, and
data prep may not import a method. Restated, not copied; pinned by tests/test_memagent_fidelity_on_cpu.py.

    authors_boxed("so \\boxed{Paris}")   # "Paris"
"""
from __future__ import annotations


def authors_boxed(text: str) -> str | None:
    r"""The boxed answer as MemAgent's and ReMemR1's scorers read it (`last_boxed_only_string` then
    `remove_boxed`): if `\boxed ` (with a space) occurs anywhere, what follows its last occurrence up
    to the next `$`; else the last `\boxed`, its braces counted from there, content unstripped. None
    when there is none, when its braces never close, or for a lone `\fbox` (their `assert` fails:
    the eval run stops, the RL reward catches it as 0)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if text[i] == "}" and depth == 0:
            found = text[start : i + 1]
            return found[len("\\boxed{") : -1] if found.startswith("\\boxed{") else None
    return None


_MATH_STRING_RULES = (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                      ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("\\%", ""), (" .", " 0."),
                      ("{.", "{0."))


def math_string(text: str) -> str:
    """MemAgent's HotpotQA reward normaliser (verl/utils/reward_score/hotpotqa.py `strip_string`): the
    replacements of `_MATH_STRING_RULES` in order, then every space removed. No article or
    punctuation rule: "Paris." and "paris" differ."""
    for old, new in _MATH_STRING_RULES:
        text = text.replace(old, new)
    return text.replace(" ", "")


def boxed_matches(reply: str, gold: str) -> bool:
    """MemAgent's `compute_score(reply, gold) == 1` (its RL reward and its data filter's "boxed"
    check): the boxed answer (`authors_boxed`) of the reply's last 300 characters, lowercased,
    equals the lowercased gold under `math_string`. An empty gold matches an empty boxed answer."""
    boxed = authors_boxed(reply[-300:].lower())
    return boxed is not None and math_string(boxed) == math_string(gold.lower())
