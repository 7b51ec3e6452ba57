"""`HttpBackend`: one model server (or the gateway in front of many) over HTTP.

Why it exists: subagent scatter rounds send hundreds to thousands of concurrent requests
(T = 220 chunks of 4096 tokens, T = 1750 of 512 for an 896K-token document). The client must
not be the bottleneck, so this is one pooled aiohttp session per event loop with a large
connection limit and keep-alive, and orjson on both sides of the wire.

Three wire formats, chosen by `api`; each is one `parser.serving.wire.dialect.Dialect` (its path,
body and reply; the server, the loopback worker and the in-process engine use the same objects), so
this module is only the transport: the pooled session, bounded bodies and error classes.
- "sglang":      SGLang's native `POST /generate` (text or `input_ids`; token ids and
                 per-token logprobs come back, which the lead agent needs).
- "completions": OpenAI `POST /v1/completions` (text or token-id prompt). The lead's path on
                 vLLM: token-id prompts in, generated ids back (`return_token_ids`).
- "chat":        OpenAI `POST /v1/chat/completions`: the *server* renders the chat template, so
                 it takes chat messages only — never text already rendered by a template (that
                 would be templated twice) and never token ids (use "completions" for the lead).
                 `SubagentReader` sends messages to backends with `renders_chat_template`.
                 `chat_template_kwargs`, e.g. {"enable_thinking": False}, is passed through.

`server` names the software behind an OpenAI API, because the extensions differ:
- "vllm":    asks for the generated token ids (`return_token_ids`); constraints go in
             `structured_outputs` ({"json": ...} / {"regex": ...}).
- "sglang":  constraints in `response_format` / `regex`; the native api="sglang" is preferred.
- "generic": any other OpenAI-compatible server (llama.cpp, ...): no token ids (the lead's token
             view becomes approximate, and training refuses it), no request-id header by default
             (llama.cpp answers 400 to one that is not a UUID), and constraints are refused
             rather than silently ignored.
`model: null` asks `GET /v1/models` once for the served model's name.

`score(prompt_ids, continuation_ids)` (parser.serving.backends.scoring) asks the same server for the
log-probs of given tokens: SGLang's `/generate` input logprobs (`logprob_start_len`, zero new
tokens), vLLM's `prompt_logprobs`, or, on a generic server, an OpenAI `echo` with `max_tokens: 0`.

Every request carries the routing key (`X-SMG-Routing-Key: doc_id:chunk_index` by default,
`parser.serving.types.ROUTING_HEADER`; the header name is a knob) for the SGLang Model Gateway's
consistent-hashing policy) so a gateway can pin a chunk to one worker, and the trajectory's
request id (`request_id_header`, `X-Request-Id` by default; null turns it off) for sticky
sessions. If the server says which worker answered (`X-Worker-Id`, set by `parser.serving.server` and the
loopback worker), it lands in `Completion.worker`.

It must never retry by itself: the engine owns retries and backoff (`parser.serving.retry`). Failures
become `BackendError`, classified by whose fault they are. The worker's: 5xx, 408, 429,
connection errors and resets, timeouts, and every 200 the client refuses (a garbled body, a body
over the bound, an encoding it did not ask for, an SGLang abort) are `retryable=True`, so a
retry (through a gateway, or `WorkerPool`'s failover) can land on a healthy worker. Ours: other
4xx, and 5xx whose body names a validation error (llama.cpp answers an over-long prompt with
500), fail the same on every worker and are `retryable=False`. The server's message is kept, capped at
`MAX_ERROR_CHARS`.

Bodies are bounded: at most `max_response_bytes` of a reply are read (a declared
Content-Length over it is refused before reading; an error body is cut at `ERROR_BODY_BYTES`,
not refused). The client asks for `identity` and never lets aiohttp decompress by itself
(a 200 KB gzip reply grew the client by 1.2 GB): a server that compresses anyway is decoded
here, within the same bound. A body over the bound is a retryable `BackendError` (the worker's).

    backend = HttpBackend("http://127.0.0.1:30000", api="sglang")
    backend = HttpBackend("http://127.0.0.1:8000", api="completions", server="vllm")  # model from /v1/models
    out = await backend.generate("Hello", SamplingParams(max_new_tokens=16))
    logprobs = await backend.score(prompt_ids, answer_ids)   # parser.serving.backends.scoring
    await backend.aclose()
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Any, Mapping, Sequence

import aiohttp
import orjson

from parser.base.redact import redact
from parser.serving.types import ROUTING_HEADER, BackendError, Completion, Prompt, SamplingParams
from parser.serving.backends.scoring import SCORE_TEMPERATURE, check_request
from parser.serving.wire.common import ModelList
from parser.serving.wire.dialect import DIALECTS, Api
from parser.serving.wire.openai import Server

_RETRYABLE_4XX = {408, 429}  # request timeout / queue full at the gateway: try again later
# OpenAI-style error types that mean "this request is wrong", whatever the status says
_VALIDATION_ERRORS = {"invalid_request_error", "exceed_context_size_error", "not_supported_error",
                      "BadRequestError", "NotFoundError"}
MAX_ERROR_CHARS = 500  # of a server's error message kept in BackendError (one was 1.1 MB)
MAX_RESPONSE_BYTES = 32 << 20  # of one reply; a lead turn of 8K tokens with logprobs is < 1 MB
ERROR_BODY_BYTES = 2 << 20  # of an error reply: enough for the 1.1 MB message llama.cpp once sent
_READ_CHUNK = 1 << 16
_ZLIB_ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 47}  # zlib wbits: gzip header / zlib or gzip


class _TooLarge(Exception):
    pass


class HttpBackend:
    def __init__(
        self,
        base_url: str,
        api: Api = "sglang",
        model: str | None = None,
        *,
        server: Server = "sglang",
        timeout_s: float = 600.0,
        max_connections: int = 8192,
        headers: Mapping[str, str] | None = None,
        routing_header: str = ROUTING_HEADER,
        request_id_header: str | None = "default",
        worker_header: str = "X-Worker-Id",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ):
        if api not in DIALECTS:
            raise ValueError(f"HttpBackend: api={api!r}; expected one of {sorted(DIALECTS)}")
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.dialect = DIALECTS[api]
        if server not in ("sglang", "vllm", "generic"):
            raise ValueError(f"HttpBackend: server={server!r}; expected sglang, vllm or generic")
        self.server = server
        self.url = self.base_url + self.dialect.path
        self.shown_url = redact(self.url)  # the URL in messages: a password in base_url is masked
        self.model = model  # None: discovered from GET /v1/models on first use (OpenAI APIs)
        self._model_lookup: asyncio.Lock | None = None
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise ValueError(f"HttpBackend: max_response_bytes must be a positive integer, got {max_response_bytes!r}")
        self.max_response_bytes = max_response_bytes
        self.headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", **(headers or {})}
        self.routing_header = routing_header
        if request_id_header == "default":
            request_id_header = None if server == "generic" else "X-Request-Id"
        self.request_id_header = request_id_header or None
        self.worker_header = worker_header
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.extra_body = dict(extra_body or {})
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ session
    def _get_session(self) -> aiohttp.ClientSession:
        """The pooled session of the running loop; made lazily because aiohttp binds a
        session to the loop it was created in (and callers may run several loops in turn)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=60.0
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                skip_auto_headers=("User-Agent",),
                auto_decompress=False,  # decoded by _read_body, within max_response_bytes
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            if self._loop is asyncio.get_running_loop():
                await self._session.close()
        self._session = None
        self._loop = None

    async def __aenter__(self) -> "HttpBackend":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def renders_chat_template(self) -> bool:
        """True when the server applies the chat template: callers send messages, not text."""
        return self.api == "chat"

    async def served_model(self) -> str:
        """The configured model name, else the first one `GET /v1/models` lists (asked once)."""
        if self.model is not None:
            return self.model
        if self._model_lookup is None:
            self._model_lookup = asyncio.Lock()
        async with self._model_lookup:
            if self.model is None:
                url = self.base_url + "/v1/models"
                body = await self._request("GET", url, None, self.headers)
                try:
                    self.model = ModelList.model_validate(body).data[0].id
                except ValueError:
                    raise BackendError(f"GET {redact(url)}: no served model listed ({str(body)[:200]}); set `model`",
                                       retryable=False) from None
        return self.model

    # ------------------------------------------------------------------ generate
    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> Completion:
        payload = self.dialect.body(prompt, sampling, server=self.server, chat_kwargs=self.chat_template_kwargs)
        if self.dialect.names_model:
            payload["model"] = await self.served_model()
        if self.extra_body:
            payload.update(self.extra_body)
        meta: dict[str, str | None] = {}
        body = await self._request("POST", self.url, orjson.dumps(payload), self._headers(routing_key, request_id), meta)
        completion = self.dialect.completion(body, sampling, where=f"POST {self.shown_url} (HTTP 200)")
        completion.worker = meta.get("worker")
        return completion

    # ------------------------------------------------------------------ score
    async def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        *,
        routing_key: str | None = None,
        request_id: str | None = None,
    ) -> list[float]:
        """Log-probs of `continuation_ids` after `prompt_ids` (parser.serving.backends.scoring): SGLang's
        input logprobs, vLLM's prompt logprobs, or an OpenAI echo; a chat API cannot score."""
        prompt, continuation = check_request(prompt_ids, continuation_ids, f"HttpBackend({self.shown_url})")
        payload = self.dialect.scoring_body(prompt + continuation, len(prompt) - 1, server=self.server,
                                            temperature=SCORE_TEMPERATURE)
        if self.dialect.names_model:
            payload["model"] = await self.served_model()
        body = await self._request("POST", self.url, orjson.dumps(payload), self._headers(routing_key, request_id))
        return self.dialect.scores(body, len(prompt), continuation, server=self.server,
                                   where=f"POST {self.shown_url} (HTTP 200)")

    def _headers(self, routing_key: str | None, request_id: str | None) -> Mapping[str, str]:
        """The client's headers plus this request's routing key and request id, when given."""
        if routing_key is None and (request_id is None or not self.request_id_header):
            return self.headers
        headers = dict(self.headers)
        if routing_key is not None:
            headers[self.routing_header] = routing_key
        if request_id is not None and self.request_id_header:
            headers[self.request_id_header] = request_id
        return headers

    async def _request(self, method: str, url: str, data: bytes | None, headers: Mapping[str, str],
                       meta: dict[str, str | None] | None = None) -> Any:
        """One HTTP exchange -> the parsed JSON body; every failure is a `BackendError`, whose
        message names the URL with its password masked (an exception's own words too)."""
        session = self._get_session()
        shown = redact(url)
        try:
            # `async with` hands the connection back to the pool on every path
            async with session.request(method, url, data=data, headers=headers) as resp:
                status = resp.status
                if meta is not None:
                    meta["worker"] = resp.headers.get(self.worker_header)
                try:
                    raw = await _read_body(resp, self.max_response_bytes if status < 400 else ERROR_BODY_BYTES,
                                           truncate=status >= 400)
                except _TooLarge as e:
                    raise BackendError(f"{method} {shown}: HTTP {status} with a body over max_response_bytes="
                                       f"{self.max_response_bytes} ({e}); not read", retryable=True, status=status) from None
                except zlib.error as e:
                    raise BackendError(f"{method} {shown}: HTTP {status} with a body that does not decode as "
                                       f"{resp.headers.get('Content-Encoding')} ({e})", retryable=True, status=status) from e
        except asyncio.TimeoutError as e:  # aiohttp's ServerTimeoutError is one too
            raise BackendError(f"{method} {shown}: no complete answer within {self.timeout_s}s", retryable=True) from e
        except aiohttp.TooManyRedirects as e:  # its own words were "0, message=''": not a server that will recover
            last = e.history[-1] if e.history else None
            to = f" {last.status} to {redact(str(last.headers.get('Location')))}" if last is not None else ""
            raise BackendError(f"{method} {shown}: redirected {len(e.history)} times (last{to}): set base_url to the "
                               "model server's own address", retryable=False) from e
        except aiohttp.ClientError as e:
            raise BackendError(f"{method} {shown}: {type(e).__name__}: {redact(str(e))}", retryable=True) from e
        if status >= 400:
            message, kind = _error_message(raw)
            retryable = (status >= 500 or status in _RETRYABLE_4XX) and kind not in _VALIDATION_ERRORS
            raise BackendError(f"{method} {shown}: HTTP {status}: {message}", retryable=retryable, status=status)
        try:
            return _loads(raw)
        except orjson.JSONDecodeError as e:
            raise BackendError(
                f"{method} {shown}: HTTP {status} but the body is not JSON ({e}): {raw[:200]!r}",
                retryable=True,
                status=status,
            ) from e


