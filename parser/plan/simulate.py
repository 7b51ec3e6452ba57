"""Discrete-event simulation (simpy) of ParSer episodes and of sequential memory reading.

Why a simulation: a scatter round is a burst of T x q requests onto W workers, and with
concurrency c the bursts of c episodes interleave with their lead turns; the round ends when
its slowest worker does, a worker's cache holds only so many chunk prefixes (LRU), and a miss
re-prefills the whole chunk. Closed forms get the mean right and the tail (hash imbalance,
queueing behind another episode's burst, cache thrash) wrong; the simulation runs the same
protocol as `parser.engine.episode.EpisodeEngine`:

    lead turn -> scatter every query of the turn to every chunk's pinned worker -> wait for all
    -> append the observation -> ... -> answering lead turn

Each server takes FIFO batches of up to `Rates.max_batch` requests and holds them for
`Rates.batch_seconds` (static batching: a scatter burst arrives at once, so continuous
batching admits the same batch). MemAgent (sequential memory reading) is one request per
chunk per sample, in order, each prefilling chunk + memory and decoding a new memory.

The peers (issue 54; docs/scaling.md "Peers"): InfMem is MemAgent's loop with a planner call
before every write, on the same sequential server: plan, write, plan, write, ..., answer: 2 x
chunks + 1 calls on the critical path, fewer when its early stop ends the reading
(`infmem_read_fraction`). RLM's cost is whatever code its root writes; the model here is rlms'
own suggested strategy (its system prompt: split the context into slices of ~100K characters,
`llm_query_batched` over them, one `llm_query` to combine): `rlm_turns` root calls on the lead's
server with a growing history, of which `rlm_map_turns` each run one batched round of sub-calls
over the whole document (one per `rlm_slice_tokens` slice, on the subagent workers, no prefix
reuse: each slice is a new prompt) and then one combining sub-call. Its critical path is
`rlm_turns` + 2 x `rlm_map_turns` calls whatever the length; its work grows with the slices.

    result = simulate_parser(workload, cluster)
    result.latency_s, result.amortized_s, result.hit_rate, result.workers
    simulate_infmem(workload, cluster).sequential_steps   # 2 x chunks + 1 without early stop
"""
from __future__ import annotations

import collections
import dataclasses
import math
import random
from typing import Any, Callable, Sequence

import simpy

from parser.plan.memory import ModelSpec
from parser.plan.rates import Job, Rates


