"""The small-model comparison reports a model the backends refuse as a row and goes on.

The packaged Gemma 3 270M is a base model: its GGUF carries no chat template, and the comparison
used to die in transformers' apply_chat_template at the first episode, losing the other models'
rows. Here a real tiny Qwen3 saved without its template stands in for it (no hub, seconds).

The first test runs the script as a user does, in its own process; the resume, probe and refusal
tests run the same script in this process (`runpy`, its own argv, stdout and stderr captured,
SystemExit turned into the exit status Python would give), so nine runs share one import of
torch and transformers and one load of each tiny model instead of paying ~5 CPU-s each.

    .venv/bin/pytest tests/test_compare_small_models_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from parser.serving.backends import load_model_and_tokenizer
from parser.serving.backends.models import build_models

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.first(minutes=2.5)  # a few minutes of small-model runs


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory) -> Path:
    """tiny-qwen3's weights and tokenizer with no chat template, as a base model ships."""
    path = tmp_path_factory.mktemp("base_model")
    model, tokenizer = load_model_and_tokenizer("tiny-qwen3")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)  # the loaded tokenizer is shared (cached): strip the saved copy
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_a_role_without_a_chat_template_is_refused_at_build_naming_role_and_model(base_model_dir):
    tiny = {"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config", "model": "tiny-qwen3"}
    base = {"_target_": "parser.serving.backends.transformers.TransformersBackend.from_config", "model": str(base_model_dir)}
    with pytest.raises(ValueError, match=f"models.lead: '{base_model_dir}' .*without a chat template"):
        build_models({"lead": base, "subagent": {"same_as": "lead"}})
    with pytest.raises(ValueError, match=f"models.subagent: '{base_model_dir}' .*without a chat template"):
        build_models({"lead": tiny, "subagent": base})
    assert build_models({"lead": tiny}).lead_tokenizer.chat_template


@pytest.mark.slow  # the script in its own process: torch, transformers and two models loaded again
def test_the_comparison_reports_the_unusable_model_and_finishes_the_others(base_model_dir, tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "compare_small_models.py"), "--models", str(base_model_dir),
           "tiny-qwen3", "--questions", "2", "--length", "12", "--out", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert "unusable: " in rows[str(base_model_dir)] and "without a chat template" in rows[str(base_model_dir)]
    assert rows["tiny-qwen3"].split("|")[2].strip() == "2"  # both samples of the model that runs
    assert (tmp_path / "tiny-qwen3.jsonl").read_text().count("\n") == 2


@pytest.fixture
def compare(monkeypatch, capsys):
    """`scripts/compare_small_models.py --questions 2 --length 12 --out OUT ARGS`, run in this process."""
    script = ROOT / "scripts" / "compare_small_models.py"

    def run(out: Path, *args: str) -> subprocess.CompletedProcess:
        argv = [str(script), "--questions", "2", "--length", "12", "--out", str(out), *args]
        with monkeypatch.context() as scope:
            scope.setattr(sys, "argv", argv)
            scope.setenv("HF_HUB_OFFLINE", "1")
            scope.chdir(out.parent)
            capsys.readouterr()
            try:
                runpy.run_path(str(script), run_name="__main__")
                code = 0
            except SystemExit as exit_:  # what the interpreter does with it at the top level
                code = exit_.code or 0
                if not isinstance(code, int):  # a message: printed to stderr, exit status 1
                    print(code, file=sys.stderr)
                    code = 1
            captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)

    return run


def row_cells(stdout: str, label: str) -> list[str]:
    return next([c.strip() for c in line.split("|")[1:-1]] for line in stdout.splitlines()
                if line.startswith(f"| {label} |"))


def test_an_interrupted_comparison_resumes_without_rerunning_or_recounting(tmp_path, compare):
    out = tmp_path / "out"
    first = compare(out, "--models", "tiny-qwen3")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = (out / "tiny-qwen3.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 2
    # the kill: sample 2's line half-written, so only sample 1 was acknowledged
    (out / "tiny-qwen3.jsonl").write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])
    second = compare(out, "--models", "tiny-qwen3")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "1 samples read back" in second.stdout and "1 to run" in second.stdout
    resumed = (out / "tiny-qwen3.jsonl").read_bytes().splitlines(keepends=True)
    assert len(resumed) == 2 and resumed[0] == lines[0]  # sample 1 not run again
    assert [json.loads(line)["id"] for line in resumed] == [json.loads(line)["id"] for line in lines]
    cells = row_cells(second.stdout, "tiny-qwen3")
    assert cells[1] == "2 (1 resumed)"
    # all read back: the same figures from the file as from the live episodes, and no new timing
    third = compare(out, "--models", "tiny-qwen3")
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    again = row_cells(third.stdout, "tiny-qwen3")
    assert again[1] == "2 (2 resumed)" and again[2:] == cells[2:]
    assert len((out / "tiny-qwen3.timings.jsonl").read_text().splitlines()) == 2  # sessions 1 and 2 ran samples

    # a line whose id now names another question (the generator changed): refused by file, never mixed in
    edited = json.loads(resumed[0])
    edited["question"] = "Who wrote something else?"
    (out / "tiny-qwen3.jsonl").write_bytes(json.dumps(edited).encode() + b"\n" + resumed[1])
    changed = compare(out, "--models", "tiny-qwen3")
    assert changed.returncode != 0
    assert f"{out / 'tiny-qwen3.jsonl'}: the line of {edited['id']} asks 'Who wrote something else?'" in changed.stderr

    # a line missing a field (hand-edited): the file, the line and the field are named, not a bare KeyError
    cut = json.loads(resumed[1])
    del cut["record"]
    (out / "tiny-qwen3.jsonl").write_bytes(resumed[0] + json.dumps(cut).encode() + b"\n")
    missing = compare(out, "--models", "tiny-qwen3")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert f"{out / 'tiny-qwen3.jsonl'}:2: field 'record' is missing or malformed" in missing.stderr


@pytest.mark.parametrize("flag", ["--concurrency", "--questions"])
def test_a_count_below_one_is_refused_with_exit_2_naming_the_flag(tmp_path, flag, compare):
    refused = compare(tmp_path / "out", "--models", "tiny-qwen3", flag, "0")
    assert refused.returncode == 2 and f"{flag} 0: expected an integer >= 1" in refused.stderr


def test_the_probe_asks_every_chunk_the_question_once_and_readers_can_differ_from_the_lead(tmp_path, compare):
    out = tmp_path / "out"
    probe = compare(out, "--probe", "--models", "tiny-qwen3")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    assert "| readers | questions | reader precision | findings/round | gold in a finding |" in probe.stdout
    assert row_cells(probe.stdout, "tiny-qwen3")[1] == "2"
    for line in (out / "tiny-qwen3.probe.jsonl").read_text().splitlines():
        line = json.loads(line)
        [query] = line["queries"]
        assert query["query"] == line["question"]
        assert len(query["calls"]) > 1  # one per chunk, all asked

    mixed = compare(out, "--models", "tiny-qwen3", "--readers", "tiny-qwen3.5")
    assert mixed.returncode == 0, mixed.stdout[-3000:] + mixed.stderr[-3000:]
    assert row_cells(mixed.stdout, "tiny-qwen3+tiny-qwen3.5")[1] == "2"
    assert (out / "tiny-qwen3+tiny-qwen3.5.jsonl").read_text().count("\n") == 2
