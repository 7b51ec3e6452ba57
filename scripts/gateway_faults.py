"""What happens to ParSer's scatter rounds when one subagent worker fails? The fault table.

For every fault and every setup it starts three loopback workers (one process each,
`parser/serving/loopback.py`) and, for a router setup, the real router binary with the shipped
settings (`configs/serve/router/<kind>.yaml`; its request timeout scaled with the client's
deadline, keeping the shipped 240 s : 300 s ratio), then sends back-to-back scatter rounds through
the episode engine's own request path (`parser.engine.tools.QueryAgents`: per-attempt deadline
`--request-timeout-s`, `--max-attempts` with backoff, a failed call recorded, never raised),
T chunks per round, each request carrying its routing key `doc_id:chunk`. At `--fault-at-s`
worker1 fails:

- kill     SIGKILL: connections refused from then on
- freeze   SIGSTOP: the process is frozen, connections hang, /health times out
- hang     generation requests are held and never answered; /health keeps answering 200
           (a wedged scheduler behind a live HTTP server)
- garbage  every request is answered HTTP 200 with a body that is no completion
- flap     down (503 everywhere, /health too) and up by turns, `--flap-period-s` each

Setups: `smg` and `sglang_router` (the two router kinds of configs/serve/), and `pool`: no
router, the client-side `WorkerPool` over the three worker URLs (`subagent.base_urls`).

Columns, per fault x setup (rounds after the fault only):
- lost        calls that failed every attempt (the engine records them; goal: 0)
- retried     calls that needed more than one client attempt
- bad         client attempts that failed (error, timeout, garbage) or took over `--slow-s`
- last bad    seconds from the fault to the end of the last bad attempt: how long clients
              felt it ("-": never); near the run's length means it was never routed around
- worst round the slowest scatter round (a round waits for its slowest call)
- moved       share of worker1's chunks answered by another worker in the last round
- router saw  what the router's own Prometheus metrics said about worker1, first time seen:
              `cb open` (circuit breaker), `unhealthy` (health checks); scraped every 0.5 s
- who         `router` (nothing lost, no client retry), `router+retry` (nothing lost, the
              client's retries were needed), `pool` (the client-side pool did it), `nobody`
              (calls lost)

    python scripts/gateway_faults.py                         # every fault x every setup (~10 min)
    python scripts/gateway_faults.py --faults kill garbage --setups smg pool --duration-s 20
    python scripts/gateway_faults.py --smoke                 # seconds: kill + garbage on smg and pool
    python scripts/gateway_faults.py --set health_check_interval_secs=2   # a router arg changed

Prints the table (markdown) with the machine's load average; `--json out.json` writes every
figure. The smoke size fails (exit 1) on nonsense: a missing row, no request answered, a
NaN/negative figure, or a fault that did not reach the worker.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence


import yaml

from parser.engine import prompts
from parser.serving.types import Completion, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.serving.gateway import ProcessGroup, router_launch, router_preset, worker_launches
from parser.engine.protocol import protocol_for
from parser.engine.tools import QueryAgents, ReaderReply

FAULTS = ("kill", "freeze", "hang", "garbage", "flap")
SETUPS = ("smg", "sglang_router", "pool")
FAULTY = 1  # worker1 fails
# the router asks a hub for the workers' model ("loopback"): a closed local port answers instead
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}


# ---------------------------------------------------------------------------- the client side
@dataclasses.dataclass
class Attempt:
    key: str
    start: float
    end: float
    worker: str | None
    error: str | None


class RecordingBackend:
    """Wraps the backend under test and records every attempt: its key, times, worker, error."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.attempts: list[Attempt] = []
        self.renders_chat_template = False

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None) -> Completion:
        start = time.monotonic()
        try:
            completion = await self.inner.generate(prompt, sampling, routing_key=routing_key, request_id=request_id)
        except BaseException as error:  # recorded, then raised for the engine's retry policy
            self.attempts.append(Attempt(routing_key, start, time.monotonic(), None, type(error).__name__))
            raise
        self.attempts.append(Attempt(routing_key, start, time.monotonic(), completion.worker, None))
        return completion

    async def aclose(self) -> None:
        await self.inner.aclose()


class PromptReader:
    """The request SubagentReader sends to a text-routed server (instructions -> chunk -> query)."""

    def __init__(self, backend: RecordingBackend):
        self.backend = backend
        self.sampling = SamplingParams(max_new_tokens=16, temperature=0.7)

    async def read(self, query: str, chunk: Chunk, doc_id: str) -> ReaderReply:
        text = prompts.render("subagent", chunk=chunk.text, query=query)
        completion = await self.backend.generate(text, self.sampling, routing_key=f"{doc_id}:{chunk.index}")
        return ReaderReply(completion.text, completion.prompt_tokens, len(completion.token_ids))

    def forget(self, doc_id: str) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- router metrics
