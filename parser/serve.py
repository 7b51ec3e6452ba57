"""A small CPU model server: any `Backend` behind SGLang's and OpenAI's HTTP schemas.

Why it exists: the whole serving path (HttpBackend -> sglang-router gateway -> workers) must
run and be tested on a laptop without a GPU. This puts the in-process `TransformersBackend`
(or any other Backend) behind the endpoints an SGLang worker exposes, so the gateway and the
HTTP client see the same wire format as in production:

    GET  /health  /health_generate  /get_model_info  /get_server_info  /get_load  /v1/models
    POST /generate              SGLang native schema (text / input_ids, meta_info incl. cached_tokens)
    POST /v1/completions        OpenAI completions (text or token-id prompt, logprobs; vLLM's
                                `return_token_ids` gives the generated ids in `choices[0].token_ids`)
    POST /v1/chat/completions   OpenAI chat; renders the tokenizer's chat template and honours
                                `chat_template_kwargs` (e.g. {"enable_thinking": false})

Answer scoring (`parser.backends.scoring`) in each server's dialect, by the backend's `score`:
SGLang's `return_logprob` + `logprob_start_len` on /generate (`max_new_tokens: 0` generates
nothing; `meta_info.input_token_logprobs`), vLLM's `prompt_logprobs: 0` on /v1/completions
(`choices[0].prompt_logprobs`; `rank` is not computed and comes back null), and OpenAI's `echo`
with `max_tokens: 0` and `logprobs` (echo with generation is refused).

Constrained decoding is read in each server's dialect and handed to the backend
(`SamplingParams.json_schema` / `.regex`): SGLang's `sampling_params.json_schema` / `regex`,
vLLM's `structured_outputs: {json | regex}`, OpenAI's `response_format: {type: json_schema}`.
    POST /flush_cache

Every response carries `X-Worker-Id`, so clients and gateway tests can see which worker
answered. It binds 127.0.0.1 unless `--host` says otherwise, and shuts down gracefully on
SIGINT/SIGTERM. Streaming, `n > 1` and batched prompts are refused with a 400.

A client error is a 400 naming the field, never a 500 (which clients and routers retry):
token ids outside the vocabulary, `top_p` outside (0, 1], `top_k` 0, a negative temperature,
a seed outside 64 bits, a constraint of the wrong type, an empty stop string, unknown roles,
messages the chat template refuses, a prompt over `context_length` tokens or 16 bytes per
token of it. A temperature below 1e-5 means greedy, as in SGLang and vLLM.

Every request is bounded (`ServerLimits`): its body at 16 MB, read within `body_timeout_s`
(else 408); a connection that has not sent a whole request header `idle_timeout_s` after it
opened or after its last response is closed (a slow or stalled client holds no connection for
ever); and a stop list at `max_stop_strings` strings of at most `max_stop_chars` characters
(each generated token is checked against every stop string, so a huge list held the model for
many times its normal time).
Templates are never taken from a request (`chat_template`, or as a `chat_template_kwargs`
key); rendering and tokenising run on a worker thread, so `/health` answers during a huge
prompt, and a client that disconnects cancels its generation (`handler_cancellation`).

    python -m parser.serve --model tiny-qwen3.5 --port 30001 --worker-id w1
    python -m parser.serve --model smollm2 --port 30002
    python -m parser.serve --model Qwen/Qwen3.5-0.8B --port 30003   # any HF path

As a library (tests): `with start_server(backend, tokenizer=tok) as handle: handle.url`.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import threading
import time
import uuid
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from parser.backends import build_backend
from parser.backends.base import ROUTING_HEADER, Backend, BackendError, Completion, SamplingParams

WORKER_HEADER = "X-Worker-Id"
BACKLOG = 4096  # a scatter round opens up to T connections at once; the default 128 drops SYNs
MAX_REQUEST_BYTES = 16 * 1024**2  # aiohttp answers 413 above this, before reading the body
BYTES_PER_TOKEN_BOUND = 16  # a prompt longer than this many bytes per context token cannot fit
GREEDY_BELOW = 1e-5  # SGLang/vLLM read a smaller temperature as greedy (logits / 1e-30 overflow)
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
# apply_chat_template's own parameters: a client may set template variables, not these
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "tools", "documents", "tokenize", "add_generation_prompt", "continue_final_message",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "padding", "truncation", "max_length",
    "tokenizer_kwargs", "conversation",
})


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The bounds on what one request may hold or cost (module docstring)."""

    body_timeout_s: float = 60.0  # to receive a request body
    idle_timeout_s: float = 30.0  # a connection without a complete request header is closed after this
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # per stop string

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"parser.serve: {field.name} must be a positive finite number, got {value!r}")


