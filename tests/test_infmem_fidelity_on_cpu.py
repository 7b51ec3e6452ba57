"""InfMem as its authors evaluate it: each rule restated as cases (input, the authors' output), and one
scripted episode replayed through `method=infmem` (issue 54; docs/fidelity.md, "InfMem").

    .venv/bin/pytest tests/test_infmem_fidelity_on_cpu.py -q

The project ships none of their code, so every expected value below was produced by running their
function on that input: UCMP13753/InfMem @ 26f1766, taskutils/memory_eval/utils/infmem.py (with
its missing `envs.BM25_IMPL` set, nltk's download stubbed, qwen-agent 0.0.34), numpy 2.4.6,
rank-bm25 0.2.2. The episode cases ran their `async_query_llm_multi_turn` whole, with only the
HTTP session replaced by a scripted `/v1/completions` (the same `script` as below), with
RECURRENT_CHUNK_SIZE=24, RETRIEVE_CHUNK_SIZE=10, RETRIEVE_CHUNK_OVERLAP=3 on the real Qwen3
tokenizer (the checkpoint's). Here only the model is faked: a scripted `/v1/completions` server
(`CompletionsServer`, reached over HTTP by the project's `HttpBackend`) or, for the cheaper cases,
`ScriptedModel` at the backend interface, both standing in for `ucmp137538/infmem-4B` served by vLLM;
tokenizer, chat template, BM25, retries and the loop are real.
"""
from __future__ import annotations

import asyncio
import hashlib

import pytest
from aiohttp import web
from rank_bm25 import BM25Okapi

from parser.methods import Sample, build_method, method_config
from parser.methods.infmem import PROMPTS
from parser.methods.infmem.retrieval import Bm25Index, tokenize_legacy, tokenize_mixed, windows
from parser.methods.infmem.rules import Plan, clamp_top_k, normalize_query, parse_plan, prediction, stop_count
from parser.serving.backends.http import HttpBackend
from parser.serving.backends.models import Models
from parser.serving.server import ServerHandle, json_response
from scripted_lead import ScriptedModel  # stands in for the served checkpoint


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# 1. prompts ----------------------------------------------------------------------------------------
def test_prompts_are_their_bytes():
    """sha256 of infmem.py `TEMPLATE_CALL_OR_ANSWER`, `TEMPLATE_RETREIVE_RECURRENT`, `TEMPLATE_FINAL` as
    they are (fields unformatted), and of the system text qwen-agent 0.0.34's
    `QwenFnCallPrompt.preprocess_fncall_messages` (lang en, parallel, auto) writes for their schema."""
    assert sha(PROMPTS.load("infmem_plan")) == "628c8d23d18351cedc45c72b5df0cdabc653e7545fe94b47324808d86c874e22"
    assert sha(PROMPTS.load("infmem_write")) == "aba251efa568f4752768dccc3117dd9da0b091a790a65ab8b07d2102f61d3e15"
    assert sha(PROMPTS.load("infmem_final")) == "76c0395b111bb18000345701c14ceaafc8a9776fb76577676df0c15274d1235e"
    assert sha(PROMPTS.load("infmem_planner_system")) == "e63d36c9849b263131abf8765ebf2dbdf4868e3e2db19ddccd4b2f9e4cffdd41"


@pytest.mark.parametrize("thinking, expected", [
    (True, "fb914247e15598ec204c75d1e6918ee2635c6e742ee04df93c0666ec991b7794"),
    (False, "05620262e789ba73bf81ee93f75d327c446779cfd7062b184554f8ac1347b76f")])
def test_a_rendered_planner_prompt_is_theirs(qwen3_tokenizer, thinking, expected):
    """`_process_messages_to_text(tokenizer, [user: TEMPLATE_CALL_OR_ANSWER.format(...)], [schema], thinking)`."""
    method = build_method(method_config("infmem", thinking=thinking), Models(lead=ScriptedModel(None), lead_tokenizer=qwen3_tokenizer))
    content = PROMPTS.render("infmem_plan", prompt="Who directed Vrystork?", memory="No previous memory",
                             retrieval_history="Current retrieval step: 1  Maximum allowed retrieval steps: 3\n")
    assert sha(method._render_planner(content)) == expected


