"""TransformersBackend's cancellation invariant: a request cancelled at any stage (queued, waiting
behind its routing key, prefilling, decoding) releases what it held and hands its key to the next
request; every request not cancelled completes; afterwards nothing stays queued and the batch's
memory (KV slots, reserved positions, queue places, per-key state) is back at its baseline.

    .venv/bin/pytest tests/test_transformers_cancellation_on_cpu.py -q

Stages are reached by events, never by sleeping: the worker is held busy (`held`) while requests
queue, and cancellations fire from a forward hook at a chosen model forward of the worker.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.transformers import TransformersBackend
from test_transformers_batching_on_cpu import held, prompt

DEADLINE_S = 60  # a request not ended by then is stranded: the test fails instead of hanging
KEYS = 4  # few keys, many requests: most requests wait behind another on their key
QUERIES = ("Who built the bridge?", "When was the mill lost?")
SAMPLINGS = (SamplingParams(max_new_tokens=2, temperature=0.0), SamplingParams(max_new_tokens=5, temperature=0.0))


def baseline(backend: TransformersBackend) -> dict:
    """What the batch holds between requests, read on the worker itself (`run_exclusive` runs
    between two decode steps, after every finished row has left)."""
    def read():
        with backend._wake:
            return {"queued": len(backend._queue), "waiting": {k: len(q) for k, q in backend._deferred.items()},
                    "keys held": set(backend._in_flight), "rows": sum(len(g) for g in backend._groups.values()),
                    "groups": len(backend._groups), "reserved positions": backend._reserved}

    box: concurrent.futures.Future = concurrent.futures.Future()

    def ask():  # on a thread of its own, so a wedged worker fails the test instead of hanging it
        try:
            box.set_result(backend.run_exclusive(read))
        except Exception as error:  # noqa: BLE001 - the test hears it
            box.set_exception(error)

    threading.Thread(target=ask, daemon=True).start()
    return box.result(timeout=DEADLINE_S)


EMPTY = {"queued": 0, "waiting": {}, "keys held": set(), "rows": 0, "groups": 0, "reserved positions": 0}


class CancelAt:
    """Fires callbacks at the worker's n-th model forward (prefill or decode), from the worker."""

    def __init__(self, model):
        self.count = 0
        self.due: dict[int, list] = {}
        self.handle = model.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.count += 1
        for fire in self.due.pop(self.count, []):
            fire()

    def close(self):
        self.handle.remove()


@pytest.fixture(scope="module")
def reference(tiny_qwen3_model, tiny_tokenizer):
    """Greedy replies of each (key, query, sampling) computed alone: what an uncancelled request must give."""
    alone = TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_batch_size=1)
    return {(k, q, s): alone.generate_ids(prompt(tiny_tokenizer, k, QUERIES[q]), SAMPLINGS[s]).token_ids
            for k in range(KEYS) for q in range(2) for s in range(2)}


# One request: (key, query, sampling, how it is cancelled, at which worker forward (0: while queued)).
# "future": the caller's future is cancelled and the cancel event set, as an asyncio timeout or
# task cancellation of `generate` does; "event": only the cancel event (a client disconnect in
# parser.serving.server, `generate_ids(cancelled=...)`); "task": a real asyncio task running `generate` is cancelled.
REQUEST = st.tuples(st.integers(0, KEYS - 1), st.integers(0, 1), st.integers(0, 1),
                    st.sampled_from([None, None, "future", "event", "task"]), st.integers(0, 40))


# The explicit example is the interleaving a search found (issue 33): request 7's task is cancelled
# just as the request ahead of it on doc:2 ends and hands it the key, so 7 leaves the queue holding
# doc:2 and, before the fix, request 13 waited for that key for good.
@example(requests=[(1, 0, 0, None, 26), (0, 0, 1, None, 18), (3, 0, 1, None, 11), (0, 0, 0, None, 4),
                   (1, 0, 0, "event", 1), (0, 1, 1, "task", 15), (2, 0, 1, "event", 22), (2, 0, 0, "task", 9),
                   (1, 0, 1, None, 17), (0, 1, 1, "event", 36), (0, 0, 0, "task", 23), (3, 1, 0, None, 30),
                   (1, 0, 1, None, 33), (2, 1, 0, None, 4)], batch=64)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(REQUEST, min_size=1, max_size=14), batch=st.sampled_from([1, 3, 64]))
