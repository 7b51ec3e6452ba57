"""TransformersBackend's batched decoding: concurrent requests share each decode forward, yet
each comes back as if it had run alone (tokens, logprobs, seeds, grammars, stop strings, the
prefix cache), and the bounds and cancellation hold.

    .venv/bin/pytest tests/test_transformers_batching_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
import torch

from parser.serving.types import BackendError, SamplingParams
from parser.serving.backends.transformers import TransformersBackend

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, return_logprobs=True)
INSTRUCTIONS = "You read one chunk of a long document. Answer the query from the chunk, or abstain."
QUERIES = ("Who built the bridge?", "When was the mill lost?")


def chunk(i: int) -> str:
    """Chunks of different lengths, like a document's."""
    return " ".join(f"Paragraph {j}. The bridge at site {i} was built in {1880 + j} by engineer {i}." for j in range(2 + 2 * i))


def prompt(tok, i: int, query: str = QUERIES[0]) -> list[int]:
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": f"{chunk(i)}\n\nQuery: {query}"}]
    return tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)


@pytest.fixture(scope="module")
def tiny_sliding_qwen3(tiny_tokenizer):
    """A tiny Qwen3 whose first layer attends through a sliding window (Gemma 3 style)."""
    from parser.offline import tiny_qwen3

    return tiny_qwen3(tiny_tokenizer, layer_types=["sliding_attention", "full_attention"], sliding_window=48,
                      use_sliding_window=True)


@pytest.fixture(params=["qwen3", "qwen3_5", "sliding"])
def model(request, tiny_qwen3_model, tiny_qwen3_5_model, tiny_sliding_qwen3):
    return {"qwen3": tiny_qwen3_model, "qwen3_5": tiny_qwen3_5_model, "sliding": tiny_sliding_qwen3}[request.param]


class Forwards:
    """Records (batch rows, new tokens) of every model forward: a decode step has 1 new token."""

    def __init__(self, model):
        self.calls: list[tuple[int, int]] = []
        self.on_decode = None  # called after each decode forward
        self._handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        rows, new = kwargs["input_ids"].shape
        self.calls.append((rows, new))
        if new == 1 and self.on_decode:
            self.on_decode()

    @property
    def decode_batches(self) -> list[int]:
        return [rows for rows, new in self.calls if new == 1]

    def close(self):
        self._handle.remove()


@pytest.fixture
def forwards(request):
    recorders = []

    def watch(model):
        recorders.append(Forwards(model))
        return recorders[-1]

    yield watch
    for r in recorders:
        r.close()


@contextlib.contextmanager
def held(backend):
    """The backend's worker busy with a job of ours until the block ends, so every request
    submitted inside is queued before any is scheduled: otherwise, on a loaded machine, the first
    can start alone before the others arrive (CI saw a round-2 tail prefilled solo)."""
    running, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=backend.run_exclusive, args=(lambda: running.set() or release.wait(30),))
    holder.start()
    assert running.wait(30), "the worker never ran the holding job"
    try:
        yield
    finally:
        release.set()
        holder.join(30)


async def concurrently(backend, requests, late=()):
    """Generate every (prompt, sampling, key) at once: all but the `late` ones queued together
    (`held`); the `late` ones start after the others have begun decoding (they join a running batch)."""
    with held(backend):
        futures = {i: backend.submit(backend.encode_prompt(p), s, key) for i, (p, s, key) in enumerate(requests) if i not in late}
    if late:
        await asyncio.sleep(0.05)
        futures |= {i: backend.submit(backend.encode_prompt(p), s, key) for i, (p, s, key) in enumerate(requests) if i in late}
    return [await asyncio.wrap_future(futures[i]) for i in range(len(requests))]


def alone(model, tok, requests):
    """The reference: each request on a backend that decodes one request at a time."""
    backend = TransformersBackend(model, tok, max_batch_size=1)
    return [backend.generate_ids(backend.encode_prompt(p), s, key) for p, s, key in requests]


def assert_same(got, want, logprob_tol=1e-4):
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert (g.text, g.finish_reason, g.prompt_tokens, g.cached_tokens) == (w.text, w.finish_reason, w.prompt_tokens, w.cached_tokens)
        if w.logprobs is not None:
            assert g.logprobs == pytest.approx(w.logprobs, abs=logprob_tol)