# 2. the retrieval corpus, its tokenisers and the search ----------------------------------------------
@pytest.mark.parametrize("n, chunk, window, overlap, legacy, enhanced", [
    (2300, 1000, 500, 100, [(0, 0, 500), (0, 500, 1000), (1, 1000, 1500), (1, 1500, 2000), (2, 2000, 2300)],
     [(0, 0, 500), (0, 400, 900), (0, 800, 1000), (1, 1000, 1500), (1, 1400, 1900), (1, 1800, 2000), (2, 2000, 2300)]),
    (23, 10, 4, 1, [(0, 0, 4), (0, 4, 8), (0, 8, 10), (1, 10, 14), (1, 14, 18), (1, 18, 20), (2, 20, 23)],
     [(0, 0, 4), (0, 3, 7), (0, 6, 10), (1, 10, 14), (1, 13, 17), (1, 16, 20), (2, 20, 23)]),
    (12, 5, 3, 5, [(0, 0, 3), (0, 3, 5), (1, 5, 8), (1, 8, 10), (2, 10, 12)],  # overlap >= window: window - 1
     [(0, 0, 3), (0, 1, 4), (0, 2, 5), (1, 5, 8), (1, 6, 9), (1, 7, 10), (2, 10, 12)])])
def test_windows_are_their_corpus(n, chunk, window, overlap, legacy, enhanced):
    """`_build_retrieve_corpus_legacy` / `_enhanced` (RETRIEVE_CHUNK_SIZE, _OVERLAP set to window, overlap)
    over the recurrent chunks of `chunk` tokens: (recurrent_idx, start, end) of each window."""
    assert windows(n, chunk, window, None) == legacy
    assert windows(n, chunk, window, overlap) == enhanced


def test_tokenizers_are_theirs():
    assert tokenize_legacy("Hello, World_2! It's  3.5\n") == ["hello,", "world_2!", "it's", "3.5"]
    assert tokenize_mixed("Hello, World_2! It's 3.5") == ["hello", "world_2", "it", "s", "3", "5"]
    assert tokenize_mixed("北京大学 in Peking") == ["in", "peking", "北", "京", "大", "学", "北京", "京大", "大学"]
    assert tokenize_mixed("Ünïcode café") == ["n", "code", "caf"]


DOCS = ["vrystork film directed by quouv in 1999", "vrystork film directed by quouv in 1999 again",
        "quouv was born in lisbon and directed vrystork", "the vrystork premiere was in berlin",
        "vrystork vrystork sequel planned by quouv", "unrelated text about cooking pasta", "quouv studied film in lisbon",
        "vrystork soundtrack by miro", "more unrelated text about gardens", "vrystork directed quouv lisbon berlin film"]
