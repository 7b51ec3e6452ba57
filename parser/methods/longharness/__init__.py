"""LongHarness (issue 34): evidence ledger and conclusions as explicit, bounded, traceable state,
over ParSer's readers or DCI's corpus tools. docs/longharness.md; the loop is `method.py`.

    python -m eval.run method=longharness
"""
from .method import LongHarnessMethod

__all__ = ["LongHarnessMethod"]
