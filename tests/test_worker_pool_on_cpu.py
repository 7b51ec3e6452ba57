"""WorkerPool against real HTTP workers: hung and garbage-answering workers are marked down and
retries land on another worker.

    .venv/bin/pytest tests/test_worker_pool_on_cpu.py -q

The workers are `parser.serving.loopback` servers (real aiohttp servers on loopback, no model).
`attempts()` is the episode engine's retry rule (retry a retryable BackendError or a timeout,
as `parser.engine.tools.QueryAgents._read` does), without its backoff, so the test stays fast.
"""
import asyncio

import pytest

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.pool import WorkerPool
from parser.serving.loopback import start_loopback

SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.0)


def prompt_for(api):
    """A chat server renders the template itself: it takes messages, never rendered text."""
    return [{"role": "user", "content": "Query: q?"}] if api == "chat" else "Query: q?"


async def attempts(pool, key, *, timeout_s, max_attempts=3, prompt="Query: q?"):
    """(completion, attempts used), retrying like the engine does."""
    for attempt in range(1, max_attempts + 1):
        try:
            return await asyncio.wait_for(pool.generate(prompt, SAMPLING, routing_key=key), timeout_s), attempt
        except (asyncio.TimeoutError, BackendError) as error:
            if attempt == max_attempts or (isinstance(error, BackendError) and not error.retryable):
                raise


@pytest.mark.parametrize("api", ["sglang", "completions", "chat"])
def test_a_worker_answering_200_garbage_is_retried_elsewhere(api):
    with start_loopback("garbage", fail_first=10**9, fail_mode="garbage") as bad, start_loopback("good") as good:
        pool = WorkerPool([HttpBackend(bad.url, api=api), HttpBackend(good.url, api=api)], cooldown_s=0.0)

        async def go():
            try:
                return await asyncio.gather(*(attempts(pool, f"doc:chunk{i}", timeout_s=10, prompt=prompt_for(api))
                                              for i in range(48)))
            finally:
                await pool.aclose()

        results = asyncio.run(go())
    assert all(isinstance(c.text, str) and c.worker == "good" for c, _ in results)  # nothing lost
    first_on_bad = sum(1 for _, used in results if used > 1)
    assert 0 < first_on_bad == len(bad.worker.records)  # each key met the bad worker at most once
    assert all(used <= 2 for _, used in results)  # cooldown 0: the retry still avoided it


def test_a_hung_worker_is_marked_down_and_later_rounds_skip_it():
    with start_loopback("hung", delay_s=60) as hung, start_loopback("good") as good:
        pool = WorkerPool([HttpBackend(hung.url), HttpBackend(good.url)], cooldown_s=60, hung_after_s=0.2)

        async def go():
            try:
                first = await asyncio.gather(*(attempts(pool, f"k{i}", timeout_s=0.5) for i in range(16)))
                # a generous timeout now: a pick of the hung worker would still cost a second attempt,
                # while a slow machine cannot make the good worker look hung
                later = await asyncio.gather(*(attempts(pool, f"k{i}", timeout_s=5) for i in range(16)))
                return first, later
            finally:
                await pool.aclose()

        first, later = asyncio.run(go())
    assert all(c.worker == "good" for c, _ in first + later)
    assert any(used == 2 for _, used in first)  # keys ranked on the hung worker timed out once...
    assert all(used == 1 for _, used in later)  # ...then it was down: no request went to it again


@pytest.mark.parametrize("api", ["sglang", "completions", "chat"])
def test_http_backend_reports_a_garbage_200_as_retryable(api):
    """Without a pool (behind the gateway) the engine must still see a retryable error, not an
    IndexError or a null text that would pass as an abstention."""
    with start_loopback("garbage", fail_first=10**9, fail_mode="garbage") as bad:
        backend = HttpBackend(bad.url, api=api)

        async def go():
            try:
                return await backend.generate(prompt_for(api), SAMPLING)
            finally:
                await backend.aclose()

        with pytest.raises(BackendError, match=r"HTTP 200\): the reply is not a") as error:
            asyncio.run(go())
    assert error.value.retryable