def error_response(message: str, status: int) -> web.Response:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return json_response({"object": "error", "error": {"message": message, "type": kind,
                                                       "code": status}}, status)


# ---------------------------------------------------------------------- hosting an app
class ServerHandle:
    """An aiohttp app served on its own thread and event loop; `close()` stops it.

    A thread (not the caller's loop) so sync tests, async tests and benchmarks can all use
    it, and so a backend that blocks its loop while computing never stalls the client.
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0,
                 backlog: int = BACKLOG, shutdown_timeout: float = 2.0,
                 idle_timeout_s: float = ServerLimits.idle_timeout_s):
        self.host = host
        self._idle_timeout_s = idle_timeout_s  # aiohttp's keep-alive timer also runs while a header arrives
        self.port = port
        self._app = app
        self._backlog = backlog
        self._shutdown_timeout = shutdown_timeout  # how long close() lets requests finish
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"serve:{port}", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_timeout,
                               handler_cancellation=True, keepalive_timeout=self._idle_timeout_s)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port, backlog=self._backlog)
            loop.run_until_complete(site.start())
            self.port = runner.addresses[0][1]
        except BaseException as e:  # e.g. port in use: re-raised in the caller's thread
            self._error = e
            self._started.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())  # graceful: on_cleanup hooks run here
        loop.close()

    def call(self, coro: Awaitable[Any], timeout: float | None = 60.0) -> Any:
        """Run a coroutine on the server's loop (e.g. to inspect state it owns)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def add_worker_header(app: web.Application, worker_id: str) -> None:
    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = worker_id

    app.on_response_prepare.append(stamp)


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


class BadRequest(ValueError):
    """A client error: becomes an OpenAI-shaped 400 naming the field."""


class RequestTimeout(BadRequest):
    """The client did not send its body in time: a 408 (which clients may retry)."""


async def read_json(request: web.Request, timeout_s: float) -> dict[str, Any]:
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"{request.path}: the request body did not arrive within {timeout_s:g} s") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"{request.path}: body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest(f"{request.path}: body must be a JSON object, got {type(body).__name__}")
    return body


