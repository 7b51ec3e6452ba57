"""Record what rlms (the pinned version) sends and returns on each RLM cross-check case, once.

Why: the comparison of `method=rlm` with the official package (tests/test_rlm_fidelity_on_cpu.py)
must run where rlms is not installed, so what rlms did is kept as JSON under tests/fixtures/rlm/:
one file per case of `tests/rlm_script.py` (root message lists at every turn, sampling fields,
sub-call prompts, answer, iteration count, fallback, rlms' own usage summary) and prompts.json (its
three prompt constants, the method's `prompt_source` where rlms is absent). Re-run it only with
the pinned rlms, after a case changes; the live test says when the fixtures and rlms disagree.

    pip install 'parser-agents[peers]'
    python scripts/record_rlm_fixtures.py            # -> tests/fixtures/rlm/*.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from parser.methods.rlm.reference import PIN, load_prompts  # noqa: E402
from rlm_script import CASES, FIXTURES, ScriptServer, run_rlms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=FIXTURES)
    args = ap.parse_args()
    prompts = load_prompts("rlms")
    if prompts.version != PIN:
        sys.exit(f"rlms {prompts.version} is installed; the fixtures are of rlms {PIN}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompts.json").write_text(json.dumps(
        {"rlms_version": prompts.version, "RLM_SYSTEM_PROMPT": prompts.system, "ORCHESTRATOR_ADDENDUM": prompts.addendum,
         "USER_PROMPT": prompts.user}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, case in CASES.items():
        with ScriptServer(case) as server:
            recorded = run_rlms(name, server)
        (args.out / f"{name}.json").write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{name}: {recorded['iterations']} iteration(s), fallback={recorded['fallback']}, answer={recorded['answer']!r}")


if __name__ == "__main__":
    main()
