"""`method=rlm` end to end through `eval.run` on the tiny CPU models, and its refusals.

    .venv/bin/pytest tests/test_rlm_method_on_cpu.py -q

Nothing is scripted in the eval run: the random-weight tiny Qwen3.5 is the root (it writes no
```repl block, so the episode is its one iteration and rlms' fallback call), the REPL
sandbox is real, and the row, the record (with the rlms version) and the viewer page are what
`parser eval --config-name tiny_cpu method=rlm_cpu` writes. The prompts come from the recorded
rlms constants (tests/fixtures/rlm/prompts.json), so the run does not need rlms installed.
"""
from __future__ import annotations

import asyncio

import pytest
from hydra import compose, initialize_config_dir

from eval.run import CONFIGS, evaluate
from eval.store import RESULTS, read_jsonl
from eval.viewer import render_page
from parser.methods import method_config
from parser.methods.rlm import RLMMethod
from parser.methods.rlm.reference import PIN
from parser.records.result import ResultRow
from rlm_script import FIXTURES

PROMPTS_JSON = str(FIXTURES / "prompts.json")


def test_eval_run_with_the_tiny_model(tmp_path):
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("tiny_cpu", overrides=[
            f"hydra.searchpath=[file://{CONFIGS}]", f"out_dir={tmp_path}", "progress=false", "method=rlm_cpu",
            "limit=1", "runs=1", "dataset.lengths=[10]", "method.episode.max_tokens_per_turn=8", f"method.prompt_source={PROMPTS_JSON}",
            # one iteration and the fallback call, without the addendum: two ~1.5K-token prefills (CPU time)
            "method.episode.max_turns=1", "method.orchestrator=false"])
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
