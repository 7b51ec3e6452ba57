"""The real sglang-router binary (PyPI `sglang-router`, the `gateway` extra) on 127.0.0.1 in front
of 3 real HTTP workers (the project's loopback worker, one process each), driven by ParSer traffic.

Checks the gateway contract (scripts/serve_subagents.py, parser/gateway.py):
- multi-round traffic: >= 99% of round-2+ requests reach the worker that served their chunk in
  round 1, and no worker gets more than 1.5x the mean (cache_aware and manual; consistent_hashing
  is measured for locality, its spread depends on where worker URLs fall on the hash ring);
- a worker killed in the middle of a scatter round loses no request: the episode engine retries
  through the gateway and the episode still ends with an answer.
Only the lead model is scripted (the outer edge); router, workers, HTTP client, reader and
episode engine are the real ones. Figures are printed (run with -s to see them).

    .venv/bin/pytest tests/e2e/test_gateway_router_on_cpu.py -q -s
"""
from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang_router", reason="needs the gateway extra: pip install 'parser-agents[gateway]'")

from parser.backends.base import ROUTING_HEADER, Completion, SamplingParams  # noqa: E402
from parser.backends.http import HttpBackend  # noqa: E402
from parser.chunking import Chunk  # noqa: E402
from parser.config import EpisodeConfig  # noqa: E402
from parser.episode import EpisodeEngine  # noqa: E402
from parser.gateway import Gateway, ProcessGroup, router_launch, routing_header, worker_launches  # noqa: E402
from parser.readers import SubagentReader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load_report():
    spec = importlib.util.spec_from_file_location("gateway_report", ROOT / "scripts" / "gateway_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gateway_report"] = module
    spec.loader.exec_module(module)
    return module


report = _load_report()


# The router asks the hub for each worker's `model_path` ("loopback"); point it at a closed
# local port so a test never talks to a hub, whatever the network.
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9"}


def _router_cfg(policy: str, **router_args) -> dict:
    return {"kind": "sglang_router", "policy": policy, "env": NO_HUB,
            "args": {"log_level": "warn", "assignment_mode": "min_group",
                     "health_check_interval_secs": 1, **router_args}}


def _gateway(policy: str, tmp_path: Path, delay_s: float, **router_args) -> Gateway:
    cfg = {"workers": {"kind": "loopback", "num": 3, "local_args": {"delay_s": delay_s}},
           "router": _router_cfg(policy, **router_args),
           "log_dir": str(tmp_path / f"logs-{policy}"), "ready_timeout_s": 60}
    return Gateway.from_config(cfg)


@pytest.fixture(scope="module")
def loopback_workers(tmp_path_factory):
    """Three loopback worker processes shared by the policy runs (they keep no routing state)."""
    group = ProcessGroup(tmp_path_factory.mktemp("workers"))
    launches = worker_launches({"kind": "loopback", "num": 3, "local_args": {"delay_s": 0.05}})
    try:
        for launch in launches:
            group.start(launch)
        for launch in launches:
            group.wait_ready(launch, 60)
        yield [launch.url for launch in launches]
    finally:
        group.stop()


@pytest.mark.parametrize("policy", ["cache_aware", "manual", "consistent_hashing"])
def test_chunks_stay_on_their_worker_across_rounds(policy, loopback_workers, tmp_path):
    workload = report.Workload(chunks=48, rounds=4, chunk_words=300)
    group = ProcessGroup(tmp_path)
    router = router_launch(_router_cfg(policy), loopback_workers)
    try:
        group.start(router)
        group.wait_ready(router, 60)
        header = routing_header(policy) or ROUTING_HEADER

        async def go():
            async with HttpBackend(router.url, routing_header=header) as backend:
                return await report.run_workload(backend, workload, num_workers=3)

        stats = asyncio.run(go())
    finally:
        group.stop()
    for s in stats:
        print(f"[{policy}] {s.line()}")
    total = report.summary(stats)
    print(f"[{policy}] summary {total}")
    assert total["failed"] == 0 and total["requests"] == 48 * 4
    assert all(len(s.per_worker) == 3 for s in stats), "a worker got no traffic"
    assert total["locality_round2plus"] >= 0.99
    if policy != "consistent_hashing":
        assert total["max_spread"] <= 1.5