class MetricsWatch:
    """Polls the router's /metrics on a thread: when worker1's breaker opened / it went unhealthy."""

    def __init__(self, metrics_url: str, worker_url: str, interval_s: float = 0.5):
        self.url, self.worker = metrics_url.rstrip("/") + "/metrics", worker_url
        self.interval_s = interval_s
        self.first: dict[str, float] = {}  # event -> monotonic time first seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "MetricsWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _value(self, text: str, name: str) -> float | None:
        match = re.search(rf'^{name}\{{worker="{re.escape(self.worker)}"\}} ([0-9.eE+-]+)$', text, re.MULTILINE)
        return float(match.group(1)) if match else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    text = resp.read().decode(errors="replace")
            except OSError:
                continue
            now = time.monotonic()
            if self._value(text, "smg_worker_cb_state") == 1:  # 0 closed, 1 open, 2 half-open
                self.first.setdefault("cb open", now)
            if self._value(text, "smg_worker_health") == 0:
                self.first.setdefault("unhealthy", now)


# ---------------------------------------------------------------------------- one run
@dataclasses.dataclass
class Row:
    fault: str
    setup: str
    rounds: int
    calls: int
    lost: int
    retried: int
    bad: int
    last_bad_s: float | None
    worst_round_s: float
    moved: float | None
    router_saw: dict[str, float]
    duration_s: float
    fault_reached: bool

    @property
    def who(self) -> str:
        if self.lost:
            return "nobody"
        if self.setup == "pool":
            return "pool"
        return "router+retry" if self.retried else "router"

    def cells(self) -> list[str]:
        last = "-" if self.last_bad_s is None else f"{self.last_bad_s:.1f}"
        moved = "-" if self.moved is None else f"{self.moved:.2f}"
        saw = ", ".join(f"{k} +{v:.1f}s" for k, v in sorted(self.router_saw.items(), key=lambda kv: kv[1])) or "-"
        if self.setup == "pool":
            saw = "(no router)"
        return [self.fault, self.setup, str(self.calls), str(self.lost), str(self.retried), str(self.bad), last,
                f"{self.worst_round_s:.1f}", moved, saw, self.who]


HEADER = ["fault", "setup", "calls", "lost", "retried", "bad", "last bad s", "worst round s", "moved", "router saw", "who"]


def _router_cfg(kind: str, overrides: dict[str, Any], client_timeout_s: float) -> dict[str, Any]:
    """The shipped router block; its request timeout keeps the shipped ratio to the engine's
    deadline (240 s router / 300 s engine), scaled to this run's `--request-timeout-s`."""
    cfg = router_preset(kind)
    cfg = {**cfg, "env": {**(cfg.get("env") or {}), **NO_HUB}, "port": 0, "prometheus_port": 0}
    timeout = max(1, round(client_timeout_s * cfg["args"]["request_timeout_secs"] / EpisodeConfig().request_timeout_s))
    cfg["args"] = {**(cfg.get("args") or {}), "log_level": "warn", "request_timeout_secs": timeout, **overrides}
    return cfg


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


def inject(fault: str, group: ProcessGroup, worker_url: str, flap_period_s: float) -> None:
    name = f"worker{FAULTY}"
    if fault == "kill":
        group.kill(name, signal.SIGKILL)
    elif fault == "freeze":
        group.kill(name, signal.SIGSTOP)
    elif fault == "hang":
        _post(worker_url + "/fault", {"fail_every": 1, "fail_mode": "hang", "hang_s": 600})
    elif fault == "garbage":
        _post(worker_url + "/fault", {"fail_every": 1, "fail_mode": "garbage"})
    elif fault == "flap":
        _post(worker_url + "/fault", {"flap_period_s": flap_period_s})
    else:
        raise ValueError(f"fault {fault!r}; expected one of {FAULTS}")


