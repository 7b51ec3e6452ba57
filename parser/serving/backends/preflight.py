"""Ask a remote model server once, before the first sample, whether it is there and what it serves.

Why: a server that was down used to be found out by every sample in turn (~4.5 s of retries each,
"will retry on re-run"), so a full eval grid spent hours failing; and an OpenAI-compatible
endpoint needed three settings besides its URL (the software behind it, the served model's name,
a tokenizer), the last of which silently went to the model hub. One GET answers all of it:
`/v1/models` (OpenAI APIs) or `/health` (SGLang's native API), under a deadline, failing with the
URL and the setting to change.

    info = probe("http://127.0.0.1:8000", api="completions")   # ServerInfo(models=["smollm2"], software="parser")
    resolve_server("auto", info)                                # "vllm": parser.serving.server speaks vLLM's extensions
"""
from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

from parser.base.config import ConfigError

PROBE_TIMEOUT_S = 10.0  # per probe: a server that cannot answer one GET in this is not ready
MAX_PROBE_BYTES = 1 << 20  # a model list is a few hundred bytes
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
    """GET `/v1/models` (OpenAI APIs) or `/health` (api: sglang) from `base_url`, once."""
    path = "/health" if api == "sglang" else "/v1/models"
    url = base_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "identity"}),
                                    timeout=timeout_s) as reply:
            body = reply.read(MAX_PROBE_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise ServerUnavailable(f"{where}: GET {url} answered {err.code} {err.reason}: is this the server's "
                                f"base URL (set {where}.base_url)?") from None
    except (urllib.error.URLError, OSError) as err:  # refused, unresolvable, timed out, reset
        reason = getattr(err, "reason", err)
        raise ServerUnavailable(f"{where}: cannot reach {url} ({reason}): start the server or set {where}.base_url; "
                                "nothing was run") from None
    if path == "/health":
        return ServerInfo((), "sglang")
    try:
        data = json.loads(body[:MAX_PROBE_BYTES]).get("data") or []
        models = tuple(str(m["id"]) for m in data if isinstance(m, dict) and m.get("id"))
        software = next((str(m["owned_by"]) for m in data if isinstance(m, dict) and m.get("owned_by")), None)
    except (ValueError, AttributeError):
        raise ServerUnavailable(f"{where}: GET {url} did not answer an OpenAI model list: is this an "
                                f"OpenAI-compatible server (set {where}.api / {where}.base_url)?") from None
    if not models:
        raise ServerUnavailable(f"{where}: GET {url} lists no served model")
    return ServerInfo(models, software)


def resolve_server(server: str, info: ServerInfo) -> str:
    """`server: auto` -> the dialect the probed software speaks (generic for unknown software)."""
    if server != "auto":
        return server
    return SOFTWARE_DIALECT.get((info.software or "").lower(), "generic")
