"""Gather: turn the T subagent replies to one query into the observation the lead reads.

Replies are parsed leniently (json-repair): abstentions — "unknown", an empty answer, or
unparsable junk — are dropped (paper §2.2). Every kept finding is labelled by its chunk
(`agent_{i}`) and keeps its quoted evidence, so the lead can check grounding (the failure
case of paper Appendix F.2 comes from ungrounded findings). Identical answers can be merged.
The observation is bounded by a token budget and says what it cut.

A reply is whatever a worker sent back, so `parse_reply` takes any value (a number or null
from a broken worker is junk) and runs in linear time (`parser.lenient_json`).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from parser import prompts
from parser.lenient_json import loads_leading
from parser.reward import normalize_answer
from parser.trajectory import Finding

ABSTENTIONS = frozenset(
    {"unknown", "none", "n/a", "na", "null", "not found", "not mentioned", "no information", "not available", "unanswerable"}
)
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)


def _fenced(body: str) -> str | None:
    """The inside of the first ```` ```json … ``` ```` fence, as the regex
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
    body = _THINK_BLOCK.sub("", text).strip()
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
    """(observation text, number of findings omitted by the budget)."""
    if not findings:
        return prompts.render("observation_empty", version, query=query, num_agents=num_agents), 0
    reporting = sum(1 + len(f.merged_agents) for f in findings)
    lines: list[str] = []
    used = count_tokens(prompts.render("observation", version, query=query, num_findings=reporting, num_agents=num_agents, findings=""))
    for finding in findings:
        agents = ", ".join([finding.agent, *finding.merged_agents])
        line = prompts.render("finding", version, agent=agents, answer=finding.answer, evidence=finding.evidence)
        cost = count_tokens(line) + 1
        if lines and used + cost > token_budget:
            break
        lines.append(line)
        used += cost
    omitted = len(findings) - len(lines)
    if omitted:
        lines.append(prompts.render("omitted", version, count=omitted))
    text = prompts.render("observation", version, query=query, num_findings=reporting, num_agents=num_agents, findings="\n".join(lines))
    return text, omitted
