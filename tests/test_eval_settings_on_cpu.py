"""Settings no run can honour are refused at load, naming the key or the file, with exit 2:
`concurrency: 0` waited forever, `runs: 0` and an empty dataset file reported "all 0 samples
done" and exited 0. Every numeric setting has a declared domain (`parser.base.domains`), checked
where eval, the demo and ask compose their config, before anything loads; a typo says what was
meant, and a `+key=` adds no key that nothing reads (issue 55 item 5). And the order study records
a cell whose folder another process holds and goes on with the others.

    .venv/bin/pytest tests/test_eval_settings_on_cpu.py -q

The method is the outer edge where one is needed (`Recorder`, as in test_eval_resume_on_cpu.py).
"""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_resume_on_cpu import Recorder, _cfg, _files, _records, _write

from eval.run import BadSetting, evaluate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("override, key", [("concurrency=0", "concurrency=0"), ("concurrency=-3", "concurrency=-3"),
                                           ("runs=0", "runs=0")])
def test_a_count_below_one_is_refused_naming_the_key(tmp_path, override, key):
    with pytest.raises(BadSetting, match=f"{key}: expected an integer >= 1"):
        asyncio.run(evaluate(_cfg(tmp_path / "out", "limit=1", override), Recorder()))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_an_empty_dataset_file_is_refused_naming_the_file(tmp_path):
    data = tmp_path / "eval_50.jsonl"
    data.write_text("")
    with pytest.raises(BadSetting, match=f"{data}: no samples"):
        asyncio.run(evaluate(_cfg(tmp_path / "out", *_files(data)), Recorder()))
    _write(data, _records(["a"]))  # the same run with a sample in the file goes
    assert asyncio.run(evaluate(_cfg(tmp_path / "out", *_files(data)), Recorder())) == 0


