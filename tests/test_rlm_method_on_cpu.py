"""`method=rlm` end to end through `eval.run` on the tiny CPU models; its budgets, failing sub-calls
and refusals.

    .venv/bin/pytest tests/test_rlm_method_on_cpu.py -q

Nothing is scripted in the eval run: the random-weight tiny Qwen3.5 is the root (it writes no
```repl block, so the episode is its one iteration and rlms' fallback call), the REPL
sandbox is real, and the row, the record (with the rlms version) and the viewer page are what
`parser eval --config-name tiny_cpu method=rlm_cpu` writes. The prompts come from the recorded
rlms constants (tests/fixtures/rlm/prompts.json), so the run does not need rlms installed. The
budget and failure cases script the root (`rlm_script.ScriptServer` stands in for the model
server); a sub-model that refuses connections stands in for one that is down.
"""
from __future__ import annotations

import asyncio
import socket

import pytest
from hydra import compose, initialize_config_dir

from eval.run import CONFIGS, evaluate
from eval.store import RESULTS, read_jsonl
from eval.viewer import render_page
from parser.methods import method_config
from parser.methods.rlm import RLMMethod
from parser.methods.rlm.reference import PIN
from parser.records.result import ResultRow
from rlm_script import CASES, FIXTURES, ScriptServer, run_ours, sandbox_settings

PROMPTS_JSON = str(FIXTURES / "prompts.json")


def test_eval_run_with_the_tiny_model(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("tiny_cpu", overrides=[
            f"hydra.searchpath=[file://{CONFIGS}]", f"out_dir={tmp_path}", "progress=false", "method=rlm_cpu",
            "limit=1", "runs=1", "dataset.lengths=[10]", "method.episode.max_tokens_per_turn=8", f"method.prompt_source={PROMPTS_JSON}",
            # one iteration and the fallback call, without the addendum: two ~1.5K-token prefills (CPU time)
            "method.episode.max_turns=1", "method.orchestrator=false",
            *(f"method.sandbox.{key}={str(value).lower()}" for key, value in asyncio.run(sandbox_settings()).items())])
    assert asyncio.run(evaluate(cfg)) == 0
    rows = list(read_jsonl(tmp_path / RESULTS))
    assert len(rows) == 1 and rows[0]["method"] == "rlm"
    record = rows[0]["record"]["rlm"]
    assert record["rlms_version"] == PIN and record["stop_reason"] == "fallback"
    assert [it["fallback"] for it in record["iterations"]] == [False, True]
    assert rows[0]["steps"] == 2 and record["usage"]["root"]["calls"] == 2 and record["usage"]["sub"]["calls"] == 0
    assert rows[0]["prediction"] == record["answer"]
    page = render_page([ResultRow.from_dict(r) for r in rows], "t")
    assert "Iteration 1" in page and "Fallback answer call" in page


def test_refusals_name_the_setting(tiny_tokenizer):
    from parser.serving.backends.models import Models

    models = Models(None, tiny_tokenizer, None, tiny_tokenizer)
    with pytest.raises(ValueError, match="max_depth=2: recursion .* not yet implemented"):
        RLMMethod(models, max_depth=2, prompt_source=PROMPTS_JSON)
    with pytest.raises(ValueError, match="sandbox.output_chars=1000"):
        RLMMethod(models, sandbox={"output_chars": 1000}, prompt_source=PROMPTS_JSON)
    with pytest.raises(ValueError, match="max_errors must be positive"):
        RLMMethod(models, max_errors=0, prompt_source=PROMPTS_JSON)
    with pytest.raises(FileNotFoundError, match="neither 'rlms' nor a JSON file"):
        RLMMethod(models, prompt_source="no/such/prompts.json")
    cfg = method_config("rlm")
    assert (cfg["episode"]["max_turns"], cfg["max_depth"], cfg["orchestrator"], cfg["prompt_source"]) == (30, 1, True, "rlms")
    assert cfg["sandbox"]["allow_unisolated"] is False and cfg["sandbox"]["output_chars"] == 20_000


def scripted(name, tokenizer, **settings):
    async def go():
        with ScriptServer(CASES[name], tokenizer) as server:
            return (await asyncio.wait_for(run_ours(name, server, tokenizer, PROMPTS_JSON, **settings), 60))[0]
    return asyncio.run(go())


def test_token_and_time_limits_end_with_rlms_best_partial_answer(tiny_tokenizer):
    """rlms' order: the token limit is checked before the iteration's reply becomes the best partial
    answer (none yet after the first); the wall-time limit before the next iteration (after it)."""
    by_tokens = scripted("probe", tiny_tokenizer, max_tokens=1)
    part = by_tokens.trace.extras["rlm"]
    assert (part["stop_reason"], by_tokens.answer, len(part["iterations"])) == ("max_tokens", None, 1)
    by_time = scripted("probe", tiny_tokenizer, max_timeout=1e-9)
    part = by_time.trace.extras["rlm"]
    assert (part["stop_reason"], len(part["iterations"])) == ("max_timeout", 1)
    assert by_time.answer == CASES["probe"].turns[0] and by_time.trace.stop_reason == "max_timeout"
    # the engine's own response budget (20 tokens; the scripted first reply is longer) ends it the same way
    by_engine = scripted("probe", tiny_tokenizer, episode={"max_response_tokens": 20})
    assert (by_engine.trace.extras["rlm"]["stop_reason"], by_engine.answer) == ("response_length", CASES["probe"].turns[0])


def test_failed_sub_calls_reach_the_repl_as_error_strings_and_the_episode_goes_on(tiny_tokenizer):
    with socket.socket() as closed:  # a port nothing listens on: every sub-call is refused
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = scripted("batched_map", tiny_tokenizer, sub_url=down)
    part = result.trace.extras["rlm"]
    replies = [r for it in part["iterations"] for b in it["blocks"] for c in b["sub_calls"] for r in c["replies"]]
    assert len(replies) == 4 and all(r.startswith("Error: LM query failed - ") for r in replies)
    assert part["stop_reason"] == "answer" and result.answer.startswith("Error: LM query failed - ")
    assert result.failed.startswith("all 4 sub-calls failed")  # no fair run: eval retries the sample