@dataclasses.dataclass
class Workload:
    """One evaluation workload. Token counts are in the subagent's tokenizer."""

    doc_tokens: int
    chunk_size: int = 4096
    num_chunks: int | None = None  # None: ceil(doc_tokens / chunk_size)
    frame_tokens: int = 200  # subagent instructions + template around the chunk (cached with it)
    query_tokens: int = 40  # the query and the template tail after it (new every round)
    subagent_output_tokens: Sequence[int] = (16,)  # drawn per call, seeded
    rounds: int = 3  # lead turns that call query_agents; one more turn answers
    queries_per_round: float = 1.0  # a fraction q: each turn issues floor(q) or floor(q) + 1 queries
    lead_prompt_tokens: int = 600  # system prompt + tool schema + question
    lead_output_tokens: int = 300  # per lead turn
    observation_tokens: int = 150  # per query, the gathered findings
    concurrency: int = 1  # episodes in flight
    samples: int = 8  # episodes simulated (amortized time = makespan / samples)
    seed: int = 0
    doc_id_prefix: str = "doc"  # episode i reads document f"{doc_id_prefix}{i}"; chunk keys are f"{doc_id}:{chunk}"
    # sequential memory reading (MemAgent)
    memagent_chunk_size: int = 5000
    memagent_frame_tokens: int = 300
    memory_tokens: int = 1024  # the memory written after every chunk
    answer_tokens: int = 64
    # InfMem (on the sequential server; its chunk, memory and answer sizes are MemAgent's fields above)
    infmem_chunk_size: int = 5000
    infmem_plan_tokens: int = 256  # one planner reply (thinking + the ✿FUNCTION✿ call or STOP)
    infmem_plan_frame_tokens: int = 700  # Qwen-Agent's function-calling system text + the planner template
    infmem_retrieved_tokens: int = 4000  # the write's retrieved windows: top_k 8 x 500 tokens (their default)
    infmem_read_fraction: float = 1.0  # chunks read before the STOP plans end it (1.0: never stops)
    infmem_early_stop: int = 3  # STOP plans in a row that end the reading: it never stops before this many plans
    # RLM (root on the lead's server, sub-calls on the subagent workers)
    rlm_turns: int = 3  # root calls: probe, map, answer (rlms' suggested strategy)
    rlm_map_turns: int = 1  # turns that map over the whole document (a batched round, then one combine)
    rlm_slice_tokens: int = 25_000  # one map sub-call's slice: rlms' ~100K characters
    rlm_system_tokens: int = 1500  # rlms' system prompt + metadata message
    rlm_root_output_tokens: int = 400  # one root reply (code)
    rlm_repl_output_tokens: int = 500  # REPL output appended to the root's history per turn
    rlm_sub_output_tokens: int = 64  # one sub-call's answer
    rlm_sub_frame_tokens: int = 100  # a sub-call's instruction around its slice (or the answers it combines)

    @property
    def chunks(self) -> int:
        return self.num_chunks or max(1, math.ceil(self.doc_tokens / self.chunk_size))

    @property
    def prefix_tokens(self) -> int:
        """Tokens of one chunk's resident prefix (instructions + chunk)."""
        return math.ceil(self.doc_tokens / self.chunks) + self.frame_tokens

    @property
    def memagent_steps(self) -> int:
        return max(1, math.ceil(self.doc_tokens / self.memagent_chunk_size))

    @property
    def infmem_chunks(self) -> int:
        return max(1, math.ceil(self.doc_tokens / self.infmem_chunk_size))

    @property
    def infmem_plans(self) -> int:
        """Planner calls: one per chunk read. Reading that ends early ends at a STOP plan, after at
        least `infmem_early_stop` plans (the STOP plans before it were each followed by a write)."""
        read = math.ceil(self.infmem_read_fraction * self.infmem_chunks)
        return self.infmem_chunks if read >= self.infmem_chunks else min(self.infmem_chunks, max(1, read, self.infmem_early_stop))

    @property
    def infmem_writes(self) -> int:
        """Memory writes: one after each plan but the one that stopped the reading."""
        return self.infmem_plans - (self.infmem_plans < self.infmem_chunks)

    @property
    def infmem_steps(self) -> int:
        """Calls on InfMem's critical path: plans + writes + the answer (2 x chunks + 1 when it never stops)."""
        return self.infmem_plans + self.infmem_writes + 1

    @property
    def rlm_slices(self) -> int:
        """Sub-calls of one map round: the document in `rlm_slice_tokens` slices."""
        return max(1, math.ceil(self.doc_tokens / self.rlm_slice_tokens))

    @property
    def rlm_sub_calls(self) -> int:
        """Sub-model calls: per map turn, one batched round over every slice and its combine."""
        return self.rlm_map_turns * (self.rlm_slices + 1)

    @property
    def rlm_steps(self) -> int:
        """Calls on RLM's critical path: every root call, and per map turn its batched round and its combine."""
        return self.rlm_turns + 2 * self.rlm_map_turns


@dataclasses.dataclass
class Cluster:
    """Servers: W subagent workers, the lead's server, and the server(s) running MemAgent."""

    subagent_rates: Rates
    subagent_workers: int = 1
    lead_rates: Rates | None = None  # None: a scripted lead that takes no time
    lead_workers: int = 1  # lead servers (rollout replicas); episodes are spread round robin
    memagent_rates: Rates | None = None
    memagent_workers: int = 1
    spec: ModelSpec | None = None  # the subagent model: cache bytes per prefix
    cache_bytes: float = math.inf  # per subagent worker, for resident prefixes
    cache_entries: int | None = None  # per worker (the CPU backend also bounds entry count)
    routing: str = "cache_aware"  # cache_aware (sticky, new chunks to the emptiest worker) | rendezvous
    # What the gateway adds to each subagent request (its p50 over a direct request, measured by
    # scripts/gateway_report.py --direct; configs/plan/router/). Requests of a round pass it in
    # parallel, so it lengthens each scatter round once; the router is not modelled as a queue.
    router_latency_s: float = 0.0
    # The CPU transformers backend on a hybrid (linear-attention) model snapshots the recurrent
    # state every N prefill tokens: a key's first reuse resumes from the last snapshot inside the
    # prefix, later reuses from the exact prefix end. None: exact reuse (attention-only models, SGLang).
    snapshot_every: int | None = None


