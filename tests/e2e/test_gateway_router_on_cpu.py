"""The real router binaries on 127.0.0.1 in front of 3 real HTTP workers (the project's loopback
worker, one process each), driven by ParSer traffic: smg 1.13.0 (PyPI `smg`, the default) and
sglang-router 0.3.2 (the authors' router), each with its shipped settings
(configs/serve/router/<kind>.yaml; health checks every second and a short shutdown grace here, to
keep the tests short).

Checks the gateway contract (parser/cli/gateway.py, parser/serving/gateway.py):
- multi-round traffic: >= 99% of round-2+ requests reach the worker that served their chunk in
  round 1, and no worker gets more than 1.5x the mean, for every policy ParSer ships (smg's
  consistent_hashing is measured for locality only: its spread depends on the hash ring); the
  same rounds straight to the workers give the router's added latency (printed);
- smg reads the chunk's routing key from `X-SMG-Routing-Key`: with chunks so short that the
  shared instructions dominate the text, it holds one sticky key per chunk and spreads them
  evenly when a whole round is in flight at once (the workers hold round 1 until all of it has
  arrived: smg balances the keys in flight, so on a busy machine early answers used to skew it to
  1.19); the same traffic with the header renamed holds no key at all;
- a worker killed in the middle of a scatter round, while it holds a request, loses no request
  (either router);
- a worker answering HTTP 200 with garbage: smg passes it through (its circuit breaker stays
  closed and the worker keeps its chunks), the engine never takes it for an answer (the calls
  fail with a clear error after their retries, the episode still answers), and the client-side
  `WorkerPool` over the same workers loses none.
Only the lead model is scripted (the outer edge); routers, workers, HTTP client, reader and
episode engine are the real ones. Figures are printed (run with -s to see them).

    .venv/bin/pytest tests/e2e/test_gateway_router_on_cpu.py -q -s
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.serving.gateway import Gateway, ProcessGroup, router_launch, router_preset, worker_launches
from parser.engine.readers import SubagentReader
from scripted_lead import ScriptedLead

import support  # tests/support: the loopback worker the gateway starts

ROOT = Path(__file__).resolve().parents[2]


def _load_report():
    spec = importlib.util.spec_from_file_location("gateway_report", ROOT / "scripts" / "gateway_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gateway_report"] = module
    spec.loader.exec_module(module)
    return module


report = _load_report()

# The routers may ask a hub for a worker's `model_path` ("loopback"); point them at a closed local
# port so a test never talks to a hub, whatever the network.
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}


# Health checks every second, and a 1 s shutdown grace: smg 1.13 pauses min(grace / 2, 5 s) on SIGTERM
# even with nothing in flight (measured: 5.3 s at its default 180 s, 0.8 s at 1 s; sglang-router
# stops in 0.1 s either way), and this module stops a router after every test
SHORT = {"log_level": "warn", "health_check_interval_secs": 1, "shutdown_grace_period_secs": 1}


def _router_cfg(kind: str, policy: str | None = None, **args) -> dict:
    cfg = router_preset(kind)
    return {**cfg, "policy": policy or cfg["policy"], "env": {**cfg["env"], **NO_HUB}, "port": 0,
            "prometheus_port": 0, "args": {**cfg["args"], **SHORT, **args}}


def _gateway(kind: str, tmp_path: Path, delay_s: float, **router_args) -> Gateway:
    cfg = {"workers": support.loopback_workers(3, delay_s=delay_s),
           "router": _router_cfg(kind, **router_args),
           "log_dir": str(tmp_path / f"logs-{kind}"), "ready_timeout_s": 60}
    return Gateway.from_config(cfg)


def _metric(metrics_url: str, name: str) -> dict[str, float]:
    """One Prometheus series of the router, by its label set (`worker="..."` -> the worker URL)."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode(errors="replace")
    found = re.findall(rf'^{name}(?:\{{([^}}]*)\}})? ([0-9.eE+-]+)$', text, re.MULTILINE)
    return {re.sub(r'^worker="([^"]+)"$', r"\1", labels): float(v) for labels, v in found}


def _post(url: str, path: str, body: dict | None = None) -> dict:
    """POST a control request to a loopback worker (/fault, /hold, /release)."""
    data = json.dumps(body or {}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + path, data=data, method="POST"), timeout=5) as resp:
        return json.loads(resp.read())


def _in_flight(url: str) -> int:
    """Requests a worker holds right now (its /get_load)."""
    with urllib.request.urlopen(url + "/get_load", timeout=5) as resp:
        return json.loads(resp.read())[0]["num_reqs"]


