"""Remote backends are asked once before anything runs (parser.serving.backends.preflight): a server that
is down fails at once naming its URL; `server: auto`, `model: null` and `tokenizer: null` are read
from GET /v1/models; offline, an unknown model or tokenizer name is refused with the valid
offline names instead of retrying the hub. The probe's deadline is the whole GET's, whatever the
server trickles, and each bad answer (5xx, 4xx, not JSON, a `data` that is not a list of model
objects, a model name it does not serve) is one line naming the URL and the reason.

The servers here are aiohttp apps on 127.0.0.1 answering GET /v1/models as vLLM, SGLang and a
generic OpenAI server do (the `owned_by` field they send); nothing else of them is needed.

    .venv/bin/pytest tests/test_preflight_on_cpu.py -q
"""
from __future__ import annotations

import threading
import time

import pytest
from aiohttp import web

from parser.serving.backends import build_backend
from parser.serving.backends.loading import load_tokenizer
from parser.serving.backends.preflight import ServerUnavailable, probe
from parser.base.config import ConfigError
from parser.serving.gateway import free_port
from support.slow_server import Trickle, http_reply


class ModelList:
    """An aiohttp app in a thread answering GET /v1/models with one model `owned_by` someone."""

    def __init__(self, model: str, owned_by: str | None, authorization: str | None = None):
        self.model, self.owned_by, self.authorization = model, owned_by, authorization  # None: open to all
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = threading.Event()

    async def models(self, request: web.Request) -> web.Response:
        if self.authorization is not None and request.headers.get("Authorization") != self.authorization:
            return web.json_response({"error": "unauthorized"}, status=401)
        entry = {"id": self.model, "object": "model", **({"owned_by": self.owned_by} if self.owned_by else {})}
        return web.json_response({"object": "list", "data": [entry]})

    def __enter__(self) -> "ModelList":
        import asyncio

        self.loop = asyncio.new_event_loop()

        async def start():
            app = web.Application()
            app.router.add_get("/v1/models", self.models)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
            self.ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()), self.loop.run_forever()), daemon=True)
        self.thread.start()
        assert self.ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def openai_section(url: str, **extra) -> dict:
    return {"_target_": "parser.serving.backends.http_backend", "base_url": url, "api": "completions", "server": "auto", "model": None, "tokenizer": None, **extra}


@pytest.mark.parametrize("owned_by,dialect", [("vllm", "vllm"), ("sglang", "sglang"), ("parser", "vllm"),
                                              ("llamacpp", "generic"), (None, "generic")])
def test_server_auto_model_and_tokenizer_come_from_the_model_list(owned_by, dialect):
    with ModelList("tiny-qwen3.5", owned_by) as server:
        backend, tokenizer = build_backend(openai_section(server.url), where="models.lead")
    assert backend.server == dialect and backend.model == "tiny-qwen3.5"
    assert tokenizer.chat_template  # the offline name's tokenizer, loaded with no hub


def test_a_server_that_is_down_fails_at_once_naming_its_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ServerUnavailable, match=rf"models\.lead: cannot reach {url}/v1/models .*set models\.lead\.base_url"):
        build_backend(openai_section(url), where="models.lead")
    with pytest.raises(ServerUnavailable, match=r"/health"):
        probe(url, api="sglang")


