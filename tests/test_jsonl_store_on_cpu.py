"""Stores survive their own failures: an acknowledged row is never lost, and the store reopens.

    .venv/bin/pytest tests/test_jsonl_store_on_cpu.py -q

One implementation (`parser.records.jsonl.JsonlStore`) under the eval results store and the knowledge
filter's log. A real file-size limit (RLIMIT_FSIZE, in a child process) stands in for a full
disk: the write fails part-way, as it does when the disk fills.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from parser.records.jsonl import JsonlStore

ROOT = Path(__file__).resolve().parents[1]


def by_id(row):
    return str(row["id"])


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def test_a_failed_append_leaves_no_fragment_for_the_next_row(tmp_path):
    """After a write cut by the file-size limit, the next row was fused onto the fragment and
    the store no longer opened. Runs in a child process: the limit applies to the whole process."""
    path = tmp_path / "store.jsonl"
    script = textwrap.dedent(f"""
        import resource, sys
        from parser.records.jsonl import JsonlStore
        store = JsonlStore({str(path)!r}, key=lambda row: row["id"])
        store.append({{"id": "a", "x": 1}})
        size = {str(path)!r} and __import__("os").path.getsize({str(path)!r})
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
        try:
            store.append({{"id": "big", "x": "y" * 100000}})
        except OSError as error:
            print("failed:", error.errno)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert "big" not in store
        store.append({{"id": "b", "x": 2}})
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "failed: 27" in done.stdout  # EFBIG: the write really was cut
    reopened = JsonlStore(path, key=by_id)
    assert [r["id"] for r in reopened.rows] == ["a", "b"] and not reopened.problems
    assert [json.loads(line)["id"] for line in lines(path) if line] == ["a", "b"]


def test_when_cutting_the_fragment_fails_too_the_next_append_overwrites_it(tmp_path, monkeypatch):
    """`ftruncate` failing is what cannot be produced on demand here: it stands in for an I/O error."""
    path = tmp_path / "store.jsonl"
    store = JsonlStore(path, key=by_id)
    store.append({"id": "a"})
    real_write, real_truncate = os.write, os.ftruncate
    state = {"fail": True}

    def half_write(fd, data):
        if state["fail"]:
            state["fail"] = False
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    def broken_truncate(fd, length):
        if not state.get("truncated"):
            state["truncated"] = True
            raise OSError(5, "Input/output error")
        return real_truncate(fd, length)

    monkeypatch.setattr(os, "write", half_write)
    monkeypatch.setattr(os, "ftruncate", broken_truncate)
    with pytest.raises(OSError, match="No space"):
        store.append({"id": "long", "text": "z" * 500})
    assert b"zzzz" in path.read_bytes()  # the fragment is still there
    store.append({"id": "b"})
    monkeypatch.undo()
    assert [r["id"] for r in JsonlStore(path, key=by_id).rows] == ["a", "b"]
    assert b"zzzz" not in path.read_bytes()


def test_a_complete_last_row_without_its_newline_is_kept(tmp_path):
    """It was taken for a torn write and cut off: an acknowledged row lost."""
    path = tmp_path / "store.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}')
    store = JsonlStore(path, key=by_id)
    assert "b" in store and not store.problems
    store.append({"id": "c"})
    assert [json.loads(line)["id"] for line in lines(path) if line] == ["a", "b", "c"]


def test_an_unfinished_last_line_is_cut_and_said(tmp_path):
    path = tmp_path / "store.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "x')
    store = JsonlStore(path, key=by_id)
    assert [r["id"] for r in store.rows] == ["a"] and "store.jsonl:2: an unfinished last line" in store.problems[0]
    assert path.read_text() == '{"id": "a"}\n'


@pytest.mark.parametrize("bad", ["not json", "[1, 2]", '"a string"', '{"no_id": 1}', "\udcff garbage"])
def test_a_bad_line_in_the_middle_loses_nothing_after_it(tmp_path, bad):
    """The knowledge-filter log kept only the rows before a bad line and truncated the rest away;
    the results store refused to open. Now the line is skipped and named, and kept in the file."""
    path = tmp_path / "store.jsonl"
    path.write_bytes(b'{"id": "a"}\n' + bad.encode("utf-8", "surrogateescape") + b'\n{"id": "b"}\n')
    before = path.read_bytes()
    store = JsonlStore(path, key=by_id)
    assert [r["id"] for r in store.rows] == ["a", "b"]
    assert len(store.problems) == 1 and store.problems[0].startswith(f"{path}:2: ")
    assert path.read_bytes() == before


