"""In-process transformers backend: the CPU default, with a per-prefix KV cache.

Why it exists: the episode engine must run end to end on a laptop/CI CPU with real models
(tiny random Qwen3/Qwen3.5, SmolLM2, or any small hub checkpoint), returning what a SGLang
server returns: token ids, per-token logprobs, finish reason, prompt and cached token counts.

    backend = TransformersBackend(model, tokenizer)
    backend = TransformersBackend.from_pretrained("Qwen/Qwen3-0.6B")      # real users (hub/local)
    c = await backend.generate(ids_or_text, SamplingParams(max_new_tokens=64, temperature=0),
                               routing_key="doc7:3")

Prefix cache (the CPU analogue of SGLang's RadixCache). Subagent prompts are
`instructions + chunk + query` and come back every round with a new query; the lead's prompt
grows by one turn per round. Each cache entry is keyed by `routing_key` (subagents:
"doc_id:chunk_index"), else `request_id` (the lead's trajectory), else one shared slot, and
holds the model state after the previous prompt (plus the tokens generated from it). The
reusable length is the longest common prefix of the new prompt with that entry's tokens.
- Attention layers: the KV cache is cropped to the reuse point.
- Linear-attention (recurrent) layers, as in Qwen3.5's Gated DeltaNet, fold the whole prefix
  into a fixed-size state that cannot be cropped. We keep snapshots of that state at chosen
  positions and resume from the latest snapshot at or before the common prefix: at the exact
  common-prefix boundary once it is known (from the second prompt of a key on, the
  instructions+chunk prefix is never recomputed), every `checkpoint_every` tokens during
  prefill (so the second prompt recomputes less than that many prefix tokens), and at the
  end of the cached tokens (the lead's next turn extends its previous one).
The cache is bounded by entry count and by bytes held (LRU).

Logprobs: of each chosen token under log_softmax(logits / temperature) (temperature 1 for
greedy), before top-k/top-p filtering: SGLang's default (`SGLANG_RETURN_ORIGINAL_LOGPROB`
unset) and what verl's actor recomputes. `logprobs_before_temperature=True` gives
log_softmax(logits) instead. Sampling order: temperature, top-k, top-p, then a draw from a
per-request `torch.Generator` seeded with `SamplingParams.seed`.

Scoring (`score(prompt_ids, continuation_ids)`, parser.serving.backends.scoring): the log-probs of given
tokens from a teacher-forced pass at temperature 1 (log_softmax of the raw logits), the cache-free
analogue of SGLang's input logprobs, run on the worker between two decode steps (`run_exclusive`).

Output conventions (SGLang's): `token_ids` include the EOS/<|im_end|> token that ended the
turn, `text` does not (special tokens are skipped, tags like <think>/<tool_call> are kept); a
stop string ends generation and is cut from `text`, while `token_ids` keep the tokens
generated up to and including the one that completed it.

Constrained decoding (`SamplingParams.json_schema` / `.regex`): xgrammar token masks
(`parser.serving.backends.grammar`), applied to the logits before sampling, so the reported logprobs
are those of the constrained distribution (as on SGLang and vLLM). A regex that comes with its
`SamplingParams.exclusion` is matched as the exclusion's base grammar, compiled once, plus the
exclusion applied per step (`grammar.ExcludingMatcher`): the same language, no compile per turn.

Concurrency: one worker thread owns the model and serves every request; concurrent requests
decode as one batch (`parser.serving.backends.kv_slots`). A request is first prefilled on its own,
through the prefix cache above (long first-round prompts gain nothing from padding: measured
0.8x batched with 1,112-token prompts), then joins the running batch — except that, on
attention-only models, a prompt whose cached prefix leaves a short tail (at most
JOINT_TAIL_TOKENS: a later round's query after its chunk) joins at once, and the tails of all
rows that joined run together in the batch's next forward (14 solo 22-token prefills took 2.0 s
of a 7.6 s cached round on SmolLM2, 2 cores); each decode step feeds
every running row one token in a single forward, and a row leaves as soon as it stops (EOS, a
stop string, its max_new_tokens, or cancellation), its state going back to the prefix cache.
Sampling, seeds, grammar masks and stop strings stay per row, as if the row ran alone; greedy
rows match one-at-a-time decoding token for token on the test prompts (the logprobs differ by
float rounding, ~1e-5). Two requests for the same cache key run one after the other, so the
second reuses what the first computed (a turn's queries all read the same chunks); a request
cancelled at any stage (queued, waiting for its key, prefilling, decoding) releases what it held
and hands its key straight to the next request waiting for it (tests/test_transformers_cancellation_on_cpu.py). Bounds:
`max_batch_size` rows and `max_batch_tokens` reserved positions (prompt + max_new_tokens) decode
at once, `max_queued_requests` wait (beyond that, a retryable BackendError). Models whose cache
has sliding-window layers decode one row at a time. `run_exclusive(fn)` runs other model work
(a forward-only scoring pass, a weight update) on the worker between two decode steps.
transformers' own continuous batching (`generate_batch`) is not used: in 5.10 it refuses
linear-attention layers and takes no per-request seed, grammar or stop string.

Must never: download from a hub when offline (from_pretrained honours HF_HUB_OFFLINE).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import math
import operator
import threading
from typing import Any, Callable, Mapping, Sequence

import torch

from parser.serving.types import BackendError, Completion, Prompt, SamplingParams
from parser.serving.backends.kv_slots import SlotBatch, SoloRows, batchable, use_gqa_sdpa
from parser.serving.backends.scoring import check_request
from parser.text.chat_format import CHATML

try:  # transformers >= 5: layer-wise caches
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
except ImportError:  # pragma: no cover - older transformers: no hybrid models, no prefix reuse of recurrent state
    from transformers.cache_utils import DynamicCache

    DynamicLayer = DynamicSlidingWindowLayer = LinearAttentionCacheLayerMixin = ()  # type: ignore[assignment]

SCORE_SLICE = 256  # continuation tokens per forward when scoring (bounds the logits held at once)
# Rows decode in groups by capacity (positions: prompt + max_new_tokens), 1024 * 4^k: a round's
# subagents share one group, while a much longer prompt (a lead's) gets its own instead of
# stretching every row's attention and zeroed buffer to its length.
MIN_CAPACITY = 1024
# A row that joins with its prompt's prefix cached runs a tail up to this long in the batch's
# next forward, with the other joined rows (attention-only models): a later round's subagent
# prompt differs from the cached one only in its query. A longer tail is prefilled on its own.
JOINT_TAIL_TOKENS = 64
CLOSE_WAIT_S = 30.0  # aclose waits this long for the worker to finish the rows it is decoding


@dataclasses.dataclass
class _Entry:
    tokens: list[int]  # the tokens whose state `cache` holds
    cache: Any  # transformers Cache
    snapshots: dict[int, list[Any]]  # position -> per-layer recurrent state (hybrid models only)


@dataclasses.dataclass(eq=False)
class _Request:
    """One generate call on its way through the worker."""

    ids: list[int]
    sampling: SamplingParams
    key: str
    cancelled: threading.Event
    future: concurrent.futures.Future
    matcher: Any
    generator: torch.Generator | None
    need: int  # positions it may hold: prompt + max_new_tokens
    out: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None
    text: str | None = None
    cached: int = 0
    snapshots: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    logits: torch.Tensor | None = None  # the next token's logits, once prefilled
    tail: list[int] = dataclasses.field(default_factory=list)  # prompt tokens the batch's next forward runs
    error: BaseException | None = None  # why it failed after it started


@dataclasses.dataclass(eq=False)
class _Job:
    """Other work for the model (`run_exclusive`), run between two decode steps."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future