def test_random_cancellations_never_strand_a_request_or_leak_memory(tiny_qwen3_model, tiny_tokenizer, reference,
                                                                    requests, batch):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_batch_size=batch, max_cache_entries=2)
    submitted: list[concurrent.futures.Future] = []
    real_submit = backend.submit
    backend.submit = lambda *a, **k: submitted.append(real_submit(*a, **k)) or submitted[-1]  # a spy: the real submit runs
    at = CancelAt(tiny_qwen3_model)

    async def main():
        loop = asyncio.get_running_loop()
        calls, events, tasks = [], [], []
        with held(backend):
            for key, query, sampling, how, when in requests:
                ids = prompt(tiny_tokenizer, key, QUERIES[query])
                event = threading.Event()
                if how == "task":
                    task = asyncio.ensure_future(backend.generate(ids, SAMPLINGS[sampling], routing_key=f"doc:{key}"))
                    fire = (lambda t=task: loop.call_soon_threadsafe(t.cancel))
                    while len(submitted) < len(calls) + 1:  # its prompt is tokenised on a thread first
                        await asyncio.sleep(0)
                    future = submitted[-1]
                else:
                    future = backend.submit(ids, SAMPLINGS[sampling], f"doc:{key}", event)
                    task = asyncio.wrap_future(future)
                    fire = {None: None, "event": event.set,
                            "future": (lambda f=future, e=event: (e.set(), f.cancel()))}[how]
                if fire is not None and when == 0:
                    fire()  # while queued: the worker is still held
                elif fire is not None:
                    at.due.setdefault(at.count + when, []).append(fire)
                calls.append(future)
                tasks.append(task)
                events.append(event)
        done, pending = await asyncio.to_thread(concurrent.futures.wait, calls, DEADLINE_S)  # the loop runs on: task cancels land
        assert not pending, f"requests {[calls.index(p) for p in pending]} never ended (stranded behind a cancelled one?)"
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        at.close()
    for (key, query, sampling, how, _), result in zip(requests, results, strict=True):
        if how is None:
            assert result.token_ids == reference[key, query, sampling]
            assert result.finish_reason in ("stop", "length")
        elif not isinstance(result, BaseException) and result.finish_reason != "abort":
            assert result.token_ids == reference[key, query, sampling]  # cancelled too late: it finished
        else:
            assert isinstance(result, (asyncio.CancelledError, concurrent.futures.CancelledError)) \
                or result.finish_reason == "abort"
    assert baseline(backend) == EMPTY
    assert len(backend.cache_info()) <= 2  # the prefix cache stays under its own bound


def test_a_request_waiting_behind_a_cancelled_one_on_its_key_still_runs(tiny_qwen3_model, tiny_tokenizer):
    """doc:0 runs; two more wait for doc:0; the first of them is cancelled: the second runs."""
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    s = SamplingParams(max_new_tokens=4, temperature=0.0)
    with held(backend):
        running = backend.submit(prompt(tiny_tokenizer, 0), s, "doc:0")
        gone = backend.submit(prompt(tiny_tokenizer, 0, QUERIES[1]), s, "doc:0")
        behind = backend.submit(prompt(tiny_tokenizer, 0, QUERIES[1]), s, "doc:0")
        gone.cancel()
    assert len(behind.result(timeout=DEADLINE_S).token_ids) == 4 and len(running.result(timeout=DEADLINE_S).token_ids) == 4
    assert baseline(backend) == EMPTY