def test_a_row_fused_with_an_earlier_fragment_is_read_back(tmp_path):
    """Files the old store wrote after a failed append: fragment + a complete, acknowledged row."""
    path = tmp_path / "store.jsonl"
    path.write_text('{"id": "a"}\n{"id": "frag", "x": "unfin{"id": "b", "nested": {"k": [1, 2]}}\n{"id": "c"}\n')
    store = JsonlStore(path, key=by_id)
    assert [r["id"] for r in store.rows] == ["a", "b", "c"] and store.by_key["b"]["nested"] == {"k": [1, 2]}
    assert "store.jsonl:2: an unfinished write was fused" in store.problems[0]


def test_the_first_row_of_a_key_wins_and_duplicates_are_named(tmp_path):
    path = tmp_path / "store.jsonl"
    path.write_text('{"id": "a", "v": 1}\n{"id": "a", "v": 2}\n')
    store = JsonlStore(path, key=by_id)
    assert store.by_key["a"]["v"] == 1 and "store.jsonl:2: key 'a' again" in store.problems[0]
    assert not store.append({"id": "a", "v": 3})


def test_reading_read_only_changes_nothing(tmp_path):
    path = tmp_path / "store.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"')
    before = path.read_bytes()
    assert [r["id"] for r in JsonlStore(path, readonly=True).rows] == ["a"]
    assert path.read_bytes() == before


