"""A small CPU model server: any `Backend` behind SGLang's and OpenAI's HTTP schemas.

Why it exists: the whole serving path (HttpBackend -> sglang-router gateway -> workers) must
run and be tested on a laptop without a GPU. This puts the in-process `TransformersBackend`
(or any other Backend) behind the endpoints an SGLang worker exposes, so the gateway and the
HTTP client see the same wire format as in production (each body's type and checks live in
`parser.serving.wire`; the routes are `parser.serving.wire.dialect.DIALECTS`, which the client, the
loopback worker and the in-process engine use too):

    GET  /health  /health_generate  /get_model_info  /get_server_info  /get_load  /v1/models
    POST /generate              SGLang native schema (text / input_ids, meta_info incl. cached_tokens)
    POST /v1/completions        OpenAI completions (text or token-id prompt, logprobs; vLLM's
                                `return_token_ids` gives the generated ids in `choices[0].token_ids`)
    POST /v1/chat/completions   OpenAI chat; renders the tokenizer's chat template and honours
                                `chat_template_kwargs` (e.g. {"enable_thinking": false})

Answer scoring (`parser.serving.backends.scoring`) in each server's dialect, by the backend's `score`:
SGLang's `return_logprob` + `logprob_start_len` on /generate (`max_new_tokens: 0` generates
nothing; `meta_info.input_token_logprobs`), vLLM's `prompt_logprobs: 0` on /v1/completions
(`choices[0].prompt_logprobs`; `rank` is not computed and comes back null), and OpenAI's `echo`
with `max_tokens: 0` and `logprobs` (echo with generation is refused).

Constrained decoding is read in each server's dialect and handed to the backend
(`SamplingParams.json_schema` / `.regex`): SGLang's `sampling_params.json_schema` / `regex`,
vLLM's `structured_outputs: {json | regex}`, OpenAI's `response_format: {type: json_schema}`
(`{type: json_object}`: any JSON object, as vLLM's JSON grammar). OpenAI fields nothing here
implements (tools, logit bias, penalties, top-k alternatives in logprobs, ...) are a 400 naming
them; a request naming another model is vLLM's 404 (`The model `x` does not exist.`); the context
advertised (`/v1/models` max_model_len) and enforced is the model's `max_position_embeddings`,
or less with `--context-length`.
    POST /flush_cache

Every response carries `X-Worker-Id`, so clients and gateway tests can see which worker
answered. It binds 127.0.0.1 unless `--host` says otherwise, prints its ready line once the port
listens, and shuts down gracefully on SIGINT/SIGTERM (while the model still loads, either ends it
in one line, exit 130; both are installed explicitly, even when started with SIGINT ignored). Streaming, `n > 1` and batched prompts are refused with a 400.

A client error is a 4xx naming the field, never a 500 (which clients and routers retry):
token ids outside the vocabulary, in the prompt or in `stop_token_ids` (checked with the body,
whatever the request then does), `top_p` outside (0, 1], `top_k` 0, a negative temperature, a seed that is not an exact integer
in [-2**63, 2**64) (never rounded), a constraint of the wrong type or nested more than
`parser.serving.wire.common.MAX_SCHEMA_DEPTH` deep, an empty stop string, unknown roles, messages the
chat template refuses, a prompt over `context_length` tokens or 16 bytes per token of it. A
temperature below 1e-5 means greedy, as in SGLang and vLLM.

Every request is bounded (`ServerLimits`): its body at 16 MB (a declared Content-Length over it
is a 413 before the body is read), read within `body_timeout_s` (else 408); it counts as in
flight (`/get_load`) only once its body is read and checked; a connection that has not sent a whole request header `idle_timeout_s` after it
opened or after its last response is closed (a slow or stalled client holds no connection for
ever); and a stop list at `max_stop_strings` strings of at most `max_stop_chars` characters
(each generated token is checked against every stop string, so a huge list held the model for
many times its normal time).
Templates are never taken from a request (`chat_template`, or as a `chat_template_kwargs`
key); rendering and tokenising run on a worker thread, so `/health` answers during a huge
prompt, and a client that disconnects cancels its generation (`handler_cancellation`).

    parser serve --model tiny-qwen3.5 --port 30001 --worker-id w1
    parser serve --model smollm2 --port 30002
    parser serve --model Qwen/Qwen3.5-0.8B --port 30003   # any HF path

As a library (tests): `with start_server(backend, tokenizer=tok) as handle: handle.url`.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import threading
import time
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web
from pydantic import ValidationError

from parser.base.domains import argparse_type, problem
from parser.base.signals import stop_on_signals
from parser.serving.backends import TRANSFORMERS, build_backend
from parser.serving.types import ROUTING_HEADER, Backend, BackendError, Completion, SamplingParams
from parser.serving.wire.common import Bounds, ErrorBody, ModelCard, ModelList, describe
from parser.serving.wire.dialect import CHAT, COMPLETIONS, DIALECTS, SGLANG, Dialect

WORKER_HEADER = "X-Worker-Id"
BACKLOG = 4096  # a scatter round opens up to T connections at once; the default 128 drops SYNs
MAX_REQUEST_BYTES = 16 * 1024**2  # a body over this is a 413 (a declared one before it is read)
BYTES_PER_TOKEN_BOUND = 16  # a prompt longer than this many bytes per context token cannot fit


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The bounds on what one request may hold or cost (module docstring)."""

    body_timeout_s: float = 60.0  # to receive a request body
    idle_timeout_s: float = 30.0  # a connection without a complete request header is closed after this
    max_stop_strings: int = 16
    max_stop_chars: int = 256  # per stop string

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # each a declared domain (parser.base.domains)
            said = problem(field.name, getattr(self, field.name))
            if said:
                raise ValueError(f"parser.serving.server: {said}")


