"""`method=infmem_cpu` end to end on one synthetic sample with the tiny random-weight Qwen3.5 in process.

    .venv/bin/pytest tests/test_infmem_tiny_on_cpu.py -q

Answers are noise and a random model never writes a ✿FUNCTION✿ call or STOP: what is checked is that
the loop runs on the real backend, chunks, template and BM25 index (a plan and a two-stage call per
chunk, the counter, the writes, the final answer) and reports the shared result fields. Its fidelity
to the authors' loop is tests/test_infmem_fidelity_on_cpu.py's.
"""
from __future__ import annotations

import asyncio
import json

from parser.methods import MethodResult, Sample, build_method, method_config
from parser.serving.backends.models import Models


def test_infmem_cpu_reads_a_synthetic_sample_on_the_tiny_model(tiny_backend, tiny_tokenizer):
    from data_prep.synthetic_world import build_synthetic_eval

    sample = Sample.from_record(build_synthetic_eval(num_questions=1, lengths=(10,), seed=1)[0])
    # the CPU preset, two chunks: budgets cut further so the test stays a few seconds
    method = build_method(method_config("infmem_cpu", chunk_size=1024, thinking_budget=4, max_new_tokens=4),
                          Models(tiny_backend, tiny_tokenizer, tiny_backend, tiny_tokenizer))
    result = asyncio.run(method.run(sample))
    assert isinstance(result, MethodResult) and result.trace.num_chunks >= 2
    plans, updates = result.trace.extras["plans"], result.trace.updates
    assert [p["chunk"] for p in plans] == list(range(len(plans))) and len(updates) in (len(plans), len(plans) - 1)
    assert result.steps == len(plans) + len(updates) + 1  # every call on the critical path
    assert 0 < result.lead_output_tokens <= result.steps * (4 + 4)  # two stages a call, each within its budget
    assert result.trace.extras["stopped_early"] == (len(updates) < len(plans))
    json.dumps(result.to_dict())  # the eval row is plain JSON
