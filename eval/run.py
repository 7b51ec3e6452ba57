"""Evaluate one method on one dataset across lengths and runs; resumable, with provenance.

Features
- Any method (ParSer, full-context, MemAgent, ReMemR1, agentic RAG, DCI, or one you add): the
  class the method config's `_target_` names (`parser.methods.build_method`; rows are filed under
  `method.name`); models come from the `models` section (`parser.serving.backends.build_models`).
- One JSONL row per finished sample, fsync'd, keyed by (dataset, length, condition, run, sample
  id): kill it and re-run the same command; it runs every expected key not in the store, never
  writes a key twice, and counts only this run's keys as done.
- Resume is checked against the inputs: the manifest fingerprints the dataset (file bytes, or
  the synthetic world's rows), the method config and the seed; if rows exist that were computed
  on other inputs (a dataset file replaced or edited, a method key changed), the run stops with
  exit 2 and names what changed (`eval.inputs`) instead of reporting the old rows as its own.
- The run directory (`out_dir`) records git hash, resolved config, package versions, seeds,
  hardware and per-session timings (`manifest.json`), and per-subset wall time
  (`timings.jsonl`) for amortized latency.
- `concurrency` samples in flight per subset; subsets (one length or condition of one run)
  run one after another, as the paper times them. Progress bars show running Sub_EM and ETA.
- `warmup` untimed, unrecorded samples first (copies of the first ones under new ids), so
  one-off costs (lazy init, first-call kernels) do not land in the first subset's latency.
- A sample whose method raises, or that got no fair run (`MethodResult.failed`: ParSer with
  every subagent call failed, `parser.serving.retry`), is logged to `errors.jsonl` (with its trace) and
  not written, so a re-run retries it; the command then exits 1.
- Ctrl-C or SIGTERM (handlers installed explicitly, so a run started as a shell's background job,
  SIGINT ignored, stops too): the samples in flight are cancelled, the session is closed in the
  manifest, one line says how many samples are saved; exit 130.
- One process per `out_dir`: a second `eval.run` on a directory in use exits 2 with a message
  naming the holder (`eval.store.lock_run_dir`).

    parser eval                                   # configs/eval/default.yaml
    parser eval --config-name tiny_cpu limit=4 runs=1
    parser eval dataset=hotpotqa concurrency=16 out_dir=outputs/eval/hqa_parser4b
    parser report outputs/eval/hqa_parser4b      # tables, plots, viewer
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from eval import provenance
from eval.datasets import Subset, load_subsets
from eval.inputs import InputsChanged, check_unchanged, fingerprint
from parser.records.metrics import PRIMARY, completion_text, score
from eval.store import ResultsStore, RunDirLocked, lock_run_dir
from parser.base import hydra_help
from parser.engine import progress
from parser.base.config import ConfigError, check_episode_keys, preset_spelling
from parser.base.settings import check_composed, precheck
from parser.base.signals import stop_on_signals
from parser.methods import Method, MethodResult, Sample, build_method
from parser.base.resources import config_dir
from parser.records.result import Key, ResultRow, TimingLine
from parser.records.sample import DataError
from parser.records.trace import dump_trace


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass


def row_label(cfg: DictConfig) -> str:
    """The table row: `report.row` (default: the method config's `label`), then `report.variant`
    if set ("ParSer w/ RL"), so every table keeps the variants apart."""
    variant = cfg.report.get("variant")
    return f"{cfg.report.row} {variant}" if variant else cfg.report.row


def result_row(subset: Subset, run: int, sample: Sample, result: MethodResult, cfg: DictConfig,
               save_record: bool, session: str = "") -> ResultRow:
    return ResultRow(
        dataset=subset.dataset,
        length=subset.length,
        run=run,
        sample_id=sample.id,
        condition=subset.condition,
        condition_index=subset.condition_index,
        method=cfg.method.name,
        row=row_label(cfg),
        variant=cfg.report.get("variant"),
        backbone=cfg.report.backbone,
        question=sample.question,
        answers=sample.answers,
        prediction=result.answer,
        scores=score(result.answer, sample.answers, completion_text(result.trace)),
        steps=result.steps,
        wall_s=round(result.wall_s, 4),
        lead_output_tokens=result.lead_output_tokens,
        subagent_output_tokens=result.subagent_output_tokens,
        meta=sample.meta,
        finished=provenance.now(),
        finished_at=round(time.time(), 3),  # with `session`: times a subset whose session was killed
        session=session,
        concurrency=int(cfg.concurrency),
        trace=result.trace if save_record else None,
    )


def sample_key(subset: Subset, run: int, sample: Sample) -> Key:
    return (subset.dataset, subset.length, subset.condition, run, sample.id)


def expected_keys(subsets: list[Subset], runs: int) -> set[Key]:
    """Every key this run must have in the store to be done."""
    return {sample_key(subset, run, s) for run in range(runs) for subset in subsets for s in subset.samples}


@dataclasses.dataclass
class Tally:
    """This session's samples, counted as each ends, so an interrupt mid-subset still reports (and
    the manifest records) every row written. `streak`: samples failed in a row, across subsets; at
    `stop_after` the run stops, because a server that went down mid-grid would otherwise fail every
    remaining sample in turn (seconds of retries each, hours over a grid). The samples not started
    are left for the re-run."""

    stop_after: int | None = None
    written: int = 0
    failed: int = 0
    streak: int = 0

    @property
    def stopping(self) -> bool:
        return self.stop_after is not None and self.streak >= self.stop_after


async def run_subset(method: Method, subset: Subset, run: int, store: ResultsStore, cfg: DictConfig,
                     tally: Tally | None = None) -> tuple[int, int]:
    """Run the unfinished samples of one subset; returns (written, failed)."""
    tally = tally or Tally()
    done = store.done_keys()
    pending = [s for s in subset.samples if sample_key(subset, run, s) not in done]
    mine = {sample_key(subset, run, s) for s in subset.samples}
    finished = [r for r in store.rows() if r.key in mine]
    if not pending:
        return 0, 0
    seed_everything(int(cfg.seed) + run)
    scores = [r.score(PRIMARY) for r in finished]
    bar = tqdm(total=len(subset.samples), initial=len(subset.samples) - len(pending), desc=f"run {run} {subset.label}",
               disable=not cfg.progress, dynamic_ncols=True)
    semaphore = asyncio.Semaphore(int(cfg.concurrency))
    written = failed = 0
    session = f"{os.getpid()}@{time.time():.3f}"  # this process's pass over this subset

    def log_failure(sample: Sample, error: str, **detail: Any) -> None:
        nonlocal failed
        failed += 1
        tally.failed += 1
        tally.streak += 1
        store.log_error({"dataset": subset.dataset, "length": subset.length, "condition": subset.condition, "run": run,
                         "sample_id": sample.id, "error": error, **detail, "time": provenance.now()})
        bar.write(f"[eval] {subset.label} run {run} sample {sample.id}: {error} (logged, will retry on re-run)")

    def turn_done(sample_id: str, turn: Any) -> None:
        """Progress inside a sample (an episode can take minutes on a CPU): its latest turn."""
        done = "answered" if turn.answer is not None else f"{len(turn.queries)} quer{'y' if len(turn.queries) == 1 else 'ies'} read"
        bar.set_postfix_str(f"{sample_id}: turn {turn.index + 1} {done}", refresh=True)

    async def one(sample: Sample) -> None:
        nonlocal written
        async with semaphore:
            if tally.stopping:  # the run is stopping: this sample is left for the re-run
                return
            try:
                with progress.listening(lambda _doc, turn: turn_done(sample.id, turn)):
                    result = await method.run(sample)
            except Exception as err:  # a broken sample must not stop the table; it is retried on re-run
                log_failure(sample, repr(err), traceback=traceback.format_exc())
                return
        if result.failed:  # no fair run (e.g. the subagents' gateway was down): not a wrong answer
            log_failure(sample, result.failed, record=dump_trace(result.trace) if result.trace is not None else None)
            return
        row = result_row(subset, run, sample, result, cfg, bool(cfg.save_records), session)
        tally.streak = 0
        if store.append(row):
            written += 1
            tally.written += 1
            scores.append(row.score(PRIMARY))
        bar.update(1)
        bar.set_postfix({PRIMARY: f"{100 * sum(scores) / len(scores):.1f}", "steps": result.steps})

    start = time.perf_counter()
    await asyncio.gather(*(one(s) for s in pending))
    wall = time.perf_counter() - start
    bar.close()
    store.log_timing(TimingLine(dataset=subset.dataset, length=subset.length, run=run, condition=subset.condition,
                                method=cfg.method.name, row=row_label(cfg), backbone=cfg.report.backbone,
                                concurrency=int(cfg.concurrency), samples=written, failed=failed, wall_s=round(wall, 4),
                                pid=os.getpid(), session=session, finished=provenance.now()))
    return written, failed


async def warm_up(method: Method, subsets: list[Subset], n: int) -> None:
    for sample in subsets[0].samples[:n]:
        copy = dataclasses.replace(sample, id=f"warmup-{sample.id}")  # its own cache key: no head start for the real one
        t = time.perf_counter()
        try:
            await method.run(copy)
        except Exception as err:  # the timed samples will hit the same error and record it
            print(f"[eval] warm-up sample failed: {err!r}")
        print(f"[eval] warm-up {copy.id}: {time.perf_counter() - t:.1f} s (not recorded)")


def build_eval_method(cfg: DictConfig, models: Any = None) -> Method:
    """The method a config names, on `models` (several methods may share them: the order study)
    or on models built from `cfg.models`. The method closes its models on `aclose`."""
    from parser.serving.backends.models import build_models

    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    check_episode_keys(method_cfg.get("episode"), "method.episode")  # a typo fails before any model loads
    check_episode_keys((method_cfg.get("reader") or {}).get("episode"), "method.reader.episode")
    models = models or build_models(OmegaConf.to_container(cfg.models, resolve=True))
    return build_method(method_cfg, models)


class BadSetting(ValueError):
    """A setting no run can honour (`concurrency: 0` waits forever, `runs: 0` or a dataset without
    samples would report "all 0 samples done"): refused at load, the key or file named; exit 2."""


def check_settings(cfg: DictConfig) -> None:
    """Every numeric setting of the composed config in its declared domain (`parser.base.domains`:
    `limit`, `runs`, `concurrency`, `stop_after_failures`, the method's and the models' settings)."""
    try:
        check_composed(cfg)
    except ConfigError as error:
        raise BadSetting(str(error)) from None


def check_subsets(subsets: list[Subset]) -> None:
    """Every subset has samples: an empty dataset file is named, not evaluated as zero samples."""
    for subset in subsets:
        if not subset.samples:
            raise BadSetting(f"{subset.source}: no samples ({subset.label}); check dataset.path or rebuild the file")
    if not subsets:
        raise BadSetting("dataset: no subsets (dataset.lengths or dataset.subsets is empty)")


async def evaluate(cfg: DictConfig, method: Method | None = None, subsets: list[Subset] | None = None) -> int:
    """Run (or resume) one eval. Pass `method` to reuse built models across several evals
    (RULER's tasks); the caller then closes it. Otherwise it is built from `cfg` and closed here.
    Pass `subsets` (what `load_subsets` returned for `cfg.dataset`) when one dataset serves
    several evals (the latency bench): it is built once, not per eval. Raises `BadSetting` for settings no run can honour, `RunDirLocked` if another process is
    evaluating into `cfg.out_dir`, and `InputsChanged` (before anything is written) if its rows
    were computed on other inputs."""
    check_settings(cfg)
    with lock_run_dir(cfg.out_dir):
        plan = _prepare(cfg, subsets)
        if plan is None:
            return 0
        return await _run(cfg, plan, method or build_eval_method(cfg), owns_method=method is None)


def evaluate_blocking(cfg: DictConfig) -> int:
    """`evaluate` for `parser eval`: the models load before the event loop starts, in this thread,
    so Ctrl-C or SIGTERM during a load (minutes for a large model) lands at once as KeyboardInterrupt
    (asyncio's handler only cancels the task at its next await, after the load); the session is then
    closed as interrupted, with the same one line as an interrupted run."""
    check_settings(cfg)
    with lock_run_dir(cfg.out_dir):
        plan = _prepare(cfg)
        if plan is None:
            return 0
        try:
            method = build_eval_method(cfg)
        except KeyboardInterrupt:
            _close(cfg, plan, Tally(), time.perf_counter(), interrupted=True)
            raise
        return asyncio.run(_run(cfg, plan, method, owns_method=True))


@dataclasses.dataclass
class _Plan:
    """What a run must do, found before any model is built: its subsets, its store, its keys."""

    subsets: list[Subset]
    store: ResultsStore
    keys: set[Key]


def _prepare(cfg: DictConfig, subsets: list[Subset] | None = None) -> _Plan | None:
    """The subsets loaded (unless given), the store opened, the inputs checked and the session
    opened in the manifest; None (said, and the session closed) when every sample is already done."""
    if subsets is None:
        subsets = load_subsets(cfg.dataset, limit=cfg.limit, max_file_bytes=cfg.max_data_file_bytes)
    check_subsets(subsets)
    store = ResultsStore(cfg.out_dir)
    for problem in store.problems:  # what opening skipped or repaired: the rows it kept are all there
        print(f"[eval] {problem}")
    config = OmegaConf.to_container(cfg, resolve=True)
    manifest = provenance.read_manifest(cfg.out_dir) or {}
    inputs = check_unchanged(cfg.out_dir, manifest.get("inputs"), fingerprint(config, subsets), store.rows())
    seeds = {"base": int(cfg.seed), "per_run": [int(cfg.seed) + r for r in range(int(cfg.runs))]}
    provenance.write_manifest(cfg.out_dir, config, seeds, inputs)
    keys = expected_keys(subsets, int(cfg.runs))
    if keys <= store.done_keys():
        print(f"[eval] {cfg.out_dir}: all {len(keys)} samples already done")
        provenance.close_session(cfg.out_dir, written=0, failed=0, expected=len(keys))
        return None
    return _Plan(subsets, store, keys)


def _close(cfg: DictConfig, plan: _Plan, tally: Tally, start: float, interrupted: bool) -> int:
    """The session closed in the manifest, and the one line an interrupted run ends with; the rows done."""
    total = len(plan.keys & plan.store.done_keys())
    provenance.close_session(cfg.out_dir, written=tally.written, failed=tally.failed, expected=len(plan.keys), done=total,
                             wall_s=round(time.perf_counter() - start, 2), interrupted=interrupted)
    if interrupted:
        print(f"\n[eval] interrupted: {total}/{len(plan.keys)} samples saved in {cfg.out_dir} ({tally.written} this session); "
              "re-run the same command to resume", file=sys.stderr)
    return total


async def _run(cfg: DictConfig, plan: _Plan, method: Method, owns_method: bool) -> int:
    tally = Tally(cfg.get("stop_after_failures"))
    start = time.perf_counter()
    interrupted = False
    try:
        await warm_up(method, plan.subsets, int(cfg.get("warmup", 0)))
        for run in range(int(cfg.runs)):
            for subset in plan.subsets:
                if not tally.stopping:
                    await run_subset(method, subset, run, plan.store, cfg, tally)
        if tally.stopping:
            print(f"[eval] stopped: {tally.streak} samples in a row failed (stop_after_failures={tally.stop_after}); "
                  f"the errors are in {Path(cfg.out_dir) / 'errors.jsonl'}; fix the cause and re-run to resume")
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C: asyncio.run cancels this task
        interrupted = True
        raise
    finally:
        if owns_method:
            await method.aclose()
        total = _close(cfg, plan, tally, start, interrupted)
    expected = len(plan.keys)
    print(f"[eval] {cfg.out_dir}: {total}/{expected} samples done ({tally.written} this session, {tally.failed} failed)")
    return 1 if tally.failed or total < expected else 0


# configs/eval/ holds this entry point's own groups (dataset, method); the shared presets it
# composes (configs/backend, configs/episode) are found through Hydra's search path.
CONFIGS = config_dir()


@hydra.main(config_path=str(CONFIGS / "eval"), config_name="default", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    try:
        with stop_on_signals():  # Ctrl-C and SIGTERM alike, even started with SIGINT ignored (a background job)
            sys.exit(evaluate_blocking(cfg))
    except (BadSetting, RunDirLocked, InputsChanged, ConfigError, provenance.ManifestDamaged, DataError,
            FileNotFoundError) as error:  # each names its file, line or key: one line, before any model loads
        print(f"eval.run: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # what was saved and how to resume is already said, in one line
        sys.exit(130)


def with_search_path(argv: list[str]) -> list[str]:
    """`argv` plus `hydra.searchpath=[configs/]`, placed among the other overrides: Hydra parses
    overrides as one positional run, so an override after a flag (`--cfg job`, `--config-name x`)
    would be refused. A user's own `hydra.searchpath=[file://<dir>]` (a method kept outside the
    repo) keeps ParSer's configs first in the list, so both are found."""
    ours = f"file://{CONFIGS}"
    for i, arg in enumerate(argv):
        if arg.startswith("hydra.searchpath="):
            parsed = OverridesParser.create().parse_override(arg).value()
            paths = [parsed] if isinstance(parsed, str) else list(parsed)
            return [*argv[:i], f"hydra.searchpath=[{','.join([ours, *(p for p in paths if p != ours)])}]", *argv[i + 1:]]
    at = next((i for i, arg in enumerate(argv) if "=" in arg and not arg.startswith("-")), len(argv))
    return [*argv[:at], f"hydra.searchpath=[{ours}]", *argv[at:]]


def main() -> None:
    hydra_help.register()
    sys.argv = [sys.argv[0], *with_search_path(preset_spelling(sys.argv[1:]))]
    precheck(CONFIGS / "eval", "default", sys.argv[1:], prog="eval.run")  # a typo or a bad value: one line, nothing loaded
    _main()


if __name__ == "__main__":
    main()
