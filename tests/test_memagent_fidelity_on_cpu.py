"""MemAgent and ReMemR1 as their authors run them: each rule restated as cases (input, the authors'
output) from their code, one test per rule (issue 32; docs/fidelity.md, "MemAgent and ReMemR1").

    .venv/bin/pytest tests/test_memagent_fidelity_on_cpu.py -q

The project cannot ship the authors' code, so every expected value below was produced by running
their function on that input, at the commit named in the test's comment:
  M = BytedTsinghua-SIA/MemAgent @ 76b7a65, R = syr-cn/ReMemR1 @ 43e69f3.
Only the model is faked (`ScriptedModel`, standing in for the served checkpoint: replies scripted
from the prompt); the tokenizer and chat template are the in-process test tokenizer.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_prep.knowledge_filter import PROMPT_TEMPLATE, is_correct
from parser.serving.backends.models import Models
from parser.methods import Sample, method_class, method_config
from parser.methods.coa import PROMPTS as COA_PROMPTS
from parser.methods.memagent import PROMPTS as MEMAGENT_PROMPTS
from parser.methods.rememr1 import PROMPTS as REMEMR1_PROMPTS
from parser.methods.rememr1.method import NO_RECALL_RESULT, TfidfRecall
from parser.methods.memagent.rules import (authors_boxed, memagent_memory, memagent_rl_reward, prediction, recall_query,
                                           remove_recalls)
from parser.text.reward import MEMAGENT_SCORER, sub_em
from scripted_lead import ScriptedModel  # stands in for the served checkpoint

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "  Who directed Vrystork?\n"  # edge whitespace: theirs `.strip()` the question (`item['input'].strip()`)


def built(method: str, models: Models, **kwargs):
    """The class configs/method/<method>.yaml names, with the class's defaults and `kwargs`."""
    return method_class(method_config(method)["_target_"])(models, **kwargs)


def read(method: str, script, tokenizer, context: str = "Document 1: Vrystork was directed by Quouv.", **kwargs):
    model = ScriptedModel(script)
    models = Models(lead=model, lead_tokenizer=tokenizer, subagent=model, subagent_tokenizer=tokenizer)
    result = asyncio.run(built(method, models, **kwargs).run(Sample(id="s", question=QUESTION, answers=["Quouv"],
                                                                             context=context)))
    return result, model