class TransformersBackend:
    """`Backend` over an in-process causal LM. See the module docstring for the cache and the batching."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_cache_entries: int = 64,  # higher: more chunks keep their prefix warm, more memory
        max_cache_bytes: int = 2 << 30,  # KV + recurrent state held across entries (LRU beyond)
        checkpoint_every: int = 256,  # recurrent-state snapshots during prefill (hybrid models)
        max_batch_size: int = 64,  # rows decoding together; 1 = one request at a time
        max_batch_tokens: int = 65536,  # positions (prompt + max_new_tokens) the running rows may reserve
        max_queued_requests: int = 4096,  # waiting requests beyond which generate raises (retryable)
        logprobs_before_temperature: bool = False,
        name: str = "transformers",
        seed: int = 0,  # of the sampler for requests without a seed (SamplingParams.seed)
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_cache_entries = max_cache_entries
        self.max_cache_bytes = max_cache_bytes
        self.checkpoint_every = max(1, int(checkpoint_every))
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_queued_requests = int(max_queued_requests)
        self.logprobs_before_temperature = logprobs_before_temperature
        self.name = name
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, tokenizer)
        self.vocab_size = model.get_input_embeddings().num_embeddings  # the ids a prompt may hold
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._entries_lock = threading.Lock()
        self._rng = torch.Generator().manual_seed(int(seed))  # for requests without a seed (worker thread only)
        self._grammars: Any = None  # parser.serving.backends.grammar.Grammars, built on first constraint
        self._grammars_lock = threading.Lock()
        self._batchable = batchable(model.config)
        # attention-only: cached prompts' tails run together in one forward (SlotBatch.step)
        self._joint_tails = self._batchable and not self._is_hybrid(DynamicCache(config=model.config))
        if self._batchable:
            use_gqa_sdpa(model)
        # The worker: started by the first request, gone once nothing is queued or running.
        self._wake = threading.Condition()
        self._queue: collections.deque[_Request | _Job] = collections.deque()
        self._deferred: dict[str, collections.deque[_Request]] = {}  # key -> requests waiting for it
        self._worker: threading.Thread | None = None
        self._groups: dict[int, SlotBatch | SoloRows] = {}  # capacity -> running rows (worker only)
        self._in_flight: dict[str, _Request] = {}  # key -> the request holding it (under _wake)
        self._reserved = 0  # sum of `need` over running requests (worker only)

    @classmethod
    def from_pretrained(
        cls, path_or_name: str, *, tokenizer: Any = None, dtype: Any = "auto", device: str = "cpu", **kwargs: Any
    ) -> "TransformersBackend":
        """Load a causal LM and its tokenizer (hub name, local dir, or a local test model name),
        eval mode, through the project's one loader (`parser.serving.backends.loading.load_model_and_tokenizer`)."""
        from parser.serving.backends.loading import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(path_or_name, dtype=dtype, **kwargs.pop("model_kwargs", {}))
        return cls(model.to(device), tokenizer or tok, **kwargs)

    @classmethod
    def from_config(cls, model: str, *, model_kwargs: Mapping[str, Any] | None = None, role: str = "models",
                    **kwargs: Any) -> tuple["TransformersBackend", Any]:
        """(backend, tokenizer) for a config section, `_target_:
        parser.serving.backends.transformers.TransformersBackend.from_config` (configs/backend/tiny_cpu.yaml):
        `model` a hub name, a path or an offline name; `model_kwargs` go to `from_pretrained`
        (e.g. `device_map: cuda`); the other keys are this class's. `role` names the section in errors."""
        from parser.serving.backends.loading import load_model_and_tokenizer, require_loadable

        require_loadable(model, f"{role}.model")
        loaded, tokenizer = load_model_and_tokenizer(model, **dict(model_kwargs or {}))
        return cls(loaded, tokenizer, **kwargs), tokenizer

    # ------------------------------------------------------------------ Backend protocol
    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> Completion:
        key = routing_key if routing_key is not None else (request_id if request_id is not None else "")
        cancelled = threading.Event()  # set when the caller gives up (a client disconnect): decoding stops
        try:  # tokenising a long prompt is heavy too: it runs on a thread, not the caller's loop
            ids = await asyncio.to_thread(self.encode_prompt, prompt)
            return await asyncio.wrap_future(self.submit(ids, sampling, key, cancelled))
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def aclose(self) -> None:
        """Drop the cached prefixes and wait (at most CLOSE_WAIT_S) for the worker to go: after an
        interrupt it is still decoding the rows just cancelled, and a process that exits under it
        dies in C++ ("terminate called without an active exception", SIGABRT) instead of exiting."""
        with self._entries_lock:
            self._entries.clear()
        worker = self._worker
        if worker is not None:
            await asyncio.to_thread(worker.join, CLOSE_WAIT_S)

    # ------------------------------------------------------------------ requests in
    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        items = list(prompt)
        if items and isinstance(items[0], dict):
            ids = self.tokenizer.apply_chat_template(items, tokenize=True, add_generation_prompt=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self._check_ids(items, "prompt")

    def generate_ids(self, ids: list[int], sampling: SamplingParams, key: str = "",
                     cancelled: threading.Event | None = None) -> Completion:
        """Blocking generate for one prompt of token ids (thread-safe; concurrent callers are
        batched); stops early, with finish_reason "abort", once `cancelled` is set."""
        return self.submit(ids, sampling, key, cancelled).result()

    def submit(self, ids: list[int], sampling: SamplingParams, key: str = "",
               cancelled: threading.Event | None = None) -> concurrent.futures.Future:
        """Queue one request for the worker; the future resolves to its `Completion`. Bad
        requests raise `BackendError` here, before anything is queued."""
        ids = self._check_ids(ids, "prompt")
        if not ids:
            raise BackendError("TransformersBackend: empty prompt", retryable=False)
        _check_sampling(sampling)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit and len(ids) + sampling.max_new_tokens > limit:
            raise BackendError(
                f"TransformersBackend: prompt {len(ids)} + max_new_tokens {sampling.max_new_tokens} "
                f"exceeds max_position_embeddings {limit}", retryable=False)
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator().manual_seed(sampling.seed)
        request = _Request(ids, sampling, key, cancelled or threading.Event(), concurrent.futures.Future(),
                           self._matcher(sampling), generator, len(ids) + sampling.max_new_tokens)
        # A caller that gives up while its request waits (asyncio cancellation cancels the
        # future) takes it out of the queue at once: a dead request holds no queue place.
        request.future.add_done_callback(lambda f, r=request: f.cancelled() and self._drop(r))
        self._enqueue(request)
        return request.future

    def _check_ids(self, ids: Sequence[Any], what: str) -> list[int]:
        """`ids` as ints inside the model's vocabulary, else a non-retryable BackendError (an id
        out of range would index past the embedding table: an IndexError deep in the worker)."""
        out = []
        for i, t in enumerate(ids):
            try:  # an integer of any kind (int, numpy, a 0-d tensor); not a bool, a float or a string
                value = None if isinstance(t, bool) else operator.index(t)
            except TypeError:
                value = None
            if value is None or not 0 <= value < self.vocab_size:
                raise BackendError(f"TransformersBackend: {what} token {i} is {t!r}, not a token id in "
                                   f"[0, {self.vocab_size})", retryable=False)
            out.append(value)
        return out

    def run_exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` on the worker between two decode steps (no row advances meanwhile) and
        return its result: model work that is not a generation, e.g. a forward-only scoring pass
        (`self._forward` over a fresh cache) or a weight update."""
        job = _Job(fn, concurrent.futures.Future())
        self._enqueue(job)
        return job.future.result()

    def _enqueue(self, item: _Request | _Job) -> None:
        with self._wake:
            waiting = len(self._queue) + sum(len(q) for q in self._deferred.values())
            if waiting >= self.max_queued_requests:
                raise BackendError(f"TransformersBackend: {waiting} requests queued (max_queued_requests)",
                                   retryable=True)
            self._queue.append(item)
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name=f"{self.name}-worker", daemon=True)
                self._worker.start()
            self._wake.notify()

    def _matcher(self, sampling: SamplingParams) -> Any:
        if sampling.constraint is None:
            return None
        with self._grammars_lock:
            if self._grammars is None:
                from parser.serving.backends.grammar import Grammars

                self._grammars = Grammars(self.tokenizer, self.model.config.vocab_size, self.eos_ids)
        return self._grammars.matcher(sampling.constraint, sampling.exclusion)

    # ------------------------------------------------------------------ the worker
    def _serve(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    if not self._queue and not self._groups:
                        self._worker = None  # the next request starts a new worker
                        return
                self._admit()
                if self._groups:
                    self._step()

    def _admit(self) -> None:
        """Start queued requests while the batch has room: prefill each alone (or, a short tail
        after a cached prefix, leave it to the batch's next forward), then join.

        A request holds its routing key from the moment it is admitted (or handed the key by
        `_release` while it waits) until it ends, by whatever path (answered, aborted, failed,
        cancelled before it started, dropped from the queue by `_drop`): every one of those paths
        goes through `_release`, which hands the key straight to the next request waiting for it,
        so a key is never free while anyone waits for it. Whoever takes a request out of a line
        (the worker, or `_drop` for a cancelled future) is the one that settles it."""
        while True:
            with self._wake:
                if not self._queue:
                    return
                item = self._queue[0]
                if isinstance(item, _Request):
                    running = sum(len(g) for g in self._groups.values())
                    holder = self._in_flight.get(item.key)
                    if holder is not None and holder is not item:  # after the running one, to reuse its prefix
                        self._deferred.setdefault(item.key, collections.deque()).append(self._queue.popleft())
                        continue
                    if running and (running >= self.max_batch_size or self._reserved + item.need > self.max_batch_tokens):
                        return
                    if item.key:
                        self._in_flight[item.key] = item
                self._queue.popleft()
            if not item.future.set_running_or_notify_cancel():
                if isinstance(item, _Request):
                    self._release(item)
                continue  # the caller gave up while it waited
            if isinstance(item, _Job):
                _settle(item.future, item.fn)
                continue
            if item.cancelled.is_set():
                self._release(item)
                item.future.set_result(Completion(text="", finish_reason="abort", prompt_tokens=len(item.ids),
                                                  worker=self.name))
                continue
            try:
                entry, item.cached, logits = self._prefill(item.ids, item.key, defer_tail=self._joint_tails)
            except Exception as error:  # noqa: BLE001 - one request's failure is its own
                self._release(item)
                item.future.set_exception(error)
                continue
            item.logits, item.snapshots = logits, entry.snapshots
            item.tail = item.ids[len(entry.tokens):]  # [] unless the tail was deferred
            if item.cancelled.is_set():  # given up while it prefilled: keep the state, join nothing
                self._store(item.key, entry)
                self._release(item)
                item.future.set_result(Completion(text="", finish_reason="abort", prompt_tokens=len(item.ids),
                                                  cached_tokens=item.cached, worker=self.name))
                continue
            capacity = MIN_CAPACITY
            while capacity <= item.need:
                capacity *= 4
            group = self._groups.get(capacity)
            if group is None:
                group = self._groups[capacity] = SlotBatch(self.model.config, capacity) if self._batchable else SoloRows()
            group.add(item, entry.cache, len(entry.tokens))
            self._reserved += item.need

    def _release(self, request: _Request) -> None:
        """`request` ends: it hands its key to the next request waiting for it, which goes to the
        queue's front holding the key. A cancelled one is handed the key too (it is not skipped
        here): whoever takes it out of the queue next, the worker or `_drop`, settles it and
        releases the key again, so no request leaves a line unsettled and no key is left free
        with requests waiting for it."""
        key = request.key
        with self._wake:
            if not key or self._in_flight.get(key) is not request:
                return
            del self._in_flight[key]
            waiting = self._deferred.get(key)
            if waiting:
                nxt = waiting.popleft()
                self._in_flight[key] = nxt
                self._queue.appendleft(nxt)
            if waiting is not None and not waiting:
                del self._deferred[key]

    def _drop(self, request: _Request) -> None:
        """A request whose caller cancelled its future leaves the queue (or its key's waiting line),
        and hands on the key if it held it (handed to it by `_release` while it queued)."""
        with self._wake:
            removed = False
            for line in (self._queue, self._deferred.get(request.key)):
                if line is not None and request in line:
                    line.remove(request)
                    removed = True
            if request.key in self._deferred and not self._deferred[request.key]:
                del self._deferred[request.key]
            if removed:
                self._release(request)
        if removed:  # the worker will never see it: mark it notified, or concurrent.futures.wait never returns
            request.future.set_running_or_notify_cancel()

    def _step(self) -> None:
        """Every running row takes one token; finished rows leave; the rest advance one forward."""
        for capacity, group in list(self._groups.items()):
            done = []
            for request in group.rows:
                if request.tail:
                    continue  # joined this step: its prompt's tail runs first
                try:
                    if self._advance(request):
                        done.append(request)
                except Exception as error:  # noqa: BLE001 - e.g. a grammar rejecting a token
                    request.error = error
                    done.append(request)
            for request in done:
                _, cache = group.pop(group.rows.index(request))
                self._finish(request, cache)
            if group.rows:
                try:
                    logits = group.step(self.model, [r.tail or r.out[-1] for r in group.rows]).to("cpu")
                except Exception as error:  # noqa: BLE001 - the whole group failed; each caller hears why
                    while group.rows:
                        request, _ = group.pop(0)
                        request.error = error
                        self._finish(request, None)
                else:
                    for request, row in zip(group.rows, logits, strict=True):
                        request.logits, request.tail = row, []
            if not group.rows:
                del self._groups[capacity]

    def _advance(self, r: _Request) -> bool:
        """Choose `r`'s next token from its logits; True when that ends the request."""
        s = r.sampling
        logits = r.logits
        if r.matcher is not None:
            r.matcher.mask(logits)
        token, logprob = self._choose(logits, s, r.generator or self._rng)
        r.out.append(token)
        r.logprobs.append(logprob)
        if r.matcher is not None:
            r.matcher.accept(token)
        if token in self.eos_ids or token in s.stop_token_ids:
            r.finish = "stop"
        elif s.stop and (hit := _find_stop(decoded := self._text(r.out), s.stop)) is not None:
            r.finish, r.text = "stop", decoded[:hit]
        elif r.cancelled.is_set():
            r.finish = "abort"
        elif len(r.out) >= s.max_new_tokens:
            r.finish = "length"
        return r.finish is not None

    def _finish(self, r: _Request, cache: Any) -> None:
        """Give the key back (and its next waiting request), keep the state, answer the caller."""
        self._reserved -= r.need
        self._release(r)
        if r.error is not None:
            r.future.set_exception(r.error)
            return
        # the state holds the prompt and every generated token but the last (never fed back)
        self._store(r.key, _Entry(r.ids + r.out[:-1], cache, r.snapshots))
        text = r.text if r.text is not None else self._text(r.out[:-1] if r.finish == "stop" else r.out)
        r.future.set_result(Completion(
            text=text,
            token_ids=r.out,
            logprobs=r.logprobs if r.sampling.return_logprobs else None,
            finish_reason=r.finish,
            prompt_tokens=len(r.ids),
            cached_tokens=r.cached,
            worker=self.name,
        ))

    # ------------------------------------------------------------------ prefix cache
    def _prefill(self, ids: list[int], key: str, defer_tail: bool = False) -> tuple[_Entry, int, torch.Tensor | None]:
        """Resume from the longest reusable prefix of `key`'s entry, run the rest of the
        prompt, and return (entry now holding the whole prompt, reused tokens, last logits).
        `defer_tail`: a rest of at most JOINT_TAIL_TOKENS after a reused prefix is not run here
        (the entry then holds the prefix only, and the logits are None): the batch runs it."""
        with self._entries_lock:
            old = self._entries.pop(key, None)
        common = _common_prefix(old.tokens, ids) if old is not None else 0
        common = min(common, len(ids) - 1)  # the last prompt token must run to give logits
        start = 0
        if old is not None and common > 0:
            start = self._rewind(old, common)
        entry = old if start > 0 else _Entry([], DynamicCache(config=self.model.config), {})
        entry.tokens = ids[:start]
        if defer_tail and start > 0 and len(ids) - start <= JOINT_TAIL_TOKENS:
            return entry, start, None
        hybrid = self._is_hybrid(entry.cache)
        cuts = {len(ids)}
        if hybrid:
            if common > start:
                cuts.add(common)  # the exact common-prefix boundary: resumed from, from now on
            first = (start // self.checkpoint_every + 1) * self.checkpoint_every
            cuts.update(range(first, len(ids), self.checkpoint_every))
        logits = None
        pos = start
        for cut in sorted(c for c in cuts if c > start):
            logits = self._forward(entry.cache, ids[pos:cut])
            pos = cut
            entry.tokens = ids[:pos]
            if hybrid and pos < len(ids):
                entry.snapshots[pos] = _snapshot(entry.cache)
        # Once a shared prefix is established (resumed from `start`, or snapshotted exactly at
        # `common`), earlier checkpoints only help a prompt that diverges sooner, which a
        # per-chunk or per-trajectory key rarely sees: free their memory.
        keep = max(start, common if common in entry.snapshots else 0)
        for p in [p for p in entry.snapshots if p < keep]:
            del entry.snapshots[p]
        return entry, start, logits

    def _rewind(self, entry: _Entry, common: int) -> int:
        """Bring `entry.cache` back to the state after `common` tokens (or the latest
        reachable point before it); returns that point (0 = nothing reusable)."""
        cache = entry.cache
        if any(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers):
            return 0  # a sliding window has already forgotten what a crop would need
        if not self._is_hybrid(cache):
            cache.crop(common)
            return common
        # Drop snapshots that the new prompt no longer shares; the live state counts as a
        # snapshot at the end of the cached tokens.
        for pos in [p for p in entry.snapshots if p > common]:
            del entry.snapshots[pos]
        if len(entry.tokens) <= common:
            return len(entry.tokens)
        point = max(entry.snapshots, default=0)
        if point == 0:
            return 0
        for layer, state in zip(cache.layers, entry.snapshots[point], strict=True):
            if isinstance(layer, DynamicLayer):
                DynamicLayer.crop(layer, point)
            if state is not None:
                _restore(layer, state)
        return point

    def _store(self, key: str, entry: _Entry) -> None:
        with self._entries_lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            total = sum(_nbytes(e) for e in self._entries.values())
            while self._entries and (len(self._entries) > self.max_cache_entries or total > self.max_cache_bytes):
                _, evicted = self._entries.popitem(last=False)
                total -= _nbytes(evicted)

    @staticmethod
    def _is_hybrid(cache: Any) -> bool:
        return bool(LinearAttentionCacheLayerMixin) and any(
            isinstance(layer, LinearAttentionCacheLayerMixin) for layer in getattr(cache, "layers", ())
        )

    def cache_info(self) -> dict[str, Any]:
        """What the prefix cache holds (for tests and benchmarks)."""
        with self._entries_lock:
            return {key: {"tokens": len(e.tokens), "snapshots": sorted(e.snapshots), "bytes": _nbytes(e)}
                    for key, e in self._entries.items()}

    # ------------------------------------------------------------------ model calls
    def _forward(self, cache: Any, ids: Sequence[int]) -> torch.Tensor:
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float().cpu()  # sampling and grammar masks run on the CPU

    def _choose(self, logits: torch.Tensor, s: SamplingParams, gen: torch.Generator | None) -> tuple[int, float]:
        if s.temperature <= 0:
            token = int(torch.argmax(logits))
            return token, float(torch.log_softmax(logits, -1)[token])
        scaled = logits / s.temperature
        logp = torch.log_softmax(logits if self.logprobs_before_temperature else scaled, -1)
        filtered = scaled.clone()
        if s.top_k is not None and 0 < s.top_k < filtered.numel():
            kth = torch.topk(filtered, s.top_k).values[-1]
            filtered[filtered < kth] = float("-inf")
        if s.top_p < 1.0:
            sorted_logits, order = torch.sort(filtered, descending=True)
            probs = torch.softmax(sorted_logits, -1)
            # drop a token when the mass before it already reaches top_p; the most likely one
            # always stays (a top_p below float32's smallest value compared 0 >= 0 and dropped all)
            drop = torch.cumsum(probs, -1) - probs >= s.top_p
            drop[0] = False
            filtered[order[drop]] = float("-inf")
        probs = torch.softmax(filtered, -1)
        token = int(torch.multinomial(probs, 1, generator=gen))
        return token, float(logp[token])

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ scoring
    async def score(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int], *,
                    routing_key: str | None = None, request_id: str | None = None) -> list[float]:
        """log p of each continuation token after the prompt (parser.serving.backends.scoring), off the event loop."""
        return await asyncio.to_thread(self.score_ids, prompt_ids, continuation_ids)

    def score_ids(self, prompt_ids: Sequence[int], continuation_ids: Sequence[int]) -> list[float]:
        """Blocking `score` (thread-safe): one teacher-forced pass at temperature 1 on the worker,
        between two decode steps (`run_exclusive`)."""
        prompt, continuation = check_request(self._check_ids(prompt_ids, "prompt"),
                                             self._check_ids(continuation_ids, "continuation"), "TransformersBackend")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit and len(prompt) + len(continuation) > limit:
            raise BackendError(f"TransformersBackend: {len(prompt)} + {len(continuation)} tokens to score exceed "
                               f"max_position_embeddings {limit}", retryable=False)
        return self.run_exclusive(lambda: self._teacher_forced(prompt, continuation))

    def _teacher_forced(self, prompt: list[int], continuation: list[int]) -> list[float]:
        """The prompt once (its last logits predict the first continuation token), then the
        continuation in slices of SCORE_SLICE tokens through a fresh KV cache, so a long
        continuation never holds more than SCORE_SLICE x vocabulary logits at once."""
        cache = DynamicCache(config=self.model.config)
        previous = self._forward(cache, prompt)[None]
        values: list[float] = []
        for start in range(0, len(continuation), SCORE_SLICE):
            piece = continuation[start:start + SCORE_SLICE]
            x = torch.tensor([piece], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=x, past_key_values=cache, use_cache=True).logits[0].float().to("cpu")
            predicting = torch.cat([previous, logits[:-1]])  # row j predicts piece[j]
            chosen = torch.log_softmax(predicting, -1).gather(-1, torch.tensor(piece)[:, None])
            values.extend(chosen[:, 0].tolist())
            previous = logits[-1:]
        return values


# ---------------------------------------------------------------------- helpers
def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in CHATML.stop_tokens if t in vocab)
    return ids


def _nbytes(entry: _Entry) -> int:
    """Memory held by one entry: attention KV, recurrent state, and its snapshots."""
    tensors = []
    for layer in entry.cache.layers:
        tensors += [getattr(layer, name, None) for name in ("keys", "values", "conv_states", "recurrent_states")]
    for states in entry.snapshots.values():
        tensors += [t for state in states if state is not None for t in state]
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _snapshot(cache: Any) -> list[Any]:
    """Copies of every recurrent layer's state (None for pure attention layers)."""
    states = []
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin) and layer.has_previous_state:
            states.append((
                layer.conv_states.clone() if layer.is_conv_states_initialized else None,
                layer.recurrent_states.clone() if layer.is_recurrent_states_initialized else None,
            ))
        else:
            states.append(None)
    return states


def _restore(layer: Any, state: tuple[Any, Any]) -> None:
    conv, recurrent = state
    if conv is not None:
        layer.conv_states.copy_(conv)
    if recurrent is not None:
        layer.recurrent_states.copy_(recurrent)
    layer.has_previous_state = True


def _settle(future: concurrent.futures.Future, fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except Exception as error:  # noqa: BLE001 - the caller of run_exclusive gets it
        future.set_exception(error)


def _check_sampling(s: SamplingParams) -> None:
    """A request the sampler cannot honour is refused up front as a non-retryable BackendError
    (every worker would refuse it the same way), not a ValueError/RuntimeError from torch mid-batch."""
    def refuse(field: str, why: str) -> None:
        raise BackendError(f"TransformersBackend: sampling {field}={getattr(s, field)!r} {why}", retryable=False)

    if isinstance(s.max_new_tokens, bool) or not isinstance(s.max_new_tokens, int) or s.max_new_tokens < 1:
        refuse("max_new_tokens", "is not an integer >= 1")
    for field in ("temperature", "top_p"):
        value = getattr(s, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            refuse(field, "is not a finite number")
    if not 0 < s.top_p <= 1:
        refuse("top_p", "is not in (0, 1]")
    if s.top_k is not None and (isinstance(s.top_k, bool) or not isinstance(s.top_k, int)):
        refuse("top_k", "is not an integer")
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int) or not -2 ** 63 <= s.seed < 2 ** 64):
        refuse("seed", "is not an integer in [-2**63, 2**64) (torch.Generator's seed range)")


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    hits = [text.find(stop) for stop in stops if stop]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else None