# ---------------------------------------------------------------------- the model server
class ModelServer:
    """Request handlers over one Backend. `tokenizer` (optional) renders chat templates,
    counts tokens for text-only backends and spells logprob tokens; defaults to
    `backend.tokenizer` when the backend has one."""

    def __init__(self, backend: Backend, *, tokenizer: Any = None, model_name: str = "default",
                 worker_id: str = "worker-0", context_length: int = 32768, limits: ServerLimits | None = None):
        self.backend = backend
        self.limits = limits or ServerLimits()
        self.tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        self.vocab_size = _vocab_size(backend, self.tokenizer)
        self.model_name = model_name
        self.worker_id = worker_id
        self.context_length = context_length
        self.inflight = 0
        self.inflight_tokens = 0  # prompt tokens of running requests (the router's load signal)
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        add_worker_header(app, self.worker_id)
        route = self._guarded
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", route(self.health_generate))
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/get_load", self.load)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/generate", route(self.generate))
        app.router.add_post("/v1/completions", route(self.completions))
        app.router.add_post("/v1/chat/completions", route(self.chat))
        app.router.add_post("/flush_cache", self.flush_cache)
        app.on_cleanup.append(self._close_backend)
        return app

    async def _close_backend(self, app: web.Application) -> None:
        await self.backend.aclose()

    def _guarded(self, handler: Callable[[web.Request], Awaitable[web.Response]]):
        async def wrapped(request: web.Request) -> web.Response:
            self.inflight += 1
            try:
                return await handler(request)
            except RequestTimeout as e:
                return error_response(str(e), 408)
            except BadRequest as e:
                return error_response(str(e), 400)
            except BackendError as e:
                return error_response(f"backend: {e}", 503 if e.retryable else 400)
            finally:
                self.inflight -= 1

        return wrapped

    # -------------------------------------------------------------- info endpoints
    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "worker_id": self.worker_id})

    async def health_generate(self, request: web.Request) -> web.Response:
        """SGLang's deep health check: one real token through the model."""
        await self.backend.generate("ping", SamplingParams(max_new_tokens=1, temperature=0.0))
        return json_response({"status": "ok", "worker_id": self.worker_id})

    def _info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_name,
            "tokenizer_path": self.model_name,
            "served_model_name": self.model_name,
            "is_generation": True,
            "weight_version": "default",
            "max_context_length": self.context_length,
        }

    async def model_info(self, request: web.Request) -> web.Response:
        return json_response(self._info())

    async def server_info(self, request: web.Request) -> web.Response:
        # the router reads model_path / dp_size / max_* from here when it adds a worker
        return json_response({
            **self._info(),
            "dp_size": 1,
            "tp_size": 1,
            "version": "parser-serve",
            "max_total_tokens": self.context_length,
            "max_running_requests": 1024,
            "worker_id": self.worker_id,
            "inflight": self.inflight,
            "uptime_s": time.time() - self.started,
        })

    async def load(self, request: web.Request) -> web.Response:
        # SGLang's shape (one entry per DP rank); sglang-router sums num_tokens for power_of_two
        return json_response([{"dp_rank": 0, "num_reqs": self.inflight, "num_waiting_reqs": 0,
                               "num_tokens": self.inflight_tokens}])

    async def models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": int(self.started),
            "owned_by": "parser", "root": self.model_name, "max_model_len": self.context_length,
        }]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        flush = getattr(self.backend, "flush_cache", None)
        if flush is not None:
            result = flush()
            if asyncio.iscoroutine(result):
                await result
        return web.Response(text="Cache flushed.\n")

    # -------------------------------------------------------------- generation
    async def _count(self, prompt: str | list[int], field: str, max_new: int) -> int:
        """Prompt tokens, checked against the context (tokenised off the event loop)."""
        budget = self.context_length - max_new
        if isinstance(prompt, str):
            if len(prompt) > BYTES_PER_TOKEN_BOUND * self.context_length:  # chars <= bytes: cheap first cut
                raise BadRequest(f"{field}: {len(prompt)} characters cannot fit the context of {self.context_length} tokens")
            if self.tokenizer is None:
                return 0
            count = len(await asyncio.to_thread(self.tokenizer.encode, prompt, add_special_tokens=False))
        else:
            count = len(prompt)
            if self.vocab_size is not None:
                bad = next((i for i, t in enumerate(prompt) if not 0 <= t < self.vocab_size), None)
                if bad is not None:
                    raise BadRequest(f"{field}[{bad}]: token id {prompt[bad]} is outside the vocabulary [0, {self.vocab_size})")
        if count > budget:
            raise BadRequest(f"{field}: {count} prompt tokens + {max_new} new tokens exceed the context of {self.context_length}")
        return count

    async def _run(self, request: web.Request, prompt: Any, sampling: SamplingParams, field: str) -> Completion:
        n_prompt = await self._count(prompt, field, sampling.max_new_tokens)
        self.inflight_tokens += n_prompt
        try:
            comp = await self.backend.generate(
                prompt, sampling,
                routing_key=request.headers.get(ROUTING_HEADER),
                request_id=request.headers.get("X-Request-Id"),
            )
        finally:
            self.inflight_tokens -= n_prompt
        if not comp.token_ids and self.tokenizer is not None and comp.text:
            comp.token_ids = list(self.tokenizer.encode(comp.text, add_special_tokens=False))
        if not comp.prompt_tokens:
            comp.prompt_tokens = n_prompt
        return comp

    def _token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return self.tokenizer.decode([token_id])

    def _logprob_block(self, token_ids: list[int], logprobs: list[float | None]) -> dict[str, Any]:
        """OpenAI completions' `logprobs` object for these tokens."""
        tokens = [self._token_text(t) for t in token_ids]
        offsets, pos = [], 0
        for tok in tokens:
            offsets.append(pos)
            pos += len(tok)
        return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}

    # -------------------------------------------------------------- scoring (input logprobs)
    async def _prompt_ids(self, prompt: str | list[int], field: str) -> list[int]:
        """The prompt as checked token ids (a text prompt is tokenised off the event loop)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise BadRequest(f"{field}: this server has no tokenizer to score a text prompt; send token ids")
            await self._count(prompt, field, 0)  # the cheap size cut before tokenising
            prompt = list(await asyncio.to_thread(self.tokenizer.encode, prompt, add_special_tokens=False))
        await self._count(prompt, field, 0)
        return prompt

    async def _input_logprobs(self, request: web.Request, ids: list[int], start: int, field: str) -> list[float | None]:
        """log p(ids[i] | ids[:i]) for i >= start (None at `start`, as SGLang and vLLM give it), by
        the backend's `score` (one forward pass)."""
        if not 0 <= start < len(ids):
            raise BadRequest(f"{field}: logprob start {start} is outside the prompt's {len(ids)} tokens")
        score = getattr(self.backend, "score", None)
        if score is None:
            raise BadRequest(f"{field}: this server's backend ({type(self.backend).__name__}) cannot score input tokens")
        if start + 1 == len(ids):
            return [None]
        self.inflight_tokens += len(ids)
        try:
            values = await score(ids[: start + 1], ids[start + 1:], routing_key=request.headers.get(ROUTING_HEADER),
                                 request_id=request.headers.get("X-Request-Id"))
        finally:
            self.inflight_tokens -= len(ids)
        return [None, *values]

    async def generate(self, request: web.Request) -> web.Response:
        body = await read_json(request, self.limits.body_timeout_s)
        text, ids = body.get("text"), body.get("input_ids")
        if (text is None) == (ids is None):
            raise BadRequest("/generate: give exactly one of 'text' or 'input_ids'")
        prompt = _single_prompt(ids if ids is not None else text, "/generate: " +
                                ("input_ids" if ids is not None else "text"))
        sp = body.get("sampling_params")
        sp = {} if sp is None else sp
        if not isinstance(sp, dict):
            raise BadRequest("/generate: sampling_params must be an object")
        want_logprobs = bool(body.get("return_logprob", False))
        sampling = _sampling(sp, "/generate: sampling_params", self.limits, max_key="max_new_tokens",
                             default_max=128, seed_key="sampling_seed", logprobs=want_logprobs)
        if body.get("stream"):
            raise BadRequest("/generate: stream=true is not supported by parser.serve")
        field = "/generate: " + ("input_ids" if ids is not None else "text")
        start = _number(body, "logprob_start_len", -1, int, "/generate")
        t0 = time.perf_counter()
        input_lps = None
        if want_logprobs and start >= 0:  # SGLang's input logprobs (-1, its default: none)
            if sampling.temperature != 1.0:  # SGLang scales them by it; the backend scores at 1
                raise BadRequest("/generate: sampling_params.temperature: input logprobs are given at temperature 1 "
                                 f"only on parser.serve, got {sampling.temperature}")
            prompt = await self._prompt_ids(prompt, field)
            input_lps = await self._input_logprobs(request, prompt, start, field)
        if input_lps is not None and sampling.max_new_tokens == 0:  # scoring only: nothing to generate
            comp = Completion(text="", finish_reason="length", prompt_tokens=len(prompt))
        else:
            comp = await self._run(request, prompt, sampling, field)
        n_out = len(comp.token_ids)
        reason: dict[str, Any] = ({"type": "length", "length": n_out}
                                  if comp.finish_reason == "length" else {"type": "stop"})
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": reason,
            "prompt_tokens": comp.prompt_tokens,
            "completion_tokens": n_out,
            "cached_tokens": comp.cached_tokens,
            "e2e_latency": time.perf_counter() - t0,
        }
        if want_logprobs:
            lps = comp.logprobs or []
            meta["output_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(lps, comp.token_ids, strict=True)]
        if input_lps is not None:
            meta["input_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(input_lps, prompt[start:], strict=True)]
        return json_response({"text": comp.text, "output_ids": comp.token_ids, "meta_info": meta})

    def _usage(self, comp: Completion) -> dict[str, Any]:
        n_out = len(comp.token_ids)
        return {
            "prompt_tokens": comp.prompt_tokens,
            "completion_tokens": n_out,
            "total_tokens": comp.prompt_tokens + n_out,
            "prompt_tokens_details": {"cached_tokens": comp.cached_tokens},
        }

    async def completions(self, request: web.Request) -> web.Response:
        body = await read_json(request, self.limits.body_timeout_s)
        _refuse_unsupported(body, "/v1/completions")
        if "prompt" not in body:
            raise BadRequest("/v1/completions: missing field 'prompt'")
        prompt = _single_prompt(body["prompt"], "/v1/completions: prompt")
        logprobs = body.get("logprobs")
        sampling = _sampling(body, "/v1/completions", self.limits, max_key="max_tokens", default_max=16,
                             seed_key="seed", logprobs=logprobs is not None and logprobs is not False)
        field = "/v1/completions: prompt"
        # input logprobs two ways: vLLM's `prompt_logprobs`, or OpenAI's `echo` with max_tokens 0
        prompt_logprobs = _number(body, "prompt_logprobs", None, int, "/v1/completions")
        if prompt_logprobs not in (None, 0):
            raise BadRequest(f"/v1/completions.prompt_logprobs: only 0 (the prompt tokens' own logprobs) is supported, "
                             f"got {prompt_logprobs}")
        echo = bool(body.get("echo"))
        if echo and sampling.max_new_tokens != 0:
            raise BadRequest("/v1/completions.echo: only with max_tokens 0 (scoring the prompt) on parser.serve")
        extra: dict[str, Any] = {}
        if prompt_logprobs is not None or (echo and sampling.return_logprobs):
            prompt = await self._prompt_ids(prompt, field)
            scores = await self._input_logprobs(request, prompt, 0, field)
            if prompt_logprobs is not None:
                extra["prompt_logprobs"] = [None] + [
                    {str(t): {"logprob": lp, "rank": None, "decoded_token": self._token_text(t)}}
                    for t, lp in zip(prompt[1:], scores[1:], strict=True)]
        if echo or (prompt_logprobs is not None and sampling.max_new_tokens == 0):
            text = prompt if isinstance(prompt, str) else (self.tokenizer.decode(prompt) if self.tokenizer else "")
            comp = Completion(text=text if echo else "", finish_reason="length",
                              prompt_tokens=len(prompt) if isinstance(prompt, list) else 0)
            lp_block = self._logprob_block(prompt, scores) if echo and sampling.return_logprobs else None
        else:
            comp = await self._run(request, prompt, sampling, field)
            lp_block = self._logprob_block(comp.token_ids, comp.logprobs or []) if sampling.return_logprobs else None
        return json_response({
            "id": "cmpl-" + uuid.uuid4().hex,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "text": comp.text, "logprobs": lp_block, "finish_reason": comp.finish_reason,
                         **_token_ids_field(body, comp), **extra}],
            "usage": self._usage(comp),
        })

    async def chat(self, request: web.Request) -> web.Response:
        body = await read_json(request, self.limits.body_timeout_s)
        _refuse_unsupported(body, "/v1/chat/completions")
        where = "/v1/chat/completions"
        messages = _messages(body.get("messages"), where)
        kwargs = _template_kwargs(body, where)
        if self.tokenizer is None:
            raise BadRequest(f"{where}: this server has no tokenizer to render chat")
        max_key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        sampling = _sampling(body, where, self.limits, max_key=max_key, default_max=1024,
                             seed_key="seed", logprobs=bool(body.get("logprobs")))
        size = sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(orjson.dumps(m)) for m in messages)
        if size > BYTES_PER_TOKEN_BOUND * self.context_length:
            raise BadRequest(f"{where}: messages: {size} characters cannot fit the context of {self.context_length} tokens")
        try:  # the server's own template, on a worker thread; what it raises is about these messages
            text = await asyncio.to_thread(self.tokenizer.apply_chat_template, messages, tokenize=False,
                                           add_generation_prompt=True, **kwargs)
        except Exception as error:  # noqa: BLE001 - jinja raises TemplateError, but templates raise anything
            raise BadRequest(f"{where}: messages: the chat template refused them: {type(error).__name__}: {error}") from None
        comp = await self._run(request, text, sampling, f"{where}: messages")
        lp_block = None
        if sampling.return_logprobs:
            lp_block = {"content": [
                {"token": self._token_text(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(comp.token_ids, comp.logprobs or [], strict=True)
            ]}
        return json_response({
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": comp.text},
                         "logprobs": lp_block, "finish_reason": comp.finish_reason, **_token_ids_field(body, comp)}],
            "usage": self._usage(comp),
        })