CHUNK_OF = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
# (query, top_k, excluded chunk) -> indices into DOCS, from `bm25_retrieve_for_recurrent_chunk` (legacy
# tokens) and `bm25_retrieve_for_recurrent_chunk_enhanced` (mixed tokens): 1 is a near-duplicate of 0
# (Jaccard > 0.8), chunks 0-2 hold three windows each (cap 2), and "zzz" scores every window 0.
SEARCHES = {
    "legacy": [("vrystork director quouv", 3, None, [4, 9, 0]), ("vrystork director quouv", 3, 0, [4, 9, 7]),
               ("vrystork director quouv", 3, 1, [9, 0, 2]), ("vrystork director quouv", 8, None, [4, 9, 0, 2, 1, 7, 6, 3]),
               ("vrystork director quouv", 8, 0, [4, 9, 7, 6, 3, 5, 8]), ("vrystork director quouv", 8, 1, [9, 0, 2, 1, 7, 6, 8]),
               ("Quouv Lisbon", 3, None, [6, 9, 2]), ("Quouv Lisbon", 3, 0, [6, 9, 4]), ("Quouv Lisbon", 3, 1, [6, 9, 2]),
               ("Quouv Lisbon", 8, None, [6, 9, 2, 4, 0, 1, 5, 3]), ("Quouv Lisbon", 8, 0, [6, 9, 4, 5, 3, 7, 8]),
               ("Quouv Lisbon", 8, 1, [6, 9, 2, 0, 1, 7, 8]), ("zzz", 3, None, [0, 1, 2]), ("zzz", 3, 0, [3, 4, 5]),
               ("zzz", 3, 1, [0, 1, 2]), ("zzz", 8, None, [0, 1, 2, 3, 4, 5, 6, 7]), ("zzz", 8, 0, [3, 4, 5, 6, 7, 8, 9]),
               ("zzz", 8, 1, [0, 1, 2, 6, 7, 8, 9])],
    "enhanced": [("vrystork director quouv", 3, None, [4, 9, 0]), ("vrystork director quouv", 3, 0, [4, 9, 7]),
                 ("vrystork director quouv", 3, 1, [9, 0, 2]), ("vrystork director quouv", 8, None, [4, 9, 0, 2, 7, 6, 3, 1]),
                 ("vrystork director quouv", 8, 0, [4, 9, 7, 6, 3, 5, 8]), ("vrystork director quouv", 8, 1, [9, 0, 2, 7, 6, 1, 8]),
                 ("Quouv Lisbon", 3, None, [6, 9, 2]), ("Quouv Lisbon", 3, 0, [6, 9, 4]), ("Quouv Lisbon", 3, 1, [6, 9, 2]),
                 ("Quouv Lisbon", 8, None, [6, 9, 2, 4, 0, 5, 7, 1]), ("Quouv Lisbon", 8, 0, [6, 9, 4, 5, 7, 3, 8]),
                 ("Quouv Lisbon", 8, 1, [6, 9, 2, 0, 7, 1, 8]), ("zzz", 3, None, [0, 2, 3]), ("zzz", 3, 0, [3, 4, 6]),
                 ("zzz", 3, 1, [0, 2, 6]), ("zzz", 8, None, [0, 2, 3, 4, 6, 7, 9, 1]), ("zzz", 8, 0, [3, 4, 6, 7, 9, 5, 8]),
                 ("zzz", 8, 1, [0, 2, 6, 7, 9, 1, 8])],
}


@pytest.mark.parametrize("variant", ["legacy", "enhanced"])
def test_searches_are_theirs(variant):
    tokens = [(tokenize_legacy if variant == "legacy" else tokenize_mixed)(d) for d in DOCS]
    index = Bm25Index(variant, DOCS, CHUNK_OF, tokens, BM25Okapi(tokens))
    for query, top_k, excluded, expected in SEARCHES[variant]:
        if variant == "legacy":
            found = index._ranked(tokenize_legacy(query), top_k, excluded)
        else:
            found = index._enhanced(tokenize_mixed(query), top_k, excluded)
        assert [DOCS.index(d) for d in found] == expected, (query, top_k, excluded)
    # their loop's use: legacy always 4 windows, the current chunk included, the planner's top_k as written
    if variant == "legacy":
        assert index.search("Quouv Lisbon", "25", question="q", current_chunk=2) == ("Quouv Lisbon", "25", [DOCS[i] for i in [6, 9, 2, 4]])
    else:
        assert index.search(" Quouv\nLisbon ", "25", question="q", current_chunk=1)[:2] == ("Quouv Lisbon", 20)
        assert index.search(None, None, question="quouv lisbon", current_chunk=3)[:2] == ("quouv lisbon", 8)


