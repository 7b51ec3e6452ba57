"""`python -m parser.cli.ask`: your own file and questions, rounds printed as they end, the answer
with the evidence it rests on (each quote checked against its chunk), on the real engine with the
tiny in-process models. Input that cannot be read (not UTF-8, a directory, nothing, a blank
question) and a `--json` destination that cannot be written are refused in one line before any
model loads; each answer is on disk as soon as it exists, so a Ctrl-C or a failed server keeps it.

    .venv/bin/pytest tests/test_ask_on_cpu.py -q
"""
from __future__ import annotations

import re

import orjson
import pytest

from parser.cli.ask import Reply, evidence_for, main, print_reply, read_document, split_words
from parser.records.jsonl import parse_json
from parser.records.trajectory import Finding, QueryRecord, Trajectory, Turn
from parser.text.chunking import Chunk
from parser.base.config import ConfigError
from parser.text.quotes import check_quote
from support.slow_server import Trickle, http_reply

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
    ("the lab was founded in 1997", "in", False, "the answer is only common words"),  # "in" occurs in the quote
    ("It was shot in the winter", "it", False, "the answer is only common words"),
    ("directed by Miro Tal.", "!!!", False, "does not state the answer"),  # punctuation only
])
def test_a_quote_verifies_only_when_it_states_the_answer_with_something_about_it(quote, answer, verifies, label):
    """Issue 55 item 8: "a", "the" or "in 1997" occur in the chunk but verify nothing."""
    verdict = check_quote(quote, answer, CHUNK)
    assert verdict.verifies is verifies and label in verdict.label
    assert verdict.in_chunk is (bool(quote) and quote in CHUNK)


def test_the_answer_repeated_is_not_a_statement():
    """Four informative words pass as a statement only when the answer is one: "1997" four times is not."""
    verdict = check_quote("1997 1997 1997 1997", "1997", "Years: 1997 1997 1997 1997.")
    assert verdict.in_chunk and not verdict.verifies and "holds nothing besides the answer" in verdict.label


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
    assert re.search(r"^the document: \d+ chunks, each read by its own subagent$", printed, re.MULTILINE)
    assert printed.count("\nanswer: ") == 2 and "answer: none" not in printed
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["question"] for r in rows] == ["Who directed Zorvan?", "Who captained the Aurel?"]
    assert all(r["answer"] and r["record"]["record"]["stop_reason"] == "answer" for r in rows)
    assert "lead: the last turn answers" in rows[0]["record"]["record"]["constraints"]



@pytest.mark.parametrize("method, settings", [
    # one iteration, then rlms' fallback call; the REPL worker is the real sandbox (rlm_script.sandbox_settings)
    ("rlm", ["method.episode.max_turns=1", "method.episode.max_tokens_per_turn=8", "method.orchestrator=false",
             "method.sub_max_new_tokens=8"]),
    # one 1,024-token chunk: a plan, a write (unless the plan stops it) and the answer, each two short stages
    ("infmem", ["method.chunk_size=1024", "method.thinking_budget=4", "method.max_new_tokens=4"]),
])
def test_the_peers_answer_a_question_through_ask_on_the_tiny_models(method, settings, tmp_path, capsys):
    """Issue 54: `parser ask FILE "q" method=rlm|infmem` runs each peer on the tiny CPU models and
    writes its record (RLM's iterations and usage, InfMem's plans) as any method's."""
    import asyncio

    from rlm_script import sandbox_settings

    path, out = tmp_path / "notes.md", tmp_path / "replies.jsonl"
    path.write_text(DOCUMENT)
    sandbox = [f"method.sandbox.{k}={str(v).lower()}" for k, v in asyncio.run(sandbox_settings()).items()] if method == "rlm" else []
    main([str(path), "Who directed Zorvan?", "models=tiny_cpu", f"method={method}", *settings, *sandbox, "--json", str(out)])
    printed = capsys.readouterr().out
    assert "\nanswer: " in printed and "subagent" not in printed  # it said every method read as ParSer does
    reads = {"rlm": "held whole in the REPL, read by the root model's code and its llm_query sub-calls",
             "infmem": "read chunk by chunk in one pass, each step's notes carried into the next"}[method]
    assert f"the document: {reads}\n" in printed
    (row,) = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    result = row["record"]
    if method == "rlm":
        rlm = result["record"]["rlm"]
        assert rlm["stop_reason"] == "fallback" and result["steps"] == 2 == rlm["usage"]["root"]["calls"]
        assert result["answer"] == rlm["answer"] and rlm["rlms_version"]
    else:
        plans, updates = result["record"]["plans"], result["record"]["updates"]
        assert len(plans) == result["record"]["num_chunks"] == 1 and result["steps"] == len(plans) + len(updates) + 1

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


