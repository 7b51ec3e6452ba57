"""An episode end to end where the subagents are real HTTP servers and one dies mid-episode.

Two `python -m parser.serving.server` processes on 127.0.0.1 serve a tiny random Qwen3.5 as subagents;
the lead is scripted (tests/scripted_lead.py, the only faked edge) so that it really issues queries. After turn 1 one
server is killed. Run: .venv/bin/pytest tests/e2e/test_episode_http_on_cpu.py -q
"""
import asyncio
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from parser.serving.backends import build_backend
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.text.chunking import chunk_document
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.engine.readers import SubagentReader
from parser.offline import byte_bpe_tokenizer
from scripted_lead import ScriptedLead

CALL = "</think>\n\n<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


@pytest.fixture
def servers():
    procs, urls = [], []
    for i in range(2):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "parser.serving.server", "--model", "tiny-qwen3.5", "--port", str(port), "--worker-id", f"w{i}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        procs.append(proc)
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url, proc in zip(urls, procs, strict=True):
            _wait_healthy(url, proc)
        yield urls, procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _document(n):
    return "\n\n".join(f"Document {i}:\nPlace {i}\nPlace {i} lies on river {i % 7} and has {i * 13} people." for i in range(1, n + 1))


def _run(urls, procs, *, pool, kill_turn=2):
    if pool:  # the config path users take: `base_urls` builds a WorkerPool
        subagents, tokenizer = build_backend({"_target_": "parser.serving.backends.http_backend", "api": "sglang", "base_urls": urls, "cooldown_s": 60,
                                              "timeout_s": 60, "tokenizer": "tiny-qwen3.5"})
        assert isinstance(subagents, WorkerPool)
    else:
        subagents, tokenizer = HttpBackend(urls[0], api="sglang", timeout_s=60), byte_bpe_tokenizer()
    reader = SubagentReader(subagents, tokenizer, max_new_tokens=8)
    config = EpisodeConfig(max_turns=6, max_attempts=3, retry_backoff_s=0.05, request_timeout_s=60)

    def on_turn(turn):
        if turn == kill_turn:
            procs[0].kill()
            procs[0].wait()

    # one query per turn, the server killed as turn `kill_turn` starts, the answer on turn 4
    turns = [f"step {n}" + CALL.format(f"query number {n}?") for n in (1, 2, 3)] + ["step 4</think><answer>done</answer>"]
    engine = EpisodeEngine(ScriptedLead(tokenizer, turns, on_call=on_turn), tokenizer, reader, config)
    chunks = chunk_document(_document(24), tokenizer, 96)

    async def go():
        try:
            return await engine.run("Which place has most people?", chunks, doc_id="doc7")
        finally:
            await subagents.aclose()

    return asyncio.run(go()), chunks


def test_worker_killed_mid_episode(servers):
    urls, procs = servers
    # 1. Through the pool: the killed worker's requests fail over to the survivor; nothing lost.
    trajectory, chunks = _run(urls, procs, pool=True)
    assert trajectory.answer == "done" and trajectory.num_turns == 4
    calls = [c for t in trajectory.turns for q in t.queries for c in q.calls]
    assert len(calls) == 3 * len(chunks)  # every (query, chunk) request is accounted for
    assert trajectory.failures == []  # retries reached the surviving worker
    assert any(c.attempts > 1 for c in calls)  # ... and the failed attempts are on record
    assert all(c.prompt_tokens > 0 for c in calls)  # real servers tokenized real prompts

    # 2. Straight at the dead server: every call is recorded as failed, the episode still ends.
    trajectory, chunks = _run(urls, procs, pool=False, kill_turn=None)
    assert trajectory.answer == "done" and trajectory.stop_reason == "answer"
    failures = trajectory.failures
    assert len(failures) == 3 * len(chunks)
    assert all(f["attempts"] == 3 and "Error" in f["error"] for f in failures)
    assert all("None of the" in q.observation for t in trajectory.turns for q in t.queries)