def test_top_k_clamp_and_query_normalisation_are_theirs():
    """`_clamp_top_k(x)` and `_normalize_query(x, "FALLBACK")`."""
    cases = [(8, 8), ("5", 5), (5.7, 5), (None, 8), ("abc", 8), (1, 3), (100, 20), (True, 3), ("20", 20), (-3, 3),
             ("3.5", 8), (21, 20), ([4], 8)]
    assert [clamp_top_k(x) for x, _ in cases] == [k for _, k in cases]
    cases = [("  a\n\tb   c ", "a b c"), ("", "FALLBACK"), ("   ", "FALLBACK"), (None, "FALLBACK"), (5, "FALLBACK"),
             ("x\r\ny", "x y"), ("\n\n", "FALLBACK"), ("Who  directed\tVrystork?", "Who directed Vrystork?")]
    assert [normalize_query(x, "FALLBACK") for x, _ in cases] == [q for _, q in cases]


# 3. the planner's reply and the early stop ----------------------------------------------------------
PLANS = [  # reply -> (calls as `_parse_response` returns them, stop)
    ('✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "Vrystork director", "top_k": 5}',
     [("retrievesearch", '{"query": "Vrystork director", "top_k": 5}')], False),
    ('<think>\nI need the director.\n</think>\n\n✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "a"}\n✿FUNCTION✿: '
     'retrievesearch\n✿ARGS✿: {"query": "b", "top_k": 3} <!-- note -->\n✿RESULT✿: x\n✿RETURN✿: y',
     [("retrievesearch", '{"query": "a"}'), ("retrievesearch", '{"query": "b", "top_k": 3}')], False),
    ('<think>Should I STOP? no</think>\n✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "c"}', [], True),
    ("STOP", [], True),
    ("Memory is enough. Stop.", [], False),
    ('✿FUNCTION✿: retrievesearch ✿ARGS✿: {"query": "same line"}', [("retrievesearch", '{"query": "same line"}')], False),
    ("✿FUNCTION✿: other_tool\n✿ARGS✿: ```py\nprint(1)\n```\ntrailing", [("other_tool", "```py\nprint(1)\n```")], False),
    ("✿FUNCTION✿: retrievesearch\n✿ARGS✿: not json at all", [("retrievesearch", "not json at all")], False),
    ("✿FUNCTION✿: retrievesearch\n✿ARGS✿:", [], False),
    ("", [], False),
    ("NONSTOP words", [], True),
]


@pytest.mark.parametrize("reply, calls, stop", PLANS)
def test_planner_replies_are_read_as_theirs(reply, calls, stop):
    assert parse_plan(reply) == Plan(calls, stop)


def test_the_strict_stop_reads_only_a_bare_stop_after_the_thinking():
    """The project's option (`strict_stop`): "STOP" in the thinking or inside a word no longer stops."""
    assert parse_plan(PLANS[2][0], strict=True) == Plan([("retrievesearch", '{"query": "c"}')], False)
    assert parse_plan("<think>\nok\n</think>\n\nSTOP", strict=True) == Plan([], True)
    assert parse_plan("NONSTOP words", strict=True) == Plan([], False)


# plan kinds in order (S: "STOP", N: neither call nor STOP, C: a call; N after the list) -> their loop's
# returned `step` on 8 chunks, and the calls it made (plans + writes + final)
STOPS = [("SSS", 3, 6), ("NNNNNNNN", 8, 17), ("SNSS", 4, 8), ("SCSSS", 5, 10), ("NSS", 3, 6), ("CCSSNS", 8, 17),
         ("SSNSSS", 5, 10), ("SSCSSN", 8, 17)]
KINDS = {"S": "STOP", "N": "Nothing to search.", "C": '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "Quouv"}'}


def test_the_early_stop_counter_is_theirs():
    for kinds, step, _ in STOPS:
        count, stopped = 0, None
        for i, kind in enumerate(kinds.ljust(8, "N"), 1):
            count = stop_count(count, parse_plan(KINDS[kind]))
            if count >= 3:
                stopped = i
                break
        assert (stopped or 8) == step, kinds


def test_the_prediction_is_their_scorers():
    """ruler_hqa.py: `extract_answer` of `extract_solution(generation)`, stripped; no fallback to thinking."""
    assert prediction("<think>so the answer is Paris</think>\n\nTherefore, the answer is **Lisbon**.") == "Lisbon"
    assert prediction("<think>so the answer is Paris</think>\n\n") is None
    assert prediction("Therefore, The answer is Lisbon.") is None  # case-sensitive, as theirs