def test_the_command_exits_2_and_says_which_key(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "eval.run", "--config-name", "tiny_cpu", "concurrency=0",
                           f"out_dir={tmp_path / 'out'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "eval.run: error: concurrency=0: expected an integer >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_order_study_records_a_locked_cell_and_runs_the_others(tmp_path, capsys):
    """One method on two controlled sets (tiny random models, as order_study_tiny_cpu): the first
    cell's folder is held by another eval.run; the study says so, runs the second, reports, exits 1."""
    from hydra import compose, initialize_config_dir

    from eval.order_study import run_study
    from eval.run import CONFIGS
    from eval.store import RESULTS, lock_run_dir

    method = "{config: memagent_cpu, overrides: ['method.chunk_size=1024', 'method.max_memory_tokens=8', 'method.max_answer_tokens=8']}"
    sets = ("[{config: synthetic_distance, overrides: ['dataset.options.distances=[0,10]', 'dataset.options.pad=3']}, "
            "{config: synthetic_order, overrides: ['dataset.options.length=20']}]")
    base = [f"hydra.searchpath=[file://{CONFIGS}]", f"study.root={tmp_path / 'study'}", f"study.methods=[{method}]",
            f"study.datasets={sets}"]
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("order_study_tiny_cpu", overrides=base)

        def compose_cell(overrides):
            return compose("order_study_tiny_cpu", overrides=[*base, *overrides])

        locked = compose_cell(["method=memagent_cpu", "dataset=synthetic_distance"]).out_dir
        with lock_run_dir(locked):
            status = asyncio.run(run_study(cfg, compose_cell))
    out = capsys.readouterr().out
    assert status == 1 and "skipped" in out and f"{locked} is in use by another eval.run" in out
    assert not (Path(locked) / RESULTS).exists()
    assert len(list((tmp_path / "study").rglob(RESULTS))) == 1  # the other cell ran


def test_a_study_whose_two_entries_share_a_folder_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    """Two labels on one method config write to one folder (its `name`): refused, naming it, before
    models are built (the second would have resumed the first's rows)."""
    from hydra import compose, initialize_config_dir

    import parser.serving.backends.models as models_module
    from eval.order_study import run_study
    from eval.run import CONFIGS

    monkeypatch.setattr(models_module, "build_models", lambda *_: pytest.fail("models were built"))
    methods = "[{config: memagent_cpu}, {config: memagent_cpu, overrides: [\"method.label='MemAgent (again)'\"]}]"
    base = [f"hydra.searchpath=[file://{CONFIGS}]", f"study.root={tmp_path}", f"study.methods={methods}",
            "study.datasets=[{config: synthetic}]"]
    with initialize_config_dir(config_dir=str(CONFIGS / "eval"), version_base="1.3"):
        cfg = compose("peers_tiny_cpu", overrides=base)
        with pytest.raises(ValueError, match=f"two cells write to the same folder \\({tmp_path}/synthetic/memagent\\)"):
            asyncio.run(run_study(cfg, lambda overrides: compose("peers_tiny_cpu", overrides=[*base, *overrides])))


# -- every numeric setting has a declared domain, checked where configs are composed (issue 55 item 5) --
def _eval(*overrides: str):
    from eval.run import CONFIGS
    from parser.base.settings import compose_checked

    return compose_checked(CONFIGS / "eval", "tiny_cpu", [f"hydra.searchpath=[file://{CONFIGS}]", *overrides])


@pytest.mark.parametrize("key, value, domain", [
    ("limit", -1, "an integer >= 1, or null"), ("limit", 0, "an integer >= 1, or null"), ("limit", float("nan"), None),
    ("limit", True, None), ("stop_after_failures", 0, "or null"), ("chunk_size", 2.5, "an integer >= 1"),
    ("timeout_s", float("inf"), "a finite number > 0"), ("timeout_s", 0, None), ("ready_timeout_s", -1, None),
    ("state_token_budget", 0, None), ("max_stalls", -2, None), ("length", 0, None), ("workers", -1, "an integer >= 0"),
    ("port", 70000, "an integer in [0, 65535]"), ("seed", -1, "[0, 4294967295]"), ("lead_top_k", 0, "or -1 (off)"),
    ("top_p", 0.0, "in (0, 1]"), ("retry_backoff_s", float("nan"), "a finite number >= 0"), ("lengths", [50, 0], "a list of"),
    ("subagent_temperature", -0.1, None), ("max_quote_chars", "12", None), ("body_timeout_s", float("-inf"), None),
])
def test_a_value_outside_its_domain_is_named_with_the_domain(key, value, domain):
    from parser.base.domains import problem

    said = problem(f"section.{key}", value)
    assert said is not None and said.startswith(f"section.{key}={value!r}: expected "), said
    assert domain is None or domain in said


@pytest.mark.parametrize("key, value", [("limit", None), ("limit", 3), ("stop_after_failures", None), ("lead_top_k", -1),
                                        ("workers", 0), ("port", 0), ("timeout_s", 600), ("lengths", None), ("top_p", 1.0),
                                        ("temperature", 0), ("note_s", 0.0), ("name", "x"), ("max_context_tokens", None)])
def test_a_value_inside_its_domain_passes(key, value):
    from parser.base.domains import problem

    assert problem(key, value) is None


def test_every_shipped_setting_is_inside_its_domain():
    """The configs eval, ask, the demo and serve compose: a domain that refused a shipped value would refuse every run."""
    from omegaconf import OmegaConf

    from eval.run import CONFIGS
    from parser.base.domains import problems

    files = [CONFIGS / "demo.yaml", CONFIGS / "ask.yaml"] + [
        p for group in ("eval", "method", "backend", "episode", "sandbox", "embedder", "serve") for p in (CONFIGS / group).rglob("*.yaml")]
    found = [f"{p}: {x}" for p in files for x in problems(OmegaConf.to_container(OmegaConf.load(p), resolve=False))
             if "${" not in x]  # an interpolation is checked once composed
    assert len(files) > 60 and found == []


def test_the_composed_run_is_refused_naming_every_bad_value(monkeypatch):
    """One composition, eight settings outside their domains (eval's, the method's, the episode's,
    the models'): each named with its value and domain, before anything is built."""
    import parser.serving.backends.models as models_module
    from parser.base.config import ConfigError

    monkeypatch.setattr(models_module, "build_models", lambda *_: pytest.fail("models were built"))
    with pytest.raises(ConfigError) as refused:
        _eval("method=longharness_cpu", "limit=-1", "stop_after_failures=0", "runs=nan", "method.episode.chunk_size=0",
              "method.state_token_budget=0", "method.max_update_tokens=inf", "dataset.lengths=[50,-5]",
              "method.episode.request_timeout_s=-1")
    said = str(refused.value)
    for part in ("limit=-1: expected an integer >= 1, or null", "stop_after_failures=0", "runs=nan",
                 "method.episode.chunk_size=0", "method.state_token_budget=0", "method.max_update_tokens=inf",
                 "dataset.lengths=[50, -5]: expected a list of integers >= 1", "method.episode.request_timeout_s=-1"):
        assert part in said, part


@pytest.mark.parametrize("overrides, said", [
    (["+limt=3"], "unknown setting limt (did you mean limit?); `+` added a key that nothing reads"),
    (["++limt=3"], "unknown setting limt (did you mean limit?); `+` added a key that nothing reads"),
    (["limt=3"], "unknown setting limt (did you mean limit?); no such key"),
    (["method=longharness_cpu", "+method.state_budget=9"], "method.state_budget (did you mean method.state_token_budget?)"),
    (["+method.episode.chunk_sise=9"], "method.episode.chunk_sise (did you mean method.episode.chunk_size?)"),
    (["+report.varient=x"], "report.varient (did you mean report.variant?)"),
    (["method=memagent_cpu", "method.chunk_sise=9"], "method.chunk_sise (did you mean method.chunk_size?)"),
    (["backend@models=openai", "+models.subagent.timeout=9"], "models.subagent.timeout (did you mean models.subagent.timeout_s?)"),
    (["+runs=3"], "+runs=3: runs is already a setting; set it without the `+` (runs=3)"),  # not Hydra's raw "Could not append"
    (["runs={a:1}"], "runs={'a': 1}: expected an integer >= 1"),  # a mapping where a number goes: int() of it deep in eval
    (["~runs"], "~runs: a setting cannot be removed; set a value (an integer >= 1)"),
    (["~limit"], "~limit: a setting cannot be removed; set limit=null to switch it off, or a value"),
    (["method.episode.chunk_size=${oops}"], "Interpolation key 'oops' not found full_key: method.episode.chunk_size"),  # was raw
    (["+method.episode.chunk_size=0x10"], "+method.episode.chunk_size=0x10: method.episode.chunk_size is already a setting"),
])
def test_a_typo_is_refused_with_what_was_meant_and_plus_adds_no_unread_key(overrides, said):
    from parser.base.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(said)):
        _eval(*overrides)