def user_turn(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# 1. prompts, byte for byte ------------------------------------------------------------------------
def test_prompts_are_the_authors_bytes_with_the_question_stripped():
    """sha256 of theirs `TEMPLATE.format(prompt=QUESTION.strip(), ...)`: M taskutils/memory_eval/utils/
    recurrent.py `TEMPLATE`, `TEMPLATE_FINAL`; recurrent_boxed.py `TEMPLATE_FINAL`; R taskutils/
    memory_eval/utils/rememr1.py `TEMPLATE`, `TEMPLATE_FINAL_BOXED`; M taskutils/memory_data/filter.py
    `TEMPLATE` (question as given). Each ends in a newline ("Updated memory:\\n")."""
    q = QUESTION.strip()

    def render(name, **fields):  # each method folder's own prompts
        return (MEMAGENT_PROMPTS if name.startswith("memagent") else REMEMR1_PROMPTS).render(name, **fields)

    assert sha(render("memagent_update", question=q, memory="No previous memory", chunk="Doc 1 text")) == \
        "3ae46911ae474cfbe2efd28d6ac5f0edbd1b412755f172158ef9374dbb66bbf4"
    assert sha(render("memagent_final_recurrent", question=q, memory="m1")) == \
        "fd742c65b279509eb5da8350abb91e7d66ee12213b8a98abcee1ee50ac738682"
    assert sha(render("memagent_final", question=q, memory="m1")) == \
        "5198a47219e8aa296d462e10643b971f26459c1339ce88a12b38e93a47b8906c"
    assert sha(render("rememr1_update", question=q, memory="m1", recalled_memory="No memory was recalled.",
                      chunk="Doc 1 text")) == "83abe3603f413ad5d6a120ed22d52d5cbc735bdd7c2d6c2190a4664b033900ec"
    assert sha(render("rememr1_final", question=q, memory="m1", recalled_memory="r1")) == \
        "b236223589e680b24351963f4f30616684a5de9b44b01ef485406b30c99ba70b"
    assert sha(PROMPT_TEMPLATE.format(question=QUESTION)) == "96c918f4929fcef732bc02d4d586437bc6a4d3985071d5ccd0d940c9811e2b98"
    assert not COA_PROMPTS.load("coa_worker").endswith("\n")  # other prompts: the file's line break only


@pytest.mark.parametrize("method", ["memagent", "rememr1"])
def test_the_method_sends_the_stripped_question_and_the_final_newline(tiny_tokenizer, method):
    """What the method hands the chat template (the served model's template decides what it keeps:
    Qwen2.5's, their checkpoints', keeps the newline; the test tokenizer's Qwen3.5-style one trims it)."""
    result, model = read(method, lambda p, i: "m", tiny_tokenizer)
    for prompt in model.prompts:
        assert "<problem> \nWho directed Vrystork?\n</problem>" in user_turn(prompt)
    reader = built(method, Models(lead=model, lead_tokenizer=tiny_tokenizer))
    state = reader.new_state()
    assert reader.update_prompt(QUESTION, "chunk", state).endswith("</section>\n\nUpdated memory:\n")
    assert reader.final_prompt(QUESTION, state).endswith("</memory>\n\nYour answer:\n")
    assert "<problem> \nWho directed Vrystork?\n</problem>" in reader.final_prompt(QUESTION, state)


# 2. the memory update ---------------------------------------------------------------------------
def test_memagent_memory_is_the_reply_as_it_is():
    """M utils/__init__.py `extract_solution` (recurrent.py: `memory, _ = extract_solution(content)`)."""
    assert memagent_memory("  kept as is \n") == "  kept as is \n"
    assert memagent_memory("") == ""
    assert memagent_memory("<think>plan</think>  the memory ") == "the memory"
    assert memagent_memory("a</think>b</think> c") == "c"


def test_an_empty_reply_empties_the_memory_unless_the_option_keeps_it(tiny_tokenizer):
    chunks = "Document 1: " + " ".join(f"w{i}" for i in range(400))
    script = lambda p, i: "first memory" if i == 0 else ""  # noqa: E731
    _, model = read("memagent", script, tiny_tokenizer, context=chunks, chunk_size=100)
    assert "<memory>\n\n</memory>" in user_turn(model.prompts[-1])
    _, model = read("memagent", script, tiny_tokenizer, context=chunks, chunk_size=100, keep_memory_on_empty=True)
    assert "<memory>\nfirst memory\n</memory>" in user_turn(model.prompts[-1])


@pytest.mark.parametrize("method", ["memagent", "rememr1", "coa"])
def test_with_thinking_on_no_think_block_is_passed_on(tiny_tokenizer, method):
    """Issue 33 item 5 (sequential part): the reply is split at `</think>` before it is made safe,
    so the thinking never becomes the memory or summary; a reply cut inside its thinking passes nothing."""
    chunks = "Document 1: " + " ".join(f"w{i}" for i in range(400))
    script = lambda p, i: "secret plan</think>kept note" if i == 0 else "more secret"  # noqa: E731
    _, model = read(method, script, tiny_tokenizer, context=chunks, chunk_size=100, thinking=True)
    assert "kept note" in user_turn(model.prompts[1])
    assert all("secret" not in user_turn(p) and "think>" not in user_turn(p) for p in model.prompts)


def test_rememr1_memory_drops_every_recall_block_and_is_stripped():
    """R rememr1.py `_parse_update_memory2`: `re.sub(r'<recall>.*?</recall>', '', t, flags=re.DOTALL).strip()`."""
    assert remove_recalls("<recall>q1</recall> mem <recall>q2</recall>") == "mem"
    assert remove_recalls("<recall></recall>mem") == "mem"
    assert remove_recalls("<recall>a\nb</recall>") == ""
    assert remove_recalls("<recall>q</recall>") == ""  # a recall alone empties the memory
    assert remove_recalls("  memory  ") == "memory"
    assert remove_recalls("<thinking>t</thinking>note") == "<thinking>t</thinking>note"  # their thinking tags stay


# 3. ReMemR1's recall -----------------------------------------------------------------------------
def test_rememr1_recall_query_is_their_regex():
    """R rememr1.py `_parse_recall_query`: `re.search(r'<recall>(.+)</recall>', t)` (greedy, one line)."""
    assert recall_query("<recall>q1</recall> mem <recall>q2</recall>") == "q1</recall> mem <recall>q2"
    assert recall_query("<recall></recall>mem") is None
    assert recall_query("<recall>a\nb</recall>") is None
    assert recall_query("x<recall>q</recall>\n<recall>r</recall>") == "q"
    assert recall_query("no recall here") is None


def test_rememr1_recall_answers_top1_even_without_overlap(tiny_tokenizer):
    """R tf_idf_retriever.py `top1_retrieve`: the argsort's best, even at cosine 0; ties: the last."""
    recall = TfidfRecall(tiny_tokenizer)
    memories = ["Quouv was born in Criamorburg", "The lake is north of the harbour"]
    assert recall.top1("where was Quouv born", memories) == memories[0]
    assert recall.top1("zzzz", memories) == memories[1]  # no word in common: still a memory
    assert recall.top1("q", [""]) is None  # no vocabulary: their retriever returns None


def test_rememr1_recall_ties_can_be_broken_as_theirs(tiny_tokenizer):
    """R tf_idf_retriever.py `retrieve` over `list(history_memory)` (rememr1.py: a `set` the memories
    are `add`ed to): `np.argsort(cosine_similarity(...))[::-1][:1]`, numpy's default sort. Run at R
    with this tokenizer on a list: `top1_retrieve("harbour", ["a harbour", "b harbour", "c harbour",
    "d harbour", "lake north"])` is "d harbour" and on the reversed list "a harbour" (four equal
    cosines, 0.7356...; the last in the list's order wins). The list is the set's iteration order,
    which follows this process's hash seed: restated here by adding the memories to a set."""
    tied = ["a harbour", "b harbour", "c harbour", "d harbour"]
    theirs = TfidfRecall(tiny_tokenizer, ties="authors")
    for shift in range(4):  # four insertion orders
        memories = tied[shift:] + tied[:shift] + ["lake north"]
        history: set[str] = set()
        for memory in memories:
            history.add(memory)
        assert theirs.top1("harbour", memories) == [m for m in history if m in tied][-1]
        assert TfidfRecall(tiny_tokenizer).top1("harbour", memories) == memories[3]  # default: the latest
    assert theirs.top1("Quouv", ["Quouv was born in Criamorburg", "The lake is north of the harbour"]) == \
        "Quouv was born in Criamorburg"  # no tie: the best, as by default
    assert OmegaConf.load(ROOT / "configs/method/rememr1.yaml").recall_ties == "latest"


def test_rememr1_update_order_is_a_choice(tiny_tokenizer):
    """R rememr1.py `async_query_llm` (eval): the memory joins the set, then the recall is answered;
    R recurrent/impls/memory_revisit.py `update` (training): the recall is answered from the
    memories before it (their issue #5)."""
    script = lambda p, i: "<recall>Vrystork director</recall>Vrystork director is Quouv" if "<section>" in p else "\\boxed{Quouv}"  # noqa: E731
    _, model = read("rememr1", script, tiny_tokenizer)
    assert "<recalled_memory>\nVrystork director is Quouv\n</recalled_memory>" in user_turn(model.prompts[-1])
    _, model = read("rememr1", script, tiny_tokenizer, recall_order="training")
    assert "<recalled_memory>\nNo memory was recalled.\n</recalled_memory>" in user_turn(model.prompts[-1])
    _, model = read("rememr1", lambda p, i: "<recall>x</recall>" if "<section>" in p else "", tiny_tokenizer)
    assert f"<recalled_memory>\n{NO_RECALL_RESULT}\n</recalled_memory>" in user_turn(model.prompts[-1])  # empty memory, no vocabulary


# 4. answers and scoring --------------------------------------------------------------------------
def test_memagent_recurrent_answer_is_their_extraction():
    """M ruler_hqa.py `get_pred` with `--api recurrent` (both run scripts' MemAgent mode):
    `extract_solution`, then utils/__init__.py `extract_answer`."""
    cases = {
        "Therefore, the answer is Paris.": "Paris",
        "The answer is Paris.": None,  # case-sensitive
        "So **the answer is** Paris.\nIt is in France.": "Paris.\nIt is in France",
        "The memory does not contain the answer.": None,  # the project's old fallback: the whole reply
        "x</think>": None,
        "<think>the answer is A</think>Therefore, the answer is B..": "B",
        "the answer is Paris<｜end▁of▁sentence｜>": "Paris",
        "the answer is \\boxed{Paris}": "\\boxed{Paris}",
    }
    for reply, theirs in cases.items():
        assert prediction(reply, "recurrent")[0] == theirs, reply


def test_rememr1_boxed_answer_is_their_extraction():
    """R test_qa.py `get_pred` with `--api rememr1`: utils/__init__.py `extract_boxed_answer`
    (`last_boxed_only_string`, content unstripped). A lone `\\fbox{}` fails their assert: None here."""
    cases = {
        "so \\boxed{ Paris } ok": " Paris ",
        "\\boxed Paris$ and": "Paris",
        "\\boxed{a} then \\boxed{b{c}}": "b{c}",
        "\\fbox{Paris}": None,
        "\\boxed{Paris": None,
        "Therefore, the answer is Paris.": None,
        "<think>\\boxed{A}</think>": "A",
    }
    for reply, theirs in cases.items():
        assert prediction(reply, "boxed")[0] == theirs, reply
    assert authors_boxed("\\boxedx{a}") is None  # not `\\boxed{`: their assert fails


def test_scoring_is_theirs_on_what_extraction_returns(tiny_tokenizer):
    """M utils/__init__.py `sub_exact_match_score` behind `if item["pred"] else 0`: no prediction
    scores 0; a blank boxed answer " " is a hit (it normalizes to "", a substring of every gold)."""
    assert sub_em(None, ["Paris"], **MEMAGENT_SCORER) == 0.0
    assert sub_em(" ", ["Paris"], **MEMAGENT_SCORER) == 1.0
    result, _ = read("memagent", lambda p, i: "m" if "<section>" in p else "", tiny_tokenizer)
    assert result.answer is None and result.trace.empty_final_reply is True  # theirs skip such a sample


def test_budgets_are_their_run_scripts():
    """R taskutils/memory_eval/run_eval.py `ReMemR1_*`: RECURRENT_MAX_NEW=2048; M run.py / R run_eval.py
    `MemAgent_*`: 1024, chunk 5000, method "recurrent"."""
    memagent = OmegaConf.load(ROOT / "configs/method/memagent.yaml")
    rememr1 = OmegaConf.load(ROOT / "configs/method/rememr1.yaml")
    assert (memagent.chunk_size, memagent.max_memory_tokens, memagent.max_answer_tokens, memagent.answer_mode) == \
        (5000, 1024, 1024, "recurrent")
    assert (rememr1.max_memory_tokens, rememr1.max_answer_tokens, rememr1.answer_mode) == (2048, 2048, "boxed")
    assert not (memagent.lenient_extraction or memagent.keep_memory_on_empty or memagent.drop_thinking)


@pytest.mark.parametrize("method", ["memagent", "rememr1"])
def test_a_long_document_keeps_their_head_and_tail_for_odd_and_even_caps(tiny_tokenizer, method):
    """M memory_eval/utils/recurrent.py and R memory_eval/utils/rememr1.py `async_query_llm`:
    `input_ids[:max_len//2] + input_ids[-max_len//2:]`. On ids 0..9 theirs keep, for L = 5, 4, 7, 1:
    [0, 1, 7, 8, 9], [0, 1, 8, 9], [0, 1, 2, 6, 7, 8, 9], [9] (`-L//2` is -ceil(L/2): L tokens, the
    odd one in the tail). Before issue 56 an odd L kept L - 1."""
    reader = built(method, Models(lead=ScriptedModel(lambda p, i: ""), lead_tokenizer=tiny_tokenizer), chunk_size=1)
    context = " ".join(f"w{i}" for i in range(40))
    ids = tiny_tokenizer.encode(context, add_special_tokens=False)
    for cap, theirs in [(5, [0, 1, 7, 8, 9]), (4, [0, 1, 8, 9]), (7, [0, 1, 2, 6, 7, 8, 9]), (1, [9])]:
        reader.max_context_tokens = cap
        kept = [ids[p] if p < cap // 2 else ids[len(ids) - 10 + p] for p in theirs]  # their 0..9 on our longer ids
        assert reader.chunks(context) == [tiny_tokenizer.decode([i]) for i in kept], cap


def test_the_lenient_extraction_is_an_option(tiny_tokenizer):
    result, _ = read("memagent", lambda p, i: "m" if "<section>" in p else "It was Quouv", tiny_tokenizer)
    assert result.answer is None
    result, _ = read("memagent", lambda p, i: "m" if "<section>" in p else "It was Quouv", tiny_tokenizer,
                     lenient_extraction=True)
    assert result.answer == "It was Quouv" and result.trace.extracted_by == "reply"


# 5. the RL reward --------------------------------------------------------------------------------
def test_memagent_rl_reward_is_theirs():
    """M verl/utils/reward_score/hotpotqa.py `compute_score`: last `\\boxed{}` within the last 300
    characters, lowercased, `strip_string` equality, max over golds."""
    cases = [
        ("so \\boxed{Paris}", ["paris"], 1.0),
        ("\\boxed{Paris} " + "x" * 300, ["paris"], 0.0),
        ("\\boxed{Paris.}", ["Paris"], 0.0),  # no punctuation rule
        ("\\boxed{New York}", ["new york"], 1.0),
        ("\\boxed{The Beatles}", ["Beatles"], 0.0),  # no article rule
        ("\\boxed{ .5}", [" 0.5"], 1.0),
        ("\\fbox{Paris}", ["paris"], 0.0),
        ("Paris", ["paris"], 0.0),
        ("\\boxed{\\text{Paris}}", ["paris"], 0.0),
        ("\\boxed{paris}", ["Rome", "Paris"], 1.0),
    ]
    for reply, golds, theirs in cases:
        assert memagent_rl_reward(reply, golds) == theirs, (reply, golds)


# 6a. the closed-book data filter ------------------------------------------------------------------
# (reply, golds, theirs): M taskutils/memory_data/filter.py, a reply counts when `scores` (its
# hotpotqa_verifier.py `compute_score`, max over golds) or `contains` (`gt.lower() in r.lower()`) is true.
FILTER_VERDICTS = [
    ("\\boxed{1000}", ["1,000"], False),                     # no article/punctuation normaliser (ours said True)
    ("The answer is \\boxed{Beatles}", ["the Beatles"], False),  # (ours said True)
    ("I think \\boxed{new  york}", ["New York"], True),         # math-string drops spaces
    ("I have no idea.", ["a"], True),                           # "a" occurs in "idea" (ours said False)
    ("I do not know.", [""], True),                             # an empty gold is in every reply (ours said False)
    ("\\boxed{ROME}", ["Paris", "rome"], True),
    ("\\fbox{Rome}", ["Rome!"], False),                        # their remove_boxed assert, caught as 0
    ("\\boxed{Rome}" + "x" * 300, ["Rome."], False),           # the boxed answer is outside the last 300 characters
    ("It is probably eiffel tower, built 1889", ["Eiffel Tower"], True),
]


def test_the_knowledge_filter_verdict_is_memagents():
    """Issue 56: 49 of 500 verdicts differed (ours normalised articles and punctuation, and refused
    empty golds). Named difference kept: a `<think>` block is not read (theirs would count
    "<think>Maybe Paris.</think> \\boxed{Rome}" as knowing "Paris"; their Qwen2.5 never thinks)."""
    for reply, golds, theirs in FILTER_VERDICTS:
        assert is_correct(reply, golds) is theirs, (reply, golds)
    assert not is_correct("<think>Maybe Paris.</think> \\boxed{Rome}", ["Paris"])


# 6. data under compat=true -----------------------------------------------------------------------
def _wiki_row(row_id, question, titles, support, answer="x"):
    """A FlashRAG 2WikiMultiHopQA row (metadata.context / supporting_facts)."""
    return {"id": row_id, "question": question, "golden_answers": [answer],
            "metadata": {"context": {"title": titles, "content": [[f"{t} text."] for t in titles]},
                         "supporting_facts": {"title": support, "sent_id": [0] * len(support)}, "type": "compositional"}}


def _hotpot_row(row_id, titles, support):
    """A HotpotQA row in the original JSON layout."""
    return {"_id": row_id, "question": "Q?", "answer": "x", "context": [[t, [f"{t} text."]] for t in titles],
            "supporting_facts": [[t, 0] for t in support]}


def test_compat_hotpotqa_keeps_a_question_whose_supporting_title_is_missing():
    """M taskutils/memory_data/processing.py `read_hotpotqa`: no filter on supporting facts."""
    from data_prep.sources import read_hotpotqa

    rows = [_hotpot_row("a", ["A", "B"], ["A", "Z"]), _hotpot_row("b", ["C", "D"], ["C", "D"])]
    assert [q.id for q in read_hotpotqa(rows)[0]] == ["b"]
    questions, _ = read_hotpotqa(rows, compat=True)
    assert [q.id for q in questions] == ["a", "b"] and questions[0].gold == (0,) and questions[0].index == 0


def test_compat_corpus_comes_from_every_question_and_index_counts_kept_ones():
    """R taskutils/data_synthesis/process_test.py `read_dataset`: `total_docs` from every example,
    built before a missing supporting title `continue`s; `index` is the position in `total_qas`."""
    from data_prep.sources import read_2wiki

    rows = [_wiki_row("a", "Q1", ["A", "B"], ["A", "Z"]), _wiki_row("b", "Q2", ["C", "D"], ["C", "D"])]
    questions, corpus = read_2wiki(rows)
    assert len(corpus) == 2 and questions[0].index == 1
    questions, corpus = read_2wiki(rows, compat=True)
    assert [q.id for q in questions] == ["b"] and len(corpus) == 4 and questions[0].index == 0


def test_compat_keeps_a_repeated_paragraph_and_every_supporting_fact():
    """R process_test.py: `context` holds one doc index per title (a repeated paragraph twice);
    `evidence_idx = [titles.index(t) for t in supporting titles]` (a title per supporting sentence,
    so repeats), `min_distance` over them: 0 when a title repeats."""
    from data_prep.packing import eval_record, pack
    from data_prep.sources import read_2wiki

    rows = [_wiki_row("a", "Q1", ["A", "B", "A", "C"], ["A", "A", "B"]),
            *[_wiki_row(f"d{i}", f"D{i}", [f"E{i}", f"F{i}"], [f"E{i}"]) for i in range(4)]]
    question = read_2wiki(rows, compat=True)[0][0]
    assert question.paragraphs.count("A\nA text.") == 2 and question.support == (0, 0, 1)
    corpus = read_2wiki(rows, compat=True)[1]
    row = eval_record(question, pack(question, corpus, 8, seed=0, compat=True), corpus)
    assert row["context"].count("A text.") == 2
    assert len(row["meta"]["evidence_idx"]) == 3 and row["meta"]["min_distance"] == 0
    assert len(row["gold_paragraph_ids"]) == 2
    plain = read_2wiki(rows)[0][0]
    assert plain.paragraphs.count("A\nA text.") == 1 and plain.support == ()


# (prediction, gold, their sub_em, their em): M taskutils/memory_eval/utils/__init__.py
# `sub_exact_match_score`, `exact_match_score` run on each pair; `update_answer` is behind `if item["pred"] else 0`.
EMPTY_GOLD_SCORES = [("anything", "the", 1.0, 0.0), ("a", "the", 1.0, 1.0), ("x", "the", 1.0, 0.0),
                     ("Paris", "?", 1.0, 0.0), ("...", "", 1.0, 1.0), (None, "the", 0.0, 0.0)]


def test_compat_keeps_a_gold_that_normalizes_to_nothing_and_scores_it_as_theirs(tmp_path):
    """Their readers (M taskutils/memory_data/processing.py `read_hotpotqa`, R
    taskutils/data_synthesis/process_test.py `read_dataset`) keep a gold such as "The" (normalized: ""),
    and their scorer (M memory_eval/utils/__init__.py `update_answer`) gives every non-empty
    prediction Sub_EM 1 on it (fidelity row 45). With compat the project keeps it from the source file to
    eval's reader (the row's `meta.compat`), and `sub_em_compat` / `em_compat` score it as theirs;
    by default data prep refuses it and `sub_em` never scores it (free accuracy)."""
    from data_prep.packing import build_grid
    from data_prep.records import DataError
    from data_prep.sources import read_eval_file, read_hotpotqa
    from parser.records.jsonl import write_records
    from parser.records.metrics import score
    from parser.records.sample import Record

    rows = [{**_hotpot_row(name, [f"{name}1", f"{name}2"], [f"{name}1"]), "answer": answer}
            for name, answer in (("a", "The"), ("b", "x"), ("c", "y"))]
    with pytest.raises(DataError, match=r"record 0: answer\[0\] = 'The' normalizes to nothing"):
        read_hotpotqa(rows)
    questions, corpus = read_hotpotqa(rows, compat=True)
    written = build_grid(questions, corpus, [4], seed=0, compat=True)[4]
    back = read_eval_file(write_records(tmp_path / "eval_4.json", written))
    assert back[0]["answers"] == ["The"] and Record.from_dict(back[0]).compat
    for pred, gold, sub_em_theirs, em_theirs in EMPTY_GOLD_SCORES:
        scores = score(pred, [gold])
        assert (scores["sub_em_compat"], scores["em_compat"]) == (sub_em_theirs, em_theirs), (pred, gold)
        assert scores["sub_em"] == scores["em"] == 0.0
    # a training set cannot reward such a gold (MemAgent's filter drops it too: "" is in every reply)
    from data_prep.recipes import train_set
    from data_prep.verl_parquet import read_rl_parquet

    path = train_set(source={"name": "hotpotqa", "path": str(write_records(tmp_path / "src.jsonl", rows))},
                     out_dir=str(tmp_path), length=4, keep=None, compat=True)
    assert len(read_rl_parquet(path)) == 2
    assert json.loads(Path(f"{path}.card.json").read_text())["counts"]["unscorable_dropped"] == 1


# 7. Table 1 with the authors' scoring -------------------------------------------------------------
def test_a_report_can_use_their_scoring_and_labels_memagent_rows_with_it(tmp_path, capsys):
    """`sub_em_compat` is MemAgent's and ReMemR1's scorer (row 35; M memory_eval/utils/__init__.py `update_answer`: a blank
    answer " " is a hit). `parser report ... --metric sub_em_compat` fills Table 1 with it, and the
    MemAgent/ReMemR1 rows say which scoring they carry; the default stays the paper's `sub_em`."""
    from eval.report import main as report
    from eval.store import ResultsStore
    from parser.records.metrics import score
    from parser.records.result import ResultRow

    store = ResultsStore(tmp_path / "runs" / "memagent")
    for method, label, answer in (("memagent", "MemAgent", " "), ("parser", "ParSer", "Quouv")):
        store.append(ResultRow(dataset="hotpotqa", length=50, run=0, sample_id=f"{method}-q0", method=method, row=label,
                               backbone="tiny", answers=["Quouv"], prediction=answer,
                               scores=score(answer, ["Quouv"])))
    report([str(tmp_path / "runs"), "--out", str(tmp_path / "theirs"), "--no-viewer", "--metric", "sub_em_compat"])
    report([str(tmp_path / "runs"), "--out", str(tmp_path / "ours"), "--no-viewer"])
    capsys.readouterr()
    theirs, ours = ((tmp_path / d / "accuracy.md").read_text() for d in ("theirs", "ours"))
    assert "Accuracy (Sub_EM, authors' scorer %)" in theirs and "| tiny | MemAgent [Sub_EM, authors' scorer] | 100.00" in theirs
    assert "Accuracy (Sub_EM %)" in ours and "| tiny | MemAgent [Sub_EM] | 0.00" in ours
    assert "| tiny | ParSer | **100.00**" in ours  # other rows keep their label
    with pytest.raises(SystemExit):
        report([str(tmp_path / "runs"), "--out", str(tmp_path / "x"), "--metric", "f1"])