# 4. a scripted episode through method=infmem ------------------------------------------------------
CONTEXT = "\n\n".join([
    "Document 1: Vrystork is a 1999 film shot in the northern valleys.",
    "Document 2: The weather in Lisbon is mild most of the year and the river is wide.",
    "Document 3: Vrystork was directed by Quouv, who also wrote its screenplay.",
    "Document 4: Pasta is cooked in salted water until it is soft but firm.",
    "Document 5: Quouv was born in Lisbon and studied film in Berlin.",
    "Document 6: The Vrystork premiere took place in Berlin in the spring.",
    "Document 7: Gardens need water, light and patience to grow well.",
    "Document 8: Miro wrote the Vrystork soundtrack on an old piano.",
    "Document 9: A short note about trains, stations and long journeys.",
    "Document 10: The end of the collection, with nothing more to say.",
])
QUESTION = "  Where was the director of Vrystork born?\n"
# (stage 1, stage 2) of each call: a thinking cut short (their forced </think>), two parallel calls (the
# last one's windows are used), arguments that are not JSON, a plan with neither call nor STOP, a top_k
# of "25", "STOP" in the thinking beside a call, then STOP twice: reading stops at plan 7 of 8 chunks
SCRIPT = {
    "plan": [("<think>\nThe question asks about the director of Vrystork",
              '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "Vrystork director", "top_k": 3}\n✿FUNCTION✿: '
              'retrievesearch\n✿ARGS✿: {"query": "Quouv\\nborn   in"}\n✿RESULT✿: (none)'),
             ("<think>\nOk.\n</think>\n\n", "✿FUNCTION✿: retrievesearch\n✿ARGS✿: {query: not json}"),
             ("<think>\nfine\n</think>\n\nThe memory looks complete.", ""),
             ("<think>\nOne more.\n</think>\n\n", '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "premiere city", "top_k": "25"}'),
             ("<think>\nMaybe STOP now.\n</think>\n\n", '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "x"}'),
             ("<think>\nEnough.\n</think>\n\nSTOP", ""),
             ("<think>\nEnough.\n</think>\n\n", "STOP")],
    "write": [(f"<think>\nNote it.\n</think>\n\nmemory {i}:", f" facts so far {i}.") for i in range(1, 8)],
    "final": [("<think>\nFrom memory.\n</think>\n\n", "Therefore, the answer is Lisbon.")],
}
# sha256 (first 16 hex digits) of every /v1/completions prompt their loop sent, in order; each with
# max_tokens 1024, temperature 0, top_p 1
THEIR_REQUESTS = {
    "enhanced": [
        "b8ecb58452c18679", "39f970f4f7758add", "0320492cf677cc0c", "c65e682375717072", "dbf03cd2b294d674", "30460ab4cf7b21d2",
        "2c6ce641dc9e43e4", "ecf4e806017acb05", "d66f0d8df8e529d0", "c182709e48b1b295", "2d3d2ac14029bb5d", "faeb1cd1a46c152a",
        "226cc2a1cb396bb4", "83530941fb32a977", "742f3e777feaa49a", "91ba37e4832b2b86", "b4b93c2e02b8a445", "95b12fd6db649220",
        "beb7c27b694cb563", "2b497778e84a9564", "f728e57172ae8c86", "aa0b37607c831480", "5e13565556da536b", "f69014c8f5fd0918",
        "8b09fe28fdabd5c5", "3955aa6875d0d6a0", "6e5d3b1e56c9fe6e", "f0d25c33f61efc1c"],
    "legacy": [
        "b8ecb58452c18679", "39f970f4f7758add", "ab0f4dc4296da93b", "414c902b40cbc8f6", "dbf03cd2b294d674", "30460ab4cf7b21d2",
        "80f3619ada22afb5", "1588c857116ed09c", "d66f0d8df8e529d0", "c182709e48b1b295", "2d3d2ac14029bb5d", "faeb1cd1a46c152a",
        "226cc2a1cb396bb4", "83530941fb32a977", "11d02eac4baa1500", "7a8a9e18c1c9432a", "b4b93c2e02b8a445", "95b12fd6db649220",
        "beb7c27b694cb563", "2b497778e84a9564", "f728e57172ae8c86", "aa0b37607c831480", "5e13565556da536b", "f69014c8f5fd0918",
        "8b09fe28fdabd5c5", "3955aa6875d0d6a0", "6e5d3b1e56c9fe6e", "f0d25c33f61efc1c"],
}
SMALL = dict(chunk_size=24, retrieve_window=10, retrieve_overlap=3)  # their RECURRENT_CHUNK_SIZE, RETRIEVE_CHUNK_*