async def _drive(backend: RecordingBackend, args: argparse.Namespace, fault: str, group: ProcessGroup,
                 worker_url: str) -> tuple[list[tuple[float, float, list[Any]]], float]:
    """Scatter rounds until the run's end; the fault goes in at `fault_at_s`. -> rounds, fault time."""
    config = EpisodeConfig(max_attempts=args.max_attempts, retry_backoff_s=args.retry_backoff_s,
                           request_timeout_s=args.request_timeout_s)
    words = "river castle amber signal harbor lantern meadow copper orbit violet".split()
    chunks = [Chunk(index=i, text=f"Document {i + 1}:\n" + " ".join(words[(i + j) % len(words)] for j in range(args.chunk_words)),
                    paragraph_ids=(i + 1,), num_tokens=args.chunk_words) for i in range(args.chunks)]
    tool = QueryAgents(PromptReader(backend), chunks, "faults", config, protocol_for(config), asyncio.Semaphore(1024),
                       lambda t: len(t.split()))
    started = time.monotonic()
    fault_time = math.inf
    rounds = []
    r = 0
    while time.monotonic() - started < args.duration_s:
        if fault_time == math.inf and time.monotonic() - started >= args.fault_at_s:
            await asyncio.to_thread(inject, fault, group, worker_url, args.flap_period_s)
            fault_time = time.monotonic()
        round_start = time.monotonic()
        record = await tool.scatter(f"Round {r}: which {words[r % len(words)]} comes first?")
        rounds.append((round_start, time.monotonic(), record.calls))
        r += 1
        await asyncio.sleep(args.round_gap_s)
    return rounds, fault_time


def run_one(fault: str, setup: str, args: argparse.Namespace, log_root: Path) -> Row:
    group = ProcessGroup(log_root / f"{fault}-{setup}")
    workers = worker_launches({"_target_": "parser.serving.gateway.module_worker", "module": "parser.serving.loopback", "num": 3,
                               "local_args": {"delay_s": args.delay_s}})
    try:
        for w in workers:
            group.start(w)
        for w in workers:
            group.wait_ready(w, 60)
        urls = [w.url for w in workers]
        metrics_url = None
        if setup == "pool":
            inner: Any = WorkerPool([HttpBackend(u, timeout_s=args.request_timeout_s * 2) for u in urls],
                                    hung_after_s=args.request_timeout_s * 0.9)
        else:
            router = router_launch(_router_cfg(setup, args.set, args.request_timeout_s), urls)
            group.start(router)
            group.wait_ready(router, 60)
            inner = HttpBackend(router.url, timeout_s=args.request_timeout_s * 2)
            metrics_url = router.metrics_url
        backend = RecordingBackend(inner)
        watch = MetricsWatch(metrics_url, urls[FAULTY]) if metrics_url else None

        async def go():
            try:
                return await _drive(backend, args, fault, group, urls[FAULTY])
            finally:
                await backend.aclose()

        if watch:
            with watch:
                rounds, fault_time = asyncio.run(go())
        else:
            rounds, fault_time = asyncio.run(go())
        reached = fault_time < math.inf and _fault_reached(fault, urls[FAULTY], group,
                                                           time.time() - (time.monotonic() - fault_time),
                                                           args.flap_period_s)
    finally:
        group.stop()
    return _summarise(fault, setup, args, rounds, fault_time, backend.attempts, watch.first if watch else {}, reached)


def _fault_reached(fault: str, url: str, group: ProcessGroup, since: float, flap_period_s: float) -> bool:
    """Did worker1 really fail? (a dead / frozen process, or requests reaching the changed worker)"""
    proc = group.procs[f"worker{FAULTY}"]
    if fault == "kill":
        return proc.poll() is not None
    if fault == "freeze":
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] == "T"  # stopped
        except OSError:
            return False
    if fault == "flap":  # a router may stop sending it anything: check its /health flips instead
        return _flaps(url, flap_period_s)
    try:
        with urllib.request.urlopen(url + "/records", timeout=5) as resp:  # /records never flaps
            return any(r["time"] > since for r in json.loads(resp.read()))
    except OSError:
        return False


def _flaps(url: str, period_s: float) -> bool:
    """Whether /health answers both 503 and 200 within two and a half flap periods."""
    seen = set()
    deadline = time.monotonic() + 2.5 * period_s
    while time.monotonic() < deadline and len(seen) < 2:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                seen.add(resp.status)
        except urllib.error.HTTPError as error:
            seen.add(error.code)
        except OSError:
            return False
        time.sleep(period_s / 4)
    return seen == {200, 503}