def _shared_workers(tmp_path_factory, workers: dict, ready_s: float):
    """Worker processes started once for a module's tests; yields their URLs."""
    group = ProcessGroup(tmp_path_factory.mktemp("workers"))
    launches = worker_launches(workers)
    try:
        for launch in launches:
            group.start(launch)
        for launch in launches:
            group.wait_ready(launch, ready_s)
        yield [launch.url for launch in launches]
    finally:
        group.stop()


@pytest.fixture(scope="module")
def loopback_workers(tmp_path_factory):
    """Three loopback worker processes shared by the policy runs (they keep no routing state)."""
    yield from _shared_workers(tmp_path_factory, support.loopback_workers(3, delay_s=0.05), 60)


@pytest.fixture(scope="module")
def scoring_workers(tmp_path_factory):
    """Two parser.serving.server workers (tiny Qwen3, seeded) shared by both routers' scoring runs: a
    score is a stateless forward pass, and each worker process costs ~9 CPU-s to start."""
    yield from _shared_workers(tmp_path_factory, {"kind": "parser_serve", "num": 2, "cpu_model": "tiny-qwen3"}, 120)


@contextlib.contextmanager
def _router(cfg: dict, worker_urls: list[str], log_dir: Path):
    """One router process (the `router:` block `cfg`) over workers that are already running."""
    group = ProcessGroup(log_dir)
    router = router_launch(cfg, worker_urls)
    try:
        group.start(router)
        group.wait_ready(router, 60)
        yield router
    finally:
        group.stop()


def _run_through_router(cfg: dict, worker_urls: list[str], tmp_path: Path, workload, routing_header=None,
                        direct: bool = False, during_round=None):
    """(per-round stats, smg's sticky-key counters at the end); `direct`: every round also straight
    to the workers (gateway_report's --direct); `during_round(r)` runs alongside round r."""
    with _router(cfg, worker_urls, tmp_path) as router:

        async def go():
            extra = {"routing_header": routing_header} if routing_header else {}
            pool = WorkerPool([HttpBackend(u) for u in worker_urls]) if direct else None
            try:
                async with HttpBackend(router.url, **extra) as backend:
                    return await report.run_workload(backend, workload, num_workers=len(worker_urls), direct=pool,
                                                     during_round=during_round)
            finally:
                if pool is not None:
                    await pool.aclose()

        stats = asyncio.run(go())
        keys = {name: sum(_metric(router.metrics_url, name).values())
                for name in ("smg_manual_policy_cache_entries", "smg_routing_key_source_total")} if cfg["kind"] == "smg" else {}
    return stats, keys


@pytest.mark.parametrize("kind,policy", [("smg", "cache_aware"), ("smg", "manual"), ("smg", "consistent_hashing"),
                                         ("sglang_router", "cache_aware"), ("sglang_router", "manual")])
def test_chunks_stay_on_their_worker_across_rounds(kind, policy, loopback_workers, tmp_path):
    workload = report.Workload(chunks=48, rounds=4, chunk_words=300)
    stats, _ = _run_through_router(_router_cfg(kind, policy), loopback_workers, tmp_path, workload, direct=True)
    for s in stats:
        print(f"[{kind} {policy}] {s.line()}")
    total = report.summary(stats)
    print(f"[{kind} {policy}] summary {total}")
    assert total["failed"] == 0 and total["requests"] == 48 * 4
    assert all(len(s.per_worker) == 3 for s in stats), "a worker got no traffic"
    assert total["locality_round2plus"] >= 0.99
    if policy != "consistent_hashing":
        assert total["max_spread"] <= 1.5
    # the same rounds straight to the workers, interleaved: what the router adds (figures, not a bound)
    assert total["direct_failed"] == 0 and all(total[k] > 0 for k in ("p50_ms", "direct_p50_ms", "p99_ms"))
    assert sum(s.requests for s in stats if s.path == "direct") == 48 * 4


ALL_IN_FLIGHT_S = 60.0  # deadline for round 1's requests to all reach the workers


def _round_one_all_in_flight(worker_urls: list[str], expected: int):
    """`during_round` for a run whose workers hold every request (POST /hold): once round 1's
    `expected` requests are all in flight, release them. smg's min_group counts the keys a worker
    has *in flight*, so round 1 is placed as if every key stayed busy, however fast this machine
    answers; later rounds follow the pins."""
    async def during(r: int) -> None:
        if r > 0:
            return
        deadline = time.monotonic() + ALL_IN_FLIGHT_S
        while (held := sum(await asyncio.gather(*(asyncio.to_thread(_in_flight, u) for u in worker_urls)))) < expected:
            assert time.monotonic() < deadline, f"{held} of round 1's {expected} requests reached the workers"
            await asyncio.sleep(0.02)  # between two looks at other processes' counts
        for url in worker_urls:
            _post(url, "/release")
    return during


