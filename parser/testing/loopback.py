"""A zero-compute loopback worker: SGLang/OpenAI-shaped answers in microseconds.

Why it exists: to measure what the *client* and the *gateway* cost without a model in the
way (scatter throughput, `scripts/bench_scatter.py`) and to check routing (does a chunk keep
landing on the same worker?). Each request is recorded with the routing-key header, the hash
of the prompt's reusable prefix (what a RadixCache would share: everything before the last
"Query:", per the subagent prompt's instructions -> chunk -> query order) and this worker's
id. It answers with the subagent's abstention, or with a finding when the prompt contains
`needle`, or (`reader="world"`) as a reader of the synthetic world's prose would
(`parser.testing.world_reader`: the frozen subagents of the CPU learning run). Faults for
retry tests: a delay, failing the first N or every K-th request with an
HTTP status, dropping the connection without an answer, or `garbage`: HTTP 200 with a body
that is no completion (`text` null on /generate, an empty `choices` list on the OpenAI paths).

    python -m parser.testing.loopback --port 31001 --worker-id w1
    python -m parser.testing.loopback --port 31002 --worker-id w2 --fail-every 10 --fail-mode drop
    python -m parser.testing.loopback --port 31003 --reader world      # reads synthetic-world chunks

In-process: `with start_loopback("w1") as h: h.url; h.worker.records`.
Endpoints: POST /generate, /v1/completions, /v1/chat/completions; GET /health,
/get_model_info, /get_server_info, /get_load, /v1/models, /records; POST /reset.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import time
from typing import Any

import orjson
from aiohttp import web

from parser.backends.base import ROUTING_HEADER
from parser.serve import BACKLOG, ServerHandle, add_worker_header, json_response

ABSTENTION = '{"answer": "unknown"}'  # parser/prompts/v1/subagent.txt's abstention
PREFIX_MARKER = "Query:"


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
                 needle: str | None = None, needle_answer: str | None = None, reader: str | None = None,
                 routing_header: str = ROUTING_HEADER, request_id_header: str = "X-Request-Id",
                 prefix_marker: str = PREFIX_MARKER, keep_records: bool = True, keep_prompts: bool = False):
        if fail_mode not in ("drop", "garbage") and not fail_mode.isdigit():
            raise ValueError(f"fail_mode={fail_mode!r}: expected an HTTP status like '500', 'drop' or 'garbage'")
        self.worker_id = worker_id
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.fail_every = fail_every
        self.fail_mode = fail_mode
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

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024**2)
        add_worker_header(app, self.worker_id)
        for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self.handle)
        info = {"model_path": "loopback", "tokenizer_path": "loopback", "is_generation": True,
                "dp_size": 1, "version": "parser-loopback", "worker_id": self.worker_id}
        for path in ("/health", "/health_generate", "/get_model_info", "/get_server_info"):
            app.router.add_get(path, lambda r, info=info: json_response(info))
        app.router.add_get("/v1/models", lambda r: json_response(
            {"object": "list", "data": [{"id": "loopback", "object": "model"}]}))
        app.router.add_get("/get_load", lambda r: json_response([{
            "dp_rank": 0, "num_reqs": self.inflight, "num_waiting_reqs": 0,
            "num_tokens": self.inflight_len}]))
        app.router.add_get("/records", self.dump_records)
        app.router.add_post("/reset", self.reset)
        return app

    def reply_text(self, prompt: Any) -> str:
        if self.reader == "world":
            from parser.testing.world_reader import reply_to_prompt

            return reply_to_prompt(prompt)
        text = prompt if isinstance(prompt, str) else (
            orjson.dumps(prompt).decode() if prompt and isinstance(prompt[0], dict) else "")
        if self.needle and self.needle in text:
            return orjson.dumps({"evidence": self.needle,
                                 "answer": self.needle_answer or self.needle}).decode()
        return ABSTENTION

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.count += 1
        n = self.count
        body = orjson.loads(await request.read())
        path = request.path
        if path == "/generate":
            prompt = body["input_ids"] if body.get("input_ids") is not None else body.get("text", "")
        elif path == "/v1/completions":
            prompt = body.get("prompt", "")
        else:
            prompt = body.get("messages", [])
        if self.keep_records:
            self.records.append(RequestRecord(
                worker_id=self.worker_id, path=path,
                routing_key=request.headers.get(self.routing_header),
                request_id=request.headers.get(self.request_id_header),
                prefix_hash=prefix_hash(prompt, self.prefix_marker),
                prompt_len=len(prompt), time=time.time(), prompt=prompt if self.keep_prompts else None,
            ))
        if self.delay_s:
            self.inflight += 1
            self.inflight_len += len(prompt)
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                self.inflight -= 1
                self.inflight_len -= len(prompt)
        if n <= self.fail_first or (self.fail_every and n % self.fail_every == 0):
            if self.fail_mode == "drop":
                request.transport.close()  # no status line: the client sees a disconnect
                raise asyncio.CancelledError
            if self.fail_mode == "garbage":  # "success" that no client can use
                return json_response({"text": None, "meta_info": {"finish_reason": {"type": "stop"}}}
                                     if path == "/generate" else {"choices": []})
            return json_response({"object": "error", "error": {
                "message": f"loopback {self.worker_id}: injected failure on request {n}",
                "code": int(self.fail_mode)}}, int(self.fail_mode))
        return json_response(_shape(path, self.reply_text(prompt), len(prompt)))

    async def dump_records(self, request: web.Request) -> web.Response:
        return json_response([dataclasses.asdict(r) for r in self.records])

    async def reset(self, request: web.Request) -> web.Response:
        self.records.clear()
        self.count = 0
        return json_response({"status": "ok"})


def _shape(path: str, text: str, prompt_len: int) -> dict[str, Any]:
    """The same answer in the three wire formats. Token ids are byte values (no tokenizer)."""
    ids = list(text.encode())
    if path == "/generate":
        return {"text": text, "output_ids": ids, "meta_info": {
            "id": "loopback", "finish_reason": {"type": "stop"}, "prompt_tokens": prompt_len,
            "completion_tokens": len(ids), "cached_tokens": 0,
            "output_token_logprobs": [[0.0, t, None] for t in ids]}}
    usage = {"prompt_tokens": prompt_len, "completion_tokens": len(ids),
             "total_tokens": prompt_len + len(ids), "prompt_tokens_details": {"cached_tokens": 0}}
    if path == "/v1/completions":
        choice = {"index": 0, "text": text, "finish_reason": "stop",
                  "logprobs": {"tokens": [chr(t) for t in ids], "token_logprobs": [0.0] * len(ids),
                               "top_logprobs": None, "text_offset": list(range(len(ids)))}}
        return {"id": "cmpl-loopback", "object": "text_completion", "model": "loopback",
                "choices": [choice], "usage": usage}
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
              "logprobs": {"content": [{"token": chr(t), "logprob": 0.0} for t in ids]}}
    return {"id": "chatcmpl-loopback", "object": "chat.completion", "model": "loopback",
            "choices": [choice], "usage": usage}


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
    ap.add_argument("--fail-mode", default="500", help="an HTTP status, 'drop' the connection, or 'garbage' (HTTP 200, no completion)")
    ap.add_argument("--needle", default=None, help="answer with a finding when this is in the prompt")
    ap.add_argument("--reader", choices=["world"], default=None,
                    help="answer as a reader of the synthetic world's prose (parser.testing.world_reader)")
    ap.add_argument("--no-records", action="store_true", help="keep no per-request records")
    args = ap.parse_args(argv)
    worker = LoopbackWorker(args.worker_id or f"loopback:{args.port}", delay_s=args.delay_s,
                            fail_first=args.fail_first, fail_every=args.fail_every,
                            fail_mode=args.fail_mode, needle=args.needle, reader=args.reader,
                            keep_records=not args.no_records)
    print(f"parser.testing.loopback: {worker.worker_id} on http://{args.host}:{args.port}",
          flush=True)
    web.run_app(worker.app(), host=args.host, port=args.port, backlog=BACKLOG,
                access_log=None, print=None, shutdown_timeout=5.0)


if __name__ == "__main__":
    main()
