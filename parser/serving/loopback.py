"""A zero-compute loopback worker: SGLang/OpenAI-shaped answers in microseconds.

Why it exists: to measure what the *client* and the *gateway* cost without a model in the
way (scatter throughput, `scripts/bench_scatter.py`) and to check routing (does a chunk keep
landing on the same worker?). Bodies are read and written through `parser.serving.wire.dialect`, the
objects the client and `parser.serving.server` use (a body they refuse is a 400 here too). Each request is recorded with the routing-key header, the hash
of the prompt's reusable prefix (what a RadixCache would share: everything before the last
"Query:", per the subagent prompt's instructions -> chunk -> query order) and this worker's
id. It answers with the subagent's abstention, or with a finding when the prompt contains
`needle`, or (`reader="world"`) as a reader of the synthetic world's prose would
(`parser.serving.world_reader`: the frozen subagents of the CPU learning run).

Faults, for retry tests and the router fault table (`scripts/gateway_faults.py`): a delay;
failing the first N or every K-th request with an HTTP status, by dropping the connection
without an answer, with `garbage` (HTTP 200 with a body that is no completion: each dialect's
`empty_reply`), or with `hang` (the request is held
for `hang_s` and then dropped, while /health keeps answering: a wedged scheduler behind a live
HTTP server); and flapping (`flap_period_s`: down for one period, up for the next, and so on,
where down answers 503 on every path, /health included, as a restarting server does). A
running worker takes new fault knobs from `POST /fault` (the harness injects a fault
mid-run); a frozen or killed process is the harness's business (SIGSTOP / SIGKILL).

    parser loopback --port 31001 --worker-id w1
    parser loopback --port 31002 --worker-id w2 --fail-every 10 --fail-mode drop
    parser loopback --port 31003 --reader world      # reads synthetic-world chunks
    curl -X POST 127.0.0.1:31001/fault -d '{"fail_every": 1, "fail_mode": "garbage"}'

In-process: `with start_loopback("w1") as h: h.url; h.worker.records`.
Endpoints: POST each dialect's path (/generate, /v1/completions, /v1/chat/completions); GET /health,
/health_generate, /server_info, /model_info (and their older /get_ names), /get_load,
/v1/models, /records; POST /reset, /fault, /hold, /release (hold every request in flight until
released: a test counts them on /get_load instead of guessing a delay).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import threading
import time
from typing import Any

import orjson
from aiohttp import web

from pydantic import ValidationError

from parser.serving.types import ROUTING_HEADER, Completion
from parser.serving.server import BACKLOG, ServerHandle, add_worker_header, json_response
from parser.serving.wire.common import Bounds, ErrorBody, ModelCard, ModelList, describe
from parser.serving.wire.dialect import DIALECTS, Dialect

ABSTENTION = '{"answer": "unknown"}'  # parser/engine/prompts/v1/subagent.txt's abstention
PREFIX_MARKER = "Query:"
FAIL_MODES = ("drop", "garbage", "hang")  # besides an HTTP status like "500"
MAX_HANG_S = 3600.0  # a held request is dropped after at most this long: nothing waits forever
# the knobs POST /fault may set, with their types
FAULT_KNOBS = {"delay_s": float, "fail_first": int, "fail_every": int, "fail_mode": str,
               "hang_s": float, "flap_period_s": float}


@dataclasses.dataclass
class RequestRecord:
    worker_id: str
    path: str
    routing_key: str | None
    request_id: str | None
    prefix_hash: str
    prompt_len: int  # characters for text prompts, tokens for token-id prompts
    time: float
    prompt: Any = None  # the whole prompt, with `keep_prompts` (parity tests compare them)


def prefix_hash(prompt: Any, marker: str = PREFIX_MARKER, prefix_chars: int = 2048) -> str:
    """Hash of the part of a prompt a prefix cache would reuse across rounds.

    Text: everything before the last `marker` (the query follows it); without the marker, the
    first `prefix_chars` characters. Token ids: the first `prefix_chars // 4` ids.
    """
    if isinstance(prompt, str):
        cut = prompt.rfind(marker) if marker else -1
        data = (prompt[:cut] if cut >= 0 else prompt[:prefix_chars]).encode()
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):  # chat messages
        data = orjson.dumps(prompt[:-1]) + prefix_hash(prompt[-1].get("content", ""), marker,
                                                       prefix_chars).encode()
    else:
        data = orjson.dumps(list(prompt)[: prefix_chars // 4])
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class LoopbackWorker:
    """The request handlers and their fault knobs (plain attributes: tests may flip them)."""

    def __init__(self, worker_id: str = "loopback-0", *, delay_s: float = 0.0,
                 fail_first: int = 0, fail_every: int = 0, fail_mode: str = "500",
                 hang_s: float = 600.0, flap_period_s: float = 0.0,
                 needle: str | None = None, needle_answer: str | None = None, reader: str | None = None,
                 routing_header: str = ROUTING_HEADER, request_id_header: str = "X-Request-Id",
                 prefix_marker: str = PREFIX_MARKER, keep_records: bool = True, keep_prompts: bool = False):
        self.worker_id = worker_id
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.fail_every = fail_every
        self.fail_mode = fail_mode
        self.hang_s = hang_s
        self.flap_period_s = flap_period_s
        self.flap_since = time.monotonic()
        self.check_faults()
        self.needle = needle
        self.needle_answer = needle_answer
        if reader not in (None, "world"):
            raise ValueError(f"reader={reader!r}: expected None or 'world'")
        self.reader = reader
        self.routing_header = routing_header
        self.request_id_header = request_id_header
        self.prefix_marker = prefix_marker
        self.keep_records = keep_records
        self.keep_prompts = keep_prompts
        self.records: list[RequestRecord] = []
        self.count = 0
        self.inflight = 0
        self.inflight_len = 0
        self.held = 0  # requests held by fail_mode "hang"
        # A test that must see a request in flight sets `hold` (in flight until it is set) and waits
        # on `in_flight` (set once a request is counted by /get_load): no guessed delay.
        self.hold: threading.Event | None = None
        self.in_flight = threading.Event()

    def check_faults(self) -> None:
        """Refuse knobs that would make the worker misbehave in a way nobody asked for."""
        if self.fail_mode not in FAIL_MODES and not self.fail_mode.isdigit():
            raise ValueError(f"fail_mode={self.fail_mode!r}: expected an HTTP status like '500', or one of {FAIL_MODES}")
        if not 0 <= self.hang_s <= MAX_HANG_S:
            raise ValueError(f"hang_s={self.hang_s}: expected 0..{MAX_HANG_S:.0f} seconds")
        if self.flap_period_s < 0 or self.delay_s < 0 or self.fail_first < 0 or self.fail_every < 0:
            raise ValueError("delay_s, fail_first, fail_every and flap_period_s must be >= 0")

    def down(self) -> bool:
        """True in the down half of a flap cycle (which starts down when flapping is set)."""
        if not self.flap_period_s:
            return False
        return int((time.monotonic() - self.flap_since) / self.flap_period_s) % 2 == 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2, middlewares=[self._flap])
        add_worker_header(app, self.worker_id)
        for dialect in DIALECTS.values():
            app.router.add_post(dialect.path, self.handler(dialect))
        info = {"model_path": "loopback", "tokenizer_path": "loopback", "is_generation": True,
                "dp_size": 1, "version": "parser-loopback", "worker_id": self.worker_id}
        for path in ("/health", "/health_generate", "/server_info", "/model_info", "/get_model_info",
                     "/get_server_info"):
            app.router.add_get(path, lambda r, info=info: json_response(info))
        app.router.add_get("/v1/models", lambda r: json_response(ModelList(data=[ModelCard(id="loopback")]).reply()))
        app.router.add_get("/get_load", lambda r: json_response([{
            "dp_rank": 0, "num_reqs": self.inflight, "num_waiting_reqs": self.held,
            "num_tokens": self.inflight_len}]))
        app.router.add_get("/records", self.dump_records)
        app.router.add_post("/reset", self.reset)
        app.router.add_post("/fault", self.set_fault)
        app.router.add_post("/hold", self.start_holding)
        app.router.add_post("/release", self.release)
        return app

    @web.middleware
    async def _flap(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path not in ("/fault", "/records", "/reset") and self.down():
            return json_response(ErrorBody.of(f"loopback {self.worker_id}: down (flapping)", 503).reply(), 503)
        return await handler(request)

    def reply_text(self, prompt: Any) -> str:
        if self.reader == "world":
            from parser.serving.world_reader import reply_to_prompt

            return reply_to_prompt(prompt)
        text = prompt if isinstance(prompt, str) else (
            orjson.dumps(prompt).decode() if prompt and isinstance(prompt[0], dict) else "")
        if self.needle and self.needle in text:
            return orjson.dumps({"evidence": self.needle,
                                 "answer": self.needle_answer or self.needle}).decode()
        return ABSTENTION

    def handler(self, dialect: Dialect):
        """The request handler of one wire format."""
        return lambda request: self.handle(request, dialect)

    async def handle(self, request: web.Request, dialect: Dialect) -> web.StreamResponse:
        self.count += 1
        n = self.count
        path = dialect.path
        try:
            body = dialect.read(await request.read(), Bounds())
        except ValidationError as error:
            return json_response(ErrorBody.of(describe(error, path), 400).reply(), 400)
        prompt = dialect.prompt_of(body)
        if self.keep_records:
            self.records.append(RequestRecord(
                worker_id=self.worker_id, path=path,
                routing_key=request.headers.get(self.routing_header),
                request_id=request.headers.get(self.request_id_header),
                prefix_hash=prefix_hash(prompt, self.prefix_marker),
                prompt_len=len(prompt), time=time.time(), prompt=prompt if self.keep_prompts else None,
            ))
        if self.delay_s or self.hold is not None:
            self.inflight += 1
            self.inflight_len += len(prompt)
            self.in_flight.set()
            try:
                await asyncio.sleep(self.delay_s)
                if self.hold is not None:
                    await asyncio.to_thread(self.hold.wait, MAX_HANG_S)
            finally:
                self.inflight -= 1
                self.inflight_len -= len(prompt)
        if n <= self.fail_first or (self.fail_every and n % self.fail_every == 0):
            if self.fail_mode == "drop":
                request.transport.close()  # no status line: the client sees a disconnect
                raise asyncio.CancelledError
            if self.fail_mode == "garbage":  # "success" that no client can use
                return json_response(dialect.empty_reply())
            if self.fail_mode == "hang":  # held, then dropped: the caller's deadline decides
                self.held += 1  # reported as waiting by /get_load, as a wedged scheduler's queue grows
                try:
                    await asyncio.sleep(self.hang_s)
                finally:
                    self.held -= 1
                request.transport.close()
                raise asyncio.CancelledError
            status = int(self.fail_mode)
            return json_response(ErrorBody.of(f"loopback {self.worker_id}: injected failure on request {n}", status).reply(),
                                 status)
        return json_response(_reply(dialect, self.reply_text(prompt), len(prompt)))

    async def dump_records(self, request: web.Request) -> web.Response:
        return json_response([dataclasses.asdict(r) for r in self.records])

    async def reset(self, request: web.Request) -> web.Response:
        self.records.clear()
        self.count = 0
        return json_response({"status": "ok"})

    async def start_holding(self, request: web.Request) -> web.Response:
        """POST /hold: every request from now on is held in flight (counted by /get_load) until
        POST /release; another process's test synchronises on the count, not on a delay."""
        if self.hold is None:
            self.hold = threading.Event()
        return json_response({"status": "holding"})

    async def release(self, request: web.Request) -> web.Response:
        """POST /release: answer the held requests, and hold no more."""
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.set()
        return json_response({"status": "released", "in_flight": self.inflight})

    async def set_fault(self, request: web.Request) -> web.Response:
        """POST /fault {"fail_every": 1, "fail_mode": "garbage"}: new fault knobs, from now on."""
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict) or not set(body) <= set(FAULT_KNOBS):
                raise ValueError(f"expected an object with keys from {sorted(FAULT_KNOBS)}")
            old = {k: getattr(self, k) for k in FAULT_KNOBS}
            for key, value in body.items():
                setattr(self, key, FAULT_KNOBS[key](value))
            try:
                self.check_faults()
            except ValueError:
                for key, value in old.items():
                    setattr(self, key, value)
                raise
        except (ValueError, TypeError, orjson.JSONDecodeError) as error:
            return json_response(ErrorBody.of(f"POST /fault: {error}", 400).reply(), 400)
        self.count = 0  # fail_first / fail_every count from the change
        self.flap_since = time.monotonic()
        return json_response({k: getattr(self, k) for k in FAULT_KNOBS})


