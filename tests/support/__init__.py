"""Test-only helpers, never shipped: the release stand-in, `slow_server.Trickle` (a model server
that trickles its reply or never answers, for deadline tests) and `loopback_workers` (a gateway
config's block of loopback workers). What recipes and scripts run is in the package: the loopback
worker is `parser.serving.loopback`, the CPU runs' tiny leads are `parser train smoke`, `parser
train warm-start` and `parser train memagent-smoke`, the vLLM-CPU launcher `parser.serving.vllm_server`.

Why here and not in `parser/`: production code never needs them (tests/test_import_graph_on_cpu.py
refuses any import of them from `parser/`, `eval/` or `data_prep/`); what users need installed,
the offline model names, lives in `parser.offline`. Imported as `support`: pytest puts tests/ on
the path (as for `verl_fakes` and `scripted_lead`), e.g.

    from support.release_standin import write_release_standin
"""
from __future__ import annotations


def loopback_workers(num: int, **local_args) -> dict:
    """A serve config's `workers:` block of `num` loopback workers (`parser.serving.gateway`'s `module` kind)."""
    return {"_target_": "parser.serving.gateway.module_worker", "module": "parser.serving.loopback", "num": num, "local_args": local_args}