# ---------------------------------------------------------------------- batching itself
def test_concurrent_requests_share_decode_forwards_and_match_one_at_a_time(model, tiny_tokenizer, forwards):
    requests = [(prompt(tiny_tokenizer, i), GREEDY, f"doc:{i}") for i in range(6)]
    requests.append((prompt(tiny_tokenizer, 40), GREEDY, "doc:40"))  # long enough for a group of its own
    want = alone(model, tiny_tokenizer, requests)
    backend = TransformersBackend(model, tiny_tokenizer)
    seen = forwards(model)
    got = asyncio.run(concurrently(backend, requests, late={4, 5}))
    assert_same(got, want)
    decode = seen.decode_batches
    if model.config.layer_types[0] == "sliding_attention":  # no per-row mask for a window: rows step alone
        assert set(decode) == {1}
    else:
        assert max(decode) >= 4, decode  # the rows really shared forwards ...
        assert len(decode) < sum(len(c.token_ids) - 1 for c in got) / 2  # ... far fewer than one per token


def test_each_row_keeps_its_own_seed_grammar_and_stop_string(model, tiny_tokenizer):
    free = TransformersBackend(model, tiny_tokenizer, max_batch_size=1).generate_ids(
        prompt(tiny_tokenizer, 2), SamplingParams(max_new_tokens=24, temperature=1.0, seed=1))
    stop = free.text[len(free.text) // 2:][:3]
    requests = [
        (prompt(tiny_tokenizer, 0), SamplingParams(max_new_tokens=12, temperature=1.5, seed=7, return_logprobs=True), "a"),
        (prompt(tiny_tokenizer, 1), SamplingParams(max_new_tokens=12, temperature=0.8, top_k=5, top_p=0.9, seed=3), "b"),
        (prompt(tiny_tokenizer, 2), SamplingParams(max_new_tokens=24, temperature=1.0, seed=1, stop=(stop,)), "c"),
        (prompt(tiny_tokenizer, 3), SamplingParams(max_new_tokens=20, temperature=1.0, seed=5,
                                                   regex=r'\{"answer": "[a-z ]{1,12}"\}'), "d"),
        (prompt(tiny_tokenizer, 4), GREEDY, "e"),
    ]
    got = asyncio.run(concurrently(TransformersBackend(model, tiny_tokenizer), requests))
    assert_same(got, alone(model, tiny_tokenizer, requests))
    assert got[2].finish_reason == "stop" and got[2].text == free.text[:free.text.find(stop)]
    assert got[3].text.startswith('{"answer": "') and got[3].finish_reason == "stop"


def test_later_rounds_reuse_each_chunks_prefix_while_batched(model, tiny_tokenizer):
    """Round 2 sends every chunk a new query: each request resumes from its chunk's prefix,
    exactly as it would one at a time, and decodes the same tokens."""
    batched = TransformersBackend(model, tiny_tokenizer, checkpoint_every=32)
    serial = TransformersBackend(model, tiny_tokenizer, checkpoint_every=32, max_batch_size=1)
    for query in QUERIES:
        requests = [(prompt(tiny_tokenizer, i, query), GREEDY, f"doc:{i}") for i in range(5)]
        want = [serial.generate_ids(serial.encode_prompt(p), s, k) for p, s, k in requests]
        got = asyncio.run(concurrently(batched, requests))
        assert_same(got, want)
    sliding = model.config.layer_types[0] == "sliding_attention"
    assert all((c.cached_tokens > 0) != sliding for c in got)  # a window cannot be rewound: no reuse


def test_later_rounds_run_every_chunks_query_in_one_forward(model, tiny_tokenizer, forwards):
    """Round 2 on an attention-only model: each row joins with its chunk's prefix and the five
    new query tails run together in one forward (they were five solo prefills). Linear-attention
    (Qwen3.5) and sliding-window models still prefill each tail alone."""
    backend = TransformersBackend(model, tiny_tokenizer, checkpoint_every=32)
    asyncio.run(concurrently(backend, [(prompt(tiny_tokenizer, i, QUERIES[0]), GREEDY, f"doc:{i}") for i in range(5)]))
    seen = forwards(model)
    requests = [(prompt(tiny_tokenizer, i, QUERIES[1]), GREEDY, f"doc:{i}") for i in range(5)]
    got = asyncio.run(concurrently(backend, requests))
    prefills = [(rows, new) for rows, new in seen.calls if new > 1]
    if model.config.layer_types[0] == "sliding_attention":
        assert all(rows == 1 for rows, _ in prefills) and all(c.cached_tokens == 0 for c in got)
    elif getattr(model.config, "layer_types", None) and "linear_attention" in model.config.layer_types:
        assert {rows for rows, _ in prefills} == {1} and len(prefills) >= 5 and all(c.cached_tokens > 0 for c in got)
    else:
        tails = {len(p) - c.cached_tokens for (p, _, _), c in zip(requests, got, strict=True)}
        assert prefills == [(5, max(tails))] and all(c.cached_tokens > 0 for c in got)


def test_two_queries_for_one_chunk_run_in_turn_and_the_second_reuses_the_first(tiny_qwen3_model, tiny_tokenizer):
    requests = [(prompt(tiny_tokenizer, 3, q), GREEDY, "doc:3") for q in QUERIES]
    got = asyncio.run(concurrently(TransformersBackend(tiny_qwen3_model, tiny_tokenizer), requests))
    assert_same(got, alone(tiny_qwen3_model, tiny_tokenizer, requests))
    assert got[0].cached_tokens == 0 and got[1].cached_tokens > len(requests[1][0]) // 2


# ---------------------------------------------------------------------- cancellation
def test_a_cancelled_request_stops_while_the_others_finish(tiny_qwen3_model, tiny_tokenizer, forwards):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    long = SamplingParams(max_new_tokens=30, temperature=0.0)
    give_up = threading.Event()
    seen = forwards(tiny_qwen3_model)
    seen.on_decode = lambda: seen.decode_batches.count(3) == 3 and give_up.set()  # the third forward decoding all three
    with held(backend):
        futures = [backend.submit(prompt(tiny_tokenizer, i), long, f"doc:{i}", give_up if i == 1 else None) for i in range(3)]
    got = [f.result(timeout=60) for f in futures]
    want = alone(tiny_qwen3_model, tiny_tokenizer, [(prompt(tiny_tokenizer, i), long, f"doc:{i}") for i in range(3)])
    assert got[1].finish_reason == "abort" and 0 < len(got[1].token_ids) < 10
    assert got[1].token_ids == want[1].token_ids[:len(got[1].token_ids)]
    assert_same([got[0], got[2]], [want[0], want[2]])


def test_a_request_cancelled_while_queued_is_never_computed(tiny_qwen3_model, tiny_tokenizer, forwards):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    gone = threading.Event()
    gone.set()
    seen = forwards(tiny_qwen3_model)
    c = backend.submit(prompt(tiny_tokenizer, 0), GREEDY, "doc:0", gone).result(timeout=60)
    assert (c.finish_reason, c.token_ids, seen.calls) == ("abort", [], [])


def test_an_abandoned_asyncio_call_frees_its_row(tiny_qwen3_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(backend.generate(prompt(tiny_tokenizer, 0), SamplingParams(max_new_tokens=2000, temperature=0)),
                                   timeout=0.5)
        return await backend.generate(prompt(tiny_tokenizer, 1), GREEDY)

    assert len(asyncio.run(main()).token_ids) == GREEDY.max_new_tokens
    assert wait_until(lambda: backend._worker is None)  # nothing left running: the worker is gone


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------------- bounds and other work
def test_rows_in_a_batch_and_reserved_positions_are_bounded(tiny_qwen3_model, tiny_tokenizer, forwards):
    requests = [(prompt(tiny_tokenizer, i), GREEDY, f"doc:{i}") for i in range(5)]
    seen = forwards(tiny_qwen3_model)
    asyncio.run(concurrently(TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_batch_size=2), requests))
    assert max(seen.decode_batches) == 2
    seen.calls.clear()
    requests = requests[3:]  # any two of these need more than the longest one alone
    tight = max(len(p) for p, _, _ in requests) + GREEDY.max_new_tokens  # room for one row at a time
    asyncio.run(concurrently(TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_batch_tokens=tight), requests))
    assert max(seen.decode_batches) == 1