class ScriptedLead:
    """The lead model, scripted: two query turns, then an answer. On the second query turn it
    schedules `on_second_scatter` to fire while that scatter round is in flight."""

    def __init__(self, on_second_scatter, delay_s: float):
        self.turn = 0
        self.on_second_scatter = on_second_scatter
        self.delay_s = delay_s

    async def generate(self, prompt, sampling: SamplingParams, *, routing_key=None, request_id=None) -> Completion:
        self.turn += 1
        if self.turn == 2:
            asyncio.get_running_loop().call_later(self.delay_s, self.on_second_scatter)
        if self.turn <= 2:
            query = ["Where was the treaty signed?", "Who signed the treaty?"][self.turn - 1]
            text = f'<think>ask</think>\n<tool_call>{{"name": "query_agents", "arguments": {{"query": "{query}"}}}}</tool_call><|im_end|>'
        else:
            text = "<think>done</think>\n<answer>Lisbon</answer><|im_end|>"
        return Completion(text=text, finish_reason="stop")

    async def aclose(self) -> None:
        pass


def test_worker_killed_mid_round_loses_no_request(tmp_path, tiny_tokenizer):
    chunks = [Chunk(index=i, text=f"Document {i + 1}:\n" + " ".join(["filler"] * 200) + (" needle-lisbon" if i == 5 else ""),
                    paragraph_ids=(i + 1,), num_tokens=210) for i in range(12)]
    # router retries off: a dead worker's requests reach the client as 5xx, so the engine's
    # own retries are what is under test
    with _gateway("cache_aware", tmp_path, delay_s=0.3, disable_retries=True,
                  health_failure_threshold=1, cb_failure_threshold=2) as gw:
        killed = []

        def kill_worker1():
            gw.group.kill("worker1")
            killed.append(True)

        async def go():
            async with HttpBackend(gw.url) as backend:
                reader = SubagentReader(backend, tiny_tokenizer, max_new_tokens=32)
                engine = EpisodeEngine(ScriptedLead(kill_worker1, delay_s=0.15), tiny_tokenizer, reader,
                                       EpisodeConfig(max_turns=4, lead_thinking=False, max_attempts=6,
                                                     retry_backoff_s=0.2, request_timeout_s=30))
                return await engine.run("Where and by whom was the treaty signed?", chunks, doc_id="doc-kill")

        trajectory = asyncio.run(go())
    assert killed, "the worker was never killed"
    assert trajectory.stop_reason == "answer" and trajectory.answer == "Lisbon"
    calls = [c for t in trajectory.turns for q in t.queries for c in q.calls]
    assert len(calls) == 2 * len(chunks)
    assert [c.status for c in calls if c.status == "failed"] == []
    retried = [c for c in calls if c.attempts > 1]
    print(f"[failover] {len(retried)} of {len(calls)} subagent requests needed a retry; "
          f"max attempts {max(c.attempts for c in calls)}")
    assert retried, "no request hit the dead worker: the kill did not land mid-round"
    assert all(c.chunk_index >= 0 for c in retried)


def test_answer_scoring_passes_through_the_gateway(tmp_path, tiny_tokenizer, tiny_qwen3_model):
    """`score` through the router to two parser.serve workers (tiny Qwen3, the same seeded weights
    as in process): SGLang's input-logprob fields reach the worker and its answer comes back
    unchanged, equal to a plain forward pass, whichever worker a key lands on. The router's
    OpenAI completions route takes text prompts only: a token-id prompt (vLLM's prompt_logprobs
    way) is refused with a 422, a clear non-retryable error (docs/info_gain.md)."""
    import torch

    from parser.backends.base import BackendError

    cfg = {"workers": {"kind": "parser_serve", "num": 2, "cpu_model": "tiny-qwen3"},
           "router": _router_cfg("cache_aware"), "log_dir": str(tmp_path / "logs-score"), "ready_timeout_s": 120}
    prompt = tiny_tokenizer.encode("Question: who built the bridge? Findings: Ada Okafor built it. Answer:",
                                   add_special_tokens=False)
    answer = tiny_tokenizer.encode(" Ada Okafor", add_special_tokens=False)
    with torch.inference_mode():
        logits = tiny_qwen3_model(input_ids=torch.tensor([prompt + answer])).logits[0].float()
    want = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(answer)[:, None])[:, 0].tolist()
    with Gateway.from_config(cfg) as gw:
        async def go(api, server):
            async with HttpBackend(gw.url, api=api, server=server, model="tiny-qwen3") as backend:
                return [await backend.score(prompt, answer, routing_key=f"doc:{i}") for i in range(4)]

        scores = asyncio.run(go("sglang", "sglang"))
        with pytest.raises(BackendError) as refused:
            asyncio.run(go("completions", "vllm"))
    for got in scores:
        assert got == pytest.approx(want, abs=1e-4)
    assert refused.value.status == 422 and not refused.value.retryable and "prompt" in str(refused.value)
