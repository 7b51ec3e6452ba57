"""MemAgent's and ReMemR1's own rules, restated from their evaluation code: how a reply becomes the
memory, how a recall query is read, how the final answer is extracted, and MemAgent's RL reward
(`memagent_rl_reward`, what its training loop `train.py` rewards by default).

Why a module of its own: these rules decide what the released checkpoints see and how they are
scored, so each is written once here, restated (never copied) from the authors' code and pinned
by a test with the authors' output (`tests/test_memagent_fidelity_on_cpu.py`); docs/fidelity.md,
section "MemAgent and ReMemR1", names each source. Sources: MemAgent = BytedTsinghua-SIA/MemAgent
@ 76b7a65 (`taskutils/memory_eval/utils/__init__.py`, `utils/recurrent.py`, `ruler_hqa.py`);
ReMemR1 = syr-cn/ReMemR1 @ 43e69f3 (`taskutils/memory_eval/utils/rememr1.py`, `test_qa.py`).

    from parser.methods.memagent.rules import prediction
    prediction("Therefore, the answer is Paris.", "recurrent")   # ("Paris", "recurrent")
"""
from __future__ import annotations

from typing import Iterable

from parser.text.memagent_scoring import authors_boxed, boxed_matches
from parser.text.reward import normalize_answer

THINK_END = "</think>"
ANSWER_IS = "the answer is"  # case-sensitive, as theirs: "The answer is" is not found
_DEEPSEEK_MARKERS = ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")  # removed from a recurrent answer, as theirs
ANSWER_MODES = ("recurrent", "boxed")


def memagent_rl_reward(reply: str, golds: str | Iterable[str]) -> float:
    r"""MemAgent's RL reward (hotpotqa.py `compute_score`): the last 300 characters of the final
    reply, lowercased; its boxed answer (`authors_boxed`); 1.0 if `math_string` of it equals
    `math_string` of a lowercased gold, else 0.0 (no boxed answer: 0.0). A gold that normalizes
    to "" never scores (as everywhere here)."""
    raw = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    return float(any(normalize_answer(g) and boxed_matches(reply, g) for g in raw))


def after_thinking(text: str) -> str:
    """MemAgent's `extract_solution`: the text after the last `</think>`, stripped; the text itself,
    untouched, when there is none."""
    return text.split(THINK_END)[-1].strip() if THINK_END in text else text


def recurrent_answer(text: str) -> str | None:
    """MemAgent's `extract_answer` (the "recurrent" mode its run scripts evaluate): `*` removed;
    everything after the last "the answer is" (to the end, several lines included), stripped, end
    markers removed, then stripped of spaces and dots; None if the phrase is absent."""
    text = text.replace("*", "")
    if ANSWER_IS not in text:
        return None
    answer = text.rsplit(ANSWER_IS, 1)[-1].strip()
    for marker in _DEEPSEEK_MARKERS:
        answer = answer.replace(marker, "")
    return answer.strip().strip(".").strip()


def prediction(reply: str, mode: str) -> tuple[str | None, str]:
    """(prediction, mode) as `ruler_hqa.py` / `test_qa.py` `get_pred` compute it from the final
    reply: stripped; the text after its last `</think>` if that is non-empty, else the whole reply;
    then `recurrent_answer` or, in "boxed" mode, `authors_boxed`. The scorer gives a falsy prediction
    0 (`sub_em(..., **MEMAGENT_SCORER)` does the same). An empty reply is skipped by theirs, not scored:
    the record's `empty_final_reply` says so."""
    if mode not in ANSWER_MODES:
        raise ValueError(f"answer_mode must be one of {ANSWER_MODES}, got {mode!r}")
    response = reply.strip()
    text = after_thinking(response) or response
    return (recurrent_answer(text) if mode == "recurrent" else authors_boxed(text)), mode


def memagent_memory(reply: str) -> str:
    """MemAgent's memory update (`recurrent.py`): the new memory is `after_thinking(reply)`: the reply
    verbatim, even empty or only whitespace."""
    return after_thinking(reply)


def remove_recalls(text: str) -> str:
    """ReMemR1's memory (`_parse_update_memory2`): every `<recall>…</recall>` removed, shortest
    first, across lines, empty ones too (`re.sub(r'<recall>.*?</recall>', '', text, flags=re.DOTALL)`),
    then stripped. Linear: the regex rescans the rest from every unclosed `<recall>`."""
    kept, pos = [], 0
    while (start := text.find("<recall>", pos)) >= 0:
        end = text.find("</recall>", start + 8)
        if end < 0:
            break  # no later opener can close either
        kept.append(text[pos:start])
        pos = end + 9
    kept.append(text[pos:])
    return "".join(kept).strip()


def recall_query(text: str) -> str | None:
    """ReMemR1's recall query (`_parse_recall_query`: `re.search(r'<recall>(.+)</recall>', text)`):
    on the first line holding a `<recall>` that its line's *last* `</recall>` closes with at least
    one character inside, everything between them (greedy, within one line); None if no line does.
    A line's first `<recall>` decides: a later one could only leave less room."""
    for line in text.split("\n"):
        start = line.find("<recall>")
        if start < 0:
            continue
        end = line.rfind("</recall>")
        if end >= start + 9:
            return line[start + 8 : end]
    return None