def test_the_queue_is_bounded_and_work_runs_between_decode_steps(tiny_qwen3_model, tiny_tokenizer):
    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer, max_queued_requests=2)
    release, holding = threading.Event(), threading.Event()

    def hold():
        holding.set()
        release.wait(30)
        return "held"

    worker = threading.Thread(target=lambda: results.append(backend.run_exclusive(hold)))
    results: list = []
    worker.start()
    assert holding.wait(30)  # the worker is busy: what comes now waits in the queue
    queued = [backend.submit(prompt(tiny_tokenizer, i), GREEDY, f"doc:{i}") for i in range(2)]
    with pytest.raises(BackendError, match="max_queued_requests") as error:
        backend.submit(prompt(tiny_tokenizer, 2), GREEDY, "doc:2")
    assert error.value.retryable
    release.set()
    worker.join(30)
    assert results == ["held"] and all(len(f.result(60).token_ids) == GREEDY.max_new_tokens for f in queued)
    with pytest.raises(ZeroDivisionError):
        backend.run_exclusive(lambda: 1 / 0)


# ---------------------------------------------------------------------- a real model
@pytest.mark.slow
def test_smollm2_greedy_subagent_replies_are_the_same_batched():
    """SmolLM2-135M (float32) on real subagent prompts, JSON-constrained as the CPU preset reads:
    batched and one-at-a-time replies are the same tokens; the logprobs differ only by float
    rounding of the batched matmuls (measured ~1e-5). The chunks are 256 tokens, not the CPU
    preset's 512: the rows still differ in length (padding), and at 512 prefilling the four
    prompts twice made this the suite's costliest in-process test (32 s alone; 21 s at 256)."""
    from data_prep.synthetic_world import build_synthetic_eval
    from parser.engine import prompts
    from parser.text.chunking import chunk_document
    from parser.offline.assets import load_smollm2

    model, tok = load_smollm2(torch.float32)
    row = build_synthetic_eval(num_questions=1, lengths=(30,), seed=3)[0]
    chunks = chunk_document(row["context"], tok, 256)[:4]  # four rows decode as one batch
    schema = prompts.LEAD.path(prompts.DEFAULT_VERSION, "subagent_schema.json").read_text(encoding="utf-8")
    sampling = SamplingParams(max_new_tokens=24, temperature=0.0, return_logprobs=True, json_schema=schema)
    requests = [(tok.apply_chat_template([{"role": "user", "content": prompts.render(
        "subagent", prompts.DEFAULT_VERSION, chunk=c.text, query=row["question"])}], tokenize=False, add_generation_prompt=True),
        sampling, f"doc:{c.index}") for c in chunks]
    got = asyncio.run(concurrently(TransformersBackend(model, tok), requests))
    assert_same(got, alone(model, tok, requests), logprob_tol=1e-3)


def test_decode_attention_equals_sdpa_with_grouped_heads_and_padding():
    """The decode step's attention (one query per row, two matmuls) is SDPA's, GQA groups and
    each row's padding mask included."""
    from parser.serving.backends.kv_slots import _decode_attention

    torch.manual_seed(0)
    rows, q_heads, kv_heads, kv, dim = 5, 6, 2, 37, 16
    query, key, value = torch.randn(rows, q_heads, 1, dim), torch.randn(rows, kv_heads, kv, dim), torch.randn(rows, kv_heads, kv, dim)
    lengths = torch.tensor([37, 30, 1, 12, 25])
    mask = torch.zeros(rows, 1, 1, kv).masked_fill_((torch.arange(kv)[None, :] >= lengths[:, None])[:, None, None], torch.finfo(torch.float32).min)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    assert torch.allclose(_decode_attention(query, key, value, mask, None), want, atol=1e-5)
    assert torch.allclose(_decode_attention(query, key, value, mask, 0.3),
                          torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3,
                                                                           enable_gqa=True).transpose(1, 2), atol=1e-5)