class Clock:
    """Stands in for the pool's `time.monotonic`: the test moves it, so no test waits out a cooldown."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_worker_that_keeps_failing_is_reprobed_ever_more_rarely(monkeypatch):
    """Each probe of a dead or hung worker costs a request a retry (or a whole deadline): the
    cooldown doubles per failure in a row instead of re-probing every `cooldown_s`, up to
    `max_cooldown_s`. Just before each cooldown ends the key's requests go to the good worker
    only; once it has ended, exactly one probe reaches the dead one."""
    from parser.serving.backends import pool as pool_module

    clock = Clock()
    monkeypatch.setattr(pool_module, "time", clock)
    with start_loopback("dead", fail_first=10**9, fail_mode="503") as dead, start_loopback("good") as good:
        pool = WorkerPool([HttpBackend(dead.url), HttpBackend(good.url)], cooldown_s=0.05, max_cooldown_s=0.4)
        key = next(k for k in (f"k{i}" for i in range(200)) if pool.ranking(k)[0] == 0)  # ranked on the dead one

        async def go():
            probes = lambda: len(dead.worker.records)  # noqa: E731
            try:
                _, used = await attempts(pool, key, timeout_s=5)
                assert used == 2 and probes() == 1  # the first failure: down for cooldown_s
                for n, cooldown in enumerate((0.05, 0.1, 0.2, 0.4, 0.4), start=1):  # doubled per failure in a row, capped
                    clock.now += cooldown - 1e-3
                    _, used = await attempts(pool, key, timeout_s=5)
                    assert used == 1 and probes() == n, f"re-probed 1 ms before a {cooldown} s cooldown ended"
                    clock.now += 2e-3
                    _, used = await attempts(pool, key, timeout_s=5)
                    assert used == 2 and probes() == n + 1, f"not re-probed after a {cooldown} s cooldown"
            finally:
                await pool.aclose()

        asyncio.run(go())


# ---------------------------------------------------------------------- any refused reply fails over
def _faulty_app():
    """One aiohttp worker per fault, as SGLang `/generate` would answer: each reply passes the
    transport but the client refuses it (or the connection dies), except `bad_request`, which is
    a 400 for a request of ours that every worker would refuse alike."""
    from aiohttp import web

    async def oversized(request):
        return web.json_response({"text": "x" * 4096, "meta_info": {"finish_reason": "stop"}})

    async def brotli(request):
        return web.Response(body=b"\x0b\x02\x80{}\x03", headers={"Content-Encoding": "br"})

    async def aborted(request):
        return web.json_response({"text": "", "meta_info": {"finish_reason": {
            "type": "abort", "message": "aborted", "status_code": 400}}})

    async def reset(request):
        request.transport.close()
        return web.Response()

    async def bad_request(request):
        return web.json_response({"error": {"message": "bad sampling", "type": "invalid_request_error"}}, status=400)

    return {"oversized": oversized, "brotli": brotli, "aborted": aborted, "reset": reset, "bad_request": bad_request}


async def _serve(handler):
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize("fault", ["oversized", "brotli", "aborted", "reset"])
def test_a_worker_whose_replies_are_refused_is_marked_down_and_its_chunks_move(fault):
    handler = _faulty_app()[fault]

    async def go():
        runner, bad_url = await _serve(handler)
        with start_loopback("good") as good:
            pool = WorkerPool([HttpBackend(bad_url, max_response_bytes=1024), HttpBackend(good.url)], cooldown_s=60)
            try:
                results = await asyncio.gather(*(attempts(pool, f"doc:chunk{i}", timeout_s=10) for i in range(16)))
                return results, pool._strikes[0] >= 1
            finally:
                await pool.aclose()
                await runner.cleanup()

    results, down = asyncio.run(go())
    assert all(c.worker == "good" for c, _ in results)  # no chunk lost
    assert any(used == 2 for _, used in results) and all(used <= 2 for _, used in results)  # moved once, in the call
    assert down  # counted toward the faulty worker's health


def test_a_bad_request_of_ours_is_neither_retried_nor_held_against_the_worker():
    async def go():
        runner, url = await _serve(_faulty_app()["bad_request"])
        with start_loopback("good") as good:
            pool = WorkerPool([HttpBackend(url), HttpBackend(good.url)], cooldown_s=60)
            keys = [k for k in (f"doc:chunk{i}" for i in range(64)) if pool.ranking(k)[0] == 0][:4]
            try:
                for key in keys:
                    with pytest.raises(BackendError, match="bad sampling") as error:
                        await attempts(pool, key, timeout_s=10)
                    assert not error.value.retryable
                return pool._strikes[0], len(good.worker.records)
            finally:
                await pool.aclose()
                await runner.cleanup()

    strikes, sent_to_good = asyncio.run(go())
    assert strikes == 0 and sent_to_good == 0  # one attempt each, on the key's own worker