def test_plus_still_adds_a_key_its_reader_takes():
    """`+dataset.options.width` (a free-form section, the order study's own use) and a key a `_target_`
    passes on (`http_backend`'s `**kwargs` to `HttpBackend`) are real additions, not typos."""
    cfg = _eval("dataset=synthetic_position", "+dataset.options.width=20", "backend@models=openai",
                "+models.subagent.routing_header=X-Key", "++limit=2")  # `++` on a key that is there sets it
    assert cfg.dataset.options.width == 20 and cfg.models.subagent.routing_header == "X-Key" and cfg.limit == 2
    assert _eval("+limit=3").limit == 3  # Hydra's `+` on a key whose value is null sets it: not a made-up key


def test_the_entry_points_refuse_in_one_line_before_anything_loads(tmp_path, capsys):
    """The demo's and eval's Hydra apps run the same check first; ask composes through it."""
    from eval.run import CONFIGS
    from parser.base.settings import precheck
    from parser.cli.ask import main as ask

    for config, name, argv, said in ((CONFIGS, "demo", ["models=tiny_cpu", "length=0"], "parser demo: error: length=0"),
                                     (CONFIGS, "demo", ["workers=-2"], "workers=-2: expected an integer >= 0"),
                                     (CONFIGS / "eval", "default", ["--config-name", "tiny_cpu", "limit=0",
                                                                    f"hydra.searchpath=[file://{CONFIGS}]"], "limit=0")):
        with pytest.raises(SystemExit) as ended:
            precheck(config, name, argv, prog=f"parser {name}" if name == "demo" else "eval.run")
        err = capsys.readouterr().err
        assert ended.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "d.md").write_text("Ann built the bridge.")
    with pytest.raises(SystemExit) as ended:
        ask([str(tmp_path / "d.md"), "Who?", "models=tiny_cpu", "method=longharness_cpu", "method.max_stalls=0"])
    assert ended.value.code == 2 and "method.max_stalls=0: expected an integer >= 1" in capsys.readouterr().err