def scripted(script: dict[str, list[tuple[str, str]]], stages: int = 2):
    """Replies by request: stage 1 or 2 of the n-th plan, write or final call (told apart by the prompt)."""
    seen: list[str] = []

    def reply(prompt: str, i: int) -> str:
        if i % stages == 0:
            seen.append("final" if "Your answer:" in prompt else "plan" if "Retrieval Planner" in prompt else "write")
        kind = seen[-1]
        return script[kind][seen.count(kind) - 1][i % stages]
    return reply


class Sent(ScriptedModel):
    """Also keeps each request's sampling, as the server would receive it."""

    def __init__(self, reply):
        super().__init__(reply)
        self.sampling = []

    async def generate(self, prompt, sampling, **kwargs):
        self.sampling.append((sampling.max_new_tokens, sampling.temperature, sampling.top_p))
        return await super().generate(prompt, sampling, **kwargs)


def episode(tokenizer, script, stages: int = 2, **settings):
    model = Sent(scripted(script, stages))
    method = build_method(method_config("infmem", **SMALL, **settings), Models(lead=model, lead_tokenizer=tokenizer))
    result = asyncio.run(method.run(Sample(id="s", question=QUESTION, answers=["Lisbon"], context=CONTEXT)))
    return result, model


class CompletionsServer:
    """A scripted `/v1/completions` endpoint (standing in for vLLM serving the checkpoint, as their eval
    talks to it): answers `reply(prompt, i)`, keeps every request body; the first `down` requests
    get a 503."""

    def __init__(self, reply, down: int = 0):
        self.reply, self.down, self.bodies = reply, down, []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.down:
            self.down -= 1
            return json_response({"error": "overloaded"}, 503)
        self.bodies.append(body)
        text = self.reply(body["prompt"], len(self.bodies) - 1)
        return json_response({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})


def served_episode(tokenizer, variant: str, down: int = 0):
    server = CompletionsServer(scripted(SCRIPT), down)
    app = web.Application()
    app.router.add_post("/v1/completions", server.handle)
    with ServerHandle(app) as handle:
        lead = HttpBackend(handle.url, api="completions", model="qwen", server="vllm")
        method = build_method(method_config("infmem", **SMALL, bm25=variant, retry={"retry_backoff_s": 0.001}),
                              Models(lead=lead, lead_tokenizer=tokenizer))
        result = asyncio.run(method.run(Sample(id="s", question=QUESTION, answers=["Lisbon"], context=CONTEXT)))
    return result, server.bodies


