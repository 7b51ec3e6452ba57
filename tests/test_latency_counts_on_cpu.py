"""The latency bench's arithmetic (eval.latency, parser.plan.project): the critical path of a call
log, calls split by sample and summed per length, the KV refusal's figure, and the projection of
measured counts to the paper's lengths. The bench itself runs at its `--smoke` size in
tests/e2e/test_benchmarks_smoke_on_cpu.py; here hand-made logs, so each number can be checked by hand.

    .venv/bin/pytest tests/test_latency_counts_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import types

import pytest

from eval import latency as lat
from parser.plan import project
from parser.records.result import ResultRow
from parser.serving.backends.models import Models
from parser.serving.types import Completion, SamplingParams


def call(role: str, start: float, end: float, prompt: int = 10, cached: int = 0, out: int = 2) -> lat.Call:
    return lat.Call(role, start, end, prompt, cached, out)


def test_rlm_critical_path_counts_a_batched_call_once_and_each_llm_query(tiny_tokenizer):
    """What the bench's docstring says of RLM, on the method's own code (`rlm_script.ScriptServer`
    stands in for the model server): the scripted root probes, maps the document with one
    llm_query_batched (three slices in flight together), then combines them with one llm_query and
    answers: root, root, batch, root, llm_query = 5 calls on the critical path, 3 of them the root's."""
    from rlm_script import CASES, FIXTURES, ScriptServer, run_ours

    recorders = []

    def record(models: Models) -> Models:
        recorders.append(lat.Recorder(models))
        return recorders[-1].models

    async def go():
        with ScriptServer(CASES["batched_map"], tiny_tokenizer) as server:
            result, _ = await asyncio.wait_for(run_ours("batched_map", server, tiny_tokenizer, str(FIXTURES / "prompts.json"),
                                                        record=record), 60)
            return result

    result = asyncio.run(go())
    calls = recorders[0].calls
    assert result.answer and [c.role for c in calls].count("lead") == result.steps == 3
    assert [c.role for c in calls].count("subagent") == 4  # three slices and the combine
    assert lat.critical_path(calls) == 5


def test_critical_path_counts_a_scatter_round_once_and_a_sequential_pass_per_call():
    parser = [call("lead", 0, 1), *(call("subagent", 1.1, 1.5 + i) for i in range(3)), call("lead", 4, 5)]
    assert lat.critical_path(parser) == 3  # lead -> the round (in flight together) -> lead
    memagent = [call("lead", i, i + 0.9) for i in range(6)]
    assert lat.critical_path(memagent) == 6
    # a call that ends late but started early does not extend a chain that began after it
    assert lat.critical_path([call("lead", 0, 10), call("lead", 1, 2), call("lead", 3, 4)]) == 2
    assert lat.critical_path([]) == 0


class ModelServer:
    """Stands in for a model server: answers every generate with fixed token counts."""

    def __init__(self):
        self.closed = 0

    async def generate(self, prompt, sampling, **kwargs):
        return Completion(text="x", token_ids=[1, 2, 3], prompt_tokens=40, cached_tokens=30)

    async def aclose(self):
        self.closed += 1


def test_recorder_logs_each_role_and_closes_a_shared_backend_once():
    server = ModelServer()
    recorder = lat.Recorder(Models(server, None, server, None))

    async def run():
        await recorder.models.lead.generate("p", SamplingParams(max_new_tokens=3))
        await recorder.models.subagent.generate("p", SamplingParams(max_new_tokens=3), routing_key="d:0")
        await recorder.models.aclose()

    asyncio.run(run())
    assert [(c.role, c.prefilled, c.output_tokens) for c in recorder.calls] == [("lead", 10, 3), ("subagent", 10, 3)]
    assert server.closed == 1 and recorder.in_flight == {"lead": 0, "subagent": 0}