class LruCache:
    """Prefix cache of one worker: key -> bytes, least recently used evicted first."""

    def __init__(self, capacity_bytes: float, capacity_entries: int | None, snapshot_every: int | None = None):
        self.capacity_bytes, self.capacity_entries = capacity_bytes, capacity_entries
        self.snapshot_every = snapshot_every
        self.entries: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.uses: dict[str, int] = {}
        self.bytes = 0
        self.peak_bytes = 0

    def reusable(self, key: str, prefix: int) -> int:
        """Tokens of `prefix` a request with `key` can skip (0 on a miss)."""
        if key not in self.entries:
            return 0
        if self.snapshot_every and self.uses.get(key, 0) < 2:
            return prefix // self.snapshot_every * self.snapshot_every
        return prefix

    def put(self, key: str, nbytes: int) -> None:
        self.uses[key] = self.uses.get(key, 0) + 1 if key in self.entries else 1
        self.bytes -= self.entries.pop(key, 0)
        self.entries[key] = nbytes
        self.bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        while self.entries and (self.bytes > self.capacity_bytes or
                                (self.capacity_entries is not None and len(self.entries) > self.capacity_entries)):
            evicted, nbytes = self.entries.popitem(last=False)
            self.uses.pop(evicted, None)
            self.bytes -= nbytes


@dataclasses.dataclass
class _Pending:
    key: str | None
    prefix: int  # tokens reusable if the key is cached
    suffix: int  # tokens always prefilled
    output: int
    arrived: float
    done: simpy.Event


class Server:
    """One model server: FIFO batches, the rates' cost model, an optional prefix cache."""

    def __init__(self, env: simpy.Environment, rates: Rates, cache: LruCache | None = None,
                 entry_bytes: Callable[[int], int] | None = None):
        self.env, self.rates, self.cache = env, rates, cache
        self.entry_bytes = entry_bytes or (lambda tokens: 0)
        self.queue: collections.deque[_Pending] = collections.deque()
        self._wake = env.event()
        self.busy_s = 0.0
        self.requests = self.hits = self.lookups = 0
        self.wait_s = 0.0
        self.max_queue = 0
        self.assigned_bytes = 0  # resident prefixes routed here (cache-aware placement)
        env.process(self._loop())

    def submit(self, key: str | None, prefix: int, suffix: int, output: int) -> simpy.Event:
        done = self.env.event()
        self.queue.append(_Pending(key, prefix, suffix, output, self.env.now, done))
        self.max_queue = max(self.max_queue, len(self.queue))
        if not self._wake.triggered:
            self._wake.succeed()
        return done

    def _loop(self):
        while True:
            if not self.queue:
                self._wake = self.env.event()
                yield self._wake
            batch = [self.queue.popleft() for _ in range(min(self.rates.max_batch, len(self.queue)))]
            jobs = []
            for item in batch:
                cached = 0
                if self.cache is not None and item.key is not None:
                    self.lookups += 1
                    cached = self.cache.reusable(item.key, item.prefix)
                    self.hits += cached > 0
                jobs.append(Job(item.prefix + item.suffix - cached, cached, item.output))
                self.wait_s += self.env.now - item.arrived
            seconds = self.rates.batch_seconds(jobs)
            yield self.env.timeout(seconds)
            self.busy_s += seconds
            self.requests += len(batch)
            for item in batch:
                if self.cache is not None and item.key is not None:
                    self.cache.put(item.key, self.entry_bytes(item.prefix + item.suffix + item.output))
                item.done.succeed()


@dataclasses.dataclass
class WorkerStats:
    requests: int
    busy_fraction: float
    mean_wait_s: float
    max_queue: int
    hit_rate: float
    peak_cache_bytes: int


@dataclasses.dataclass
class Result:
    latency_s: float  # mean per-episode wall time
    amortized_s: float  # makespan / samples (the paper's Table 2 metric)
    throughput_per_s: float
    hit_rate: float  # chunk-prefix hits over subagent requests
    workers: list[WorkerStats]
    sequential_steps: float  # lead turns (ParSer) or model calls (MemAgent) per episode

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _worker_stats(servers: Sequence[Server], makespan: float) -> list[WorkerStats]:
    return [WorkerStats(s.requests, s.busy_s / makespan if makespan else 0.0, s.wait_s / max(s.requests, 1),
                        s.max_queue, s.hits / s.lookups if s.lookups else 0.0,
                        s.cache.peak_bytes if s.cache else 0) for s in servers]