def test_a_password_in_the_url_is_masked_in_every_refusal_and_sent_as_basic_auth(capsys):
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=rf"cannot reach http://ann:\*\*\*@{dead}/v1/models") as down:
        build_backend(openai_section(f"http://ann:s3cret@{dead}"), where="models.lead")
    # `Basic YW5uOnMzY3JldA==` is ann:s3cret: the probe must send it, as aiohttp does for every request after
    with ModelList("tiny-qwen3.5", "vllm", authorization="Basic YW5uOnMzY3JldA==") as server:
        authorised = server.url.replace("http://", "http://ann:s3cret@")
        assert probe(authorised, api="completions").models == ("tiny-qwen3.5",)
        with pytest.raises(ServerUnavailable, match=r"ann:\*\*\*@127\.0\.0\.1:\d+ does not serve 'other'") as unserved:
            build_backend(openai_section(authorised, model="other"), where="models.lead")
        with pytest.raises(ServerUnavailable, match=r"GET http://ann:\*\*\*@127\.0\.0\.1:\d+/v1/models answered 401") as refused:
            probe(server.url.replace("http://", "http://ann:wrong@"), api="completions")
        pool, _ = build_backend({"_target_": "parser.serving.backends.http_backend", "api": "completions",
                                 "base_urls": [authorised, f"http://ann:s3cret@{dead}"], "tokenizer": "tiny-qwen3.5"})
    warned = capsys.readouterr().out
    assert f"ann:***@{dead}" in warned and len(pool.backends) == 2
    for said in (str(down.value), str(unserved.value), str(refused.value), warned):
        assert "s3cret" not in said and "wrong" not in said