def test_a_call_that_times_out_is_logged_as_failed():
    """Under load a subagent call outlives its deadline and the engine retries it: the run then
    measured retries, and the bench must be able to say so."""
    class Stalled(ModelServer):
        async def generate(self, prompt, sampling, **kwargs):
            await asyncio.sleep(10)

    recorder = lat.Recorder(Models(Stalled(), None, None, None))

    async def run():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(recorder.models.subagent.generate("p", SamplingParams(max_new_tokens=3)), 0.01)

    asyncio.run(run())
    assert [(c.role, c.failed) for c in recorder.calls] == [("subagent", True)] and recorder.in_flight["subagent"] == 0


def row(sid: str, length: int, finished_at: float, wall_s: float, sub: float, steps: int) -> ResultRow:
    return ResultRow(dataset="synthetic", length=length, run=0, sample_id=sid, scores={"sub_em": sub}, steps=steps,
                     wall_s=wall_s, finished_at=finished_at)


def test_per_length_splits_calls_by_sample_and_averages_per_length():
    rows = [row("a", 12, 10.0, 10.0, 1.0, 2), row("b", 12, 20.0, 10.0, 0.0, 2), row("c", 24, 30.0, 10.0, 1.0, 3)]
    calls = [call("lead", 1, 2), call("subagent", 2, 3, prompt=50, cached=10, out=5), call("lead", 4, 9),  # sample a
             call("lead", 11, 19),  # sample b
             call("lead", 21, 22), call("lead", 23, 24), call("lead", 25, 29)]  # sample c
    recorder = types.SimpleNamespace(in_flight={"subagent": 0})
    profile = lat.Profile(recorder)
    profile.attached = True
    profile.events = [(5.0, "prefill", 3.0), (6.0, "lead decode", 4.0), (15.0, "prefill", 2.0), (26.0, "grammar", 1.0)]
    out = lat.per_length(rows, calls, profile)
    assert set(out) == {12, 24}
    twelve = out[12]
    assert twelve["samples"] == 2 and twelve["sub_em"] == 0.5
    assert twelve["calls"] == 2.0 and twelve["subagent_calls"] == 0.5  # (3 + 1) / 2, (1 + 0) / 2
    assert twelve["failed_calls"] == 0
    assert twelve["prefilled"] == (10 + 40 + 10 + 10) / 2 and twelve["decoded"] == (2 + 5 + 2 + 2) / 2
    assert (twelve["lead_prefilled"], twelve["subagent_prefilled"]) == ((10 + 10 + 10) / 2, 40 / 2)
    assert twelve["critical_path"] == (3 + 1) / 2
    assert twelve["parts"]["prefill"] == 2.5 and twelve["parts"]["lead decode"] == 2.0
    assert twelve["parts"]["Python overhead"] == pytest.approx(((10 - 7) + (10 - 2)) / 2)  # wall minus the parts
    assert out[24]["critical_path"] == 3 and out[24]["parts"]["grammar"] == 1.0


def test_kv_refusal_names_the_figure_and_the_setting_to_raise():
    backend = types.SimpleNamespace(max_cache_entries=64, max_cache_bytes=2 << 30)
    assert lat.kv_refusal(48, [600] * 14, 47_000.0, backend, 8 << 30) is None
    too_many = lat.kv_refusal(400, [600] * 110, 47_000.0, backend, 8 << 30)
    assert "110 chunk prefixes > max_cache_entries 64" in too_many and "models.lead.max_cache_entries" in too_many
    backend.max_cache_entries = 512
    too_big = lat.kv_refusal(400, [600] * 110, 47_000.0, backend, 8 << 30)
    assert too_big.startswith("L=400: 110 chunks x 600 tokens x 45.9 KiB/token = 2.89 GiB of KV > max_cache_bytes 2.00")
    backend.max_cache_bytes = 16 << 30
    assert "available" in lat.kv_refusal(400, [600] * 110, 47_000.0, backend, 1 << 30)
    assert lat.kv_refusal(400, [600] * 110, None, backend, None) is None  # no prefix cache here: nothing to bound


