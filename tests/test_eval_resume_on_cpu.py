"""eval.run resumes by keys, against the inputs it was given.

"Done" is every expected (dataset, length, condition, run, sample id) key in the store, not a row
count; and the rows already there must come from the same inputs (dataset files' bytes or the
synthetic world's rows, the method config, the seed), or the run refuses and names what changed.

The method is the outer edge here: `Recorder` stands in for a real method (it answers at once
and remembers which samples it was asked), because what is under test is eval.run's
bookkeeping. tests/e2e/test_eval_e2e_on_cpu.py runs the same loop on real tiny models.

    .venv/bin/pytest tests/test_eval_resume_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eval import provenance
from eval.run import evaluate
from eval.store import ERRORS, RESULTS, read_jsonl
from parser.methods import MethodResult, Sample
from parser.records.result import ResultRow
from parser.records.trajectory import Trajectory, Turn

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


class Recorder:
    """A method that answers every sample with its first gold answer and records the ids."""

    name = "recorder"

    def __init__(self, fail: set[str] = frozenset()):
        self.asked: list[str] = []
        self.fail = fail

    async def run(self, sample: Sample) -> MethodResult:
        self.asked.append(sample.id)
        if sample.id in self.fail:
            raise RuntimeError(f"injected failure on {sample.id}")
        return MethodResult(answer=sample.answers[0], steps=1, wall_s=0.0)

    async def aclose(self) -> None:
        pass


def _cfg(out_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        return compose("tiny_cpu", overrides=[f"hydra.searchpath=[file://{CONFIGS}]", f"out_dir={out_dir}",
                                              "progress=false", *overrides])


def _run(out_dir: Path, *overrides: str, method: Recorder | None = None) -> tuple[int, Recorder]:
    method = method or Recorder()
    return asyncio.run(evaluate(_cfg(out_dir, *overrides), method)), method


def _rows(out_dir: Path) -> list[dict]:
    return list(read_jsonl(out_dir / RESULTS))


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _records(ids: list[str], question: str = "Who wrote {id}?") -> list[dict]:
    return [{"id": i, "question": question.format(id=i), "answers": [f"author of {i}"], "length": 50,
             "context": f"Document 1:\n{i} was written by the author of {i}."} for i in ids]


def _files(path: Path) -> tuple[str, ...]:
    return ("dataset=hotpotqa", "dataset.name=tiny_files", f"dataset.path='{path.parent}/eval_{{length}}.jsonl'",
            "dataset.lengths=[50]", "runs=1")


# ------------------------------------------------------------------------------------- keys, not counts
def test_an_out_dir_with_rows_of_another_length_still_runs_the_asked_samples(tmp_path, capsys):
    """4 rows at L=50 and 2 samples asked at L=100 printed "all 2 samples already done" and ran nothing."""
    out = tmp_path / "run"
    status, first = _run(out, "dataset.lengths=[50]", "dataset.num_questions=2", "runs=2")
    assert status == 0 and len(first.asked) == 4 and len(_rows(out)) == 4
    capsys.readouterr()
    status, second = _run(out, "dataset.lengths=[100]", "dataset.num_questions=2", "runs=1")
    assert status == 0
    assert sorted(second.asked) == sorted({r["sample_id"].replace("_L50", "_L100") for r in _rows(out)[:2]})
    assert {(r["length"], r["run"]) for r in _rows(out)} == {(50, 0), (50, 1), (100, 0)}
    assert "2/2 samples done (2 this session, 0 failed)" in capsys.readouterr().out


def test_the_completeness_check_counts_this_runs_keys(tmp_path, capsys):
    """Rows of other keys must not make up for a sample of this run that failed."""
    out = tmp_path / "run"
    _run(out, "dataset.lengths=[50]", "dataset.num_questions=2", "runs=2")
    ids = [r["sample_id"].replace("_L50", "_L100") for r in _rows(out) if r["run"] == 0]
    capsys.readouterr()
    status, second = _run(out, "dataset.lengths=[100]", "dataset.num_questions=2", "runs=1", method=Recorder(fail={ids[0]}))
    assert status == 1 and sorted(second.asked) == sorted(ids)
    assert "1/2 samples done (1 this session, 1 failed)" in capsys.readouterr().out
    assert [e["sample_id"] for e in read_jsonl(out / ERRORS)] == [ids[0]]
    status, third = _run(out, "dataset.lengths=[100]", "dataset.num_questions=2", "runs=1")
    assert status == 0 and third.asked == [ids[0]]  # only the failed sample is retried


def test_a_larger_limit_runs_only_the_new_samples(tmp_path):
    """Same inputs, more of them: an extension, not a change."""
    out = tmp_path / "run"
    assert _run(out, "dataset.lengths=[50]", "dataset.num_questions=3", "limit=1", "runs=1")[0] == 0
    status, second = _run(out, "dataset.lengths=[50]", "dataset.num_questions=3", "limit=2", "runs=1")
    assert status == 0 and len(second.asked) == 1 and len(_rows(out)) == 2


def test_rows_are_keyed_by_condition_too(tmp_path):
    from eval.store import ResultsStore

    store = ResultsStore(tmp_path)
    row = {"dataset": "d", "length": 50, "run": 0, "sample_id": "q0", "scores": {"sub_em": 1.0}}
    assert store.append(ResultRow(**row, condition="ordered"))
    assert store.append(ResultRow(**row, condition="reverse_ordered"))  # the same id under another condition
    assert not store.append(ResultRow(**row, condition="ordered"))
    assert ResultsStore(tmp_path).done_keys() == {("d", 50, "ordered", 0, "q0"), ("d", 50, "reverse_ordered", 0, "q0")}


# ------------------------------------------------------------------------------------- changed inputs
def test_a_replaced_dataset_file_is_refused_and_named(tmp_path):
    """A file replaced by one with new ids: today "all 2 samples already done", nothing evaluated."""
    data = tmp_path / "eval_50.jsonl"
    _write(data, _records(["a", "b"]))
    out = tmp_path / "run"
    assert _run(out, *_files(data))[0] == 0
    before = (out / RESULTS).read_bytes(), json.loads((out / "manifest.json").read_text())["sessions"]
    _write(data, _records(["c", "d"]))
    with pytest.raises(ValueError, match=rf"{data}.*changed") as refused:
        _run(out, *_files(data))
    assert "out_dir" in str(refused.value)  # says how to go on
    assert (out / RESULTS).read_bytes() == before[0]  # nothing written, no session added
    assert json.loads((out / "manifest.json").read_text())["sessions"] == before[1]


def test_an_edited_dataset_file_is_refused_and_named(tmp_path):
    """Same ids, new questions: the old rows were scored on other questions."""
    data = tmp_path / "eval_50.jsonl"
    _write(data, _records(["a", "b"]))
    out = tmp_path / "run"
    assert _run(out, *_files(data))[0] == 0
    _write(data, _records(["a", "b"], question="When was {id} written?"))
    recorder = Recorder()
    with pytest.raises(ValueError, match=rf"{data}.*changed"):
        _run(out, *_files(data), method=recorder)
    assert recorder.asked == []


def test_a_new_file_for_a_new_length_is_not_a_change(tmp_path):
    data = tmp_path / "eval_50.jsonl"
    _write(data, _records(["a", "b"]))
    out = tmp_path / "run"
    assert _run(out, *_files(data))[0] == 0
    _write(tmp_path / "eval_100.jsonl", [{**r, "length": 100} for r in _records(["a", "b"])])
    status, second = _run(out, *_files(data)[:-2], "dataset.lengths=[50,100]", "runs=1")
    assert status == 0 and sorted(second.asked) == ["a", "b"] and len(_rows(out)) == 4


def test_a_synthetic_world_with_other_parameters_is_refused(tmp_path):
    out = tmp_path / "run"
    assert _run(out, "dataset.lengths=[50]", "dataset.num_questions=2", "runs=1")[0] == 0
    with pytest.raises(ValueError, match=r"synthetic.*changed"):
        _run(out, "dataset.lengths=[50]", "dataset.num_questions=2", "runs=1", "dataset.seed=1")


def test_a_changed_method_config_is_refused_and_the_key_named(tmp_path):
    out = tmp_path / "run"
    assert _run(out, "dataset.lengths=[50]", "dataset.num_questions=1", "runs=1")[0] == 0
    with pytest.raises(ValueError, match=r"method\.episode\.max_turns: 4 -> 5"):
        _run(out, "dataset.lengths=[50]", "dataset.num_questions=1", "runs=1", "method.episode.max_turns=5")
    # how calls are made (deadlines, retries, concurrency) is not what is computed: accepted
    status, again = _run(out, "dataset.lengths=[50]", "dataset.num_questions=1", "runs=2",
                         "method.episode.request_timeout_s=900", "concurrency=4")
    assert status == 0 and len(again.asked) == 1


def test_a_run_stops_after_a_streak_of_failed_samples_and_resumes_the_rest(tmp_path, capsys):
    """A server gone down mid-grid fails every sample in turn: after `stop_after_failures` failures
    in a row the run stops (exit 1, the way to resume said); the samples it did not start are not
    logged as failures, and a re-run with the cause fixed runs them all."""
    ids = [f"q{i}" for i in range(6)]
    path = tmp_path / "eval_50.jsonl"
    _write(path, _records(ids))
    out = tmp_path / "out"
    failing = Recorder(fail=set(ids))
    code, method = _run(out, *_files(path), "stop_after_failures=3", "concurrency=1", method=failing)
    assert code == 1 and method.asked == ids[:3]
    assert len((out / ERRORS).read_text().splitlines()) == 3
    assert "3 samples in a row failed (stop_after_failures=3)" in capsys.readouterr().out
    code, method = _run(out, *_files(path), "stop_after_failures=3", "concurrency=1")
    assert code == 0 and sorted(method.asked) == ids


# ------------------------------------------------------------------------------------- the manifest
# A damaged `manifest.json` (hand-edited, cut by a full disk, written by another tool) stopped a
# resume with a bare JSONDecodeError / KeyError / TypeError naming no file. Now it is refused with
# `ManifestDamaged`: the file, what is wrong, and the fix (set it aside; the rows are kept).
GOOD = {"created": "2026-01-01T00:00:00+00:00", "sessions": [{"started": "x"}], "config": {},
        "inputs": {"method": {}, "seed": 0, "dataset": {}, "subsets": {"d/L50": {"source": "f", "sha256": "ab"}}}}
DAMAGED = {
    "empty": b"",
    "whitespace": b"  \n",
    "cut": json.dumps(GOOD).encode()[:40],
    "not UTF-8": json.dumps(GOOD).encode().replace(b"2026", b"\xff\xfe26"),
    "a list": b"[1, 2]",
    "null": b"null",
    "sessions a dict": json.dumps({**GOOD, "sessions": {}}).encode(),
    "sessions of strings": json.dumps({**GOOD, "sessions": ["a"]}).encode(),
    "config a string": json.dumps({**GOOD, "config": "x"}).encode(),
    "inputs a list": json.dumps({**GOOD, "inputs": []}).encode(),
    "inputs without subsets": json.dumps({**GOOD, "inputs": {"method": {}, "seed": 0}}).encode(),
    "a subset without sha256": json.dumps({**GOOD, "inputs": {**GOOD["inputs"], "subsets": {"d/L50": {"source": "f"}}}}).encode(),
    "Infinity": json.dumps(GOOD).replace('"seed": 0', '"seed": Infinity').encode(),
    "nested 2000": b'{"created": ' + b"[" * 2000 + b"]" * 2000 + b"}",
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_a_damaged_manifest_is_refused_naming_the_file_and_the_fix(tmp_path, name):
    (tmp_path / "manifest.json").write_bytes(DAMAGED[name])
    with pytest.raises(provenance.ManifestDamaged) as error:
        provenance.read_manifest(tmp_path)
    message = str(error.value)
    assert message.startswith(str(tmp_path / "manifest.json")) and "move it aside" in message


def test_a_good_manifest_and_none_read_back(tmp_path):
    assert provenance.read_manifest(tmp_path) is None
    (tmp_path / "manifest.json").write_text(json.dumps(GOOD))
    assert provenance.read_manifest(tmp_path) == GOOD


def test_a_resume_over_a_damaged_manifest_stops_before_writing_and_resumes_once_set_aside(tmp_path):
    out = tmp_path / "run"
    overrides = ("dataset.lengths=[50]", "dataset.num_questions=2", "runs=1")
    assert asyncio.run(evaluate(_cfg(out, *overrides), Recorder())) == 0
    rows = _rows(out)
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:25])  # a disk that filled mid-write
    with pytest.raises(provenance.ManifestDamaged, match="manifest.json: cannot be read"):
        asyncio.run(evaluate(_cfg(out, "dataset.num_questions=3", *overrides[:1], *overrides[2:]), Recorder()))
    assert _rows(out) == rows and manifest.read_bytes()[:25] == manifest.read_bytes()  # nothing written
    shutil.move(manifest, out / "manifest.json.damaged")  # the fix the message gives
    second = Recorder()
    assert asyncio.run(evaluate(_cfg(out, "dataset.num_questions=3", "dataset.lengths=[50]", "runs=1"), second)) == 0
    assert len(second.asked) == 1 and len(_rows(out)) == 3
    assert len(provenance.read_manifest(out)["sessions"]) == 1


@pytest.mark.slow
def test_eval_run_exits_2_with_the_message(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_bytes(b'{"sessions": 3}')
    done = subprocess.run([sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", f"out_dir={out}", "limit=1",
                           "runs=1", "progress=false"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{out / 'manifest.json'}: field 'sessions' should be a list" in done.stderr
    assert "Traceback" not in done.stderr


class Surrogates(Recorder):
    """A method whose answer and trace hold lone surrogates (a tokenizer's byte-fallback pieces)."""

    async def run(self, sample: Sample) -> MethodResult:
        await super().run(sample)
        turn = Turn(0, "\udc80", "", [], None, None, 1, "stop", 0.0)
        return MethodResult(answer=f"{sample.answers[0]} \ud83d", steps=1, wall_s=0.0,
                            trace=Trajectory(sample.question, sample.id, 1, turns=[turn]))


def test_a_lone_surrogate_in_a_result_row_is_written_escaped_and_the_run_finishes(tmp_path):
    """It raised UnicodeEncodeError from the store's append and aborted the run."""
    out = tmp_path / "run"
    overrides = ("dataset.lengths=[50]", "dataset.num_questions=2", "runs=1", "save_records=true")
    assert asyncio.run(evaluate(_cfg(out, *overrides), Surrogates())) == 0
    assert "\\ud83d" in (out / RESULTS).read_text(encoding="utf-8")
    rows = _rows(out)
    assert len(rows) == 2 and all(r["prediction"].endswith(" \ufffd") for r in rows)
    second = Recorder()
    assert asyncio.run(evaluate(_cfg(out, *overrides), second)) == 0 and second.asked == []  # resumes: nothing lost