def test_a_pool_starts_when_one_worker_answers_and_fails_when_none_does(capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    with ModelList("tiny-qwen3.5", "sglang") as live:
        pool, _ = build_backend({"_target_": "parser.serving.backends.http_backend", "api": "completions", "base_urls": [live.url, dead], "tokenizer": "tiny-qwen3.5"})
    assert len(pool.backends) == 2 and dead in capsys.readouterr().out
    with pytest.raises(ServerUnavailable, match=dead):
        build_backend({"_target_": "parser.serving.backends.http_backend", "api": "completions", "base_urls": [dead], "tokenizer": "tiny-qwen3.5"})


def test_offline_a_served_model_this_machine_lacks_names_the_tokenizer_setting(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with ModelList("some-org/not-on-this-machine", "vllm") as server:
        with pytest.raises(ConfigError, match=r"models\.subagent\.tokenizer is not set and the served model "
                                              r"'some-org/not-on-this-machine' is not on this machine"):
            build_backend(openai_section(server.url), where="models.subagent")


def test_offline_an_unknown_model_name_is_refused_with_the_offline_names(monkeypatch):
    """Refused before transformers is asked (it retried the hub 22 times, 97 s, before an OSError)."""
    import transformers

    def no_hub(*_args, **_kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_hub)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_hub)
    with pytest.raises(ConfigError, match=r"'tiny-qwen35' is not a local path, not an offline name \(.*tiny-qwen3\.5"):
        load_tokenizer("tiny-qwen35")
    with pytest.raises(ConfigError, match="smollm2"):
        build_backend({"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config", "model": "smolm2"})


# ---------------------------------------------------------------------- deadlines and bad answers
# `support.slow_server.Trickle` stands in for a server that is stuck mid-reply or never answers
# (interval_s=0 with the whole reply at once: a server that answers at once, badly).
MODELS = b'{"object": "list", "data": [{"id": "tiny-qwen3.5", "object": "model", "owned_by": "vllm"}]}'


@pytest.mark.parametrize("reply,at_once", [(http_reply(MODELS), 0),  # the status line itself, a byte at a time
                                           (http_reply(MODELS), len(http_reply(MODELS)) - len(MODELS) + 5),  # the body
                                           (None, 0)],  # accepts, never answers
                         ids=["trickled-headers", "trickled-body", "silent"])
def test_the_probe_ends_at_its_deadline_however_slowly_the_server_answers(reply, at_once):
    """urllib's timeout was per read: a byte every 50 ms held the probe for the whole reply (and a
    slower trickle for ever). The deadline is the whole GET's."""
    with Trickle(reply, at_once=at_once, interval_s=0.05) as server:
        started = time.monotonic()
        with pytest.raises(ServerUnavailable, match=rf"models\.lead: GET {server.url}/v1/models gave no complete answer "
                                                    r"within 0\.5 s") as refused:
            probe(server.url, "completions", "models.lead", timeout_s=0.5)
        assert time.monotonic() - started < 2.0  # the whole reply takes ~5 s to trickle
    assert "\n" not in str(refused.value)


def test_a_base_url_ending_in_v1_is_told_to_drop_it():
    """An OpenAI client's base_url ends in /v1; ours is the server's root, so /v1/v1/models was a
    bare 404 (or, down, a refused connection) with nothing said about why."""
    reply = http_reply(b'{"detail": "Not Found"}', "404 Not Found")
    with Trickle(reply, at_once=len(reply)) as server:
        with pytest.raises(ServerUnavailable, match=r"/v1/v1/models answered 404 .*models\.lead\.base_url ends in /v1, "
                                                    r"which the API paths add: drop it\)"):
            probe(server.url + "/v1/", "chat", "models.lead")


@pytest.mark.parametrize("reply,reason", [
    (http_reply(b"upstream exploded", "500 Internal Server Error", "text/plain"), r"answered 500 Internal Server Error \('upstream exploded'\): the server is failing"),
    (http_reply(b"", "503 Service Unavailable"), r"answered 503 Service Unavailable \(an empty body\)"),
    (http_reply(b'{"detail": "Not Found"}', "404 Not Found"), r"answered 404 Not Found: is this the server's base URL"),
    (http_reply(b"nope", "401 Unauthorized"), r"answered 401 Unauthorized"),
    (http_reply(b"<html><body>It works!</body></html>", content_type="text/html"), r"the answer is not JSON \('<html>"),
    (http_reply(b'\xff\xfe{\x00"\x00'), r"the answer is not JSON"),  # UTF-16, or just not UTF-8
    (http_reply(b'{"data": [{"id": "m"}]'), r"the answer is not JSON"),  # cut off
    (http_reply(b'[{"id": "m"}]'), r"no `data` list of models"),
    (http_reply(b'{"data": {"id": "m"}}'), r"no `data` list of models"),
    (http_reply(b'{"data": "m"}'), r"no `data` list of models"),
    (http_reply(b'{"models": [{"id": "m"}]}'), r"no `data` list of models"),
    (http_reply(b'{"data": ["m"]}'), r"data\[0\] is not a model object with an `id` \(\"m\"\)"),
    (http_reply(b'{"data": [{"id": "m"}, {"name": "n"}]}'), r"data\[1\] is not a model object"),
    (http_reply(b'{"data": [{"id": 7}]}'), r"data\[0\] is not a model object"),
    (http_reply(b'{"data": []}'), r"lists no served model"),
    (http_reply(b"[" * 100_000 + b"]" * 100_000), r"the answer is not JSON \('\[\[\["),  # json's RecursionError escaped
    (http_reply(b'data: {"object": "list"}\n\n', content_type="text/event-stream"), r"the answer is not JSON \('data: "),  # SSE
    (http_reply(b"", "301 Moved Permanently")[:-2] + b"Location: /v1/models\r\n\r\n", r"answered 301 Moved Permanently"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", r"did not answer HTTP \(SSH-2\.0-OpenSSH_9\.6\)"),  # not HTTP at all
    (b"HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n{\"data\"", r"the answer is not JSON \('\{\"data\"'\)"),  # closed mid-body
], ids=lambda value: value[:24].decode("ascii", "replace") if isinstance(value, bytes) else None)
def test_a_bad_answer_is_one_line_naming_the_url_and_the_reason(reply, reason):
    with Trickle(reply, at_once=len(reply)) as server:
        with pytest.raises(ServerUnavailable, match=rf"models\.subagent: .*{server.url}/v1/models.*{reason}") as refused:
            probe(server.url, "chat", "models.subagent")
    assert "\n" not in str(refused.value)


def test_a_model_the_server_does_not_serve_is_refused_before_anything_runs():
    """Every request would be a 404 (vLLM's "The model `x` does not exist"), retried by nobody."""
    with Trickle(http_reply(MODELS), at_once=len(http_reply(MODELS))) as server:
        with pytest.raises(ServerUnavailable, match=rf"models\.lead: {server.url} does not serve 'qwen3.5-4b' \(it serves "
                                                    r"'tiny-qwen3\.5'\); set models\.lead\.model to one of them"):
            build_backend(openai_section(server.url, model="qwen3.5-4b"), where="models.lead")