def test_shape_from_counts_reads_rounds_queries_and_budget_fills():
    parser = project.Shape.from_counts("scatter", calls={"lead": 4, "subagent": 42}, decoded={"lead": 64, "subagent": 210},
                                       budgets={"lead": 128, "subagent": 48}, critical_path=7, chunks=14)
    assert (parser.rounds, parser.queries_per_round, parser.lead_fill) == (3, 1, 0.125)
    assert parser.subagent_fill == pytest.approx(5 / 48)
    memagent = project.Shape.from_counts("sequential", calls={"lead": 8}, decoded={"lead": 512}, budgets={"lead": 64},
                                         critical_path=8, chunks=7)
    assert memagent.update_fill == 1.0


def test_projection_of_the_papers_own_memory_fill_is_the_papers_workload():
    shapes = {"ParSer": project.Shape("scatter", rounds=3, lead_fill=0.125, subagent_fill=0.1),
              "MemAgent": project.Shape("sequential", update_fill=1.0), "CoA": project.Shape("sequential", update_fill=0.5)}
    budgets = {"ParSer": project.PaperBudgets(4096, lead_tokens=2048, subagent_tokens=512),
               "MemAgent": project.PaperBudgets(5000, update_tokens=1024),
               "CoA": project.PaperBudgets(8000, update_tokens=8000)}
    rows = {(r["doc_tokens"], r["method"]): r for r in project.project(shapes, budgets, lengths=(7_000, 896_000))}
    memagent = rows[(896_000, "MemAgent")]
    assert memagent["seconds"] == pytest.approx(memagent["paper_workload_s"])  # the paper's structure and memory
    assert memagent["seconds_fills"] == pytest.approx(memagent["paper_workload_s"])  # 1,024 of 1,024: the paper's memory
    assert rows[(896_000, "CoA")]["seconds_fills"] > rows[(896_000, "CoA")]["seconds"]  # 4,000-token summaries vs ~1K
    assert memagent["paper_s"] == 876.20 and memagent["paper_ratio"] == 11.2
    assert rows[(896_000, "ParSer")]["ratio"] == 1.0 and rows[(896_000, "ParSer")]["paper_s"] == 78.22
    assert rows[(896_000, "CoA")]["paper_s"] is None  # the paper did not time CoA
    assert memagent["ratio"] > rows[(7_000, "MemAgent")]["ratio"] > 1  # sequential reading falls behind with length


def test_shape_from_counts_reads_rlm_turns_and_infmem_reading():
    """RLM: 3 root calls around one llm_query_batched round and one llm_query (critical path 5);
    InfMem: 13 logical calls (6 plans, 6 writes, the answer) and a trace that says it read 3 of 6 chunks."""
    rlm = project.Shape.from_counts("rlm", calls={"lead": 3, "subagent": 5}, decoded={"lead": 96, "subagent": 80},
                                    budgets={"lead": 64, "subagent": 32}, critical_path=5, chunks=6)
    assert (rlm.turns, rlm.rounds, rlm.lead_fill, rlm.subagent_fill) == (3, 1, 0.5, 0.5)
    silent = project.Shape.from_counts("rlm", calls={"lead": 3}, decoded={"lead": 192}, budgets={"lead": 64, "subagent": 32},
                                       critical_path=3, chunks=6)
    assert (silent.rounds, silent.subagent_fill) == (0, 0.0)  # a root that wrote no sub-call
    infmem = project.Shape.from_counts("infmem", calls={"lead": 13}, decoded={"lead": 312}, budgets={"lead": 48},
                                       critical_path=26, chunks=6, read_fraction=0.5)
    assert (infmem.update_fill, infmem.read_fraction) == (0.5, 0.5)
    with pytest.raises(ValueError, match="Shape.kind='dci'"):
        project.Shape("dci")


