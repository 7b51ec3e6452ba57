"""`python -m parser.cli.ask`: your own file and questions, rounds printed as they end, the answer
with the evidence it rests on (each quote checked against its chunk), on the real engine with the
tiny in-process models.

    .venv/bin/pytest tests/test_ask_on_cpu.py -q
"""
from __future__ import annotations

import orjson
import pytest

from parser.cli.ask import Reply, evidence_for, main, print_reply, read_document
from parser.records.trajectory import Finding, QueryRecord, Trajectory, Turn
from parser.text.chunking import Chunk
from parser.base.config import ConfigError
from parser.text.quotes import check_quote

DOCUMENT = """# The Zorvan expedition

Zorvan is a film directed by Miro Tal. It was shot in the winter of 1971.

The expedition's ship, the Aurel, was captained by Ines Varo.
"""


def test_text_and_markdown_are_read_as_they_are(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    assert read_document(path) == DOCUMENT


def test_jsonl_passages_become_numbered_documents_and_a_bad_line_is_named(tmp_path):
    path = tmp_path / "passages.jsonl"
    path.write_text('"Zorvan is a film."\n\n{"text": "Miro Tal was born in 1950."}\n')
    assert read_document(path) == "Document 1:\nZorvan is a film.\n\nDocument 2:\nMiro Tal was born in 1950."
    path.write_text('"fine"\n{"title": "no text field"}\n')
    with pytest.raises(ConfigError, match=r"passages\.jsonl:2: expected a JSON string or an object with a text field"):
        read_document(path)
    path.write_text('"fine"\n{not json\n')
    with pytest.raises(ConfigError, match=r"passages\.jsonl:2: not JSON"):
        read_document(path)
    path.write_text("\n \n")
    with pytest.raises(ConfigError, match="the document is empty"):
        read_document(path)


def test_evidence_is_the_agreeing_findings_with_each_quote_checked_against_its_chunk():
    chunks = [Chunk(0, "Zorvan is a film directed by Miro Tal.", (1,), 9), Chunk(1, "The Aurel's captain: Ines Varo.", (2,), 8)]

    def finding(agent, answer, evidence, merged=()):
        return Finding(agent, int(agent[6:]), answer, evidence, list(merged))

    query = QueryRecord("who?", [finding("agent_0", "Miro Tal", "directed by Miro Tal", merged=["agent_1"]),
                                 finding("agent_1", "Ines Varo", "captained by Ines Varo")],  # paraphrased: not verbatim in chunk 1
                        calls=[], observation="")
    record = Trajectory("who?", "d", 2, turns=[Turn(0, "", "", [query], None, None, 1, "stop", 0.1)])
    evidence = evidence_for("Miro Tal.", record, chunks)
    assert [(e.chunk_index, e.agent, e.in_chunk) for e in evidence] == [(0, "agent_0", True), (1, "agent_1", False)]
    everything = evidence_for("Someone else", record, chunks)  # none agrees: every finding, nothing hidden
    assert [(e.chunk_index, e.answer) for e in everything] == [(0, "Miro Tal"), (1, "Miro Tal"), (1, "Ines Varo")]
    assert evidence_for("Miro Tal", Trajectory("who?", "d", 2), chunks) == []
    assert evidence_for("Miro Tal", None, chunks) == []  # a method without an episode has no findings


CHUNK = "Zorvan is a film directed by Miro Tal. It was shot in the winter of 1971, in 1997 restored, and the lab was founded in 1997."


@pytest.mark.parametrize("quote, answer, verifies, label", [
    ("a", "Miro Tal", False, "does not state the answer"),
    ("the", "the lab", False, "does not state the answer"),
    ("in 1997", "1997", False, "holds nothing besides the answer"),
    ("1997", "1997", False, "holds nothing besides the answer"),
    ("Miro Tal", "Miro Tal.", False, "holds nothing besides the answer"),
    ("It was shot in the winter", "1971", False, "does not state the answer"),
    ("directed by Miro Tal", "Tal", True, "quote found in the chunk"),
    ("directed by Miro Tal", "Ta", False, "does not state the answer"),  # a part of a word is not the answer
    ("the lab was founded in 1997", "1997", True, "quote found in the chunk"),
    ("Zorvan is a film directed by Miro Tal", "Zorvan is a film directed by Miro Tal", True, "quote found"),  # a statement, whole
    ("the lab", "lab", False, "holds nothing besides the answer"),
    ("founded in 1998", "1998", False, "quote NOT in the chunk"),
    ("", "1997", False, "no quote"),
    ("the winter of 1971", "yes", False, "does not state the answer"),
])
def test_a_quote_verifies_only_when_it_states_the_answer_with_something_about_it(quote, answer, verifies, label):
    """Issue 55 item 8: "a", "the" or "in 1997" occur in the chunk but verify nothing."""
    verdict = check_quote(quote, answer, CHUNK)
    assert verdict.verifies is verifies and label in verdict.label
    assert verdict.in_chunk is (bool(quote) and quote in CHUNK)


def test_the_printed_check_says_found_only_for_verifying_quotes(capsys):
    chunks = [Chunk(0, CHUNK, (1,), 30)]
    query = QueryRecord("when?", [Finding("agent_0", 0, "1997", "in 1997", []),
                                  Finding("agent_0", 0, "1997 restoration", "in 1997 restored", [])], calls=[], observation="")
    record = Trajectory("when?", "d", 1, turns=[Turn(0, "", "", [query], None, None, 1, "stop", 0.1)])
    print_reply(Reply("when?", "1997", evidence_for("1997", record, chunks), {}))
    lines = capsys.readouterr().out.splitlines()
    assert "[quote in the chunk, but it holds nothing besides the answer: not verification]" in lines[1]
    assert "does not state the answer" in lines[2] and "quote found" not in "\n".join(lines)


def test_the_command_prints_each_round_and_the_answer_and_writes_the_trajectory(tmp_path, capsys):
    """Two questions on the tiny CPU models: under the CPU preset the last lead turn answers, so
    each question ends with an answer line; --json keeps one row per question."""
    path, out = tmp_path / "notes.md", tmp_path / "replies.jsonl"
    path.write_text(DOCUMENT)
    main([str(path), "Who directed Zorvan?", "Who captained the Aurel?", "models=tiny_cpu", "method.episode.max_turns=2",
          "--json", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("=== ") == 2 and printed.count("turn 1 (lead") == 2
    assert printed.count("\nanswer: ") == 2 and "answer: none" not in printed
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["question"] for r in rows] == ["Who directed Zorvan?", "Who captained the Aurel?"]
    assert all(r["answer"] and r["record"]["record"]["stop_reason"] == "answer" for r in rows)
    assert "lead: the last turn answers" in rows[0]["record"]["record"]["constraints"]


def test_unknown_presets_and_keys_are_refused_with_the_valid_names(tmp_path, capsys):
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    for argv, expected in (([str(path), "Q?", "models=tiny_cpuu"], "Available options in 'backend'"),
                           ([str(path), "Q?", "models=tiny_cpu", "+method.episode.max_turn=2"], "did you mean method.episode.max_turns"),
                           ([str(tmp_path / "missing.md"), "Q?"], "missing.md")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert expected in capsys.readouterr().err


def test_ask_against_a_local_openai_server_with_one_url_setting(tiny_qwen3_5_model, tiny_tokenizer, tmp_path, capsys):
    """`backend@models=openai` plus the server's URL is enough: the preflight reads GET /v1/models
    once (parser.serving.server says owned_by=parser: vLLM's dialect, so token ids and the CPU preset's
    constraints work), the served name `tiny-qwen3.5` is the model and, being an offline name,
    the tokenizer. The real parser.serving.server app, in process, over real HTTP on 127.0.0.1."""
    from parser.serving.backends.transformers import TransformersBackend
    from parser.serving.server import start_server

    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    backend = TransformersBackend(tiny_qwen3_5_model, tiny_tokenizer)
    with start_server(backend, tokenizer=tiny_tokenizer, model_name="tiny-qwen3.5", worker_id="w0") as server:
        main([str(path), "Who directed Zorvan?", "backend@models=openai", f"models.lead.base_url={server.url}",
              "method=parser_cpu", "method.episode.max_turns=2"])
    printed = capsys.readouterr().out
    assert "turn 1 (lead" in printed and "\nanswer: " in printed and "answer: none" not in printed
