"""Text shown in an HTML page, escaped: what a model, a document or a tool wrote is data, never markup.

Why it exists: the trajectory viewer (`eval.viewer`) and the methods' parts of it
(`parser.methods.*.view`) all put model text into one page; each had its own copy of the same
escape, and one copy that forgot quotes would let a reply close an attribute. `None` shows as
nothing (a record's missing field), anything else as its `str`.

    f"<pre>{escape(block.get('code'))}</pre>"
"""
from __future__ import annotations

import html
from typing import Any


def escape(value: Any) -> str:
    """`value` as HTML text, quotes included (safe inside an attribute too)."""
    return html.escape("" if value is None else str(value), quote=True)
