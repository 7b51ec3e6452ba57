"""`parser plan`: plan a ParSer deployment and compare it with sequential reading.

For each document length in the workload it reports, from the rates files and the model config:

* per-sample latency, amortized time per sample (Table 2's metric) and throughput, for ParSer on
  `subagent_gpus` workers and for MemAgent-style sequential memory reading;
* the peers as the document grows (`peers` table): InfMem on the sequential server (up to 2 x
  chunks + 1 calls on its critical path, fewer with early stopping) and RLM with ParSer's lead as
  its root and the subagent workers as its sub-model (its calls depend on the code the root
  writes; the modelled strategy and its numbers are the workload's `infmem_*` / `rlm_*` keys,
  `parser.plan.simulate`'s docstring);
* per-worker load (requests per worker per round, busy fraction, mean queueing delay);
* cache memory per worker: what the resident chunk prefixes of all in-flight episodes need
  (KV of the full-attention layers + Qwen3.5's linear-attention state) vs what the worker has,
  and the resulting prefix hit rate (from the simulated LRU);
* the GPU count past which latency stops improving: the smallest swept count within
  `sweep.tolerance` of the best latency any count reaches.

It writes plan.md (the table), plan.json and plan.png (latency vs subagent GPUs, one line per
length, MemAgent's latency as reference, hit rate on the right axis) to the run directory.

    parser plan                                          # the paper's 4B cluster, eval workload
    parser plan workload=train cluster.subagent_gpus=10  # RL training rollouts
    parser plan 'workload.lengths=[28000]' workload.concurrency=256 rates.subagent=path/to/rates.yaml
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from parser.plan.memory import ModelSpec
from parser.plan.rates import Rates
from parser.plan.simulate import Cluster, Result, Workload, simulate_infmem, simulate_memagent, simulate_parser, simulate_rlm
from parser.base.resources import config_file

GIB = 1 << 30


def load_spec(cfg: Mapping[str, Any]) -> ModelSpec:
    """`model:` section: `config_json` (a path) or `hf_config` (inline config.json fields)."""
    kwargs = {"name": cfg.get("name"), "kv_dtype": cfg.get("kv_dtype"), "weight_bytes": cfg.get("weight_bytes")}
    if cfg.get("config_json"):
        return ModelSpec.from_file(cfg["config_json"], **kwargs)
    if cfg.get("hf_config"):
        return ModelSpec.from_hf_config(cfg["hf_config"], **kwargs)
    raise ValueError("model: give config_json (a config.json path) or hf_config (its fields)")


def load_rates(value: Any) -> Rates | None:
    """A rates file path (`configs/plan/rates/...`: from the working directory, else the shipped
    configs, `parser.base.resources.config_file`), an inline mapping, or null (a role that takes no time)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return Rates.from_dict(value)
    return Rates.load(config_file(value))


def load_router(value: Any) -> float:
    """The gateway's added latency per subagent request, from a router file (configs/plan/router/:
    `added_latency_s` and the `source` it was measured by), an inline mapping, or null (none)."""
    if value is None:
        return 0.0
    if not isinstance(value, Mapping):
        path = config_file(value)
        with open(path) as f:
            value = yaml.safe_load(f)
        where = str(path)
    else:
        where = "router"
    if not isinstance(value, Mapping) or not value.get("source") or not isinstance(value.get("added_latency_s"), (int, float)):
        raise ValueError(f"{where}: a router file needs added_latency_s (seconds) and the source that measured it")
    if value["added_latency_s"] < 0:
        raise ValueError(f"{where}: added_latency_s={value['added_latency_s']} is negative")
    return float(value["added_latency_s"])


def cache_capacity_bytes(spec: ModelSpec, hardware: Mapping[str, Any]) -> float:
    """What one worker has for KV + state: its GPUs' memory x mem_fraction_static - weights."""
    if hardware.get("cache_bytes") is not None:
        return float(hardware["cache_bytes"])
    gpus = int(hardware.get("gpus_per_worker", 1))
    total = hardware["gpu_memory_gib"] * GIB * gpus * hardware["mem_fraction_static"]
    return max(total - spec.weight_bytes, 0.0)