def _token_ids_field(body: dict[str, Any], comp: Completion) -> dict[str, Any]:
    return {"token_ids": comp.token_ids} if body.get("return_token_ids") else {}


def _constraint(d: dict[str, Any], where: str) -> dict[str, str]:
    """SamplingParams' json_schema / regex from any of the dialects in the module docstring."""
    found: dict[str, Any] = {}
    structured = _object(d, "structured_outputs", where)
    fmt = d.get("response_format")
    if fmt is not None and not isinstance(fmt, (dict, str)):
        raise BadRequest(f"{where}.response_format: expected an object, got {type(fmt).__name__}")
    schema = d.get("json_schema", structured.get("json"))
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = _object(fmt, "json_schema", f"{where}.response_format").get("schema", schema)
    if schema is not None:
        if not isinstance(schema, (str, dict, bool)):
            raise BadRequest(f"{where}: json schema: expected an object or a JSON string, got {type(schema).__name__}")
        found["json_schema"] = schema if isinstance(schema, str) else orjson.dumps(schema).decode()
    regex = d.get("regex", structured.get("regex"))
    if regex is not None:
        if not isinstance(regex, str):
            raise BadRequest(f"{where}: regex: expected a string, got {type(regex).__name__}")
        found["regex"] = regex
    if len(found) > 1:
        raise BadRequest(f"{where}: give one constraint (json schema or regex), not both")
    return found


