"""LongHarness (issue 34): evidence ledger and conclusions as explicit, bounded, traceable state,
over ParSer's readers or DCI's corpus tools, as a tool set of the episode engine. docs/longharness.md.

    parser eval method=longharness
"""
from .method import LongHarnessMethod

__all__ = ["LongHarnessMethod"]