def _summarise(fault: str, setup: str, args: argparse.Namespace, rounds, fault_time: float,
               attempts: Sequence[Attempt], router_saw: dict[str, float], reached: bool) -> Row:
    after = [(s, e, calls) for s, e, calls in rounds if e > fault_time]
    home: dict[str, str] = {}
    for a in attempts:
        if a.end < fault_time and a.worker and a.error is None:
            home.setdefault(a.key, a.worker)
    faulty_id = f"w{FAULTY}"
    bad = [a for a in attempts if a.end > fault_time and (a.error is not None or a.end - a.start > args.slow_s)]
    calls = [c for _, _, cs in after for c in cs]
    moved = None
    if after and home:
        last_keys = {a.key: a.worker for a in attempts if a.start >= after[-1][0] and a.error is None}
        mine = [k for k, w in home.items() if w == faulty_id]
        if mine:
            moved = sum(last_keys.get(k) not in (None, faulty_id) for k in mine) / len(mine)
    return Row(
        fault=fault, setup=setup, rounds=len(after), calls=len(calls),
        lost=sum(c.status == "failed" for c in calls), retried=sum(c.attempts > 1 for c in calls), bad=len(bad),
        last_bad_s=max(a.end for a in bad) - fault_time if bad else None,
        worst_round_s=max((e - s for s, e, _ in after), default=0.0), moved=moved,
        router_saw={k: v - fault_time for k, v in router_saw.items() if v >= fault_time - args.metrics_slack_s},
        duration_s=(rounds[-1][1] - fault_time) if rounds and fault_time < math.inf else 0.0, fault_reached=reached,
    )


# ---------------------------------------------------------------------------- report
def table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def check(rows: Sequence[Row], faults: Sequence[str], setups: Sequence[str]) -> list[str]:
    """Nonsense the smoke run must fail on."""
    problems = []
    seen = {(r.fault, r.setup) for r in rows}
    problems += [f"missing row {f} x {s}" for f in faults for s in setups if (f, s) not in seen]
    for r in rows:
        if r.calls == 0:
            problems.append(f"{r.fault} x {r.setup}: no call after the fault")
        if r.calls and r.lost == r.calls:
            problems.append(f"{r.fault} x {r.setup}: every call lost")
        if not r.fault_reached:
            problems.append(f"{r.fault} x {r.setup}: the fault never reached worker{FAULTY}")
        numbers = [r.worst_round_s, r.duration_s, *(v for v in [r.last_bad_s, r.moved] if v is not None)]
        if any(math.isnan(x) or x < 0 for x in numbers):
            problems.append(f"{r.fault} x {r.setup}: a NaN or negative figure {numbers}")
    return problems


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected key=value (a router arg, e.g. health_check_interval_secs=2)")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # -- what to run
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    ap.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS)
    ap.add_argument("--set", nargs="*", default=[], help="router args key=value over the shipped config")
    ap.add_argument("--smoke", action="store_true", help="seconds: kill + garbage on smg and pool, short runs")
    # -- workload
    ap.add_argument("--chunks", type=int, default=24, help="T: requests per scatter round")
    ap.add_argument("--chunk-words", type=int, default=300)
    ap.add_argument("--delay-s", type=float, default=0.05, help="loopback answer delay")
    ap.add_argument("--round-gap-s", type=float, default=0.2, help="the lead's turn between rounds")
    ap.add_argument("--duration-s", type=float, default=40.0, help="per run")
    ap.add_argument("--fault-at-s", type=float, default=5.0)
    ap.add_argument("--flap-period-s", type=float, default=3.0)
    # -- the client (the episode engine's retry policy)
    ap.add_argument("--max-attempts", type=int, default=4)
    ap.add_argument("--retry-backoff-s", type=float, default=0.5)
    ap.add_argument("--request-timeout-s", type=float, default=5.0, help="per attempt (EpisodeConfig.request_timeout_s)")
    ap.add_argument("--slow-s", type=float, default=1.0, help="an attempt slower than this counts as bad")
    ap.add_argument("--metrics-slack-s", type=float, default=1.0)
    ap.add_argument("--log-dir", default=None, help="process logs (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="also write every figure here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.faults, args.setups = ["kill", "garbage"], ["smg", "pool"]
        args.duration_s, args.fault_at_s, args.chunks = min(args.duration_s, 6.0), min(args.fault_at_s, 1.5), 12
    args.set = _parse_set(args.set)
    log_root = Path(args.log_dir or os.environ.get("TMPDIR", "/tmp")) / f"gateway-faults-{os.getpid()}"

    rows = []
    for fault in args.faults:
        for setup in args.setups:
            load = os.getloadavg()
            row = run_one(fault, setup, args, log_root)
            rows.append(row)
            print(f"[{fault} x {setup}] " + " | ".join(row.cells()[2:]) + f"  (load {load[0]:.1f})", flush=True)
    load = os.getloadavg()
    print(f"\nworker{FAULTY} of 3 fails {args.fault_at_s:.0f} s into each {args.duration_s:.0f} s run; "
          f"T={args.chunks} chunks/round, client: {args.max_attempts} attempts, {args.request_timeout_s:.0f} s "
          f"per attempt; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} ({os.cpu_count()} cores)\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "load": load,
                                               "rows": [{**dataclasses.asdict(r), "who": r.who} for r in rows]}, indent=2))
    problems = check(rows, args.faults, args.setups)
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
