"""ParSer: read in parallel, reason in depth.

A lead agent that never sees the document scatters focused queries to one frozen subagent per
chunk and reasons over the gathered findings. See docs/architecture.md for the module map.
"""

__version__ = "0.1.0"