class Router:
    """Which worker serves a key: sticky once placed."""

    def __init__(self, servers: Sequence[Server], policy: str, prefix_bytes: int):
        if policy not in ("cache_aware", "rendezvous"):
            raise ValueError(f"routing={policy!r}; expected cache_aware or rendezvous")
        self.servers, self.policy, self.prefix_bytes = list(servers), policy, prefix_bytes
        self.placed: dict[str, Server] = {}
        if policy == "rendezvous":  # the same ranking as parser.serving.backends.pool.WorkerPool
            from parser.serving.backends.pool import WorkerPool

            self._pool = WorkerPool([None] * len(self.servers))  # type: ignore[list-item]

    def route(self, key: str) -> Server:
        server = self.placed.get(key)
        if server is None:
            if self.policy == "rendezvous":
                server = self.servers[self._pool.ranking(key)[0]]
            else:  # SGLang's cache_aware with no prefix match: the worker with the smallest tree
                server = min(self.servers, key=lambda s: (s.assigned_bytes, len(s.queue)))
            server.assigned_bytes += self.prefix_bytes
            self.placed[key] = server
        return server


def simulate_parser(workload: Workload, cluster: Cluster) -> Result:
    """ParSer episodes at `workload.concurrency` on `cluster`."""
    wl, env = workload, simpy.Environment()
    spec = cluster.spec
    entry = (lambda tokens: spec.prefix_bytes(tokens)) if spec is not None else None
    workers = [Server(env, cluster.subagent_rates,
                      LruCache(cluster.cache_bytes, cluster.cache_entries, cluster.snapshot_every), entry)
               for _ in range(cluster.subagent_workers)]
    router = Router(workers, cluster.routing, spec.prefix_bytes(wl.prefix_tokens) if spec else 0)
    leads = [Server(env, cluster.lead_rates, LruCache(math.inf, None)) for _ in range(cluster.lead_workers)
             ] if cluster.lead_rates else []
    rng = random.Random(wl.seed)
    latencies: list[float] = []

    def episode(sample: int):
        started, context, cached = env.now, wl.lead_prompt_tokens, 0
        lead = leads[sample % len(leads)] if leads else None
        for turn in range(wl.rounds + 1):
            if lead is not None:
                yield lead.submit(f"lead{sample}", cached, context - cached, wl.lead_output_tokens)
            if turn == wl.rounds:
                break
            whole = int(wl.queries_per_round)
            queries = max(1, whole + (rng.random() < wl.queries_per_round - whole))
            keys = [f"{wl.doc_id_prefix}{sample}:{chunk}" for chunk in range(wl.chunks)]
            if cluster.router_latency_s:
                yield env.timeout(cluster.router_latency_s)
            calls = [router.route(key).submit(key, wl.prefix_tokens, wl.query_tokens, rng.choice(wl.subagent_output_tokens))
                     for _ in range(queries) for key in keys]
            yield simpy.AllOf(env, calls)
            cached = context + wl.lead_output_tokens
            context = cached + queries * wl.observation_tokens
        latencies.append(env.now - started)

    makespan = _run_closed_loop(env, episode, wl.samples, wl.concurrency)
    lookups = sum(w.lookups for w in workers)
    return Result(sum(latencies) / len(latencies), makespan / wl.samples, wl.samples / makespan,
                  sum(w.hits for w in workers) / lookups if lookups else 0.0, _worker_stats(workers, makespan),
                  wl.rounds + 1)


def simulate_memagent(workload: Workload, cluster: Cluster) -> Result:
    """Sequential memory reading: per sample, one call per chunk in order, then the answer."""
    wl, env = workload, simpy.Environment()
    if cluster.memagent_rates is None:
        raise ValueError("simulate_memagent needs cluster.memagent_rates")
    servers = [Server(env, cluster.memagent_rates) for _ in range(cluster.memagent_workers)]
    latencies: list[float] = []

    def episode(sample: int):
        started, server = env.now, servers[sample % len(servers)]
        for step in range(wl.memagent_steps):
            memory = wl.memory_tokens if step else 0
            yield server.submit(None, 0, wl.memagent_frame_tokens + wl.memagent_chunk_size + memory, wl.memory_tokens)
        yield server.submit(None, 0, wl.memagent_frame_tokens + wl.memory_tokens, wl.answer_tokens)
        latencies.append(env.now - started)

    makespan = _run_closed_loop(env, episode, wl.samples, wl.concurrency)
    return Result(sum(latencies) / len(latencies), makespan / wl.samples, wl.samples / makespan, 0.0,
                  _worker_stats(servers, makespan), wl.memagent_steps + 1)