def error_response(message: str, status: int, kind: str | None = None, param: str | None = None) -> web.Response:
    return json_response(ErrorBody.of(message, status, kind, param).reply(), status)


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


class ModelNotFound(BadRequest):
    """A request for a model this server does not serve: vLLM's 404."""


class BodyTooLarge(BadRequest):
    """A declared body over MAX_REQUEST_BYTES: a 413 before a byte of it is read."""


async def read_request(request: web.Request, dialect: Dialect, timeout_s: float, bounds: Bounds) -> Any:
    """The body as `dialect`'s request, read within `timeout_s`; a refused one names its fields."""
    try:
        raw = await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"{request.path}: the request body did not arrive within {timeout_s:g} s") from None
    try:
        return dialect.read(raw, bounds)
    except ValidationError as error:
        raise BadRequest(describe(error, request.path)) from None


# ---------------------------------------------------------------------- the model server
class ModelServer:
    """Request handlers over one Backend. `tokenizer` (optional) renders chat templates,
    counts tokens for text-only backends and spells logprob tokens; defaults to
    `backend.tokenizer` when the backend has one."""

    def __init__(self, backend: Backend, *, tokenizer: Any = None, model_name: str = "default",
                 worker_id: str = "worker-0", context_length: int | None = None, limits: ServerLimits | None = None):
        self.backend = backend
        self.limits = limits or ServerLimits()
        self.tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        self.vocab_size = _vocab_size(backend, self.tokenizer)
        self.bounds = Bounds(vocab_size=self.vocab_size, max_stop_strings=self.limits.max_stop_strings,
                             max_stop_chars=self.limits.max_stop_chars)
        self.model_name = model_name
        self.worker_id = worker_id
        self.context_length = _context_length(backend, context_length)
        self.inflight = 0
        self.inflight_tokens = 0  # prompt tokens of running requests (the router's load signal)
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        add_worker_header(app, self.worker_id)
        route = self._guarded
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", route(self.health_generate, None))
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/get_load", self.load)
        app.router.add_get("/v1/models", self.models)
        handlers = {SGLANG.name: self.generate, COMPLETIONS.name: self.completions, CHAT.name: self.chat}
        for dialect in DIALECTS.values():
            app.router.add_post(dialect.path, route(handlers[dialect.name], dialect))
        app.router.add_post("/flush_cache", self.flush_cache)
        app.on_cleanup.append(self._close_backend)
        return app

    async def _close_backend(self, app: web.Application) -> None:
        await self.backend.aclose()

    def _guarded(self, handler: Callable[..., Awaitable[web.Response]], kind: Dialect | None):
        """`handler(request, body)` with the body read and checked as `kind`'s request first; a request counts
        as in flight (`/get_load`) only from then on, and every client error is a 4xx."""
        async def wrapped(request: web.Request) -> web.Response:
            try:
                if kind is not None:
                    body = await self._body(request, kind)
            except BodyTooLarge as e:
                response = error_response(str(e), 413)
                response.force_close()  # the unread body must not be taken for the next request
                return response
            except ModelNotFound as e:
                return error_response(str(e), 404, "NotFoundError", "model")
            except RequestTimeout as e:
                return error_response(str(e), 408)
            except BadRequest as e:
                return error_response(str(e), 400)
            self.inflight += 1
            try:
                return await (handler(request, body) if kind is not None else handler(request))
            except BadRequest as e:
                return error_response(str(e), 400)
            except BackendError as e:
                return error_response(f"backend: {e}", 503 if e.retryable else 400)
            finally:
                self.inflight -= 1

        return wrapped

    async def _body(self, request: web.Request, kind: Dialect) -> Any:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            raise BodyTooLarge(f"{request.path}: Content-Length {request.content_length} is over the "
                               f"{MAX_REQUEST_BYTES}-byte bound on a request body; not read")
        body = await read_request(request, kind, self.limits.body_timeout_s, self.bounds)
        model = getattr(body, "model", None)
        if model is not None and model != self.model_name:  # vLLM's words and status
            raise ModelNotFound(f"The model `{model}` does not exist.")
        return body

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
        card = ModelCard(id=self.model_name, created=int(self.started), owned_by="parser", root=self.model_name,
                         max_model_len=self.context_length)
        return json_response(ModelList(data=[card]).reply())

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
            count = len(prompt)  # ids were checked against the vocabulary with the body (parser.serving.wire)
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

    async def generate(self, request: web.Request, body: Any) -> web.Response:
        """SGLANG (`POST /generate`), with SGLang's input logprobs for scoring."""
        sampling = body.params()
        prompt, field = body.prompt, f"{SGLANG.path}.{body.prompt_field}"
        start = body.logprob_start_len
        t0 = time.perf_counter()
        input_lps = None
        if body.return_logprob and start >= 0:  # SGLang's input logprobs (-1, its default: none)
            if sampling.temperature != 1.0:  # SGLang scales them by it; the backend scores at 1
                raise BadRequest(f"{SGLANG.path}.sampling_params.temperature: input logprobs are given at temperature 1 "
                                 f"only on parser.serving.server, got {sampling.temperature}")
            prompt = await self._prompt_ids(prompt, field)
            scores = await self._input_logprobs(request, prompt, start, field)
            input_lps = [(lp, t, None) for lp, t in zip(scores, prompt[start:], strict=True)]
        if input_lps is not None and sampling.max_new_tokens == 0:  # scoring only: nothing to generate
            comp = Completion(text="", finish_reason="length", prompt_tokens=len(prompt))
        else:
            comp = await self._run(request, prompt, sampling, field)
        return json_response(SGLANG.reply(comp, model=self.model_name, logprobs=body.return_logprob,
                                          input_logprobs=input_lps, latency=time.perf_counter() - t0))

    async def completions(self, request: web.Request, body: Any) -> web.Response:
        """COMPLETIONS (`POST /v1/completions`), with vLLM's `prompt_logprobs` and OpenAI's `echo` for scoring."""
        sampling = body.params()
        prompt, field = body.prompt, f"{COMPLETIONS.path}.prompt"
        # input logprobs two ways: vLLM's `prompt_logprobs`, or OpenAI's `echo` with max_tokens 0
        prompt_logprobs = scored = None
        if body.prompt_logprobs is not None or (body.echo and sampling.return_logprobs):
            prompt = await self._prompt_ids(prompt, field)
            scores = await self._input_logprobs(request, prompt, 0, field)
            scored = (prompt, scores)
            if body.prompt_logprobs is not None:
                prompt_logprobs = [None] + [
                    {str(t): {"logprob": lp, "rank": None, "decoded_token": self._token_text(t)}}
                    for t, lp in zip(prompt[1:], scores[1:], strict=True)]
        if body.echo or (body.prompt_logprobs is not None and sampling.max_new_tokens == 0):
            text = prompt if isinstance(prompt, str) else (self.tokenizer.decode(prompt) if self.tokenizer else "")
            comp = Completion(text=text if body.echo else "", finish_reason="length",
                              prompt_tokens=len(prompt) if isinstance(prompt, list) else 0)
            logprobs = body.echo and sampling.return_logprobs  # the echoed prompt's, nothing generated
        else:
            comp = await self._run(request, prompt, sampling, field)
            logprobs, scored = sampling.return_logprobs, None
        return json_response(COMPLETIONS.reply(comp, model=self.model_name, logprobs=logprobs, token_text=self._token_text,
                                               token_ids=bool(body.return_token_ids), scored=scored,
                                               prompt_logprobs=prompt_logprobs))

    async def chat(self, request: web.Request, body: Any) -> web.Response:
        """CHAT (`POST /v1/chat/completions`): this server renders its tokenizer's chat template."""
        where = CHAT.path
        if self.tokenizer is None:
            raise BadRequest(f"{where}: this server has no tokenizer to render chat")
        sampling = body.params()
        size = sum(message.size() for message in body.messages)
        if size > BYTES_PER_TOKEN_BOUND * self.context_length:
            raise BadRequest(f"{where}.messages: {size} characters cannot fit the context of {self.context_length} tokens")
        try:  # the server's own template, on a worker thread; what it raises is about these messages
            text = await asyncio.to_thread(self.tokenizer.apply_chat_template, body.template_messages(), tokenize=False,
                                           add_generation_prompt=True, **body.chat_template_kwargs)
        except Exception as error:  # noqa: BLE001 - jinja raises TemplateError, but templates raise anything
            raise BadRequest(f"{where}.messages: the chat template refused them: {type(error).__name__}: {error}") from None
        comp = await self._run(request, text, sampling, f"{where}.messages")
        return json_response(CHAT.reply(comp, model=self.model_name, logprobs=sampling.return_logprobs,
                                        token_text=self._token_text, token_ids=bool(body.return_token_ids)))


