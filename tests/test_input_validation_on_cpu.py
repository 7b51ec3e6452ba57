"""Every entry point of a record applies the rules data prep applies (`parser.records.sample`).

    .venv/bin/pytest tests/test_input_validation_on_cpu.py -q

The verl parquet checker (`data_prep.verl_parquet.read_rl_parquet`, the agent loop's own row
reader) read wrong types straight through: a list as the document, a dict as the question,
golds that normalize to nothing. Each probe writes a real parquet file and expects an error
naming the file, the row and the field.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.verl_parquet import read_rl_parquet, rl_row
from parser.records.sample import DataError

GOOD = {"question": "Who directed Zorvan?", "answers": ["Miro Tal"], "context": "Document 1:\nZorvan is by Miro Tal.",
        "index": 0, "id": "q0", "num_docs": 1}


def ours(**extra_info):
    row = rl_row(GOOD, "hotpotqa")
    row["extra_info"] = {**row["extra_info"], **extra_info}
    return row


def released(**fields):
    return {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Who directed Zorvan?"}],
            "context": GOOD["context"], "reward_model": {"style": "rule", "ground_truth": ["Miro Tal"]},
            "extra_info": {"index": 3}, **fields}


def write(tmp_path, *rows, name="train.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


@pytest.mark.parametrize("row, message", [
    (ours(context=["Document 1:", "a list"]), "field 'extra_info.context' must be a string, got list"),
    (released(context=12345), "field 'context' must be a string, got int"),
    (released(context=b"Document 1:\nbytes"), "field 'context' must be a string, got bytes"),
    (ours(context="   "), "field 'extra_info.context' is empty"),
    (ours(question={"text": "q"}), "field 'extra_info.question' must be a string, got dict"),
    (released(prompt=[{"role": "user", "content": None}]), r"field 'prompt\[\].content' must be a string, got NoneType"),
    (released(reward_model={"ground_truth": {"Miro Tal": 1}}), "field 'reward_model.ground_truth' must be a non-empty list"),
    (released(reward_model={"ground_truth": ["Miro Tal", "the"]}), r"reward_model.ground_truth\[1\] = 'the' normalizes to nothing"),
    (released(reward_model={"ground_truth": [""]}), r"reward_model.ground_truth\[0\] = '' normalizes to nothing"),
    (released(reward_model={"ground_truth": "?!"}), r"normalizes to nothing"),
    (released(reward_model={"ground_truth": [1.5]}), r"reward_model.ground_truth\[0\] must be a string, got float"),
    (released(reward_model="rule"), "field 'reward_model' must be a mapping"),
])
def test_the_parquet_checker_refuses_what_data_prep_refuses(tmp_path, row, message):
    path = write(tmp_path, row)  # (one type per parquet column: the bad row is the file)
    with pytest.raises(DataError, match=message) as error:
        read_rl_parquet(path)
    assert str(error.value).startswith(f"{path} row 0:")


def test_the_parquet_checker_still_reads_both_layouts_and_numeric_golds(tmp_path):
    (mine,) = read_rl_parquet(write(tmp_path, rl_row(GOOD, "hotpotqa"), name="ours.parquet"))
    (theirs,) = read_rl_parquet(write(tmp_path, released(reward_model={"ground_truth": [1999]})))
    assert (list(mine.answers), list(theirs.answers)) == (["Miro Tal"], ["1999"])
    assert theirs.question == "Who directed Zorvan?" and theirs.context == GOOD["context"]


# -- the eval loader --------------------------------------------------------------------------------
def eval_row(**fields):
    return {"id": "q0_L1", "question": "Who directed Zorvan?", "answers": ["Miro Tal"], "context": GOOD["context"],
            "length": 1, **fields}


@pytest.mark.parametrize("bad, message", [
    (eval_row(answers={"Miro Tal": 1}), "field 'answers' must be a non-empty list of strings, got dict"),
    (eval_row(answers=[]), "field 'answers' must be a non-empty list"),
    (eval_row(answers=["the"]), r"answers\[0\] = 'the' normalizes to nothing"),
    (eval_row(answers=[""]), r"answers\[0\] = '' normalizes to nothing"),
    (eval_row(answers=[None]), r"answers\[0\] must be a string, got NoneType"),
    (eval_row(answers=[["Miro", "Tal"]]), r"answers\[0\] must be a string, got list"),
    (eval_row(context=["Document 1:", "a list"]), "field 'context' must be a string, got list"),
    (eval_row(context=""), "field 'context' is empty"),
    (eval_row(question=["q"]), "field 'question' must be a string, got list"),
    (eval_row(question="  "), "field 'question' is empty"),
    ({**eval_row(), "question": None, "input": 7}, "field 'input' must be a string, got int"),
    ({k: v for k, v in eval_row().items() if k != "answers"}, "missing field 'answers'"),
])
def test_the_eval_loader_refuses_what_data_prep_refuses(tmp_path, bad, message):
    """The file loader accepted these (a dict's keys became the golds, "the" matched every
    prediction, a list became the document)."""
    import orjson

    from eval.datasets import load_subsets

    path = tmp_path / "eval_1.jsonl"
    path.write_bytes(orjson.dumps(eval_row(id="ok_L1")) + b"\n" + orjson.dumps(bad) + b"\n")
    with pytest.raises(DataError, match=message) as error:
        load_subsets({"name": "x", "source": "files", "lengths": [1], "path": str(tmp_path / "eval_{length}.jsonl")})
    assert str(error.value).startswith(f"{path}:2:")


def test_the_eval_loader_reads_memagent_rows_and_numeric_golds(tmp_path):
    import orjson

    from eval.datasets import load_subsets

    path = tmp_path / "eval_1.json"
    path.write_bytes(orjson.dumps([{"index": 4, "input": "When?", "answers": [1999], "context": GOOD["context"], "num_docs": 1}]))
    (subset,) = load_subsets({"name": "x", "source": "files", "lengths": [1], "path": str(tmp_path / "eval_{length}.json")})
    assert subset.samples[0].answers == ["1999"] and subset.samples[0].question == "When?"


def test_an_empty_training_table_is_refused_naming_the_file(tmp_path):
    """A parquet with the columns but no rows was accepted as training data (it trains on nothing)."""
    from data_prep.verl_parquet import write_rl_parquet

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([ours()]).slice(0, 0), path)
    with pytest.raises(DataError, match=f"{path}: the parquet table has no rows"):
        read_rl_parquet(path)
    with pytest.raises(DataError, match="no rows to write"):
        write_rl_parquet(tmp_path / "none.parquet", [], data_source="synthetic")
    assert not (tmp_path / "none.parquet").exists()


@pytest.mark.parametrize("make, message", [
    (lambda path: path.mkdir(), r"eval_1\.jsonl: a directory, not a data file"),
    (lambda path: path.write_bytes(b'{"question": "caf\xe9"}\n'), r"eval_1\.jsonl:1: .*byte 17 is not UTF-8"),
])
def test_an_eval_file_that_cannot_be_read_as_records_is_refused_naming_it(tmp_path, make, message):
    """A directory was an IsADirectoryError traceback; both end `parser eval` in one line, exit 2."""
    from eval.datasets import load_subsets

    make(tmp_path / "eval_1.jsonl")
    with pytest.raises(DataError, match=message):
        load_subsets({"name": "x", "source": "files", "lengths": [1], "path": str(tmp_path / "eval_{length}.jsonl")})


def test_an_eval_file_over_the_size_bound_is_refused_unread_naming_its_size_and_the_setting(tmp_path):
    """Every data file was read whole into memory, whatever its size (a 3 GB sparse file here)."""
    import orjson

    from eval.datasets import load_subsets
    from eval.run import _prepare
    from parser.base.resources import config_dir
    from parser.base.settings import compose_checked

    path = tmp_path / "eval_1.jsonl"
    path.write_bytes(orjson.dumps(eval_row(id="ok_L1")) + b"\n")
    size = path.stat().st_size
    dataset = {"name": "x", "source": "files", "lengths": [1], "path": str(tmp_path / "eval_{length}.jsonl")}
    (under,) = load_subsets(dataset, max_file_bytes=size)  # at the bound: read exactly as with the default
    (default,) = load_subsets(dataset)
    assert (under.samples, under.digest) == (default.samples, default.digest)
    with pytest.raises(DataError, match=rf"eval data file {path}: {size:,} bytes, over max_data_file_bytes={size - 1:,} "
                                        rf".*parser eval max_data_file_bytes={size}$"):
        load_subsets(dataset, max_file_bytes=size - 1)
    cfg = compose_checked(config_dir("eval"), "tiny_cpu", [f"hydra.searchpath=[file://{config_dir()}]", "dataset=files",
                                                         f"dataset.path={path}", "max_data_file_bytes=9"])
    with pytest.raises(DataError, match="over max_data_file_bytes=9 "):  # the setting reaches the loader
        _prepare(cfg)
    with open(path, "r+b") as handle:
        handle.truncate(3 * 2**30)
    with pytest.raises(DataError, match="3,221,225,472 bytes, over max_data_file_bytes=2,147,483,648 "):
        load_subsets(dataset)
    path.unlink()


def test_parser_eval_ends_a_bad_data_file_in_one_line_before_any_model_loads(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "eval_50.jsonl").mkdir()
    done = subprocess.run([sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", f"out_dir={tmp_path / 'out'}",
                           "dataset=hotpotqa", "dataset.name=files", f"dataset.path='{tmp_path}/eval_{{length}}.jsonl'",
                           "dataset.lengths=[50]"], cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [f"eval.run: error: {tmp_path}/eval_50.jsonl: a directory, not a data file; "
                                        "give the JSON or JSONL file itself"]
