"""Remote backends are asked once before anything runs (parser.serving.backends.preflight): a server that
is down fails at once naming its URL; `server: auto`, `model: null` and `tokenizer: null` are read
from GET /v1/models; offline, an unknown model or tokenizer name is refused with the valid
offline names instead of retrying the hub.

The servers here are aiohttp apps on 127.0.0.1 answering GET /v1/models as vLLM, SGLang and a
generic OpenAI server do (the `owned_by` field they send); nothing else of them is needed.

    .venv/bin/pytest tests/test_preflight_on_cpu.py -q
"""
from __future__ import annotations

import socket
import threading

import pytest
from aiohttp import web

from parser.serving.backends import build_backend
from parser.serving.backends.loading import load_tokenizer
from parser.serving.backends.preflight import ServerUnavailable, probe
from parser.base.config import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelList:
    """An aiohttp app in a thread answering GET /v1/models with one model `owned_by` someone."""

    def __init__(self, model: str, owned_by: str | None):
        self.model, self.owned_by = model, owned_by
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = threading.Event()

    async def models(self, request: web.Request) -> web.Response:
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