async def _read_body(resp: aiohttp.ClientResponse, limit: int, *, truncate: bool) -> bytes:
    """At most `limit` bytes of the decoded body: more raises `_TooLarge` (or, with `truncate`,
    is dropped unread). gzip/deflate are decoded here with the same bound; another encoding
    (the client asked for identity) is refused."""
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity") and encoding not in _ZLIB_ENCODINGS:
        raise BackendError(f"{resp.method} {redact(str(resp.url))}: the server sent Content-Encoding {encoding!r}, which this client "
                           "does not decode (it asks for identity)", retryable=True, status=resp.status)
    decoder = zlib.decompressobj(_ZLIB_ENCODINGS[encoding]) if encoding in _ZLIB_ENCODINGS else None
    if decoder is None and resp.content_length is not None and resp.content_length > limit and not truncate:
        raise _TooLarge(f"Content-Length {resp.content_length}")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_READ_CHUNK):
        if decoder is not None:
            chunk = decoder.decompress(chunk, limit + 1 - len(body))
        body += chunk
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise _TooLarge(f"more than {limit} bytes" + (" once decompressed" if decoder is not None else ""))
    if decoder is not None:
        body += decoder.flush()
        if len(body) > limit and not truncate:
            raise _TooLarge(f"more than {limit} bytes once decompressed")
    return bytes(body[:limit])


