"""Test-only helpers, never shipped: the loopback worker and its synthetic-world readers, the
CPU runs' tiny leads (`verl_smoke`, `memagent_smoke`, `learn_lead`), the release stand-in and a
real vLLM-CPU server for tests/servers.

Why here and not in `parser/`: production code never needs them (tests/test_import_graph_on_cpu.py
refuses any import of them from `parser/`, `eval/` or `data_prep/`); what users need installed,
the offline model names, lives in `parser.offline`. Imported as `support`: pytest puts tests/ on
the path (as for `verl_fakes` and `scripted_lead`); a process started outside pytest, from a
checkout, gets it with `PYTHONPATH=tests` (the CPU recipes export it), e.g.

    python -m parser.serving.loopback --port 30001 --reader world
"""
from __future__ import annotations

import os
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent


def pythonpath() -> str:
    """PYTHONPATH for a child process that runs `python -m support.<module>`: this checkout's
    tests/ ahead of whatever this process was given."""
    return os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)


def loopback_workers(num: int, **local_args) -> dict:
    """A serve config's `workers:` block of `num` loopback workers (`parser.serving.gateway`'s `module` kind):
    the tests supply the worker, the gateway only knows how to start a server module."""
    return {"kind": "module", "module": "parser.serving.loopback", "num": num, "local_args": local_args,
            "env": {"PYTHONPATH": pythonpath()}}
