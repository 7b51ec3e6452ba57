"""How LongHarness acquires evidence: through a tool set of the one episode engine.

`readers` (document-level, ParSer's): each query is `query_agents` over the chunks
(`parser.engine.tools.QueryAgents`, built by `EpisodeEngine.query_agents`, so the scatter, retries,
timeouts and fan-out bounds are the engine's); every reader's finding becomes a candidate quote
from its chunk. `corpus` (DCI's): each query is the `bash` tool of `parser.engine.sandbox.tools.SandboxTools` over
the document written as a corpus directory; a plain phrase is searched as a fixed string
(`grep -rn -i -F`), a line that starts with an allowed program runs as it is; every
`file:line:text` line of the output is a candidate quote from that file line.

Both return, per query, the records for the trajectory and the candidates, as
`Candidate(source, quote, answer)`, with `sources` (name -> text) for the quote check.

    acquirer = ReaderAcquisition(engine.query_agents(chunks, doc_id), chunks)
    rounds = await acquirer.acquire(["who founded X"])
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

from parser.text.actions import TOOL_NAME, ToolCall
from parser.text.chunking import Chunk
from parser.engine.sandbox.tools import ALLOWED_COMMANDS, SandboxTools
from parser.engine.gather import parse_reply
from parser.engine.tools import QueryAgents

_MATCH = re.compile(r"^(?:\./)?(?P<path>[^:\n]+?):(?P<line>\d+):(?P<text>.*)$")


def grep_lines(text: str) -> list[str]:
    """`text`'s lines as grep numbers them: split on "\n" only. `str.splitlines` also splits on
    U+2028, U+0085, "\r", form feeds, ...: a file holding one numbered the rest of its lines apart
    from grep's, and such a character inside a matched line of grep's output started a new line
    that could read as another file's `file:line:text` (a forged candidate)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


@dataclasses.dataclass
class Candidate:
    source: str
    quote: str
    answer: str = ""


@dataclasses.dataclass
class Acquired:
    """One query's outcome: its candidates and what the trajectory keeps of it."""

    candidates: list[Candidate]
    query_record: Any = None  # parser.records.trajectory.QueryRecord (readers)
    call_record: dict[str, Any] | None = None  # a FunctionTools call record (corpus)


class ReaderAcquisition:
    """`query_agents` over the chunks; a finding's quote is its evidence, else its answer."""

    prompt = "acquire_readers"

    def __init__(self, tools: QueryAgents, chunks: list[Chunk], max_candidates: int):
        self.tools, self.max_candidates = tools, max_candidates
        self.sources = {f"chunk {c.index}": c.text for c in chunks}

    async def acquire(self, queries: list[str]) -> list[Acquired]:
        result = await self.tools.execute([ToolCall(TOOL_NAME, {"query": q}) for q in queries])
        out = []
        for record in result.queries:
            candidates = []
            for call in record.calls:
                parsed = parse_reply(call.raw) if call.status == "finding" else None
                if parsed is not None:
                    answer, evidence = parsed
                    candidates.append(Candidate(f"chunk {call.chunk_index}", evidence or answer, answer))
            out.append(Acquired(candidates[: self.max_candidates], query_record=record))
        return out


class CorpusAcquisition:
    """DCI's sandboxed `bash` over the corpus directory; every `file:line:text` output line is a candidate,
    in file and line order."""

    prompt = "acquire_corpus"

    def __init__(self, tools: SandboxTools, root: Path, max_candidates: int):
        self.tools, self.max_candidates = tools, max_candidates
        self.lines = {p.name: grep_lines(p.read_bytes().decode("utf-8")) for p in sorted(root.iterdir()) if p.is_file()}
        self.sources = {f"{name}:{n}": line for name, lines in self.lines.items() for n, line in enumerate(lines, start=1)}

    @staticmethod
    def command(query: str) -> str:
        """A line that starts with an allowed program runs as it is; anything else is a phrase."""
        first = query.split(maxsplit=1)[0] if query.split() else ""
        if first in ALLOWED_COMMANDS:
            return query
        return f"grep -rn -i -F -e {shlex.quote(query)} ."

    async def acquire(self, queries: list[str]) -> list[Acquired]:
        calls = [ToolCall("bash", {"command": self.command(q)}) for q in queries]
        result = await self.tools.execute(calls)
        out = []
        for message, record in zip(result.messages, result.calls, strict=True):
            candidates = []
            for line in grep_lines(message["content"]):
                match = _MATCH.match(line.strip())
                if match and match["path"] in self.lines:
                    candidates.append((match["path"], int(match["line"]), match["text"]))
            candidates.sort()  # file order, not the directory's: the same corpus gives the same ledger
            out.append(Acquired([Candidate(f"{path}:{line}", text) for path, line, text in candidates[: self.max_candidates]],
                                call_record=record))
        return out
