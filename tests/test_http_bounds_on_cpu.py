"""HttpBackend reads bounded bodies, decompresses nothing it did not ask for, and ends each
request at its deadline however slowly the server answers.

    .venv/bin/pytest tests/test_http_bounds_on_cpu.py -q

A real aiohttp server on 127.0.0.1 stands in for a hostile or broken model server: a gzip
bomb, a reply far over the bound, a Content-Length that lies, an encoding nobody asked for.
Memory is measured with tracemalloc (the server runs in this process too, in a thread; it only
ever holds one 1 MB chunk).
"""
from __future__ import annotations

import asyncio
import time
import tracemalloc
import zlib

import orjson
import pytest
from aiohttp import web

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.server import ServerHandle
from support.slow_server import Trickle, http_reply

SP = SamplingParams(max_new_tokens=8, temperature=0.0)
MB = 1 << 20
BOMB = web.AppKey("bomb", bytes)
META = b'", "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 1}}'


def bomb(decompressed_mb: int) -> bytes:
    """A gzip body of an SGLang reply whose text is `decompressed_mb` MB of 'a' (~0.1% of it on the wire)."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [squeeze.compress(b'{"text": "')]
    parts += [squeeze.compress(b"a" * MB) for _ in range(decompressed_mb)]
    return b"".join(parts + [squeeze.compress(META), squeeze.flush()])


async def gzip_bomb(request: web.Request) -> web.Response:
    return web.Response(body=request.app[BOMB], headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})


async def huge(request: web.Request) -> web.StreamResponse:
    """A valid SGLang reply with a 48 MB text, streamed in 1 MB chunks."""
    response = web.StreamResponse(status=500 if request.path.startswith("/huge500") else 200)
    await response.prepare(request)
    await response.write(b'{"text": "')
    for _ in range(48):
        await response.write(b"a" * MB)
    await response.write(META)
    return response


async def liar(request: web.Request) -> web.StreamResponse:
    """Declares 10 GB, sends 10 bytes, then stalls."""
    response = web.StreamResponse(headers={"Content-Length": str(10 << 30)})
    await response.prepare(request)
    await response.write(b'{"text": "')
    await asyncio.sleep(30)
    return response


async def brotli(request: web.Request) -> web.Response:
    return web.Response(body=b"\x1b\x00\x00", headers={"Content-Encoding": "br"})


async def echo_headers(request: web.Request) -> web.Response:
    text = orjson.dumps({str(k): v for k, v in request.headers.items()}).decode()
    return web.json_response({"text": text, "meta_info": {"finish_reason": {"type": "stop"}}})


@pytest.fixture(scope="module")
def hostile():
    app = web.Application()
    app[BOMB] = bomb(200)
    for path, handler in (("/bomb", gzip_bomb), ("/huge", huge), ("/huge500", huge), ("/liar", liar), ("/brotli", brotli), ("/echo", echo_headers)):
        app.router.add_post(path + "/generate", handler)
    with ServerHandle(app) as handle:
        yield handle


def generate(url: str, **kwargs):
    backend = HttpBackend(url, **kwargs)

    async def once():
        try:
            return await backend.generate("x", SP)
        finally:
            await backend.aclose()

    return asyncio.run(once())


def peak_bytes(fn):
    tracemalloc.start()
    try:
        try:
            fn()
        except BackendError as error:
            return tracemalloc.get_traced_memory()[1], error
        return tracemalloc.get_traced_memory()[1], None
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_is_not_inflated_past_the_bound(hostile):
    """aiohttp decompressed by itself: a 200 KB reply became a 200 MB completion."""
    assert len(hostile._app[BOMB]) < 1 * MB
    peak, error = peak_bytes(lambda: generate(hostile.url + "/bomb"))
    assert error is not None and "max_response_bytes" in str(error) and "decompressed" in str(error)
    assert error.retryable is True  # the worker's fault: another worker may answer within the bound
    assert peak < 80 * MB, f"{peak / MB:.0f} MB"


def test_a_reply_over_the_bound_is_refused_while_reading(hostile):
    peak, error = peak_bytes(lambda: generate(hostile.url + "/huge", max_response_bytes=8 * MB))
    assert error is not None and "max_response_bytes=8388608" in str(error)
    assert peak < 24 * MB, f"{peak / MB:.0f} MB"


def test_the_default_bound_refuses_a_48_mb_reply(hostile):
    with pytest.raises(BackendError, match="max_response_bytes"):
        generate(hostile.url + "/huge")


def test_an_error_body_is_cut_not_held(hostile):
    peak, error = peak_bytes(lambda: generate(hostile.url + "/huge500", max_response_bytes=4 * MB))
    assert error is not None and error.status == 500 and error.retryable is True
    assert len(str(error)) < 800 and peak < 16 * MB


def test_a_lying_content_length_is_refused_before_reading(hostile):
    started = time.perf_counter()
    with pytest.raises(BackendError, match="Content-Length 10737418240") as error:
        generate(hostile.url + "/liar", timeout_s=10)
    assert error.value.retryable is True and time.perf_counter() - started < 5


def test_an_encoding_nobody_asked_for_is_refused(hostile):
    with pytest.raises(BackendError, match="Content-Encoding 'br'") as error:
        generate(hostile.url + "/brotli")
    assert error.value.retryable is True


def test_the_client_asks_for_an_uncompressed_reply(hostile):
    sent = orjson.loads(generate(hostile.url + "/echo").text)
    assert sent.get("Accept-Encoding") == "identity"


def test_a_gzip_reply_within_the_bound_still_works(hostile):
    """A proxy that compresses anyway is decoded here."""
    app = web.Application()
    small = zlib.compress(orjson.dumps({"text": "fine", "meta_info": {"finish_reason": {"type": "stop"}}}), wbits=31)

    async def compressed(request):
        return web.Response(body=small, headers={"Content-Encoding": "gzip"})

    app.router.add_post("/generate", compressed)
    with ServerHandle(app) as handle:
        assert generate(handle.url).text == "fine"


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_response_bound_that_cannot_work_is_refused(value):
    with pytest.raises(ValueError, match="max_response_bytes"):
        HttpBackend("http://127.0.0.1:1", max_response_bytes=value)


REPLY = http_reply(b'{"text": "' + b"a" * 200 + META)  # ~5 s at a byte per 25 ms


@pytest.mark.parametrize("reply,at_once", [(REPLY, 0), (REPLY, REPLY.index(b"\r\n\r\n") + 4), (None, 0)],
                         ids=["trickled-headers", "trickled-body", "silent"])
def test_a_request_ends_at_its_deadline_however_slowly_the_server_answers(reply, at_once):
    """`timeout_s` is the whole exchange's (connect, headers, body), not each read's: a lead or
    subagent server that trickles bytes or never answers fails the attempt at the deadline, as a
    retryable `BackendError` naming the URL (the worker's fault: a retry may reach a healthy one)."""
    with Trickle(reply, at_once=at_once, interval_s=0.025) as server:
        started = time.monotonic()
        with pytest.raises(BackendError, match=rf"POST {server.url}/generate: no complete answer within 0\.5s") as failed:
            generate(server.url, timeout_s=0.5)
        assert time.monotonic() - started < 2.0
    assert failed.value.retryable


def test_a_redirect_loop_is_one_line_saying_so_and_not_retried():
    """A base_url behind a redirect (a proxy's login page, http to https, a path moved) ended in
    aiohttp's words, "TooManyRedirects: 0, message=''", and was retried as if the server might recover."""
    reply = http_reply(b"", "301 Moved Permanently")[:-2] + b"Location: /generate\r\n\r\n"
    with Trickle(reply, at_once=len(reply)) as server:
        with pytest.raises(BackendError, match=rf"POST {server.url}/generate: redirected 10 times \(last 301 to /generate\): "
                                               "set base_url to the model server's own address") as failed:
            generate(server.url, timeout_s=5)
    assert not failed.value.retryable


def test_waiting_for_a_worker_that_trickles_its_health_ends_at_the_deadline():
    """`parser.serving.gateway.wait_ready` (the demo's and the gateway's workers) polls with the
    same total deadline: urllib's per-read timeout let one trickled /health outlast the wait."""
    from parser.serving.gateway import wait_ready

    with Trickle(http_reply(b'{"status": "ok"}'), interval_s=0.025) as server:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"{server.url}/health not ready after 1s \(TimeoutError"):
            wait_ready(server.url, timeout_s=1.0)
        assert time.monotonic() - started < 3.0
    with Trickle(http_reply(b'{"status": "ok"}'), at_once=1 << 10) as server:
        wait_ready(server.url, timeout_s=5.0)  # a worker that answers is ready at once