@pytest.mark.parametrize("variant", ["enhanced", "legacy"])
def test_a_scripted_episode_sends_their_prompts_and_stops_where_theirs_does(qwen3_tokenizer, variant):
    result, bodies = served_episode(qwen3_tokenizer, variant)
    sent = [sha(b["prompt"])[:16] for b in bodies]
    first_difference = next((i for i, (a, b) in enumerate(zip(sent, THEIR_REQUESTS[variant], strict=False)) if a != b), None)
    assert first_difference is None, f"request {first_difference} differs:\n{bodies[first_difference]['prompt'][-1500:]}"
    assert len(sent) == len(THEIR_REQUESTS[variant])
    assert {(b["model"], b["max_tokens"], b["temperature"], b["top_p"], b.get("stop")) for b in bodies} == {("qwen", 1024, 0.0, 1.0, None)}
    assert result.answer == "Lisbon"  # their final: "Therefore, the answer is Lisbon."
    trace = result.trace
    assert trace.num_chunks == 8 and trace.extras["stopped_early"] and trace.extras["stopped_at_chunk"] == 6  # their step 7
    assert result.steps == 14 == len(sent) // 2  # 7 plans, 6 writes, the final: each two requests
    assert [u["chunk"] for u in trace.updates] == list(range(6))
    searches = [s for p in trace.extras["plans"] for s in p["searches"]]
    top_ks = [s["top_k"] for s in searches]
    assert top_ks == ([3, 8, 8, 20] if variant == "enhanced" else [3, 8, 8, "25"])  # the legacy search keeps it as written
    assert [p["stop_count"] for p in trace.extras["plans"]] == [0, 0, 1, 0, 1, 2, 3]


def test_every_stop_sequence_ends_the_method_where_their_loop_ends(qwen3_tokenizer):
    for kinds, step, calls in STOPS:
        plans = [("<think>\n.\n</think>\n\n", KINDS[k]) for k in kinds.ljust(8, "N")]
        script = {"plan": plans, "write": [("<think>\n.\n</think>\n\n", "m")] * 8,
                  "final": [("<think>\n.\n</think>\n\n", "Therefore, the answer is x.")]}
        result, _ = episode(qwen3_tokenizer, script)
        stopped = calls < 8 + 8 + 1  # theirs returned before reading every chunk
        assert result.steps == calls and result.trace.extras["stopped_early"] == stopped, kinds
        assert result.trace.extras["stopped_at_chunk"] == (step - 1 if stopped else None), kinds
        assert len(result.trace.updates) == (step - 1 if stopped else 8), kinds


def test_thinking_budget_and_off_are_their_two_call_shapes(qwen3_tokenizer):
    """Stage 1 asks `thinking_budget` tokens; thinking off is one request per call, its reply as is."""
    script = {"plan": [("STOP", "")] * 3, "write": [("m", "")] * 2, "final": [("Therefore, the answer is x.", "")]}
    _, model = episode(qwen3_tokenizer, script, thinking_budget=7)
    assert [s[0] for s in model.sampling[:2]] == [7, 1024]
    assert model.prompts[1].endswith("STOP\n\nConsidering the limited time, I must stop thinking now.\n</think>\n\n")
    result, model = episode(qwen3_tokenizer, script, stages=1, thinking=False)
    assert len(model.prompts) == 6 and result.answer == "x" and result.steps == 6
    assert all(p.endswith("<think>\n\n</think>\n\n") for p in model.prompts)  # the template's own empty thinking


def test_the_document_is_tokenised_once(qwen3_tokenizer):
    """The chunks and the planner's BM25 index are cut from one encoding of the document (the index
    encoded it a second time); the tokenizer is the real one, only counted."""
    import copy

    counted, documents = copy.copy(qwen3_tokenizer), []
    counted.encode = lambda text, **kwargs: (documents.append(text) if len(text) > len(CONTEXT) // 2 else None) \
        or qwen3_tokenizer.encode(text, **kwargs)
    script = {"plan": [("STOP", "")] * 3, "write": [("m", "")] * 2, "final": [("Therefore, the answer is x.", "")]}
    result, _ = episode(counted, script)
    assert len(documents) == 1 and result.trace.extras["stopped_at_chunk"] == 2


def test_a_failed_request_is_retried_not_read_as_an_empty_plan(qwen3_tokenizer):
    """Theirs reads an HTTP error as "" (a plan with no call, or an empty memory); here the request is
    retried (`parser.serving.retry`) and the episode is the one theirs gives when nothing fails."""
    result, bodies = served_episode(qwen3_tokenizer, "enhanced", down=1)
    assert [sha(b["prompt"])[:16] for b in bodies] == THEIR_REQUESTS["enhanced"] and result.answer == "Lisbon"
