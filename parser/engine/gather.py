"""Gather: turn the T subagent replies to one query into the observation the lead reads.

Replies are parsed leniently (json-repair): abstentions — "unknown", an empty answer, or
unparsable junk — are dropped (paper §2.2). Every kept finding is labelled by its chunk
(`agent_{i}`) and keeps its quoted evidence, so the lead can check grounding (the failure
case of paper Appendix F.2 comes from ungrounded findings). Identical answers can be merged.
The observation is bounded by a token budget and says what it cut.

A reply is whatever a worker sent back, so `parse_reply` takes any value (a number or null
from a broken worker is junk) and runs in linear time (`parser.text.lenient_json`).

`gather_release` renders what the authors' release shows instead (release
train/scripts/subagent.py; `parser.engine.protocol` picks one of the two): a reply containing one of
the subagent's SGLang stop strings ("unknown", "Unknown": any occurrence, case-sensitive) or a
failed request (None) is dropped; the rest is read from a fenced ```json block, else the outermost {...}, with json-repair; falsy
`evidence`/`answer` are left out, a reply that is not a JSON object but is longer than 64
characters is passed on as `raw_response`; the kept replies go out as one JSON object keyed
`agent_{i}` (indent 2, non-ASCII kept), or a fixed message when none is left. No merging, no budget.

Both take one query's replies as (chunk index, text or None for a failed request), in chunk
order, and return a `Gathered`; `parser.engine.tools.QueryAgents` records the calls around it:

    gathered = gather("Who?", [(0, '{"answer": "unknown"}'), (1, '{"answer": "Paris", "evidence": "..."}')],
                      count_tokens=len, token_budget=4096)
    gathered = gather_release([(0, "Unknown"), (1, '{"evidence": "...", "answer": "..."}'), (2, None)])
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

from parser.engine import prompts
from parser.text import release
from parser.text.lenient_json import loads_leading, loads_lenient
from parser.text.reward import normalize_answer
from parser.records.trajectory import Finding

ABSTENTIONS = frozenset(
    {"unknown", "none", "n/a", "na", "null", "not found", "not mentioned", "no information", "not available", "unanswerable"}
)


def _after_thinking(text: str) -> str:
    """The reply after a leading thinking block (closed, or cut at the limit: then nothing). A
    `<think>` anywhere else is text — a finding that quotes a document containing one was dropped."""
    body = text.strip()
    if not body.startswith("<think>"):
        return body
    end = body.find("</think>")
    return "" if end < 0 else body[end + len("</think>") :].strip()


def _fenced(body: str) -> str | None:
    r"""The inside of the first ```` ```json … ``` ```` fence, as the regex
    ```` ```(?:json)?\s*(.*?)``` ```` finds it (whose `\s*` backtracking is quadratic on a long
    unclosed fence of whitespace)."""
    start = body.find("```")
    end = body.find("```", start + 3) if start >= 0 else -1
    if end < 0:
        return None
    inside = body[start + 3 : end]
    return inside.removeprefix("json").lstrip()


def parse_reply(text: Any) -> tuple[str, str] | None:
    """(answer, evidence) for a finding, or None for an abstention / junk (any non-string too)."""
    if not isinstance(text, str):
        return None
    body = _after_thinking(text)
    fenced = _fenced(body)
    if fenced is not None:
        body = fenced
    start = body.find("{")
    if start < 0:
        return None
    parsed, problem = loads_leading(body[start:])
    if problem:
        return None
    if isinstance(parsed, list):  # several objects: keep the first that is a dict
        parsed = next((p for p in parsed if isinstance(p, dict)), None)
    if not isinstance(parsed, dict):
        return None
    answer = parsed.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return None
    if normalize_answer(answer) in ABSTENTIONS or normalize_answer(answer) == "":
        return None
    evidence = parsed.get("evidence", "")
    return answer.strip(), evidence.strip() if isinstance(evidence, str) else str(evidence)


def merge_identical(findings: list[Finding]) -> list[Finding]:
    """Fold findings whose normalized answers match into the first one (order kept)."""
    kept: dict[str, Finding] = {}
    for finding in findings:
        key = normalize_answer(finding.answer)
        if key in kept:
            kept[key].merged_agents.append(finding.agent)
        else:
            kept[key] = finding
    return list(kept.values())


def render_observation(
    query: str,
    findings: list[Finding],
    num_agents: int,
    count_tokens: Callable[[str], int],
    token_budget: int,
    version: str = prompts.DEFAULT_VERSION,
) -> tuple[str, int]:
    """(observation text, number of findings omitted by the budget). Findings are kept whole, in
    order, while they fit; a first finding that alone exceeds the budget is cut to fit (it used to
    pass whole: a 120K-token finding went through a 256-token budget as "0 omitted")."""
    if not findings:
        return prompts.render("observation_empty", version, query=query, num_agents=num_agents), 0
    reporting = sum(1 + len(f.merged_agents) for f in findings)
    lines: list[str] = []
    used = count_tokens(prompts.render("observation", version, query=query, num_findings=reporting, num_agents=num_agents, findings=""))
    longest = _CHARS_PER_TOKEN_BOUND * token_budget  # more characters than this cannot fit the budget
    for finding in findings:
        agents = ", ".join([finding.agent, *finding.merged_agents])
        answer, evidence = finding.answer[:longest], finding.evidence[:longest]
        line = prompts.render("finding", version, agent=agents, answer=answer, evidence=evidence)
        cost = count_tokens(line) + 1
        if used + cost > token_budget:
            if lines:
                break
            line = _cut_to_fit(agents, answer, evidence, token_budget - used - 1, count_tokens, version)
            if line is None:
                break
            cost = count_tokens(line) + 1
        lines.append(line)
        used += cost
    omitted = len(findings) - len(lines)
    if omitted:
        lines.append(prompts.render("omitted", version, count=omitted))
    text = prompts.render("observation", version, query=query, num_findings=reporting, num_agents=num_agents, findings="\n".join(lines))
    return text, omitted


_CHARS_PER_TOKEN_BOUND = 128  # characters in the longest token of the Qwen3 / Qwen3.5 vocabularies


def _cut_to_fit(agents: str, answer: str, evidence: str, room: int, count_tokens: Callable[[str], int],
                version: str) -> str | None:
    """The finding's line with the longest evidence prefix (then answer prefix) that fits `room`
    tokens, by bisection; None if not even an empty one fits."""
    def line(a: str, e: str) -> str:
        return prompts.render("finding_cut", version, agent=agents, answer=a, evidence=e)

    def longest(fits: Callable[[int], bool], n: int) -> int:
        low, high = 0, n  # fits(low) holds
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid) else (low, mid - 1)
        return low

    if count_tokens(line(answer, "")) <= room:
        keep = longest(lambda k: count_tokens(line(answer, evidence[:k])) <= room, len(evidence))
        return line(answer, evidence[:keep])
    if count_tokens(line("", "")) > room:
        return None
    keep = longest(lambda k: count_tokens(line(answer[:k], "")) <= room, len(answer))
    return line(answer[:keep], "")


@dataclasses.dataclass
class Gathered:
    """One query's gathered replies: what the lead reads, and which replies counted."""

    observation: str
    findings: list[Finding]
    kept: list[bool]  # per reply, in order: a finding (True) or an abstention / failure
    omitted: int = 0  # findings cut by the observation budget


