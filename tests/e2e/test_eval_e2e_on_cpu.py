"""End to end on CPU: `python -m eval.run` on the synthetic world with tiny in-process models,
killed mid-run and resumed, then the report (tables, plots) and the trajectory viewer.

Nothing is faked: a real subprocess runs the real engine on random-weight Qwen3.5 models, is
SIGKILLed after its first fsync'd row, and a second invocation of the same command must finish
with exactly runs x lengths x questions rows, no key twice.

    HF_HUB_OFFLINE=1 .venv/bin/pytest tests/e2e/test_eval_e2e_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.report import build_report
from eval.store import RESULTS, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
QUESTIONS, LENGTHS, RUNS = 2, (50, 100), 2
EXPECTED = QUESTIONS * len(LENGTHS) * RUNS
# 16-token findings (the preset's 48 are one short JSON object): a random-weight subagent fills
# every budget, and its decoding was most of each sample's CPU (8 samples: 44 -> 31 CPU-s)
SHORT_FINDINGS = "method.episode.subagent_max_tokens=16"
pytestmark = pytest.mark.first(minutes=2)  # eval runs killed and resumed: minutes
# one eval run's deadline, not a target: the resumed run's fixture took 548 s on a 2-core machine at
# half speed
RUN_DEADLINE_S = 1800


def _command(out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", f"out_dir={out_dir}", f"runs={RUNS}",
            f"dataset.num_questions={QUESTIONS}", f"dataset.lengths=[{','.join(map(str, LENGTHS))}]", "concurrency=1",
            "progress=false", SHORT_FINDINGS]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _count(path: Path) -> int:
    return sum(1 for _ in read_jsonl(path)) if path.exists() else 0


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("eval") / "run"
    proc = subprocess.Popen(_command(out), cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + RUN_DEADLINE_S
    while _count(out / RESULTS) < 1:
        if proc.poll() is not None:
            pytest.fail(f"eval exited ({proc.returncode}) before it could be killed:\n{proc.stdout.read().decode()[-3000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"no result rows after {RUN_DEADLINE_S} s")
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _count(out / RESULTS)
    assert 1 <= before < EXPECTED, "the kill must land mid-run"
    done = subprocess.run(_command(out), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, before


def test_kill_and_resume_gives_exactly_the_expected_rows(resumed_run):
    out, before = resumed_run
    rows = list(read_jsonl(out / RESULTS))
    keys = [(r["dataset"], r["length"], r["run"], r["sample_id"]) for r in rows]
    assert len(rows) == EXPECTED and len(set(keys)) == EXPECTED
    assert {(L, run) for _, L, run, _ in keys} == {(L, run) for L in LENGTHS for run in range(RUNS)}
    ids = {L: {sid for _, length, _, sid in keys if length == L} for L in LENGTHS}
    assert all(len(v) == QUESTIONS for v in ids.values())

    manifest = json.loads((out / "manifest.json").read_text())
    first, second = manifest["sessions"]
    assert second["written"] == EXPECTED - before  # the resume only ran what was missing
    assert first.get("ended") is None  # the killed session never closed
    assert second["git"]["commit"] and second["packages"]["torch"] and second["hardware"]["cpu_count"]
    assert manifest["config"]["method"]["episode"]["max_turns"] == 4  # configs/episode/cpu.yaml
    assert second["seeds"] == {"base": 0, "per_run": [0, 1]}
    row = rows[0]
    assert row["method"] == "parser" and row["record"]["turns"] and row["steps"] == len(row["record"]["turns"])
    timings = list(read_jsonl(out / "timings.jsonl"))
    # A subset killed midway leaves no timing line; its rows are timed only when resumed.
    assert EXPECTED - before <= sum(t["samples"] for t in timings) <= EXPECTED
    assert {(t["length"], t["run"]) for t in timings} == {(L, run) for L in LENGTHS for run in range(RUNS)}


def test_report_and_viewer_from_the_resumed_run(resumed_run, tmp_path):
    out, _ = resumed_run
    report = build_report([out], tmp_path / "report")
    table = (tmp_path / "report" / "accuracy.md").read_text()
    assert "| tiny-qwen3.5 | ParSer |" in table and "| 50 | 100 | Max δ | Avg. |" in table
    assert {p.name for p in report["figures"]} == {"accuracy_vs_length_synthetic.png", "steps_vs_length.png"}
    assert all(p.stat().st_size > 5000 for p in report["figures"])
    latency = {e["length"]: e for e in report["latency"]}
    assert set(latency) == set(LENGTHS) and all(e["amortized_s"] > 0 for e in latency.values())
    # the killed session's finished rows are timed too: every sample counted once
    assert {L: e["samples"] for L, e in latency.items()} == {L: QUESTIONS * RUNS for L in LENGTHS}
    page = report["viewer"][0].read_text()
    assert page.count('<details class="sample"') == EXPECTED
    assert "query_agents" in page or "invalid action" in page  # the lead's rounds are rendered


def test_a_second_eval_on_a_busy_out_dir_refuses(tmp_path):
    """Two processes on one out_dir wrote every row twice and lost a manifest session."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from eval.store import lock_run_dir\n"
                               f"with lock_run_dir({str(out)!r}):\n    print('held', flush=True); time.sleep(120)"],
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(_command(out), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_DEADLINE_S)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by another eval.run (pid {holder.pid}" in second.stderr
        assert not (out / RESULTS).exists() and not (out / "manifest.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_controlled_analysis_end_to_end(tmp_path):
    """The position control on the synthetic world, in process: conditions become a plot."""
    from hydra import compose, initialize_config_dir

    from eval.run import evaluate

    out = tmp_path / "position"
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("tiny_cpu", overrides=[f"hydra.searchpath=[file://{CONFIGS}]", "dataset=synthetic_position",
                                             "dataset.num_questions=1", "runs=1", "progress=false", f"out_dir={out}",
                                             SHORT_FINDINGS])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    assert asyncio.run(evaluate(cfg)) == 0
    rows = list(read_jsonl(out / RESULTS))
    assert [r["condition"] for r in rows] == ["st00", "st50", "st90"]
    report = build_report([out], tmp_path / "report", viewer=False)
    assert report["controlled"]["synthetic_position"]["conditions"] == ["st00", "st50", "st90"]
    assert (tmp_path / "report" / "figures" / "controlled_synthetic_position.png").exists()


def test_a_replaced_dataset_file_stops_the_resume_with_exit_2(tmp_path):
    """The old rows were scored on the old file: the command names the file instead of reporting them."""
    data = tmp_path / "eval_50.jsonl"

    def write(ids):
        data.write_text("".join(json.dumps({"id": i, "question": f"Where was {i} born?", "answers": ["Varnholm"],
                                            "length": 50, "context": f"Document 1:\n{i} was born in Varnholm."}) + "\n"
                                for i in ids))

    command = [sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", f"out_dir={tmp_path / 'run'}", "runs=1",
               "dataset=hotpotqa", "dataset.name=files", f"dataset.path='{tmp_path}/eval_{{length}}.jsonl'",
               "dataset.lengths=[50]", "progress=false"]
    write(["a"])
    first = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    write(["b"])
    second = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"{data} changed since its 1 rows were written" in second.stderr
    assert _count(tmp_path / "run" / RESULTS) == 1


def _as_a_background_job_starts_it() -> None:
    """In the child, before exec: SIGINT ignored, as a POSIX shell starts a background job (`make
    test &`, a CI step's `( ... ) &`), and Python keeps an ignored SIGINT at startup. eval.run
    installs its handlers explicitly (`parser.base.signals.stop_on_signals`); when it trusted the
    inherited one, the interrupted run never raised KeyboardInterrupt, finished every sample and
    exited 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_ends_with_one_line_and_the_manifest_counts_the_rows_on_disk(tmp_path):
    """SIGINT (Ctrl-C) mid-run, to a run started with SIGINT ignored: no traceback, one line saying
    how many samples are saved and how to resume, exit 130; the session is closed in the manifest with the rows on disk counted (it
    once said `written: 4` with 6 rows on disk: the interrupted subset's rows were not counted)."""
    out = tmp_path / "run"
    proc = subprocess.Popen(_command(out), cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_a_background_job_starts_it)
    deadline = time.time() + RUN_DEADLINE_S
    while _count(out / RESULTS) < 1:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"eval ended ({proc.returncode}) or stalled before it could be interrupted")
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=RUN_DEADLINE_S)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "terminate called" not in stderr, stderr[-3000:]
    on_disk = _count(out / RESULTS)
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert last == (f"[eval] interrupted: {on_disk}/{EXPECTED} samples saved in {out} ({on_disk} this session); "
                    "re-run the same command to resume")
    session = json.loads((out / "manifest.json").read_text())["sessions"][-1]
    assert session["interrupted"] is True and session["done"] == session["written"] == on_disk >= 1