def simulate_infmem(workload: Workload, cluster: Cluster) -> Result:
    """InfMem on the sequential server(s): per chunk read a planner call, then (unless the plan
    stopped the reading) the memory write over the retrieved windows, the chunk and the memory;
    then the answer from the memory."""
    wl, env = workload, simpy.Environment()
    if cluster.memagent_rates is None:
        raise ValueError("simulate_infmem needs cluster.memagent_rates (the sequential readers' server)")
    servers = [Server(env, cluster.memagent_rates) for _ in range(cluster.memagent_workers)]
    writes = wl.infmem_writes
    latencies: list[float] = []

    def episode(sample: int):
        started, server = env.now, servers[sample % len(servers)]
        for step in range(wl.infmem_plans):
            memory = wl.memory_tokens if step else 0
            yield server.submit(None, 0, wl.infmem_plan_frame_tokens + memory, wl.infmem_plan_tokens)
            if step < writes:
                yield server.submit(None, 0, wl.memagent_frame_tokens + wl.infmem_retrieved_tokens + wl.infmem_chunk_size
                                    + memory, wl.memory_tokens)
        yield server.submit(None, 0, wl.memagent_frame_tokens + wl.memory_tokens, wl.answer_tokens)
        latencies.append(env.now - started)

    makespan = _run_closed_loop(env, episode, wl.samples, wl.concurrency)
    return Result(sum(latencies) / len(latencies), makespan / wl.samples, wl.samples / makespan, 0.0,
                  _worker_stats(servers, makespan), wl.infmem_steps)


def simulate_rlm(workload: Workload, cluster: Cluster) -> Result:
    """RLM as the module docstring models it: `rlm_turns` root calls on the lead's server (the
    history re-sent each turn, its prefix reused), the first `rlm_map_turns` after the probe each
    followed by a batched round of `rlm_slices` sub-calls spread over the subagent workers and one
    combining sub-call. A scripted root (`lead_rates` None) takes no time."""
    wl, env = workload, simpy.Environment()
    if not 0 <= wl.rlm_map_turns < wl.rlm_turns:
        raise ValueError(f"rlm_map_turns={wl.rlm_map_turns}: map turns come after the probe turn, so 0 <= it < "
                         f"rlm_turns={wl.rlm_turns}")
    workers = [Server(env, cluster.subagent_rates) for _ in range(cluster.subagent_workers)]
    piece = math.ceil(wl.doc_tokens / wl.rlm_slices) + wl.rlm_sub_frame_tokens
    combine = wl.rlm_slices * wl.rlm_sub_output_tokens + wl.rlm_sub_frame_tokens
    roots = [Server(env, cluster.lead_rates, LruCache(math.inf, None)) for _ in range(cluster.lead_workers)
             ] if cluster.lead_rates else []
    latencies: list[float] = []

    def episode(sample: int):
        started, context, cached = env.now, wl.rlm_system_tokens, 0
        root = roots[sample % len(roots)] if roots else None
        for turn in range(wl.rlm_turns):
            if root is not None:
                yield root.submit(f"root{sample}", cached, context - cached, wl.rlm_root_output_tokens)
            if 1 <= turn <= wl.rlm_map_turns:
                calls = [workers[i % len(workers)].submit(None, 0, piece, wl.rlm_sub_output_tokens)
                         for i in range(wl.rlm_slices)]
                yield simpy.AllOf(env, calls)
                yield workers[sample % len(workers)].submit(None, 0, combine, wl.rlm_sub_output_tokens)
            cached = context + wl.rlm_root_output_tokens
            context = cached + wl.rlm_repl_output_tokens
        latencies.append(env.now - started)

    makespan = _run_closed_loop(env, episode, wl.samples, wl.concurrency)
    return Result(sum(latencies) / len(latencies), makespan / wl.samples, wl.samples / makespan, 0.0,
                  _worker_stats(workers, makespan), wl.rlm_steps)


def _run_closed_loop(env: simpy.Environment, episode: Callable[[int], Any], samples: int, concurrency: int) -> float:
    """`samples` episodes, `concurrency` at a time (an eval loop with a semaphore); the makespan."""
    if samples < 1 or concurrency < 1:
        raise ValueError(f"samples={samples}, concurrency={concurrency}: both must be >= 1")
    pending = collections.deque(range(samples))

    def slot():
        while pending:
            yield env.process(episode(pending.popleft()))

    env.run(simpy.AllOf(env, [env.process(slot()) for _ in range(min(concurrency, samples))]))
    return env.now
