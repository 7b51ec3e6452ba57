"""Ask a remote model server once, before the first sample, whether it is there and what it serves.

Why: a server that was down used to be found out by every sample in turn (~4.5 s of retries each,
"will retry on re-run"), so a full eval grid spent hours failing; and an OpenAI-compatible
endpoint needed three settings besides its URL (the software behind it, the served model's name,
a tokenizer), the last of which silently went to the model hub. One GET answers all of it:
`/v1/models` (OpenAI APIs) or `/health` (SGLang's native API), failing with the URL, the reason
and the setting to change. The deadline is the whole GET's, not each read's: a server that
trickles a byte a second, or accepts and never answers, fails at `timeout_s` like one that is
down. A 5xx, a 4xx, a body that is not JSON, a model list whose `data` is not a list of objects
with ids, and (`check_served`) a configured `model` the server does not list are each refused
in one line before anything runs. A URL's userinfo is sent as basic auth (as aiohttp sends it for
every request after), and every message names the URL with its password masked
(`parser.base.redact`).

    info = probe("http://127.0.0.1:8000", api="completions")   # ServerInfo(models=["smollm2"], software="parser")
    resolve_server("auto", info)                                # "vllm": parser.serving.server speaks vLLM's extensions
"""
from __future__ import annotations

import base64
import dataclasses
import http.client
import io
import json
import socket
import time
import urllib.parse

from parser.base.config import ConfigError
from parser.base.redact import redact

PROBE_TIMEOUT_S = 10.0  # the whole probe: a server that cannot answer one GET in this is not ready
MAX_PROBE_BYTES = 1 << 20  # a model list is a few hundred bytes
MAX_SHOWN_CHARS = 120  # of a refused body, quoted in the error
# `owned_by` of GET /v1/models -> the `server` dialect (parser.serving.backends.http) that software speaks.
# parser.serving.server answers vLLM's extensions (`return_token_ids`, `structured_outputs`).
SOFTWARE_DIALECT = {"vllm": "vllm", "sglang": "sglang", "parser": "vllm"}


class ServerUnavailable(ConfigError):
    """The server did not answer its probe: nothing was run, the URL is named."""


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    models: tuple[str, ...]  # served model ids, as GET /v1/models lists them (empty for /health)
    software: str | None  # its `owned_by`: vllm, sglang, parser, or whatever a generic server says


def probe(base_url: str, api: str, where: str = "models", timeout_s: float = PROBE_TIMEOUT_S) -> ServerInfo:
    """GET `/v1/models` (OpenAI APIs) or `/health` (api: sglang) from `base_url`, once, whole
    within `timeout_s`; anything but a 200 with a model list is `ServerUnavailable`, one line
    naming the URL and the reason."""
    path = "/health" if api == "sglang" else "/v1/models"
    url = base_url.rstrip("/") + path
    shown = redact(url)  # what the messages name: a password in the URL is masked
    # an OpenAI client's base_url ends in /v1; ours is the server's root (the API paths add /v1)
    v1 = f" ({where}.base_url ends in /v1, which the API paths add: drop it)" if base_url.rstrip("/").endswith("/v1") else ""
    try:
        status, reason, body = get(url, timeout_s)
    except TimeoutError:
        raise ServerUnavailable(f"{where}: GET {shown} gave no complete answer within {timeout_s:g} s: is the server "
                                f"overloaded or stuck (set {where}.base_url)? nothing was run") from None
    except http.client.HTTPException as err:  # something answered, but not HTTP (or cut off mid-reply)
        raise ServerUnavailable(f"{where}: {shown} did not answer HTTP ({_said(err)}): is {where}.base_url "
                                "the model server's? nothing was run") from None
    except (OSError, ValueError) as err:  # refused, unresolvable, reset, not an http(s) URL
        raise ServerUnavailable(f"{where}: cannot reach {shown} ({_said(err)}): start the server or set "
                                f"{where}.base_url{v1}; nothing was run") from None
    if status >= 500:
        raise ServerUnavailable(f"{where}: GET {shown} answered {status} {reason} ({_shown(body)}): the server is failing; "
                                "see its log. nothing was run")
    if status != 200:
        raise ServerUnavailable(f"{where}: GET {shown} answered {status} {reason}: is this the server's "
                                f"base URL (set {where}.base_url)?{v1}")
    if path == "/health":
        return ServerInfo((), "sglang")
    models = model_list(body, where, shown)
    software = next((str(m["owned_by"]) for m in models if m.get("owned_by")), None)
    return ServerInfo(tuple(str(m["id"]) for m in models), software)