Replies = Sequence[tuple[int, "str | None"]]  # (chunk index, reply text; None: the request failed)


def gather(query: str, replies: Replies, *, count_tokens: Callable[[str], int], token_budget: int,
           merge: bool = True, version: str = prompts.DEFAULT_VERSION) -> Gathered:
    """This project's observation: findings labelled by chunk, identical answers merged, budgeted."""
    findings, kept = [], []
    for index, text in replies:
        parsed = parse_reply(text)
        kept.append(parsed is not None)
        if parsed:
            findings.append(Finding(agent=f"agent_{index}", chunk_index=index, answer=parsed[0], evidence=parsed[1]))
    if merge:
        findings = merge_identical(findings)
    observation, omitted = render_observation(query, findings, len(replies), count_tokens, token_budget, version)
    return Gathered(observation, findings, kept, omitted)


def _release_body(text: str) -> str:
    """The part of a reply the release parses: what `re.search(r"```json\\s*(.*?)\\s*```")` then
    `re.search(r"\\{.*\\}")` (DOTALL) find, else the whole text — found with `str.find`, since both
    regexes backtrack quadratically (an unclosed fence of spaces, or many `{` and no `}`)."""
    fence = text.find("```json")
    close = text.find("```", fence + 7) if fence >= 0 else -1
    if close >= 0:
        return text[fence + 7: close].strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start: end + 1] if 0 <= start < end else text


def parse_release_reply(text: str | None) -> dict[str, Any] | None:
    """One subagent reply as the release keeps it: {evidence?, answer?} or {raw_response}; None
    for a failure, an abstention (a stop string anywhere) or an empty finding."""
    if not isinstance(text, str) or any(stop in text for stop in release.STOP_STRINGS):
        return None
    parsed, _ = loads_lenient(_release_body(text))  # json-repair as the release, but bounded: garbage never stalls a round
    if isinstance(parsed, dict):
        kept = {key: parsed.get(key) for key in release.FINDING_KEYS if parsed.get(key)}
    elif len(text.strip()) > release.RAW_MIN_CHARS:
        kept = {release.RAW_KEY: text.strip()}
    else:
        kept = {}
    return kept or None


def gather_release(replies: Replies) -> Gathered:
    """The release's tool reply for one query (module docstring): its JSON of the kept replies, by chunk."""
    kept = {index: parsed for index, text in replies if (parsed := parse_release_reply(text))}
    findings = [Finding(release.AGENT_KEY.format(index=index), index, _text(fields.get("answer", "")),
                        _text(fields.get("evidence", fields.get(release.RAW_KEY, "")))) for index, fields in kept.items()]
    observation = (json.dumps({release.AGENT_KEY.format(index=i): fields for i, fields in kept.items()}, indent=2, ensure_ascii=False)
                   if kept else release.NO_FINDINGS)
    return Gathered(observation, findings, [index in kept for index, _ in replies])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)