# ---------------------------------------------------------------------- error bodies
def _error_message(raw: bytes) -> tuple[str, str | None]:
    """(the server's own words, capped at MAX_ERROR_CHARS; its error type if it names one):
    OpenAI `{"error": {"message", "type"}}`, vLLM `{"message", "type"}`, SGLang/FastAPI
    `{"error": ...}` / `{"detail": ...}`, or the raw text."""
    try:
        obj = _loads(raw)
    except orjson.JSONDecodeError:
        return _cap(raw[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace")) or "(empty body)", None
    message, kind = str(obj), None
    if isinstance(obj, dict):
        kind = obj.get("type") if isinstance(obj.get("type"), str) else None
        for key in ("error", "detail", "message"):
            val = obj.get(key)
            if isinstance(val, dict) and "message" in val:
                message = str(val["message"])
                kind = val.get("type") if isinstance(val.get("type"), str) else kind
                break
            if val:
                message = str(val)
                break
    return _cap(message), kind


def _loads(raw: bytes) -> Any:
    """orjson, after a cheap look at both ends: orjson's error path takes ~12x the body in memory
    (50 MB for a 4 MB HTML page or a cut-off reply), so what cannot be one JSON object or array
    is refused before it is parsed."""
    body = raw.strip()
    if not body or (body[:1], body[-1:]) not in ((b"{", b"}"), (b"[", b"]")):
        raise orjson.JSONDecodeError("not one JSON object or array", body[:80].decode("utf-8", "replace"), 0)
    return orjson.loads(body)


def _cap(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}... [{len(text)} chars]"
