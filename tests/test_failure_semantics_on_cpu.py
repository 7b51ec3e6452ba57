"""One failure semantics for every model call (parser/serving/retry.py), as each method meets it.

Timeouts and `BackendError(retryable=True)` are retried; a final timeout or `BackendError` is a
failed subagent call (ParSer) or a failed sample (a lead or a baseline's call); anything else is a
bug and surfaces. A sample whose subagent calls all failed counts as failed in eval's results and
exit code.

The lead is `parser.plan.validate.ScriptedLead` (it stands in for a trained lead: one query, then
an answer); the readers and models here fail on purpose, standing in for a broken reader or a
server that errs; the dead gateway is a real HTTP backend pointed at a closed local port.

    .venv/bin/pytest tests/test_failure_semantics_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest

from parser.serving.types import BackendError, Completion
from parser.serving.backends.models import Models
from parser.text.chunking import Chunk
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.methods import Sample, method_class, method_config
from parser.methods.parser import ParSerMethod
from parser.plan.validate import ScriptedLead
from parser.serving.retry import CallFailed, RetryPolicy
from parser.engine.tools import ReaderReply

FAST = dict(max_attempts=3, retry_backoff_s=0.001, request_timeout_s=5.0)
CHUNKS = [Chunk(index=i, text=f"Document {i + 1}:\nPlace {i} lies on river {i}.", paragraph_ids=(i + 1,), num_tokens=12)
          for i in range(3)]


class FailingReader:
    """A chunk reader that raises `errors[n]` on its n-th read (then replies with a finding)."""

    def __init__(self, *errors: BaseException, forever: BaseException | None = None):
        self.errors, self.forever, self.reads = list(errors), forever, 0

    async def read(self, query, chunk, doc_id):
        self.reads += 1
        if self.forever is not None:
            raise self.forever
        if self.errors:
            raise self.errors.pop(0)
        return ReaderReply('{"evidence": "Place 1 lies on river 1.", "answer": "Place 1"}')

    def forget(self, doc_id):
        pass

    def close(self):
        pass


def _episode(tokenizer, reader, **config):
    engine = EpisodeEngine(ScriptedLead(tokenizer, rounds=1), tokenizer, reader, EpisodeConfig(**{**FAST, **config}))
    return asyncio.run(engine.run("Which place lies on river 1?", CHUNKS[:1], doc_id="d0"))


def _calls(trajectory):
    return [c for t in trajectory.turns for q in t.queries for c in q.calls]


# ------------------------------------------------------------------------------------- subagents
@pytest.mark.parametrize("bug", [TypeError("read() got an unexpected keyword argument 'doc'"),
                                 AttributeError("'NoneType' object has no attribute 'text'")])
def test_a_reader_bug_surfaces_instead_of_becoming_a_failed_call(tiny_tokenizer, bug):
    """It used to be caught and shown to the lead as an ordinary failed call."""
    reader = FailingReader(forever=bug)
    with pytest.raises(type(bug), match=re.escape(str(bug))):
        _episode(tiny_tokenizer, reader)
    assert reader.reads == 1  # and never retried


def test_a_retryable_error_is_retried_then_recorded_with_its_attempts(tiny_tokenizer):
    trajectory = _episode(tiny_tokenizer, FailingReader(forever=BackendError("HTTP 503: overloaded", status=503)))
    (call,) = _calls(trajectory)
    assert (call.status, call.attempts, call.error) == ("failed", 3, "BackendError: HTTP 503: overloaded")
    assert trajectory.answer == "done" and trajectory.failures[0]["attempts"] == 3  # the episode goes on


def test_a_non_retryable_error_is_recorded_after_one_attempt(tiny_tokenizer):
    reader = FailingReader(forever=BackendError("HTTP 400: prompt too long", retryable=False, status=400))
    (call,) = _calls(_episode(tiny_tokenizer, reader))
    assert (call.status, call.attempts, reader.reads) == ("failed", 1, 1)


def test_a_timeout_and_a_transient_error_are_retried_to_a_finding(tiny_tokenizer, capsys):
    """Each retry says so in one stderr line: the attempt, the wait, the reason."""
    class SlowOnce(FailingReader):
        async def read(self, query, chunk, doc_id):
            if self.reads == 0:
                self.reads += 1
                await asyncio.sleep(10)
            return await super().read(query, chunk, doc_id)

    reader = SlowOnce(BackendError("connection reset"))
    (call,) = _calls(_episode(tiny_tokenizer, reader, request_timeout_s=0.2))
    assert (call.status, call.attempts) == ("finding", 3)
    said = [re.sub(r" in \d+\.\d s ", " in S ", line) for line in capsys.readouterr().err.splitlines()]
    assert said == ["[parser] retry 2 of 3 in S after TimeoutError (no answer within the attempt's deadline)",
                    "[parser] retry 3 of 3 in S after BackendError: connection reset"]


# ------------------------------------------------------------------------------------- the lead
class FlakyLead(ScriptedLead):
    """The scripted lead, raising `errors` first (one per generate call)."""

    def __init__(self, tokenizer, *errors):
        super().__init__(tokenizer, rounds=1)
        self.errors, self.calls = list(errors), 0

    async def generate(self, prompt, sampling, **ids):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return await super().generate(prompt, sampling, **ids)


def test_lead_generations_are_retried_and_the_attempts_recorded(tiny_tokenizer):
    lead = FlakyLead(tiny_tokenizer, BackendError("HTTP 502"), asyncio.TimeoutError())
    engine = EpisodeEngine(lead, tiny_tokenizer, FailingReader(), EpisodeConfig(**FAST))
    trajectory = asyncio.run(engine.run("Which place lies on river 1?", CHUNKS, doc_id="d0"))
    assert trajectory.answer == "done" and [t.lead_attempts for t in trajectory.turns] == [3, 1]


def test_a_lead_that_keeps_failing_fails_the_episode_and_a_lead_bug_at_once(tiny_tokenizer):
    failing = FlakyLead(tiny_tokenizer, *[BackendError("HTTP 500")] * 3)
    with pytest.raises(CallFailed, match=r"HTTP 500 \(after 3 attempts\)"):
        asyncio.run(EpisodeEngine(failing, tiny_tokenizer, FailingReader(), EpisodeConfig(**FAST)).run("q?", CHUNKS))
    buggy = FlakyLead(tiny_tokenizer, KeyError("logprobs"))
    with pytest.raises(KeyError):
        asyncio.run(EpisodeEngine(buggy, tiny_tokenizer, FailingReader(), EpisodeConfig(**FAST)).run("q?", CHUNKS))
    assert buggy.calls == 1


# ------------------------------------------------------------------------------------- the baselines
class FlakyModel:
    """A text backend for the single-call baselines: raises `errors` first, then answers."""

    def __init__(self, *errors):
        self.errors, self.calls = list(errors), 0

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        # boxed for the boxed modes (CoA, ReMemR1), "the answer is" for MemAgent's recurrent mode (its default)
        return Completion(text="memory: Place 1 is on river 1. \\boxed{Place 1} Therefore, the answer is Place 1.")

    async def aclose(self):
        pass


SAMPLE = Sample(id="s0", question="Which place lies on river 1?", answers=["Place 1"],
                context="\n\n".join(c.text for c in CHUNKS))


@pytest.mark.parametrize("name", ["full_context", "memagent", "rememr1", "coa"])
def test_baselines_retry_the_lead_like_parser_does(tiny_tokenizer, name):
    """Full-context and MemAgent called the lead with no retry: one 503 failed the sample."""
    model = FlakyModel(BackendError("HTTP 503"), asyncio.TimeoutError())
    method = method_class(method_config(name)["_target_"])(Models(model, tiny_tokenizer, model, tiny_tokenizer), retry={"retry_backoff_s": 0.001})
    result = asyncio.run(method.run(SAMPLE))
    assert result.answer and model.calls >= 3


@pytest.mark.parametrize("name", ["full_context", "memagent", "coa"])
def test_baselines_surface_a_bug_and_fail_a_call_that_keeps_failing(tiny_tokenizer, name):
    cls = method_class(method_config(name)["_target_"])  # the class configs/method/<name>.yaml names
    bug = FlakyModel(ValueError("bad sampling"))
    with pytest.raises(ValueError):
        asyncio.run(cls(Models(bug, tiny_tokenizer)).run(SAMPLE))
    assert bug.calls == 1
    down = FlakyModel(*[BackendError("HTTP 503")] * 2)
    method = cls(Models(down, tiny_tokenizer), retry={"max_attempts": 2, "retry_backoff_s": 0.001})
    with pytest.raises(CallFailed, match="after 2 attempts"):
        asyncio.run(method.run(SAMPLE))


def test_a_cancel_that_lands_as_the_call_completes_is_not_lost():
    """Ctrl-C is one task cancel (asyncio.run). Python 3.11's asyncio.wait_for dropped it when it
    landed in the loop iteration that completed the call (the result was returned instead), and an
    interrupted eval.run went on to finish every sample. Here both happen in one iteration."""

    async def scenario():
        reply = asyncio.get_running_loop().create_future()

        async def attempt():
            return await reply

        call = asyncio.create_task(RetryPolicy(max_attempts=1, backoff_s=0.0, timeout_s=30.0).call(attempt))
        await asyncio.sleep(0)  # the call is waiting on its reply
        reply.set_result("done")  # the reply arrives ...
        call.cancel()  # ... and Ctrl-C lands before the call resumes
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(scenario())


def test_a_retry_section_with_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_retries'\]"):
        RetryPolicy.from_section({"max_retries": 3})


def test_the_knowledge_filter_retries_through_the_same_policy(tmp_path, tiny_tokenizer):
    from data_prep.knowledge_filter import parametric_filter

    model = FlakyModel(BackendError("HTTP 503"))
    questions = [{"id": "q1", "question": SAMPLE.question, "answers": SAMPLE.answers}]
    policy = RetryPolicy(max_attempts=2, backoff_s=0.001, timeout_s=5.0)
    result = asyncio.run(parametric_filter(questions, model, tiny_tokenizer, log_path=tmp_path / "f.jsonl", samples=1,
                                           retry=policy))
    assert result["q1"]["answerable"] and model.calls == 2


# ------------------------------------------------------------------------------------- eval
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_sample_whose_subagent_calls_all_failed_fails_the_eval_run(tmp_path, tiny_tokenizer):
    """Every subagent call refused (the gateway is down): the sample is failed, not a wrong answer."""
    from hydra import compose, initialize_config_dir

    from eval.run import evaluate
    from eval.store import ERRORS, RESULTS, read_jsonl
    from parser.serving.backends.http import HttpBackend

    configs = Path(__file__).resolve().parent.parent / "configs"
    out = tmp_path / "run"
    with initialize_config_dir(config_dir=str(configs / "eval"), version_base="1.3"):
        cfg = compose("tiny_cpu", overrides=[f"hydra.searchpath=[file://{configs}]", f"out_dir={out}", "progress=false",
                                             "dataset.lengths=[50]", "dataset.num_questions=1", "runs=1"])
    gateway = HttpBackend(f"http://127.0.0.1:{_closed_port()}", api="sglang", timeout_s=5)
    models = Models(ScriptedLead(tiny_tokenizer, rounds=1), tiny_tokenizer, gateway, tiny_tokenizer)
    method = ParSerMethod(models, episode={**FAST, "chunk_size": 512, "max_turns": 3})

    async def go():
        try:
            return await evaluate(cfg, method)
        finally:
            await method.aclose()

    assert asyncio.run(go()) == 1
    assert not (out / RESULTS).exists() or list(read_jsonl(out / RESULTS)) == []
    (error,) = list(read_jsonl(out / ERRORS))
    assert error["error"].startswith("all ") and "subagent calls failed" in error["error"]
    failures = error["record"]["failures"]  # the trajectory's record of each failed call is kept
    assert failures and all(f["attempts"] == 3 and "BackendError" in f["error"] for f in failures)