def test_the_other_hydra_commands_refuse_in_one_line_too(tmp_path, capsys, monkeypatch):
    """`parser gateway`, `parser ruler` and `parser order-study` run the same precheck (a typo, a
    `+key=` nothing reads, a value outside its domain); the demo's `length` shorter than a synthetic
    question's own paragraphs is one line naming the setting, not the packer's traceback, and so is
    an `output=` in a folder that is not there (it failed after the whole run); eval's `out_dir`
    with a file in the way is one line too (Hydra made its run folder there first: a traceback)."""
    from parser.cli import main as parser_cli

    monkeypatch.chdir(tmp_path)  # Hydra's run folder, where one is made
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # parser.cli.main rewrites it
    (tmp_path / "a_file").write_text("")
    for argv, said in ((["gateway", "dry_run=true", "+workers.nmu=2"], "parser gateway: error: unknown setting workers.nmu (did you mean workers.num?)"),
                       (["gateway", "dry_run=true", "workers.base_port=-1"], "workers.base_port=-1: expected an integer in [0, 65535]"),
                       (["ruler", "limt=3"], "eval.ruler: error: unknown setting limt (did you mean limit?)"),
                       (["order-study", "models=tiny_cpu", "method.episode.chunk_sise=3"], "did you mean method.episode.chunk_size?"),
                       (["demo", "models=tiny_cpu", "length=5"], "parser demo: error: length=5: too short for the synthetic world"),
                       (["eval", "--config-name", "tiny_cpu", "out_dir=a_file"],  # Hydra's mkdir traceback
                        "eval.run: error: a_file: cannot be the run folder: a_file is a file, not a directory"),
                       (["order-study", "study.root=a_file/sub"], "eval.order_study: error: a_file/sub: cannot be the run folder: a_file is a file"),
                       (["demo", "models=tiny_cpu", "output=no/such/out.jsonl"],  # was found after the whole run
                        f"parser demo: error: output={tmp_path}/no/such/out.jsonl: the folder {tmp_path}/no/such does not exist")):
        with pytest.raises(SystemExit) as ended:
            parser_cli(argv)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and said in err, err
        assert len([line for line in err.splitlines() if "error" in line]) == 1 and "Traceback" not in err, err


def test_parser_eval_loads_its_models_outside_the_event_loop(tmp_path, monkeypatch, capsys):
    """A model load inside the loop made Ctrl-C wait for the load to end (asyncio's handler only
    cancels at the next await). `evaluate_blocking` (parser eval) builds the method with no loop
    running, so a Ctrl-C there is a KeyboardInterrupt at once: the session is closed as interrupted
    and the run ends in eval's one line. `build_eval_method` is the outer edge here: the real load
    is replaced by one that checks where it runs, then is interrupted."""
    import eval.run as run_module
    from eval.provenance import read_manifest

    def load(cfg):
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()  # no event loop: the signal's KeyboardInterrupt lands in the load
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "build_eval_method", load)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_module.evaluate_blocking(_cfg(out, "limit=1", "runs=1"))
    session = read_manifest(out)["sessions"][-1]
    assert session["interrupted"] is True and session["done"] == session["written"] == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("[eval] interrupted: 0/")


def test_a_data_file_that_is_a_device_or_a_fifo_is_refused_naming_it(tmp_path):
    """/dev/zero was read for ever (memory without end); a FIFO reads empty the second time eval
    reads it (its fingerprint), so neither is a data file."""
    from parser.records.sample import DataError

    fifo = tmp_path / "eval.jsonl"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo):
        with pytest.raises(DataError, match=f"eval data file {path}: a device, FIFO or socket, not a file"):
            asyncio.run(evaluate(_cfg(tmp_path / "out", "dataset=hotpotqa", "dataset.name=x", f"dataset.path='{path}'",
                                      "dataset.lengths=null", "runs=1"), Recorder()))