@dataclasses.dataclass
class Row:
    doc_tokens: int
    chunks: int
    gpus: int
    parser: Result
    memagent: Result | None
    cache_need_bytes: float  # per worker, resident prefixes of all in-flight episodes
    cache_capacity_bytes: float
    knee_gpus: int | None = None
    sweep: dict[int, Result] = dataclasses.field(default_factory=dict)
    concurrency: int = 1
    infmem: Result | None = None  # on the sequential server (None: no memagent rates)
    rlm: Result | None = None  # root on the lead's server, sub-calls on the subagent workers
    infmem_chunks: int = 0
    rlm_sub_calls: int = 0  # per sample: each map turn's batched round and its combine

    @property
    def resident_episodes(self) -> int:
        """In-flight episodes whose chunk prefixes all fit in the workers' caches together."""
        per_episode = self.cache_need_bytes * self.gpus / self.concurrency
        return int(self.cache_capacity_bytes * self.gpus // per_episode) if per_episode else 0


def workload_for(cfg: Mapping[str, Any], doc_tokens: int) -> Workload:
    fields = {f.name for f in dataclasses.fields(Workload)}
    params = {k: v for k, v in cfg.items() if k in fields}
    params["subagent_output_tokens"] = tuple(cfg["subagent_output_tokens"])
    return Workload(doc_tokens=doc_tokens, **{k: v for k, v in params.items() if k != "doc_tokens"})


def plan(cfg: Mapping[str, Any]) -> list[Row]:
    spec = load_spec(cfg["model"])
    capacity = cache_capacity_bytes(spec, cfg["hardware"])
    rates = {role: load_rates(cfg["rates"].get(role)) for role in ("subagent", "lead", "memagent")}
    router_latency_s = load_router(cfg.get("router"))
    cl = cfg["cluster"]

    def cluster(gpus: int) -> Cluster:
        return Cluster(subagent_rates=rates["subagent"], subagent_workers=gpus, lead_rates=rates["lead"],
                       lead_workers=cl.get("lead_gpus", 1),
                       memagent_rates=rates["memagent"], memagent_workers=cl.get("memagent_gpus", 1), spec=spec,
                       cache_bytes=capacity, cache_entries=cfg["hardware"].get("cache_entries"), routing=cl["routing"],
                       router_latency_s=router_latency_s)

    rows = []
    for doc_tokens in cfg["workload"]["lengths"]:
        wl = workload_for(cfg["workload"], doc_tokens)
        gpus = cl["subagent_gpus"]
        need = wl.concurrency * wl.chunks * spec.prefix_bytes(wl.prefix_tokens) / gpus
        row = Row(doc_tokens, wl.chunks, gpus, simulate_parser(wl, cluster(gpus)),
                  simulate_memagent(wl, cluster(gpus)) if rates["memagent"] else None, need, capacity,
                  concurrency=wl.concurrency)
        row.infmem = simulate_infmem(wl, cluster(gpus)) if rates["memagent"] else None
        row.rlm = simulate_rlm(wl, cluster(gpus))
        row.infmem_chunks = wl.infmem_chunks
        row.rlm_sub_calls = wl.rlm_sub_calls
        counts = sorted({*cfg["sweep"]["gpus"], gpus})
        row.sweep = {n: (row.parser if n == gpus else simulate_parser(wl, cluster(n))) for n in counts}
        best = min(r.latency_s for r in row.sweep.values())
        row.knee_gpus = min(n for n, r in row.sweep.items() if r.latency_s <= best * (1 + cfg["sweep"]["tolerance"]))
        rows.append(row)
    return rows


def _gib(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x / GIB:.1f}"


def table(rows: Sequence[Row]) -> str:
    out = ["| doc tokens | chunks | subagent GPUs | ParSer latency (s) | ParSer amortized (s/sample) | MemAgent latency (s) "
           "| MemAgent amortized (s/sample) | requests/worker (max) | busy (max) | queue wait (s, max) "
           "| cache need / have per worker (GiB) | episodes whose prefixes fit | prefix hit rate | latency flat from (GPUs) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w = r.parser.workers
        mem = r.memagent
        out.append(
            f"| {r.doc_tokens:,} | {r.chunks} | {r.gpus} | {r.parser.latency_s:.2f} | {r.parser.amortized_s:.2f} | "
            f"{mem.latency_s if mem else float('nan'):.2f} | {mem.amortized_s if mem else float('nan'):.2f} | "
            f"{max(x.requests for x in w)} | {max(x.busy_fraction for x in w):.0%} | "
            f"{max(x.mean_wait_s for x in w):.2f} | {_gib(r.cache_need_bytes)} / {_gib(r.cache_capacity_bytes)} | "
            f"{r.resident_episodes} | {r.parser.hit_rate:.0%} | {r.knee_gpus} |")
    return "\n".join(out)


def peers_table(rows: Sequence[Row]) -> str:
    """Per length: each method's per-sample latency and its calls on the critical path (steps);
    RLM's sub-calls too (a batched round per map turn, plus its combine)."""
    def cell(result: Result | None) -> str:
        return "–" if result is None else f"{result.latency_s:.2f} [{result.sequential_steps:g}]"

    out = ["| doc tokens | ParSer latency (s) [steps] | MemAgent [steps] | InfMem chunks | InfMem [steps] "
           "| RLM sub-calls | RLM [steps] |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.doc_tokens:,} | {cell(r.parser)} | {cell(r.memagent)} | {r.infmem_chunks} | {cell(r.infmem)} "
                   f"| {r.rlm_sub_calls} | {cell(r.rlm)} |")
    return "\n".join(out)


def plot(rows: Sequence[Row], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    hits = ax.twinx()
    for i, r in enumerate(rows):
        color = f"C{i}"
        gpus = sorted(r.sweep)
        ax.plot(gpus, [r.sweep[n].latency_s for n in gpus], "o-", color=color, label=f"ParSer {r.doc_tokens // 1000}K")
        hits.plot(gpus, [r.sweep[n].hit_rate * 100 for n in gpus], ":", color=color, alpha=0.6)
        if r.memagent:
            ax.axhline(r.memagent.latency_s, color=color, ls="--", lw=1, label=f"MemAgent {r.doc_tokens // 1000}K")
        ax.axvline(r.knee_gpus, color=color, lw=0.6, alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("subagent GPUs (workers)")
    ax.set_ylabel("per-sample latency (s)")
    hits.set_ylabel("prefix hit rate (%, dotted)")
    hits.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("ParSer latency vs subagent GPUs (vertical: where it stops improving)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(cfg: Mapping[str, Any], out_dir: Path) -> list[Row]:
    rows = plan(cfg)
    text = table(rows) + "\n\nThe peers as the document grows (latency per sample, [calls on the critical path]):\n\n" + peers_table(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.md").write_text(text + "\n", encoding="utf-8")
    (out_dir / "plan.json").write_text(json.dumps([{
        "doc_tokens": r.doc_tokens, "chunks": r.chunks, "gpus": r.gpus, "parser": r.parser.to_dict(),
        "memagent": r.memagent.to_dict() if r.memagent else None, "infmem": r.infmem.to_dict() if r.infmem else None,
        "rlm": r.rlm.to_dict() if r.rlm else None, "rlm_sub_calls": r.rlm_sub_calls, "cache_need_bytes": r.cache_need_bytes,
        "cache_capacity_bytes": r.cache_capacity_bytes, "resident_episodes": r.resident_episodes,
        "knee_gpus": r.knee_gpus,
        "sweep": {n: {"latency_s": s.latency_s, "amortized_s": s.amortized_s, "hit_rate": s.hit_rate}
                  for n, s in r.sweep.items()}} for r in rows], indent=1), encoding="utf-8")
    plot(rows, out_dir / "plan.png")
    print(text)
    print(f"wrote {out_dir / 'plan.md'}, plan.json, plan.png")
    return rows