def model_list(body: bytes, where: str, url: str) -> list[dict]:
    """The entries of an OpenAI model list, each an object with a string `id`; refused otherwise."""
    hint = f"is this an OpenAI-compatible server (set {where}.api / {where}.base_url)?"
    where = f"{where}: GET {url}"
    if len(body) > MAX_PROBE_BYTES:
        raise ServerUnavailable(f"{where}: a model list over {MAX_PROBE_BYTES} bytes; {hint}")
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        raise ServerUnavailable(f"{where}: the answer is not JSON ({_shown(body)}); {hint}") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise ServerUnavailable(f"{where}: the answer has no `data` list of models ({_shown(body)}); {hint}")
    for index, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise ServerUnavailable(f"{where}: data[{index}] is not a model object with an `id` "
                                    f"({json.dumps(entry)[:MAX_SHOWN_CHARS]}); {hint}")
    if not data:
        raise ServerUnavailable(f"{where}: lists no served model")
    return data


def check_served(model: str | None, info: ServerInfo, url: str, where: str) -> None:
    """A configured `model` must be one the server lists: asking for another fails every request
    with a 404, so it is refused here, once, with the names it does serve."""
    if model is not None and info.models and model not in info.models:
        raise ServerUnavailable(f"{where}: {redact(url)} does not serve {model!r} (it serves {', '.join(map(repr, info.models))}); "
                                f"set {where}.model to one of them, or null for the first")


def resolve_server(server: str, info: ServerInfo) -> str:
    """`server: auto` -> the dialect the probed software speaks (generic for unknown software)."""
    if server != "auto":
        return server
    return SOFTWARE_DIALECT.get((info.software or "").lower(), "generic")


# ---------------------------------------------------------------------- one GET under a deadline
def get(url: str, timeout_s: float) -> tuple[int, str, bytes]:
    """(status, reason, at most MAX_PROBE_BYTES + 1 bytes of body) of one GET, all of it within
    `timeout_s`: urllib's timeout is per socket read, so a server sending a byte every few seconds
    held a probe for ever. Every read here gets only the time left; past it, `TimeoutError`."""
    deadline = time.monotonic() + timeout_s
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {redact(url)!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection, sock = kind(parts.hostname, parts.port, timeout=timeout_s), None
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                           headers={"Accept-Encoding": "identity", "Connection": "close", **_basic_auth(parts)})
        sock = connection.sock
        connection.sock = _Deadline(sock, deadline)  # what the response reads through
        reply = connection.getresponse()
        return reply.status, reply.reason, reply.read(MAX_PROBE_BYTES + 1)
    finally:
        connection.close()
        if sock is not None:
            sock.close()


def _basic_auth(parts: urllib.parse.SplitResult) -> dict[str, str]:
    """The Authorization header of a URL's userinfo, as aiohttp sends it for the requests that
    follow (without it, a server behind basic auth answered the probe 401 and was refused)."""
    if parts.username is None:
        return {}
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")}


class _Deadline:
    """A connected socket as `http.client` reads a response from it, each read bounded by the
    time left before `deadline`."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self.sock, self.deadline))

    def close(self) -> None:
        """Nothing: the response may still be reading (`Connection: close`); `get` closes the socket."""


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


def _said(error: BaseException) -> str:
    """An error's words on one line (a bad status line is quoted as the server sent it, CRLF and all)."""
    return redact(" ".join(str(error).split()))[:MAX_SHOWN_CHARS] or type(error).__name__


def _shown(body: bytes) -> str:
    text = body[:MAX_SHOWN_CHARS].decode("utf-8", "replace").strip()
    return repr(text) + ("..." if len(body) > MAX_SHOWN_CHARS else "") if text else "an empty body"
