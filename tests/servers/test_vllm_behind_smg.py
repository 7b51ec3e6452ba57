"""The episode engine's subagents through smg (the default router) to real vLLM-CPU workers.

    make test-servers          # builds .venv-vllm, starts vLLM(s) and smg on 127.0.0.1

Two vLLM workers (`parser.serving.vllm_server`) behind `python -m smg launch` with the shipped
router settings (configs/serve/router/smg.yaml) when memory allows (the second starts only if,
with it, at least `SPARE_GIB` of memory stays available to the machine; otherwise one, and the
test says so). What
must hold through the router, as in the direct tests (test_vllm_server.py):
- an episode whose subagents go through smg keeps the lead's exact token view (the lead talks to
  vLLM directly: smg's /v1/completions refuses token-id prompts, checked below) and gets the same
  replies as subagents sent straight to the worker;
- a scatter round of >= 64 chunks is answered in full, and in the next round every chunk returns
  to the worker holding its prefix: its cached tokens cover its whole instructions + chunk
  prefix (with two workers, a chunk sent to the other worker would find only the shared
  instructions cached — the same round under new routing keys shows that);
- constrained replies (JSON schema, regex) pass through smg in vLLM's `structured_outputs`.
"""
from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from parser.engine import prompts
from parser.serving.backends import load_model_and_tokenizer
from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.text.chunking import chunk_document
from parser.engine.episode import EpisodeConfig, EpisodeEngine
from parser.serving.gateway import ProcessGroup, router_launch, router_preset
from parser.engine.protocol import protocol_for
from parser.engine.readers import SubagentReader
from parser.engine.tools import QueryAgents

from parser.serving.vllm_server import vllm_server
from varnholm import NEEDLE, QUESTION, document, episode_config

SPARE_GIB = 4.0  # memory that must stay available to the shared machine after a second worker
WORKER_GIB = 4.0  # a second worker, 1 GiB KV cache (measured: 4.8 GiB resident with the first's 2 GiB)


def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


@pytest.fixture(scope="module")
def workers(vllm, tmp_path_factory):
    """The session's vLLM server and, when memory allows, a second one (1 GiB KV cache)."""
    python = os.environ.get("PARSER_VLLM_PYTHON")
    available = _available_gib()
    print(f"\n[smg+vllm] {available:.1f} GiB available with the first worker up")
    if not python:
        print("[smg+vllm] one worker only: PARSER_VLLM_PYTHON is not set, so no second server can start")
        yield [vllm.url]
    elif available - WORKER_GIB < SPARE_GIB:
        print(f"[smg+vllm] one worker only: a second (~{WORKER_GIB:.0f} GiB) would leave under {SPARE_GIB:.0f} GiB available")
        yield [vllm.url]
    else:
        try:
            server = vllm_server(python, Path(tmp_path_factory.mktemp("vllm2")) / "server.log", kv_cache_gib=1)
            url = server.__enter__()
        except RuntimeError as error:
            pytest.fail(str(error))
        try:
            yield [vllm.url, url]
        finally:
            server.__exit__(None, None, None)


@pytest.fixture(scope="module")
def smg(workers, tmp_path_factory):
    """smg with the shipped settings over the vLLM workers: `.url`, `.metrics_url`."""
    cfg = router_preset("smg")
    cfg.update(port=0, prometheus_port=0, args={**cfg["args"], "log_level": "warn"})
    group = ProcessGroup(tmp_path_factory.mktemp("smg"))
    router = router_launch(cfg, workers)
    try:
        group.start(router)
        group.wait_ready(router, 120)
        yield router
    finally:
        group.stop()


@pytest.fixture(scope="module")
def smollm2():
    return load_model_and_tokenizer("smollm2")


