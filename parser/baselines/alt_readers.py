"""ParSer with alternative subagents (paper Table 5) as eval methods: `parser_thinking`, `parser_dci`.

The same lead and the same `parser` method and episode engine; only the chunk reader changes
(`parser.readers`). These names exist so the eval config can pick the variant by name:

    python -m eval.run method=parser_dci report.row="ParSer (DCI subagents)"
"""
from __future__ import annotations

from typing import Any, Mapping

from parser.methods import MethodResult, Models, Sample, register_method
from parser.parser_method import ParSerMethod


class _ReaderVariant:
    reader_type = "direct"

    def __init__(self, models: Models, *, episode: Mapping[str, Any] | None = None, reader: Mapping[str, Any] | None = None):
        from parser.readers import build_reader  # parser.readers imports parser.baselines: import late

        self.reader = build_reader({"type": self.reader_type, **(reader or {})}, models)
        self.inner = ParSerMethod(models, episode=dict(episode or {}), reader=self.reader)

    async def run(self, sample: Sample) -> MethodResult:
        try:
            return await self.inner.run(sample)
        finally:
            if hasattr(self.reader, "forget"):
                self.reader.forget(sample.id)

    async def aclose(self) -> None:
        if hasattr(self.reader, "close"):
            self.reader.close()
        await self.inner.aclose()


@register_method("parser_thinking")
class ParSerThinkingSubagents(_ReaderVariant):
    name = "parser_thinking"
    reader_type = "thinking"


@register_method("parser_dci")
class ParSerDCISubagents(_ReaderVariant):
    name = "parser_dci"
    reader_type = "dci"