def test_smg_pins_chunks_by_the_routing_key_header(loopback_workers, tmp_path):
    """25-word chunks: the shared instructions are most of every prompt's text, so text routing
    cannot tell chunks apart; smg's routing-key override (the shipped default) can."""
    workload = report.Workload(chunks=48, rounds=3, chunk_words=25)
    assert report.instruction_share(workload) > 0.3
    try:
        for url in loopback_workers:
            _post(url, "/hold")
        keyed, keys = _run_through_router(_router_cfg("smg"), loopback_workers, tmp_path / "keyed", workload,
                                          during_round=_round_one_all_in_flight(loopback_workers, workload.chunks))
    finally:
        for url in loopback_workers:  # the module's other tests share these workers
            _post(url, "/release")
    total = report.summary(keyed)
    print(f"[smg, X-SMG-Routing-Key] summary {total}; {keys}")
    assert keys == {"smg_manual_policy_cache_entries": 48, "smg_routing_key_source_total": 48 * 3}
    assert total["locality_round2plus"] == 1.0 and total["max_spread"] <= 1.1
    unkeyed, keys = _run_through_router(_router_cfg("smg"), loopback_workers, tmp_path / "renamed", workload,
                                        routing_header="X-Not-A-Routing-Key")
    print(f"[smg, header renamed] summary {report.summary(unkeyed)}; {keys}")
    assert keys == {"smg_manual_policy_cache_entries": 0, "smg_routing_key_source_total": 0}, "smg pinned keys it was never sent"


def scripted_lead(tokenizer, on_second_scatter=None) -> ScriptedLead:
    """The lead model, scripted: two query turns, then an answer. As the second query turn starts
    (before that turn's scatter round is sent) it calls `on_second_scatter()`."""
    def on_call(n):
        if n == 2 and on_second_scatter is not None:
            on_second_scatter()

    turns = [f'<think>ask</think>\n<tool_call>{{"name": "query_agents", "arguments": {{"query": "{q}"}}}}</tool_call>'
             for q in ("Where was the treaty signed?", "Who signed the treaty?")]
    return ScriptedLead(tokenizer, [*turns, "<think>done</think>\n<answer>Lisbon</answer>"], on_call=on_call)


CHUNKS = [Chunk(index=i, text=f"Document {i + 1}:\n" + " ".join(["filler"] * 200) + (" needle-lisbon" if i == 5 else ""),
                paragraph_ids=(i + 1,), num_tokens=210) for i in range(12)]


def _episode(backend, tokenizer, lead):
    reader = SubagentReader(backend, tokenizer, max_new_tokens=32)
    engine = EpisodeEngine(lead, tokenizer, reader, EpisodeConfig(max_turns=4, lead_thinking=False, max_attempts=4,
                                                                  retry_backoff_s=0.2, request_timeout_s=10))
    return engine.run("Where and by whom was the treaty signed?", CHUNKS, doc_id="doc-faults")


HOLD_S = 5.0  # worker1 holds each round-2 request this long: it is killed holding one (under the client's 10 s)
SEEN_S = 30.0  # deadline for worker1 to report a round-2 request in flight


def _kill_once_busy(gw: Gateway, name: str, killed: list) -> None:
    """Kill worker `name` as soon as its /get_load counts a request in flight (it has read one
    and holds it for HOLD_S): the kill lands mid-request by construction, not after a guessed delay."""
    url = next(w.url for w in gw.workers if w.name == name)
    _post(url, "/fault", {"delay_s": HOLD_S})

    def watch():
        deadline = time.monotonic() + SEEN_S
        while time.monotonic() < deadline:
            if _in_flight(url) > 0:
                gw.group.kill(name)
                killed.append(True)
                return
            time.sleep(0.01)  # between two looks (the worker is another process): its state decides, not this pause

    threading.Thread(target=watch, name=f"kill-{name}", daemon=True).start()


@pytest.mark.parametrize("kind", ["smg", "sglang_router"])
def test_worker_killed_mid_round_loses_no_request(kind, tmp_path, tiny_tokenizer):
    with _gateway(kind, tmp_path, delay_s=0.3) as gw:
        killed = []

        async def go():
            lead = scripted_lead(tiny_tokenizer, lambda: _kill_once_busy(gw, "worker1", killed))
            async with HttpBackend(gw.url) as backend:
                return await _episode(backend, tiny_tokenizer, lead)

        trajectory = asyncio.run(go())
        router_retries = sum(_metric(gw.metrics_url, "smg_worker_retries_total").values())
    assert killed, f"worker1 never held a round-2 request within {SEEN_S} s: the worker was never killed"
    assert trajectory.stop_reason == "answer" and trajectory.answer == "Lisbon"
    calls = [c for t in trajectory.turns for q in t.queries for c in q.calls]
    assert len(calls) == 2 * len(CHUNKS)
    assert [c.status for c in calls if c.status == "failed"] == []
    client_retries = sum(c.attempts - 1 for c in calls)
    print(f"[{kind} kill] every call answered: the router re-sent {router_retries:.0f} requests, "
          f"the client {client_retries}")
    assert router_retries + client_retries > 0, "nobody re-sent anything: the kill did not land mid-round"