def _block_size(url: str) -> int:
    """vLLM caches a prefix in whole KV blocks (128 tokens on the CPU build): from its /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        match = re.search(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', resp.read().decode(errors="replace"))
    assert match, f"{url}/metrics: no vllm:cache_config_info block_size"
    return int(match.group(1))


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode(errors="replace")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def _episode(lead, subagent, tokenizer, config, chunks):
    reader = SubagentReader(subagent, tokenizer, temperature=0.0, max_new_tokens=config.subagent_max_tokens,
                            json_constrained=True)
    try:
        return await EpisodeEngine(lead, tokenizer, reader, config).run(QUESTION, chunks, doc_id="varnholm-smg")
    finally:
        await lead.aclose()
        await subagent.aclose()


def test_episode_through_smg_keeps_the_token_view_and_the_replies(vllm, smg, smollm2):
    _, tokenizer = smollm2
    config = episode_config()
    chunks = chunk_document(document(24), tokenizer, 512)

    def lead():
        return HttpBackend(vllm.url, api="completions", server="vllm")

    direct = asyncio.run(_episode(lead(), HttpBackend(vllm.url, api="completions", server="vllm"), tokenizer, config, chunks))
    started = time.perf_counter()
    routed = asyncio.run(_episode(lead(), HttpBackend(smg.url, api="completions", server="vllm"), tokenizer, config, chunks))
    calls = [c for t in routed.turns for q in t.queries for c in q.calls]
    print(f"\n[smg+vllm] {routed.num_turns}-turn episode, {len(calls)} subagent calls through smg: "
          f"{time.perf_counter() - started:.1f} s (direct {direct.wall_s:.1f} s)")
    assert routed.token_view_valid, routed.token_view_note
    assert routed.constraints == ["subagents: json_schema", "lead: one action per turn"]
    assert calls and all(c.status != "failed" for c in calls)
    assert [(f.chunk_index, f.answer) for t in routed.turns for q in t.queries for f in q.findings] == \
        [(f.chunk_index, f.answer) for t in direct.turns for q in t.queries for f in q.findings]
    assert routed.response_ids == direct.response_ids and routed.response_mask == direct.response_mask


def test_a_token_id_prompt_through_smg_is_refused_not_retried(smg, smollm2):
    """smg 1.13's /v1/completions takes text prompts only: the lead's token ids must go to vLLM
    directly. The refusal is a 400 the engine does not retry."""
    backend = HttpBackend(smg.url, api="completions", server="vllm")

    async def go():
        try:
            return await backend.generate([17, 42, 99], SamplingParams(max_new_tokens=4, temperature=0.0))
        finally:
            await backend.aclose()

    with pytest.raises(BackendError, match="HTTP 400") as error:
        asyncio.run(go())
    assert error.value.retryable is False


def test_scatter_through_smg_keeps_each_chunk_on_the_worker_that_holds_it(smg, workers, smollm2):
    _, tokenizer = smollm2
    chunks = chunk_document(document(260), tokenizer, 96)
    assert len(chunks) >= 64
    backend = HttpBackend(smg.url, api="completions", server="vllm")
    reader = SubagentReader(backend, tokenizer, temperature=0.0, max_new_tokens=24, json_constrained=True)

    block = _block_size(workers[0])
    instructions = len(tokenizer.encode(reader.prompt(QUESTION, chunks[0]).split(chunks[0].text)[0], add_special_tokens=False))

    def prefix_tokens(query: str, chunk) -> int:
        prompt = reader.prompt(query, chunk)
        return len(tokenizer.encode(prompt[: prompt.rindex(query)], add_special_tokens=False))

    def full_hits(record, query) -> float:
        """Share of calls whose cached tokens cover every whole block of their own instructions +
        chunk prefix (a call on another worker finds only the shared instructions' blocks)."""
        return sum(c.cached_tokens >= prefix_tokens(query, chunks[c.chunk_index]) // block * block
                   for c in record.calls) / len(record.calls)

    # the check can tell the two apart only where a chunk's prefix has more whole blocks than the instructions
    assert all(prefix_tokens(QUESTION, c) // block > instructions // block for c in chunks), (block, instructions)

    def tool(doc_id):
        return QueryAgents(reader, chunks, doc_id, EpisodeConfig(), protocol_for(EpisodeConfig()), asyncio.Semaphore(512),
                           lambda text: len(tokenizer.encode(text, add_special_tokens=False)))

    queries = [QUESTION, "When was the lighthouse keeper of Varnholm appointed?", "Who kept the Varnholm light?"]

    async def rounds():
        try:
            keyed = tool("varnholm-scatter")
            first = await keyed.scatter(queries[0])
            before = [_counter(u, "vllm:request_success_total") for u in workers]
            second = await keyed.scatter(queries[1])
            after = [_counter(u, "vllm:request_success_total") for u in workers]
            rekeyed = await tool("varnholm-rekeyed").scatter(queries[2])  # new keys: placed afresh
            return first, second, rekeyed, [a - b for a, b in zip(after, before, strict=True)]
        finally:
            await backend.aclose()

    first, second, rekeyed, per_worker = asyncio.run(rounds())
    hits, rehits = full_hits(second, queries[1]), full_hits(rekeyed, queries[2])
    print(f"\n[smg+vllm] {len(chunks)} chunks over {len(workers)} worker(s): round 1 {first.latency_s:.1f} s, "
          f"round 2 {second.latency_s:.1f} s, requests per worker {per_worker}; round 2 full prefix hits {hits:.2f}, "
          f"cached {sum(c.cached_tokens for c in second.calls)} of {sum(c.prompt_tokens for c in second.calls)} "
          f"prompt tokens; under new routing keys {rehits:.2f}")
    assert first.failures == second.failures == rekeyed.failures == 0
    assert hits >= 0.95, "chunks did not come back to the worker holding their prefix"
    if len(workers) > 1:
        assert min(per_worker) >= 0.3 * len(chunks), f"one worker took nearly all chunks: {per_worker}"
        assert rehits < hits - 0.2, "new routing keys landed where the old ones were: the test shows nothing"


def test_constrained_replies_pass_through_smg(smg, smollm2):
    _, tokenizer = smollm2
    schema = prompts.LEAD.path(prompts.DEFAULT_VERSION, "subagent_schema.json").read_text()
    backend = HttpBackend(smg.url, api="completions", server="vllm")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompts.render("subagent", prompts.DEFAULT_VERSION, chunk=NEEDLE, query=QUESTION)}],
        tokenize=False, add_generation_prompt=True)

    async def go():
        try:
            reply = await backend.generate(prompt, SamplingParams(max_new_tokens=64, temperature=0.0, json_schema=schema),
                                           routing_key="varnholm:0")
            choice = await backend.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0, regex="(yes|no)"),
                                            routing_key="varnholm:0")
            return reply, choice
        finally:
            await backend.aclose()

    reply, choice = asyncio.run(go())
    assert list(orjson.loads(reply.text))[0] == "answer", reply.text
    assert choice.text in ("yes", "no") and choice.token_ids