def test_concurrent_appends_all_land_on_their_own_lines(tmp_path):
    path = tmp_path / "store.jsonl"
    store = JsonlStore(path, key=by_id)
    threads = [threading.Thread(target=lambda i=i: store.append({"id": f"r{i}", "pad": "p" * (i % 7) * 50})) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reopened = JsonlStore(path, key=by_id)
    assert len(reopened.rows) == 64 and not reopened.problems


def test_the_knowledge_filter_resumes_past_a_bad_line(tmp_path, tiny_tokenizer):
    """The filter's log with a bad line in the middle: the questions after it were lost and asked
    again. Now only the question never asked is."""
    from parser.serving.types import Completion
    from data_prep.knowledge_filter import parametric_filter

    log = tmp_path / "filter.jsonl"
    done = {"id": "q1", "responses": ["x"], "correct": [False], "answerable": False}
    log.write_text(json.dumps({**done, "id": "q0"}) + "\n#garbage\n" + json.dumps(done) + "\n")
    asked = []

    class Model:
        async def generate(self, prompt, sampling, request_id=None, **_):
            asked.append(request_id)
            return Completion(text="\\boxed{nope}", token_ids=[1], finish_reason="stop")

    questions = [{"id": f"q{i}", "question": f"Q{i}?", "answers": ["Yes"]} for i in range(3)]
    result = asyncio.run(parametric_filter(questions, Model(), tiny_tokenizer, log_path=log, samples=1))
    assert sorted(result) == ["q0", "q1", "q2"] and asked == ["filter-q2-0"]
    assert "#garbage" in log.read_text() and log.read_text().count('"id": "q1"') == 1


# -- the eval results store is one -----------------------------------------------------------------
def result(sid: str, **extra):
    return {"dataset": "synthetic", "length": 50, "condition": None, "run": 0, "sample_id": sid, "sub_em": 1.0, **extra}


def test_the_results_store_reopens_after_a_failed_append(tmp_path):
    script = textwrap.dedent(f"""
        import os, resource
        from eval.store import ResultsStore
        from parser.records.result import ResultRow
        store = ResultsStore({str(tmp_path)!r})
        store.append(ResultRow.from_dict({result("a")!r}))
        size = os.path.getsize(store.results_path)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 64, hard))
        try:
            store.append(ResultRow.from_dict({{**{result("big")!r}, "record": {{"r": "r" * 200000}}}}))
        except OSError:
            print("append failed")
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        print("acknowledged", store.append(ResultRow.from_dict({result("b")!r})))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "append failed" in done.stdout and "acknowledged True" in done.stdout
    from eval.store import ResultsStore

    assert sorted(row.sample_id for row in ResultsStore(tmp_path).rows()) == ["a", "b"]


def test_the_results_store_keeps_a_complete_last_row_without_its_newline(tmp_path):
    from eval.store import RESULTS, ResultsStore

    (tmp_path / RESULTS).write_text(json.dumps(result("a")) + "\n" + json.dumps(result("b")))
    assert sorted(row.sample_id for row in ResultsStore(tmp_path).rows()) == ["a", "b"]


def test_a_result_row_without_its_key_names_its_file_and_line_and_blocks_nothing(tmp_path):
    from eval.store import RESULTS, ResultsStore

    (tmp_path / RESULTS).write_text(json.dumps(result("a")) + "\n" + json.dumps({"sample_id": "x"}) + "\n" + json.dumps(result("b")) + "\n")
    store = ResultsStore(tmp_path)
    assert sorted(row.sample_id for row in store.rows()) == ["a", "b"]
    assert any(p.startswith(f"{tmp_path / RESULTS}:2: a row without its key") for p in store.problems)


def test_a_bad_timing_line_does_not_stop_the_run_dir_from_opening(tmp_path):
    from eval.store import TIMINGS, ResultsStore

    (tmp_path / TIMINGS).write_text('{"dataset": "a", "length": 50, "wall_s": 1}\n{oops\n{"dataset": "b", "length": 50, "wall_s": 2}\n')
    store = ResultsStore(tmp_path)
    assert [t.dataset for t in store.timings.rows] == ["a", "b"]


# A hand-edited line: values JSON does not have, numbers past a double, nesting deeper than any
# row, bytes that are not UTF-8. Each stopped the results store from opening (or let inf/NaN into
# the means); now each is skipped, named by file, line and field, and left in the file.
HAND_EDITS = {
    "Infinity": b'{"id": "x", "wall_s": Infinity}',
    "-Infinity": b'{"id": "x", "meta": {"gap": -Infinity}}',
    "NaN": b'{"id": "x", "sub_em": NaN}',
    "1e400": b'{"id": "x", "wall_s": 1e400}',
    "-2e999 in a list": b'{"id": "x", "scores": [1, -2e999]}',
    "5000 digits": b'{"id": "x", "steps": ' + b"9" * 5000 + b"}",
    "400 digits negative": b'{"id": "x", "steps": -' + b"7" * 400 + b"}",
    "nested 1000": b'{"id": "x", "meta": ' + b"[" * 1000 + b"]" * 1000 + b"}",
    "nested 5000 objects": b'{"id": "x", "m": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
    "nested 100": b'{"id": "x", "m": ' + b"[" * 100 + b"]" * 100 + b"}",
    "latin-1": '{"id": "x", "question": "caf\xe9"}'.encode("latin-1"),
    "a lone 0xff": b'{"id": "x", "q": "\xff\xfe"}',
}
FIELDS = {"Infinity": "wall_s", "-Infinity": "meta.gap", "NaN": "sub_em", "1e400": "wall_s",
          "-2e999 in a list": "scores[1]", "5000 digits": "steps", "400 digits negative": "steps"}


@pytest.mark.parametrize("name", list(HAND_EDITS))
@pytest.mark.parametrize("where", ["middle", "last, without its newline"])
def test_a_hand_edited_line_never_stops_the_store_from_opening(tmp_path, name, where):
    path = tmp_path / "results.jsonl"
    bad = HAND_EDITS[name]
    path.write_bytes(b'{"id": "a"}\n' + bad + (b'\n{"id": "b"}\n' if where == "middle" else b""))
    before = path.read_bytes()
    store = JsonlStore(path, key=by_id)
    assert [r["id"] for r in store.rows] == (["a", "b"] if where == "middle" else ["a"])
    assert len(store.problems) == 1, store.problems
    problem = store.problems[0]
    assert problem.startswith(f"{path}:2: ") and "left in the file" in problem and "fix or delete that line" in problem
    if name in FIELDS:
        assert f"field {FIELDS[name]!r}" in problem
    # the hand-edited line is kept (a last line gets its newline), and the next append goes after it
    assert path.read_bytes() == before + (b"" if where == "middle" else b"\n")
    store.append({"id": "c", "wall_s": 1.5})
    reopened = JsonlStore(path, key=by_id)
    assert [r["id"] for r in reopened.rows] == (["a", "b", "c"] if where == "middle" else ["a", "c"])
    assert len(reopened.problems) == 1


def test_rows_as_deep_as_a_trajectory_and_big_integers_still_read(tmp_path):
    """The bounds refuse what no writer of ours produces, nothing it does."""
    path = tmp_path / "results.jsonl"
    row = {"id": "a", "record": {"turns": [{"queries": [{"calls": [{"tokens": [[1, 2], [3]]}]}]}]},
           "seed": 2**63 - 1, "neg": -(2**63), "tiny": 5e-324, "big": 1.7e308, "text": "naïve – 東京"}
    JsonlStore(path, key=by_id).append(row)
    reopened = JsonlStore(path, key=by_id)
    assert reopened.rows == [row] and not reopened.problems


def test_a_lone_surrogate_in_a_row_is_escaped_not_fatal(tmp_path):
    """`"\\ud800"` in a prediction raised UnicodeEncodeError from `append` and aborted the run."""
    path = tmp_path / "results.jsonl"
    store = JsonlStore(path, key=by_id)
    assert store.append({"id": "a", "prediction": "x\ud800y", "meta": {"k\udfff": ["\udc80"]}})
    store.append({"id": "b"})
    text = path.read_bytes().decode("utf-8")  # the file stays valid UTF-8: the surrogate is an escape
    assert "\\ud800" in text and "\\udc80" in text
    reopened = JsonlStore(path, key=by_id)
    assert not reopened.problems and [r["id"] for r in reopened.rows] == ["a", "b"]
    row = reopened.by_key["a"]
    assert row["prediction"] == "x\ufffdy" and row["meta"] == {"k\ufffd": ["\ufffd"]}
    json.dumps(row).encode("utf-8")  # nothing downstream trips on it


def test_an_infinite_value_is_refused_at_append_not_written(tmp_path):
    """`json.dumps` wrote `Infinity`, a line no reader of the file accepts (a bug upstream must surface)."""
    store = JsonlStore(tmp_path / "results.jsonl", key=by_id)
    store.append({"id": "a"})
    with pytest.raises(ValueError):
        store.append({"id": "b", "wall_s": float("inf")})
    assert (tmp_path / "results.jsonl").read_bytes() == b'{"id": "a"}\n' and "b" not in store


def test_atomic_writes_and_new_store_files_are_fsynced_with_their_directory(tmp_path, monkeypatch):
    """The manifest (and every atomic output) was renamed into place unsynced: a power cut
    could leave an empty file or the old one."""
    from parser.records import jsonl

    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    jsonl.write_json(tmp_path / "sub" / "manifest.json", {"a": 1})
    assert any(p.startswith(str(tmp_path / "sub" / ".manifest.json.")) for p in synced)  # the file, before rename
    assert str(tmp_path / "sub") in synced  # the directory, after
    synced.clear()
    JsonlStore(tmp_path / "new" / "results.jsonl", key=by_id).append({"id": "a"})
    assert synced == [str(tmp_path / "new" / "results.jsonl"), str(tmp_path / "new")]


@pytest.mark.parametrize("fragment", [b'{"a": ' * 20000, b'{"id": "frag", "deep": ' + b'{"k": ' * 20000])
def test_a_line_with_thousands_of_nested_row_starts_still_gives_back_the_fused_row(tmp_path, fragment):
    """Finding a row fused with a fragment tried every `{"` with the full parser (and a
    nesting past the recursion limit crashed the store). Each try is now orjson's."""
    path = tmp_path / "store.jsonl"
    path.write_bytes(b'{"id": "a"}\n' + fragment + b'{"id": "b"}\n{"id": "c"}\n')
    store = JsonlStore(path, key=by_id)
    assert [r["id"] for r in store.rows] == ["a", "b", "c"] and "fused" in store.problems[0]


def test_rows_holding_unicode_line_separators_stay_whole(tmp_path):
    """A record ends at `\\n` only: U+2028, U+2029 and U+0085 are valid unescaped inside a JSON
    string (orjson writes them raw), and `str.splitlines` would cut the row there."""
    from parser.records.jsonl import read_records, write_jsonl

    rows = [{"id": str(i), "text": f"a{sep}b"} for i, sep in enumerate(("\u2028", "\u2029", "\x85", "\r"))]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert "\u2028".encode() in path.read_bytes()  # raw in the file, not escaped
    assert read_records(path) == rows
    store = JsonlStore(path, key=lambda row: row["id"])
    assert store.rows == rows and not store.problems
    for name, text in (("bom.jsonl", b"\r\n".join(json.dumps(r).encode() for r in rows) + b"\r\n"), ("bom.json", json.dumps(rows).encode())):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text)  # "UTF-8 with BOM", CRLF: a Windows editor's save
        assert read_records(tmp_path / name) == rows, name