def _reply(dialect: Dialect, text: str, prompt_len: int) -> dict[str, Any]:
    """`text` as `dialect`'s reply, with logprobs. Token ids are byte values (no tokenizer)."""
    ids = list(text.encode())
    comp = Completion(text=text, token_ids=ids, logprobs=[0.0] * len(ids), prompt_tokens=prompt_len)
    return dialect.reply(comp, model="loopback", logprobs=True, token_text=chr)


class LoopbackHandle(ServerHandle):
    def __init__(self, worker: LoopbackWorker, host: str, port: int):
        self.worker = worker
        super().__init__(worker.app(), host, port)


def start_loopback(worker_id: str = "loopback-0", host: str = "127.0.0.1", port: int = 0,
                   **options: Any) -> LoopbackHandle:
    """A loopback worker on a background thread; `options` are `LoopbackWorker`'s knobs."""
    return LoopbackHandle(LoopbackWorker(worker_id, **options), host, port)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--worker-id", default=None)
    ap.add_argument("--delay-s", type=float, default=0.0, help="sleep before answering")
    ap.add_argument("--fail-first", type=int, default=0, help="fail the first N requests")
    ap.add_argument("--fail-every", type=int, default=0, help="fail every K-th request")
    ap.add_argument("--fail-mode", default="500",
                    help="an HTTP status, 'drop' the connection, 'garbage' (HTTP 200, no completion) or 'hang'")
    ap.add_argument("--hang-s", type=float, default=600.0, help="fail-mode hang: hold a request this long, then drop it")
    ap.add_argument("--flap-period-s", type=float, default=0.0, help="down (503 everywhere) / up for this long in turn")
    ap.add_argument("--needle", default=None, help="answer with a finding when this is in the prompt")
    ap.add_argument("--reader", choices=["world"], default=None,
                    help="answer as a reader of the synthetic world's prose (parser.serving.world_reader)")
    ap.add_argument("--no-records", action="store_true", help="keep no per-request records")
    args = ap.parse_args(argv)
    worker = LoopbackWorker(args.worker_id or f"loopback:{args.port}", delay_s=args.delay_s,
                            fail_first=args.fail_first, fail_every=args.fail_every,
                            fail_mode=args.fail_mode, hang_s=args.hang_s,
                            flap_period_s=args.flap_period_s, needle=args.needle, reader=args.reader,
                            keep_records=not args.no_records)
    print(f"parser.serving.loopback: {worker.worker_id} on http://{args.host}:{args.port}",
          flush=True)
    web.run_app(worker.app(), host=args.host, port=args.port, backlog=BACKLOG,
                access_log=None, print=None, shutdown_timeout=5.0)


if __name__ == "__main__":
    main()