# ---------------------------------------------------------------------- refused before any model loads
@pytest.fixture
def no_model(monkeypatch):
    """`build` is where models load (the backend preset, then the method): reaching it fails the test."""
    def build(cfg):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("parser.cli.ask.build", build)


def refused(argv, capsys) -> str:
    """The command's one stderr line, having checked it exits 2."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("content,stdin,question,expected", [
    ("Zorvan is a film.\ncafé".encode("latin-1"), None, "Q?", r"notes\.md:2: not UTF-8 text \(byte 21: b'\\xe9'\)"),
    ("Zorvan".encode("utf-16"), None, "Q?", r"notes\.md:1: not UTF-8 text \(byte 0"),
    (None, None, "Q?", r"notes\.md: a directory, not a file"),
    (b"", None, "Q?", r"notes\.md: the document is empty"),
    (None, b"", "Q?", r"stdin \(-\): the document is empty"),
    (None, b" \n\t\n", "Q?", r"stdin \(-\): the document is empty"),
    (None, b"Zorvan \xff\xfe", "Q?", r"stdin \(-\):1: not UTF-8 text \(byte 7"),
    (DOCUMENT.encode(), None, "", r"question 1 is empty \(''\)"),
    (DOCUMENT.encode(), None, " \t ", r"question 1 is empty \(' \\t '\)"),
], ids=["latin-1", "utf-16", "directory", "empty-file", "empty-stdin", "blank-stdin", "stdin-not-utf8",
        "empty-question", "blank-question"])
def test_input_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch, capsys, no_model, content, stdin, question,
                                                         expected):
    import io

    path = tmp_path / "notes.md"
    if content is None and stdin is None:
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert re.search(expected, refused(["-" if stdin is not None else str(path), question, "models=tiny_cpu"], capsys))


def test_a_document_too_big_or_not_text_is_refused_unread(tmp_path, capsys, no_model):
    """A 2 GB sparse file is refused by its size (it was read whole), /dev/zero once the bound has
    come (it never ended), UTF-16 without its byte-order mark by its NUL bytes (valid UTF-8)."""
    import os

    from parser.cli.ask import MAX_DOCUMENT_BYTES

    sparse, utf16 = tmp_path / "sparse.txt", tmp_path / "utf16.txt"
    with open(sparse, "wb") as handle:
        handle.truncate(2 * 2**30)
    utf16.write_bytes("Zorvan\nis a film".encode("utf-16-le"))
    for path, said in ((sparse, f"{sparse}: 2,147,483,648 bytes, over the {MAX_DOCUMENT_BYTES:,} a document may be"),
                       ("/dev/zero", f"/dev/zero: more than the {MAX_DOCUMENT_BYTES:,} bytes a document may be"),
                       (utf16, f"{utf16}:1: a NUL byte (byte 1): not a text file (UTF-16?")):
        assert said in refused([str(path), "Q?", "models=tiny_cpu"], capsys)
    os.unlink(sparse)


@pytest.mark.parametrize("word", ["x=3: what is x?", "answer=yes?"])
def test_a_question_that_starts_with_word_equals_is_refused_by_name_and_asked_after_the_separator(
        tmp_path, capsys, no_model, word):
    """It was taken for a setting (`x`, `answer`) and failed as an unknown key, with no word on how to ask it."""
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    said = refused([str(path), word, "models=tiny_cpu"], capsys)
    assert f"{word!r} looks like a setting, but {word.split('=')[0]!r} is none of parser ask's" in said
    assert f"put it after `--`: parser ask FILE -- '{word}'" in said
    assert split_words(["Who?", "models=tiny_cpu", "method.episode.max_turns=2"], [word, "method=rlm"]) == (
        ["Who?", word, "method=rlm"], ["models=tiny_cpu", "method.episode.max_turns=2"])
    with pytest.raises(AssertionError, match="a model was loaded"):  # every check passed: the question is asked
        main([str(path), "models=tiny_cpu", "--", word])


def test_a_mistyped_setting_is_refused_and_a_setting_with_a_space_is_told_about_the_separator(tmp_path, capsys, no_model):
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    assert "'metod' is none of parser ask's (backend@models, cpu_budgets, method, models) (did you mean method?)" in \
        refused([str(path), "Q?", "metod=rlm"], capsys)
    assert "if 'method=which is best?' is a question, put it after `--`" in \
        refused([str(path), "Q?", "method=which is best?"], capsys)


def test_a_second_question_that_is_blank_is_named_by_its_place(tmp_path, capsys, no_model):
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    assert "question 2 is empty ('   ')" in refused([str(path), "Who directed Zorvan?", "   ", "models=tiny_cpu"], capsys)


@pytest.mark.parametrize("where", ["directory", "missing-folder", "file-as-folder", "cannot-create", "read-only-folder",
                                   "the-document", "fifo-without-reader"])
def test_a_json_destination_that_cannot_be_written_is_refused_before_any_model_loads(tmp_path, capsys, no_model, where):
    import os

    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    out, expected = {"directory": (tmp_path, "a directory, not a file"),
                     "missing-folder": (tmp_path / "no" / "out.jsonl", f"the folder {tmp_path / 'no'} does not exist"),
                     "file-as-folder": (path / "out.jsonl", f"{path} is a file, not a folder"),
                     "the-document": (tmp_path / "." / "notes.md", "that is the document being asked; writing would overwrite it"),
                     "fifo-without-reader": (tmp_path / "fifo", "a FIFO that no process reads; start its reader first"),  # it waited for ever
                     "cannot-create": ("/proc/self/answers.jsonl", "cannot be written"),  # even root cannot
                     "read-only-folder": (tmp_path / "ro" / "out.jsonl", "cannot be written (Permission denied)")}[where]
    if where == "read-only-folder":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder; /proc/self stands for an unwritable one")
        (tmp_path / "ro").mkdir(mode=0o500)
    if where == "fifo-without-reader":
        os.mkfifo(out)
    assert f"--json {out}: {expected}" in refused([str(path), "Q?", "models=tiny_cpu", "--json", str(out)], capsys)
    assert path.read_text() == DOCUMENT


def test_a_destination_that_fills_up_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """/dev/full opens but refuses every write: the failed line is said once, exit 2 (closing the
    file retried the unflushed line and ended in an OSError traceback)."""
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    monkeypatch.setattr("parser.cli.ask.build", lambda cfg: (Answers(), {}))
    with pytest.raises(SystemExit) as exit_:
        main([str(path), "Q1?", "Q2?", "models=tiny_cpu", "--json", "/dev/full"])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "parser.cli.ask: error: --json /dev/full: cannot be written (No space left on device); 0 of 2 answers kept in /dev/full"]


class Answers:
    """Stands in for the method and its models: answers every question at once."""

    reading = "not read: every question is answered at once"

    async def run(self, sample):
        from parser.methods import MethodResult

        return MethodResult(answer="Miro Tal", steps=1, wall_s=0.0)

    async def aclose(self):
        pass


def test_jsonl_records_end_at_newline_only(tmp_path):
    """U+2028, U+2029 and U+0085 are valid unescaped inside a JSON string (orjson writes them raw);
    `str.splitlines` cut a record there and refused the file as 'not JSON'. CRLF ends a line too."""
    path = tmp_path / "passages.jsonl"
    passages = ["Zorvan\u2028is a film.", {"text": "Miro Tal\u2029was born in 1950."}, "Ines\x85Varo", "Aurel\u2028\u2029"]
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(orjson.dumps(p) for p in passages) + b"\r\n")
    assert read_document(path) == ("Document 1:\nZorvan\u2028is a film.\n\nDocument 2:\nMiro Tal\u2029was born in 1950.\n\n"
                                   "Document 3:\nInes\x85Varo\n\nDocument 4:\nAurel")


# ---------------------------------------------------------------------- every answer kept
class TwoThenStop:
    """Stands in for the method and its models: answers the first two questions, then on the third
    either Ctrl-C lands or the model server fails for good. Before each question it reads the
    `--json` file: every earlier answer must already be on disk."""

    reading = "not read: two answers, then the stop"

    def __init__(self, out, stop: BaseException):
        self.out, self.stop, self.closed = out, stop, False

    async def run(self, sample):
        from parser.methods import MethodResult

        number = int(sample.id.removeprefix("ask-"))
        assert len(self.out.read_bytes().splitlines()) == number  # written and flushed as answered
        if number == 2:
            raise self.stop
        return MethodResult(answer=f"answer {number}" + " \ud83d" * number, steps=1, wall_s=0.0)  # a lone surrogate: model text

    async def aclose(self):
        self.closed = True


@pytest.mark.parametrize("stop,code,line", [
    (KeyboardInterrupt(), 130, "interrupted; 2 of 3 answers kept in {out}"),
    ("server", 1, "error: BackendError: POST http://127.0.0.1:9/v1/completions: HTTP 503: overloaded (after 4 attempts)"
                  "; 2 of 3 answers kept in {out}"),
], ids=["ctrl-c", "server-failed"])
def test_each_answer_is_written_as_it_comes_so_a_stop_on_the_third_keeps_two(tmp_path, monkeypatch, capsys, stop, code, line):
    from parser.serving.retry import CallFailed
    from parser.serving.types import BackendError

    path, out = tmp_path / "notes.md", tmp_path / "answers.jsonl"
    path.write_text(DOCUMENT)
    if stop == "server":
        stop = CallFailed(BackendError("POST http://127.0.0.1:9/v1/completions: HTTP 503: overloaded", retryable=True), 4)
    method = TwoThenStop(out, stop)
    monkeypatch.setattr("parser.cli.ask.build", lambda cfg: (method, {}))
    with pytest.raises(SystemExit) as exit_:
        main([str(path), "Q1?", "Q2?", "Q3?", "models=tiny_cpu", "--json", str(out)])
    assert exit_.value.code == code and method.closed
    assert capsys.readouterr().err.splitlines() == [f"parser.cli.ask: {line.format(out=out)}"]
    assert [parse_json(row)["answer"] for row in out.read_bytes().splitlines()] == ["answer 0", "answer 1 \ufffd"]


def test_a_failing_server_ends_the_command_in_one_line_each_retry_said(tmp_path, capsys):
    """The OpenAI preset against a server that lists its model and then answers every completion
    with a 503: each retry is one stderr line, then the command ends in one line naming the URL
    and the reason (exit 1), never a traceback. A server failing its model list ends it in one
    line before any model loads (exit 2). Real HTTP on 127.0.0.1; the server is an aiohttp app."""
    from aiohttp import web

    from parser.serving.server import ServerHandle

    async def models(request):
        return web.json_response({"data": [{"id": "tiny-qwen3.5", "object": "model", "owned_by": "parser"}]})

    async def overloaded(request):
        return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", overloaded)
    path = tmp_path / "notes.md"
    path.write_text(DOCUMENT)
    with ServerHandle(app) as server:
        with pytest.raises(SystemExit) as exit_:
            main([str(path), "Who directed Zorvan?", "backend@models=openai", f"models.lead.base_url={server.url}",
                  "method=parser_cpu", "method.episode.max_attempts=3", "method.episode.retry_backoff_s=0.01"])
    err = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 1
    assert [line.split(" in ")[0] for line in err[:-1]] == ["[parser] retry 2 of 3", "[parser] retry 3 of 3"]
    assert all(f"POST {server.url}/v1/completions: HTTP 503: overloaded" in line for line in err)
    assert err[-1].startswith("parser.cli.ask: error: ") and err[-1].endswith("(after 3 attempts)")
    with Trickle(http_reply(b"internal error", "500 Internal Server Error"), at_once=1 << 10) as failing:
        line = refused([str(path), "Q?", "backend@models=openai", f"models.lead.base_url={failing.url}"], capsys)
    assert f"models.lead: GET {failing.url}/v1/models answered 500 Internal Server Error ('internal error')" in line