def test_a_garbage_200_passes_through_smg_and_only_the_client_pool_routes_around_it(tmp_path, tiny_tokenizer):
    with _gateway("smg", tmp_path, delay_s=0.0) as gw:
        bad = gw.workers[1].url
        _post(bad, "/fault", {"fail_every": 1, "fail_mode": "garbage"})

        async def through(backend):
            try:
                return await _episode(backend, tiny_tokenizer, scripted_lead(tiny_tokenizer))
            finally:
                await backend.aclose()

        via_router = asyncio.run(through(HttpBackend(gw.url)))
        cb_state = _metric(gw.metrics_url, "smg_worker_cb_state")[bad]
        health = _metric(gw.metrics_url, "smg_worker_health")[bad]
        with urllib.request.urlopen(bad + "/records", timeout=5) as resp:
            garbage_served = len(json.loads(resp.read()))
        via_pool = asyncio.run(through(WorkerPool([HttpBackend(w.url) for w in gw.workers])))

    router_calls = [c for t in via_router.turns for q in t.queries for c in q.calls]
    failed = [c for c in router_calls if c.status == "failed"]
    print(f"[smg garbage] through the router: {len(failed)} of {len(router_calls)} calls failed after "
          f"{sorted({c.attempts for c in failed})} attempts; the garbage worker answered {garbage_served} "
          f"requests; its breaker {cb_state} (0 = closed), health {health}")
    assert via_router.stop_reason == "answer", "a garbage worker must never end the episode"
    assert failed and all(c.attempts == 4 and "(HTTP 200): the reply is not" in c.error for c in failed)
    assert all(c.status != "finding" for c in failed) and not any(c.raw for c in failed)
    assert cb_state == 0 and health == 1, "smg noticed the garbage: update docs/scaling.md's fault table"
    assert garbage_served >= 4 * len(failed)  # every retry of a failed key went back to the garbage worker

    pool_calls = [c for t in via_pool.turns for q in t.queries for c in q.calls]
    print(f"[pool garbage] {sum(c.status == 'failed' for c in pool_calls)} failed, "
          f"{sum(c.attempts > 1 for c in pool_calls)} retried of {len(pool_calls)}")
    assert via_pool.answer == "Lisbon" and not [c for c in pool_calls if c.status == "failed"]


@pytest.mark.parametrize("kind", ["smg", "sglang_router"])
def test_answer_scoring_passes_through_the_gateway(kind, scoring_workers, tmp_path, tiny_tokenizer, tiny_qwen3_model):
    """`score` through the router to two parser.serving.server workers (tiny Qwen3, the same seeded weights
    as in process): SGLang's input-logprob fields reach the worker and its answer comes back
    unchanged, equal to a plain forward pass, whichever worker a key lands on. Either router's
    OpenAI completions route takes text prompts only: a token-id prompt (vLLM's prompt_logprobs
    way) is refused with a 4xx, a clear non-retryable error (docs/info_gain.md)."""
    import torch

    from parser.serving.types import BackendError

    prompt = tiny_tokenizer.encode("Question: who built the bridge? Findings: Ada Okafor built it. Answer:",
                                   add_special_tokens=False)
    answer = tiny_tokenizer.encode(" Ada Okafor", add_special_tokens=False)
    with torch.inference_mode():
        logits = tiny_qwen3_model(input_ids=torch.tensor([prompt + answer])).logits[0].float()
    want = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(answer)[:, None])[:, 0].tolist()
    with _router(_router_cfg(kind), scoring_workers, tmp_path / f"logs-score-{kind}") as router:
        async def go(api, server):
            async with HttpBackend(router.url, api=api, server=server, model="tiny-qwen3") as backend:
                return [await backend.score(prompt, answer, routing_key=f"doc:{i}") for i in range(4)]

        scores = asyncio.run(go("sglang", "sglang"))
        with pytest.raises(BackendError) as refused:
            asyncio.run(go("completions", "vllm"))
    for got in scores:
        assert got == pytest.approx(want, abs=1e-4)
    # measured: smg 1.13.0 answers 400 (its prompt field takes a string or strings), sglang-router 0.3.2 a 422
    assert refused.value.status == {"smg": 400, "sglang_router": 422}[kind]
    assert not refused.value.retryable and "prompt" in str(refused.value)