def _object(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where}.{key}: expected an object, got {type(value).__name__}")
    return value


def _refuse_unsupported(body: dict[str, Any], where: str) -> None:
    if body.get("stream"):
        raise BadRequest(f"{where}: stream=true is not supported by parser.serve")
    if body.get("n", 1) != 1:
        raise BadRequest(f"{where}: n={body.get('n')!r}; only n=1 is supported")


def _single_prompt(value: Any, where: str) -> str | list[int]:
    """One prompt: a string or token ids; a batch of exactly one is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool)
                                                 for t in value):
        return value
    raise BadRequest(f"{where}: expected one string or one non-empty list of token ids "
                     "(batched prompts are not supported)")


def _vocab_size(backend: Backend, tokenizer: Any) -> int | None:
    """Rows of the model's input embedding (an id past them crashes the forward), else the tokenizer's size."""
    model = getattr(backend, "model", None)
    if model is not None and hasattr(model, "get_input_embeddings"):
        return int(model.get_input_embeddings().num_embeddings)
    return len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None


def _messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest(f"{where}: 'messages' must be a non-empty list of objects")
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRequest(f"{where}: messages[{i}].role: {str(role)[:40]!r} is not one of {', '.join(sorted(ROLES))}")
        if not (content is None or isinstance(content, str)
                or (isinstance(content, list) and all(isinstance(p, dict) for p in content))):
            raise BadRequest(f"{where}: messages[{i}].content: expected a string or a list of content parts")
    return messages


def _template_kwargs(body: dict[str, Any], where: str) -> dict[str, Any]:
    """Template variables a client may set (`enable_thinking`): scalars, never a template."""
    if "chat_template" in body:
        raise BadRequest(f"{where}: chat_template: templates are not accepted from requests; the server renders its model's own")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest(f"{where}: chat_template_kwargs must be an object")
    for key, value in kwargs.items():
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise BadRequest(f"{where}: chat_template_kwargs.{key}: not accepted from requests")
        if not (value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 256)):
            raise BadRequest(f"{where}: chat_template_kwargs.{key}: expected a boolean, number or short string")
    return kwargs


def _number(d: dict[str, Any], key: str, default: Any, kind: type, where: str) -> Any:
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{where}.{key}: expected a number, got {value!r}")
    if kind is int and value != int(value):
        raise BadRequest(f"{where}.{key}: expected an integer, got {value!r}")
    return kind(value)


def _stop(d: dict[str, Any], where: str, limits: ServerLimits) -> tuple[str, ...]:
    stop = d.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f"{where}.stop: expected a string or a list of strings, got {str(stop)[:80]!r}")
    if len(stops) > limits.max_stop_strings:
        raise BadRequest(f"{where}.stop: {len(stops)} stop strings; at most {limits.max_stop_strings} are accepted")
    for i, text in enumerate(stops):
        if not text:
            raise BadRequest(f"{where}.stop[{i}]: an empty stop string matches everywhere")
        if len(text) > limits.max_stop_chars:
            raise BadRequest(f"{where}.stop[{i}]: {len(text)} characters; at most {limits.max_stop_chars} are accepted")
    return tuple(stops)


def _sampling(d: dict[str, Any], where: str, limits: ServerLimits, *, max_key: str, default_max: int, seed_key: str,
              logprobs: bool) -> SamplingParams:
    stop_t = _stop(d, where, limits)
    max_new = _number(d, max_key, default_max, int, where)
    if max_new < 0:
        raise BadRequest(f"{where}.{max_key}: must be >= 0, got {max_new}")
    temperature = _number(d, "temperature", 1.0, float, where)
    if not 0.0 <= temperature < float("inf"):
        raise BadRequest(f"{where}.temperature: must be a finite number >= 0, got {temperature}")
    top_p = _number(d, "top_p", 1.0, float, where)
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"{where}.top_p: must be in (0, 1], got {top_p}")
    top_k = _number(d, "top_k", -1, int, where)
    if top_k < -1 or top_k == 0:
        raise BadRequest(f"{where}.top_k: must be -1 (off) or at least 1, got {top_k}")
    seed = d.get(seed_key)
    if seed is not None:
        seed = _number(d, seed_key, None, int, where)
        if not -(2**63) <= seed < 2**64:
            raise BadRequest(f"{where}.{seed_key}: must fit in 64 bits, got {seed}")
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=top_p,
        top_k=top_k,
        stop=stop_t,
        seed=seed,
        return_logprobs=logprobs,
        **_constraint(d, where),
    )


def start_server(backend: Backend, host: str = "127.0.0.1", port: int = 0, *,
                 tokenizer: Any = None, model_name: str = "default",
                 worker_id: str = "worker-0", context_length: int = 32768,
                 limits: ServerLimits | None = None) -> ServerHandle:
    """Serve `backend` on a background thread; port 0 picks a free port (`handle.port`)."""
    server = ModelServer(backend, tokenizer=tokenizer, model_name=model_name, worker_id=worker_id,
                         context_length=context_length, limits=limits)
    return ServerHandle(server.app(), host, port, idle_timeout_s=server.limits.idle_timeout_s)


# ---------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-qwen3.5",
                    help="tiny-qwen3.5 | tiny-qwen3 | smollm2 | a Hugging Face path")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--worker-id", default=None, help="sent back as X-Worker-Id (default host:port)")
    ap.add_argument("--context-length", type=int, default=32768)
    for field in dataclasses.fields(ServerLimits):  # the request bounds, e.g. --max-stop-strings 32
        ap.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = ap.parse_args(argv)
    limits = ServerLimits(**{field.name: getattr(args, field.name) for field in dataclasses.fields(ServerLimits)})

    backend, tokenizer = build_backend({"type": "transformers", "model": args.model, "name": args.model})
    server = ModelServer(backend, tokenizer=tokenizer, model_name=args.model,
                         worker_id=args.worker_id or f"{args.host}:{args.port}",
                         context_length=args.context_length, limits=limits)
    print(f"parser.serve: {args.model} on http://{args.host}:{args.port} "
          f"(worker {server.worker_id})", flush=True)
    web.run_app(server.app(), host=args.host, port=args.port, backlog=BACKLOG, access_log=None, print=None,
                shutdown_timeout=10.0, handler_cancellation=True, keepalive_timeout=limits.idle_timeout_s)


if __name__ == "__main__":
    main()