def test_projection_of_the_peers_runs_the_planners_simulations_without_a_paper_reference():
    shapes = {"ParSer": project.Shape("scatter", rounds=3),
              "InfMem": project.Shape("infmem", update_fill=0.5), "InfMem early": project.Shape("infmem", read_fraction=0.25),
              "RLM": project.Shape("rlm", turns=3, rounds=1), "RLM silent": project.Shape("rlm", turns=3)}
    budgets = {"ParSer": project.PaperBudgets(4096, lead_tokens=2048, subagent_tokens=512),
               **dict.fromkeys(("InfMem", "InfMem early"), project.PaperBudgets(5000, update_tokens=2048)),
               **dict.fromkeys(("RLM", "RLM silent"), project.PaperBudgets(0, lead_tokens=2048, subagent_tokens=1024))}
    rows = {r["method"]: r for r in project.project(shapes, budgets, lengths=(896_000,))}
    assert all(rows[m]["paper_s"] is None and rows[m]["paper_workload_s"] is None and rows[m]["paper_ratio"] is None
               for m in ("InfMem", "RLM"))  # the paper timed neither
    # the planner's own workload is RLM's measured shape 3 turns / 1 map turn: the same simulation
    planner = project.SIMULATIONS["rlm"](project.workload(896_000, None, None), project.paper_cluster())
    assert rows["RLM"]["seconds"] == pytest.approx(planner.amortized_s)
    assert rows["RLM silent"]["seconds"] < rows["RLM"]["seconds"]  # no map round: three root calls only
    assert rows["InfMem early"]["seconds"] < rows["InfMem"]["seconds"] / 3  # 45 of 180 chunks planned over
    assert rows["InfMem"]["seconds_fills"] > rows["InfMem"]["seconds"]  # 1,024-token plans and memories vs 256 / 1,024


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_latency.py"
    spec = importlib.util.spec_from_file_location("bench_latency", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_length_whose_sample_failed_is_said_at_the_end_and_the_others_still_count(tmp_path):
    """At 400 paragraphs ParSer's lead outgrew SmolLM2's context and that sample failed: the bench
    then called its 200-paragraph row missing too ("nonsense"), because the run's label had become
    "ParSer (partial: 1 of 2 samples)", and printed no ratio. The failed length is now said at the
    end, naming the errors file, and every other figure is checked and printed."""
    bench = _bench()
    floors = {200: {"seconds": 52.1}, 400: {"seconds": 115.8}}
    counts = {"parser": {200: {"calls": 175, "critical_path": 7, "subagent_calls": 171, "failed_calls": 0}}}
    rows = {"parser": "ParSer (partial: 1 of 2 samples)"}
    latency = [{"row": rows["parser"], "length": 200, "amortized_s": 145.4}]
    bench.refuse_nonsense(latency, counts, floors, ["parser"], rows, {"parser": {400}})  # no exit: L=400 failed by right
    with pytest.raises(SystemExit, match="no timed row at L=400"):
        bench.refuse_nonsense(latency, counts, floors, ["parser"], rows, {"parser": set()})
    with pytest.raises(SystemExit, match=r"samples failed: parser at L=400 \(.*parser/errors.jsonl\)"):
        bench.say_failed({"parser": {400}, "memagent": set()}, tmp_path)
    bench.say_failed({"parser": set()}, tmp_path)  # nothing failed: no exit


@pytest.mark.parametrize("status, body, emptied", [(200, b'{"success": true}', True),
                                                   (200, b'{"success": false}', False),
                                                   (404, b'{"detail": "Not Found"}', False)])
def test_the_vllm_prefix_cache_is_emptied_before_a_phase_or_the_bench_says_it_was_not(status, body, emptied, capsys):
    """Stands in for vLLM's dev API (`POST /reset_prefix_cache`, VLLM_SERVER_DEV_MODE=1; 404 without
    it): on a real vLLM-CPU the floor left every chunk prefix cached and ParSer's first round reused it."""
    import http.server
    import threading

    paths = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            paths.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert _bench().empty_prefix_cache(f"http://127.0.0.1:{server.server_port}/") is emptied
    finally:
        server.shutdown()
        thread.join()
    assert paths == ["/reset_prefix_cache"]
    said = capsys.readouterr().out
    assert ("could not be emptied" in said) is not emptied
