"""parser.serve answers a malformed request with a 400 naming the field, and bounds what a
request may hold: the time its header and body may take, and its stop list.

    .venv/bin/pytest tests/test_serve_bounds_on_cpu.py -q

The real server over the tiny random-weight Qwen3.5 and the in-process BPE tokenizer, on a
thread of this process; slow clients are raw sockets.
"""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from parser.backends.transformers import TransformersBackend
from parser.serve import ServerLimits, start_server


@pytest.fixture(scope="module")
def server(tiny_qwen3_5_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)
    with start_server(backend, tokenizer=tiny_tokenizer, limits=ServerLimits(body_timeout_s=1, idle_timeout_s=1)) as handle:
        yield handle


def post(url: str, raw_json: str) -> tuple[int, dict]:
    """POST a JSON text as it is (stdlib json: integers past 64 bits, which orjson cannot write)."""
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=raw_json, headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.json(content_type=None)

    return asyncio.run(go())


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format.json_schema: expected an object"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": "x"}, "structured_outputs: expected an object"),
    ("/v1/completions", {"prompt": "x", "response_format": 7}, "response_format: expected an object"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": 5}}, "sampling_params.json_schema: expected an object or a JSON string"),
    ("/generate", {"text": "x", "sampling_params": {"regex": ["a"]}}, "regex: expected a string"),
    ("/generate", {"text": "x", "sampling_params": {"sampling_seed": 2**70}}, "sampling_params.sampling_seed: must fit in 64 bits"),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}, "/v1/completions.seed: must fit in 64 bits"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "seed": -(2**64)}, "seed: must fit in 64 bits"),
    ("/generate", {"text": "x", "sampling_params": []}, "sampling_params: expected an object"),
    ("/generate", {"text": "x", "sampling_params": {"stop": [""]}}, "sampling_params.stop[0]: an empty stop string"),
    ("/generate", {"text": "x", "sampling_params": {"stop": [f"zq{i}" for i in range(17)]}}, "17 stop strings; at most 16"),
    ("/v1/completions", {"prompt": "x", "stop": "y" * 257}, "/v1/completions.stop[0]: 257 characters; at most 256"),
])
def test_malformed_requests_are_400s_naming_the_field(server, path, body, field):
    """Each of these was a 500 (which clients and routers retry) or was accepted."""
    status, out = post(server.url + path, json.dumps(body))
    assert status == 400 and field in out["error"]["message"], out


def test_a_top_p_below_float32_resolution_still_samples(server):
    """top_p=1e-300 is 0.0 in float32: the nucleus kept no token and sampling failed (a 500)."""
    status, out = post(server.url + "/generate", json.dumps({"text": "x", "sampling_params": {"top_p": 1e-300, "max_new_tokens": 2}}))
    assert status == 200 and len(out["output_ids"]) == 2


def test_a_stalled_request_header_does_not_hold_the_connection(server):
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")  # ...and never the rest
        started = time.monotonic()
        try:
            reply = conn.recv(1024)  # b"": the server closed it
        except socket.timeout:
            reply = None
        held = time.monotonic() - started
    assert reply == b"" and held < 1 + 3, f"the connection was held {held:.1f} s"


def test_a_trickled_header_is_cut_at_the_idle_timeout(server):
    """A slow client keeps sending one header byte at a time (the timer must not restart)."""
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 6:
            try:
                conn.sendall(b"X")
                conn.settimeout(0.2)
                if conn.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.monotonic() - started < 1 + 3


def test_a_body_that_never_arrives_is_a_408(server):
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\"")
        started = time.monotonic()
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
    assert time.monotonic() - started < 1 + 3


def test_the_request_bounds_are_cli_flags():
    """`python -m parser.serve --help` lists every ServerLimits field as a flag."""
    out = subprocess.run([sys.executable, "-m", "parser.serve", "--help"], capture_output=True, text=True, timeout=120).stdout
    for flag in ("--body-timeout-s", "--idle-timeout-s", "--max-stop-strings", "--max-stop-chars"):
        assert flag in out


@pytest.mark.parametrize("field, value", [("max_stop_strings", 0), ("idle_timeout_s", float("inf")), ("body_timeout_s", -1)])
def test_a_request_bound_that_cannot_work_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        ServerLimits(**{field: value})
