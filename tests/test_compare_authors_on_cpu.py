"""scripts/compare_authors.py on a handful of inputs: where the project claims parity with MemAgent's
and ReMemR1's own code, their functions (imported by path, unchanged) and ours agree (issue 56).

    PARSER_AUTHORS_DIR=/tmp/authors .venv/bin/pytest tests/test_compare_authors_on_cpu.py -q

Needs an export of the authors' files (no network in CI, so skipped there), laid out as the script's
docstring says: $PARSER_AUTHORS_DIR/memagent (BytedTsinghua-SIA/MemAgent @ 76b7a65, `taskutils/`) and
$PARSER_AUTHORS_DIR/rememr1 (syr-cn/ReMemR1 @ 43e69f3, `taskutils/memory_eval/`). Only their HTTP
session is scripted (it stands in for their vLLM server); the tokenizer is the real Qwen3 one.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AUTHORS = Path(os.environ.get("PARSER_AUTHORS_DIR", "/tmp/authors"))
FETCH = "export them first as scripts/compare_authors.py's docstring says (archive 76b7a65 / 43e69f3 of each repository)"
N = 4  # inputs per rule: the full 500 is the script's job
pytestmark = pytest.mark.filterwarnings("ignore:The parameter 'token_pattern'")  # their TfidfVectorizer's


@pytest.fixture(scope="module")
def compare():
    if not (AUTHORS / "memagent/taskutils").is_dir() or not (AUTHORS / "rememr1/taskutils").is_dir():
        pytest.skip(f"the authors' files are not under {AUTHORS}; {FETCH}")
    spec = importlib.util.spec_from_file_location("compare_authors", ROOT / "scripts" / "compare_authors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.load_authors(AUTHORS / "memagent", AUTHORS / "rememr1")


def test_filter_verdicts_and_scores_are_theirs(compare):
    script, theirs = compare
    from data_prep.knowledge_filter import is_correct
    from parser.text.reward import MEMAGENT_SCORER, sub_em

    verdicts = [(r, g) for r, g in script.filter_inputs(4 * N, 1) if "<think>" not in r]  # kept: <think> is not read
    assert [is_correct(r, g) for r, g in verdicts] == [script.their_verdict(theirs["filter"], r, g) for r, g in verdicts]
    for empty in (False, True):
        pairs = script.scorer_inputs(4 * N, 1, empty)
        assert [sub_em(p, [g], **MEMAGENT_SCORER) for p, g in pairs] == [script.their_sub_em(theirs["scorer"], p, g) for p, g in pairs]


@pytest.mark.parametrize("method, options", [("memagent", {"untrusted_text": "verbatim"}),
                                             ("rememr1", {"untrusted_text": "verbatim", "recall_ties": "authors"})])
def test_verbatim_prompts_are_theirs_and_the_default_differs_only_where_it_neutralises(compare, qwen3_tokenizer, method, options):
    script, theirs = compare
    differ, neutralised, _ = script.compare_episodes(method, theirs[method], qwen3_tokenizer, N, 1, True, **options)
    assert differ == 0 and neutralised > 0  # the inputs do hold control strings
    neutralising = {"recall_ties": "authors"} if method == "rememr1" else {}  # the default untrusted_text
    differ, held, elsewhere = script.compare_episodes(method, theirs[method], qwen3_tokenizer, N, 1, True, **neutralising)
    assert 0 < differ <= held == neutralised and elsewhere == 0

def test_an_odd_context_cap_keeps_what_theirs_keeps(compare, qwen3_tokenizer):
    script, theirs = compare
    assert script.compare_episodes("memagent", theirs["memagent"], qwen3_tokenizer, N, 1, False, odd_caps_only=True) == (0, 0, 0)