def test_a_request_handed_its_key_then_cancelled_hands_it_on(tiny_qwen3_model, tiny_tokenizer):
    """doc:0 runs; two more wait for it. The moment the first ends and hands the key to the
    second, the second's caller gives up (its future is cancelled while it sits at the queue's
    front): the third still runs. The spy on `_store` (the first's state going back to the cache,
    right after its hand-off) stands in for a caller whose timeout fires at exactly that point."""
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    s = SamplingParams(max_new_tokens=2, temperature=0.0)
    store = backend._store
    handed: list[concurrent.futures.Future] = []

    def store_then_give_up(key, entry):
        store(key, entry)
        while handed:
            assert handed.pop().cancel()  # still queued: the cancel lands before the worker takes it

    backend._store = store_then_give_up
    with held(backend):
        first = backend.submit(prompt(tiny_tokenizer, 0), s, "doc:0")
        second = backend.submit(prompt(tiny_tokenizer, 0, QUERIES[1]), s, "doc:0")
        third = backend.submit(prompt(tiny_tokenizer, 0, QUERIES[1]), s, "doc:0")
        handed.append(second)
    done, pending = concurrent.futures.wait([first, second, third], timeout=DEADLINE_S)
    assert not pending, "the request behind a cancelled hand-off never ran"
    assert second.cancelled() and len(first.result().token_ids) == 2 and len(third.result().token_ids) == 2
    assert baseline(backend) == EMPTY


def test_cancelled_requests_free_their_queue_places(tiny_qwen3_model, tiny_tokenizer):
    """A burst of cancellations leaves no dead request counted against max_queued_requests."""
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_queued_requests=4)
    s = SamplingParams(max_new_tokens=2, temperature=0.0)
    with held(backend):
        for _ in range(3):
            burst = [backend.submit(prompt(tiny_tokenizer, i % 2), s, f"doc:{i % 2}") for i in range(4)]
            for f in burst:
                f.cancel()
        live = [backend.submit(prompt(tiny_tokenizer, i % 2), s, f"doc:{i % 2}") for i in range(4)]
        with pytest.raises(BackendError, match="max_queued_requests"):
            backend.submit(prompt(tiny_tokenizer, 0), s, "doc:0")
    assert all(len(f.result(timeout=DEADLINE_S).token_ids) == 2 for f in live)
    assert baseline(backend) == EMPTY


# ---------------------------------------------------------------------- typed errors
@pytest.mark.parametrize("ids, sampling, field", [
    ([5, 10**6], SamplingParams(max_new_tokens=2), "prompt token 1"),
    ([5, -1], SamplingParams(max_new_tokens=2), "prompt token 1"),
    ([5, "7"], SamplingParams(max_new_tokens=2), "prompt token 1"),
    ([5, 6], SamplingParams(max_new_tokens=2, seed=2 ** 64), "seed"),
    ([5, 6], SamplingParams(max_new_tokens=2, seed=-2 ** 63 - 1), "seed"),
    ([5, 6], SamplingParams(max_new_tokens=2, temperature=float("nan")), "temperature"),
    ([5, 6], SamplingParams(max_new_tokens=2, temperature=float("inf")), "temperature"),
    ([5, 6], SamplingParams(max_new_tokens=2, top_p=float("nan")), "top_p"),
    ([5, 6], SamplingParams(max_new_tokens=0), "max_new_tokens"),
])
def test_requests_no_worker_could_serve_are_non_retryable_backend_errors(tiny_qwen3_model, tiny_tokenizer, ids,
                                                                          sampling, field):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    with pytest.raises(BackendError, match=field) as error:
        asyncio.run(backend.generate(ids, sampling))
    assert not error.value.retryable
    assert baseline(backend) == EMPTY


@pytest.mark.parametrize("prompt_ids, continuation", [([5, 10**6], [7]), ([5], [-3]), ([5], [2 ** 70])])
def test_scoring_ids_outside_the_vocabulary_is_a_non_retryable_backend_error(tiny_qwen3_model, tiny_tokenizer,
                                                                               prompt_ids, continuation):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    with pytest.raises(BackendError, match="not a token id") as error:
        asyncio.run(backend.score(prompt_ids, continuation))
    assert not error.value.retryable