def _vocab_size(backend: Backend, tokenizer: Any) -> int | None:
    """Rows of the model's input embedding (an id past them crashes the forward), else the tokenizer's size."""
    model = getattr(backend, "model", None)
    if model is not None and hasattr(model, "get_input_embeddings"):
        return int(model.get_input_embeddings().num_embeddings)
    return len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None


def _context_length(backend: Backend, asked: int | None) -> int:
    """The context advertised and enforced: the model's own positions (its config), or less if asked."""
    config = getattr(getattr(backend, "model", None), "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text_config, "max_position_embeddings", None)
    if asked is None:
        if limit is None:
            raise ValueError(f"parser.serving.server: {type(backend).__name__} states no max_position_embeddings; "
                             "give context_length (--context-length)")
        return int(limit)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise ValueError(f"parser.serving.server: context_length must be a positive integer, got {asked!r}")
    if limit is not None and asked > limit:
        raise ValueError(f"parser.serving.server: context_length {asked} is over the model's max_position_embeddings {limit}")
    return asked


def start_server(backend: Backend, host: str = "127.0.0.1", port: int = 0, *,
                 tokenizer: Any = None, model_name: str = "default",
                 worker_id: str = "worker-0", context_length: int | None = None,
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
    # every number is held to its declared domain (parser.base.domains) as it is parsed: a value
    # outside it is argparse's one-line error, exit 2, before the model loads
    ap.add_argument("--port", type=argparse_type("port", int), default=30000)
    ap.add_argument("--worker-id", default=None, help="sent back as X-Worker-Id (default host:port)")
    ap.add_argument("--context-length", type=argparse_type("context_length", int), default=None,
                    help="tokens a request may span (default: the model's max_position_embeddings; never more)")
    for field in dataclasses.fields(ServerLimits):  # the request bounds, e.g. --max-stop-strings 32
        ap.add_argument(f"--{field.name.replace('_', '-')}", type=argparse_type(field.name, type(field.default)),
                        default=field.default)
    args = ap.parse_args(argv)
    limits = ServerLimits(**{field.name: getattr(args, field.name) for field in dataclasses.fields(ServerLimits)})
    with stop_on_signals():  # SIGINT / SIGTERM while the model loads too, even started with SIGINT ignored
        try:
            print(f"parser.serving.server: loading {args.model}", flush=True)
            backend, tokenizer = build_backend({"_target_": TRANSFORMERS, "model": args.model, "name": args.model})
            server = ModelServer(backend, tokenizer=tokenizer, model_name=args.model,
                                 worker_id=args.worker_id or f"{args.host}:{args.port}",
                                 context_length=args.context_length, limits=limits)
            ready = (f"parser.serving.server: {args.model} on http://{args.host}:{args.port} "
                     f"(worker {server.worker_id})")
            # aiohttp prints once the port listens, and from then on stops gracefully on SIGINT/SIGTERM itself
            web.run_app(server.app(), host=args.host, port=args.port, backlog=BACKLOG, access_log=None,
                        print=lambda _listening: print(ready, flush=True), shutdown_timeout=10.0,
                        handler_cancellation=True, keepalive_timeout=limits.idle_timeout_s)
        except KeyboardInterrupt:  # before the server listened: nothing to drain
            print("parser.serving.server: interrupted before serving", flush=True)
            raise SystemExit(130) from None
    print("parser.serving.server: stopped", flush=True)


if __name__ == "__main__":
    main()
