"""A constraint in `SamplingParams` reaches every backend, or the backend refuses it.

The contract (`parser.serving.types.SamplingParams`): a backend honours `json_schema` / `regex`
or raises a non-retryable `BackendError`; none ignores it silently. This file has one row per
class that implements `Backend.generate` in the package and its scripts, found by reading the
source: a new backend class without a row fails `test_every_backend_class_has_a_row`.

    .venv/bin/pytest tests/test_constraints_reach_backends_on_cpu.py -q

Fakes stand in only for what cannot run here: `FakeEngine` for `sglang.Engine` (GPU-only; its
`async_generate` keywords are recorded, `tests/gpu/test_sglang_engine.py` runs the real one),
`FakeServerManager` for verl's rollout client, and a capture server on 127.0.0.1 for the SGLang
and vLLM HTTP servers. The transformers backend runs a real (tiny, random) model under xgrammar.
"""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
from aiohttp import web

from parser.serving.types import BackendError, Completion, SamplingParams
from parser.serving.server import ServerHandle, json_response
from parser.serving.wire.dialect import DIALECTS

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = '{"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}'
CONSTRAINTS = ({"json_schema": SCHEMA}, {"regex": "(yes|no)"})
SGLANG_REPLY = {"text": "yes", "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 2}}


def backend_classes() -> set[str]:
    """`path:Class` of every class whose `async def generate(self, prompt, sampling, ...)` makes it
    a Backend, in parser/ and scripts/ (read, not imported: a GPU-only class counts too)."""
    found = set()
    for path in sorted([*ROOT.joinpath("parser").rglob("*.py"), *ROOT.joinpath("scripts").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or any(getattr(b, "id", None) == "Protocol" for b in node.bases):
                continue  # the Protocol itself is the contract, not a backend
            for item in node.body:
                if isinstance(item, ast.AsyncFunctionDef) and item.name == "generate":
                    names = [a.arg for a in item.args.args[:3]]
                    if names == ["self", "prompt", "sampling"]:
                        found.add(f"{path.relative_to(ROOT).as_posix()}:{node.name}")
    return found


def run(coro):
    return asyncio.run(coro)


def sampled(**constraint: str) -> SamplingParams:
    return SamplingParams(max_new_tokens=24, temperature=0.0, **constraint)


# ---------------------------------------------------------------------- stand-ins at the edge
class FakeEngine:
    """`sglang.Engine.async_generate` (sglang 0.5.x keywords), recording what it is given."""

    def __init__(self, reply: Any = None):
        self.calls: list[dict[str, Any]] = []
        self.reply = reply or SGLANG_REPLY

    async def async_generate(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.reply


class FakeServerManager:
    """verl's `LLMServerClient.generate`, recording calls (a refusal must come before any)."""

    def __init__(self):
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        self.calls.append(sampling_params)
        raise AssertionError("a constrained request reached verl's rollout")


class Recorder:
    """The inner backend of a wrapper: records the SamplingParams it receives."""

    renders_chat_template = False

    def __init__(self):
        self.seen: list[SamplingParams] = []

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None) -> Completion:
        self.seen.append(sampling)
        return Completion(text="yes", token_ids=[5])

    async def aclose(self) -> None:
        pass


class Capture:
    """An HTTP server on 127.0.0.1 answering SGLang's and OpenAI's paths, keeping each body."""

    def __init__(self):
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        if "sampling_params" in body:
            return json_response(SGLANG_REPLY)
        if "messages" in body:
            return json_response({"choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "yes"}}]})
        return json_response({"choices": [{"index": 0, "text": "yes", "finish_reason": "stop"}]})


@pytest.fixture
def capture():
    cap = Capture()
    app = web.Application()
    for dialect in DIALECTS.values():
        app.router.add_post(dialect.path, cap.handle)
    with ServerHandle(app) as handle:
        cap.url = handle.url
        yield cap


# ---------------------------------------------------------------------- one row per Backend class
def honours_http(capture, **_):
    """SGLang `/generate`: sampling_params.json_schema/regex; vLLM: structured_outputs; a generic
    OpenAI server has no known field: refused."""
    from parser.serving.backends.http import HttpBackend

    async def one(backend, prompt, s):
        try:
            return await backend.generate(prompt, s)
        finally:
            await backend.aclose()

    for constraint in CONSTRAINTS:
        (key, value), = constraint.items()
        run(one(HttpBackend(capture.url), [1, 2], sampled(**constraint)))
        assert capture.bodies[-1]["sampling_params"][key] == value
        run(one(HttpBackend(capture.url, api="completions", server="vllm", model="m"), [1, 2], sampled(**constraint)))
        sent = capture.bodies[-1]["structured_outputs"]
        assert sent == ({"json": orjson.loads(SCHEMA), "disable_any_whitespace": True} if key == "json_schema"
                        else {"regex": value})
        run(one(HttpBackend(capture.url, api="chat", server="sglang", model="m"), [{"role": "user", "content": "x"}],
                sampled(**constraint)))
        body = capture.bodies[-1]
        if key == "regex":
            assert body["regex"] == value
        else:
            assert body["response_format"]["json_schema"]["schema"] == orjson.loads(SCHEMA)
        refused(lambda s: one(HttpBackend(capture.url, api="completions", server="generic", model="m"), "x", s),
                constraint)


def honours_transformers(tiny_qwen3_model, tiny_tokenizer, **_):
    """A real (tiny, random) model under xgrammar's token masks: the output matches the constraint."""
    from parser.serving.backends.transformers import TransformersBackend

    backend = TransformersBackend(tiny_qwen3_model, tiny_tokenizer)
    prompt = tiny_tokenizer.encode("Is the bridge older than the mill?", add_special_tokens=False)
    free = run(backend.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0.0)))
    assert not re.fullmatch("(yes|no)", free.text)  # the random model alone says something else
    out = run(backend.generate(prompt, sampled(regex="(yes|no)")))
    assert re.fullmatch("(yes|no)", out.text) and out.finish_reason == "stop"
    out = run(backend.generate(prompt, sampled(json_schema=SCHEMA)))
    assert isinstance(orjson.loads(out.text)["answer"], str)


def honours_sglang_engine(**_):
    """The engine gets POST /generate's fields (text named prompt): the constraint included."""
    from parser.serving.backends.sglang_engine import SGLangEngineBackend

    for constraint in CONSTRAINTS:
        (key, value), = constraint.items()
        engine = FakeEngine()
        out = run(SGLangEngineBackend(engine=engine, tokenizer=object()).generate([1, 2], sampled(**constraint)))
        call = engine.calls[-1]
        assert call["sampling_params"][key] == value and call["input_ids"] == [1, 2] and out.text == "yes"
        run(SGLangEngineBackend(engine=engine, tokenizer=object()).generate("text", sampled(**constraint)))
        assert engine.calls[-1]["prompt"] == "text" and engine.calls[-1]["sampling_params"][key] == value


def refuses_verl_rollout(**_):
    from parser.train.server_manager import ServerManagerBackend

    manager = FakeServerManager()
    backend = ServerManagerBackend(manager, {"temperature": 1.0})
    for constraint in CONSTRAINTS:
        refused(lambda s: backend.generate([1, 2], s, request_id="t"), constraint)
    assert manager.calls == []


def refuses_scripted_lead(tiny_tokenizer, **_):
    from parser.plan.validate import ScriptedLead

    for constraint in CONSTRAINTS:
        refused(lambda s: ScriptedLead(tiny_tokenizer, rounds=1).generate([1], s, request_id="t"), constraint)


def refuses_compare_authors(**_):
    spec = importlib.util.spec_from_file_location("compare_authors", ROOT / "scripts" / "compare_authors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for constraint in CONSTRAINTS:
        refused(lambda s: module.ScriptedBackend(lambda i: "reply").generate("x", s, request_id="t"), constraint)


def delegates(build: Callable[[Recorder], Any]) -> Callable[..., None]:
    """A wrapper hands the same SamplingParams to the backend it wraps (which honours or refuses)."""

    def row(**_):
        for constraint in CONSTRAINTS:
            inner = Recorder()
            s = sampled(**constraint)
            run(build(inner).generate("x", s, request_id="t"))
            assert inner.seen == [s]

    return row


def _pool(inner):
    from parser.serving.backends.pool import WorkerPool

    return WorkerPool([inner])


def _retrying(inner):
    from parser.serving.retry import RetryingBackend, RetryPolicy

    return RetryingBackend(inner, RetryPolicy(max_attempts=2, backoff_s=0.0, timeout_s=5.0))


def _recording_lead(inner):
    from parser.methods.memagent.train import RecordingLead
    from parser.offline import byte_bpe_tokenizer

    return RecordingLead(inner, byte_bpe_tokenizer())


def _gateway_faults_recorder(inner):
    spec = importlib.util.spec_from_file_location("gateway_faults", ROOT / "scripts" / "gateway_faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module.RecordingBackend(inner)


def refused(call: Callable[[SamplingParams], Any], constraint: dict[str, str]) -> None:
    with pytest.raises(BackendError) as err:
        run(call(sampled(**constraint)))
    assert err.value.retryable is False


ROWS: dict[str, Callable[..., None]] = {
    "parser/serving/backends/http.py:HttpBackend": honours_http,
    "parser/serving/backends/transformers.py:TransformersBackend": honours_transformers,
    "parser/serving/backends/sglang_engine.py:SGLangEngineBackend": honours_sglang_engine,
    "parser/train/server_manager.py:ServerManagerBackend": refuses_verl_rollout,
    "parser/plan/validate.py:ScriptedLead": refuses_scripted_lead,
    "parser/serving/backends/pool.py:WorkerPool": delegates(_pool),
    "parser/serving/retry.py:RetryingBackend": delegates(_retrying),
    "parser/methods/memagent/train.py:RecordingLead": delegates(_recording_lead),
    "scripts/gateway_faults.py:RecordingBackend": delegates(_gateway_faults_recorder),
    "scripts/compare_authors.py:ScriptedBackend": refuses_compare_authors,
}


def test_every_backend_class_has_a_row():
    found = backend_classes()
    assert found - set(ROWS) == set(), "a Backend class without a row: add one saying how it honours or refuses"
    assert set(ROWS) - found == set(), "a row for a class that no longer exists"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_constraint_is_honoured_or_refused(name, request):
    fixtures = {f: request.getfixturevalue(f) for f in ("tiny_qwen3_model", "tiny_tokenizer")}
    if name.endswith("HttpBackend"):
        fixtures["capture"] = request.getfixturevalue("capture")
    ROWS[name](**fixtures)


def test_engine_and_http_share_one_abort_policy(capture):
    """An abort inside a result is retryable on both paths; a request the engine refuses up
    front (ValueError, SGLang's HTTP 400) is not."""
    from parser.serving.backends.sglang_engine import SGLangEngineBackend
    from parser.serving.wire.sglang import GenerateResponse

    abort = {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "oom", "status_code": 400}}}
    with pytest.raises(BackendError) as via_wire:
        GenerateResponse.model_validate(abort).completion(False, "POST /generate")
    with pytest.raises(BackendError) as via_engine:
        run(SGLangEngineBackend(engine=FakeEngine(abort), tokenizer=object()).generate([1], sampled()))
    assert via_wire.value.retryable is via_engine.value.retryable is True

    class Refusing(FakeEngine):
        async def async_generate(self, **kwargs):
            raise ValueError("The input (40000 tokens) is longer than the model's context length (32768 tokens).")

    with pytest.raises(BackendError) as err:
        run(SGLangEngineBackend(engine=Refusing(), tokenizer=object()).generate([1], sampled()))
    assert err.value.retryable is False
