"""The DCI sandbox always returns, leaves no process behind, and bounds what it reads.

    .venv/bin/pytest tests/test_dci_sandbox_bounds_on_cpu.py -q

Real `head`/`grep`/`rg` processes on a temp corpus. A FIFO fed by `yes` stands in for a command
that is still printing when its deadline comes; `/bin/sh` put in place of `head` stands in for a
program that forks (none of the six allowed ones does, so the process-group kill is checked on
a shell). Every process a test starts is found by a marker in its command line and killed by
pid in teardown, so a failing test leaves nothing running.
"""
from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parser.engine.sandbox import tools as dci, process as dci_process
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.text.chunking import chunk_document, render_paragraphs, split_paragraphs
from parser.engine.sandbox.tools import Refused, Sandbox, SandboxTools, _locate, materialize_corpus
from parser.methods.dci import PROMPTS as DCI_PROMPTS
from scripted_lead import CALL, ScriptedLead

needs_rg = pytest.mark.skipif(_locate("rg") is None, reason="ripgrep (rg) is not installed")
SECRET = "TOP-SECRET-7f3a"
GRACE_S = 2.0  # the kill grace the sandbox promises (dci.KILL_GRACE_S), as a literal: a probe, not a mirror


def processes_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture()
def marker():
    """A unique string for one test's processes; whatever still carries it is killed after."""
    tag = f"probe{uuid.uuid4().hex[:12]}"
    yield tag
    for pid in processes_with(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture()
def corpus(tmp_path):
    document = render_paragraphs(["Film X\nFilm X is a 1999 drama directed by Anna Berg.",
                                  "Anna Berg\nAnna Berg (1950-2011) was a Swedish director."])
    return materialize_corpus(document, tmp_path / "corpus")


@pytest.fixture()
def flood(corpus, marker):
    """A FIFO in the corpus that `yes` keeps full: reading it prints for ever."""
    fifo = corpus / f"{marker}.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", 'exec yes 0123456789abcdef > "$0"', str(fifo)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield fifo
    writer.kill()
    writer.wait()


def run(coro, within: float, busy_loop: bool = False):
    """Run a sandbox coroutine; fail (not hang) if it has not returned `within` seconds.
    `busy_loop`: other work holds the event loop 20 ms at a time, as other episodes do; the
    command's output then piles up between reads."""
    async def bounded():
        async def busy():
            while True:
                time.sleep(0.02)
                await asyncio.sleep(0)

        other = asyncio.ensure_future(busy()) if busy_loop else None
        try:
            return await asyncio.wait_for(coro, within)
        finally:
            if other is not None:
                other.cancel()

    try:
        return asyncio.run(bounded())
    except asyncio.TimeoutError:
        pytest.fail(f"the sandbox did not return within {within} s")


# -- class 1: a deadline that is always honoured, and no process left behind -----------------
def test_a_command_still_printing_at_its_deadline_returns(corpus, flood):
    """The collector used to stop reading at the deadline and then wait for a process whose
    output nobody drained: with the loop busy (so output had piled up), `call` never returned."""
    sandbox = Sandbox(corpus, timeout_s=0.5)
    started = time.monotonic()
    reply = run(sandbox.call("bash", {"command": f"head -c 100000000000 {flood.name}"}), within=10, busy_loop=True)
    assert "timed out after 0.5 s" in reply and "0123456789abcdef" in reply
    assert time.monotonic() - started < 0.5 + GRACE_S + 2
    assert len(reply) < sandbox.limits.max_output_chars + 500


def test_many_flooding_commands_at_once_all_return(corpus, flood):
    sandbox = Sandbox(corpus, timeout_s=0.5, slots=dci.ProcessSlots(4))

    async def many():
        return await asyncio.gather(*(sandbox.call("bash", {"command": f"head -c 100000000000 {flood.name}"}) for _ in range(6)))

    replies = run(many(), within=20, busy_loop=True)
    assert all("timed out" in reply for reply in replies)


def test_a_dci_episode_whose_command_floods_still_ends(corpus, flood, qwen3_5_tokenizer):
    """Through the real engine: DCI episodes never finished once the model ran such a command."""
    lead = ScriptedLead(qwen3_5_tokenizer, ["Look.\n</think>\n\n" + CALL.format("bash", "command", f"head -c 100000000000 {flood.name}")])
    engine = EpisodeEngine(lead, qwen3_5_tokenizer, config=EpisodeConfig())
    trajectory = run(engine.run_tools("Who directed Film X?", SandboxTools(Sandbox(corpus, timeout_s=0.5), "dci", templates=DCI_PROMPTS)), within=30, busy_loop=True)
    assert trajectory.answer == "x" and trajectory.stop_reason == "answer"
    assert "timed out after 0.5 s" in next(m["content"] for m in trajectory.messages if m["role"] == "tool")


def test_a_forking_command_is_killed_with_its_whole_group(corpus, marker):
    """A child that keeps the output pipe open outlived the kill of its parent alone, and the
    collector waited for it."""
    sandbox = Sandbox(corpus, timeout_s=0.5)
    sandbox.programs["head"] = "/bin/sh"  # stands in for a program that forks
    tag = f"{int(marker[-6:], 16) % 100000:05d}"
    child, leader = f"30.{tag}", f"31.{tag}"
    started = time.monotonic()
    try:
        reply = run(sandbox.call("bash", {"command": f"head -c 'sleep {child} & exec sleep {leader}'"}), within=10)
        assert "timed out" in reply
        assert time.monotonic() - started < 0.5 + GRACE_S + 2
        assert wait_until(lambda: not processes_with(child) and not processes_with(leader)), "a child outlived the timeout"
    finally:
        for pid in processes_with(child) + processes_with(leader):
            os.kill(pid, signal.SIGKILL)


def test_a_cancelled_call_kills_its_command(corpus, marker, monkeypatch):
    """An episode cancelled mid-command (eval interrupted, a reader timed out) must not leave
    the command running: one blocked on a FIFO would run for ever. The cancel comes once the call
    waits on its running command (asyncio itself kills a child whose start is cancelled, which
    would prove nothing about the sandbox)."""
    fifo = corpus / f"{marker}.fifo"
    os.mkfifo(fifo)  # no writer: opening it blocks for ever
    sandbox = Sandbox(corpus, timeout_s=60)

    def head_running():  # exec'd (not the limits shim any more), so the call is past starting it
        return any(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"head") for pid in processes_with(fifo.name))

    waiting = asyncio.Event()
    wait = asyncio.wait

    async def noting_wait(futures, **kwargs):  # run_limited's wait for its command to finish
        waiting.set()
        return await wait(futures, **kwargs)

    monkeypatch.setattr(dci_process.asyncio, "wait", noting_wait)

    async def cancel_midway():
        task = asyncio.ensure_future(sandbox.call("bash", {"command": f"head -n 1 {fifo.name}"}))
        assert await asyncio.to_thread(wait_until, head_running)
        await asyncio.wait_for(waiting.wait(), 20)  # past starting it: waiting on the running command
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # checked while the loop still runs (closing the loop would reap the transport anyway)
        return await asyncio.to_thread(wait_until, lambda: not processes_with(fifo.name), 3.0)

    assert run(cancel_midway(), within=20), "the cancelled command is still running"


def test_a_killed_parent_takes_its_commands_with_it(corpus, marker, tmp_path):
    """SIGKILL the process running the sandbox: its command (blocked on a FIFO, so it uses no
    CPU and no limit would ever stop it) must die too."""
    fifo = corpus / f"{marker}.fifo"
    os.mkfifo(fifo)
    script = textwrap.dedent(f"""
        import asyncio
        from parser.engine.sandbox.tools import Sandbox
        asyncio.run(Sandbox({str(corpus)!r}, timeout_s=120).call("bash", {{"command": "head -n 1 {fifo.name}"}}))
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[1])

    def command():  # the parent's own command line names the FIFO too
        return [pid for pid in processes_with(fifo.name) if pid != parent.pid]

    try:
        assert wait_until(lambda: bool(command()), timeout=30), "the command never started"
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not command()), "the command outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()


def test_a_turn_of_many_calls_runs_a_bounded_number_of_commands(corpus, marker):
    """A turn with thousands of calls started that many processes at once; by default a
    sandbox runs at most 8 (`max_processes`)."""
    fifo = corpus / f"{marker}.fifo"
    os.mkfifo(fifo)
    peak = run(_peak_processes(Sandbox(corpus, timeout_s=1), fifo, calls=12), within=30)
    assert 1 <= peak <= 8


def test_sandboxes_sharing_slots_share_the_bound(corpus, marker, tmp_path):
    """A method or reader holds one `ProcessSlots` for all its corpora."""
    fifo = corpus / f"{marker}.fifo"
    os.mkfifo(fifo)
    slots = dci.ProcessSlots(2)
    first, second = Sandbox(corpus, timeout_s=1, slots=slots), Sandbox(corpus, timeout_s=1, slots=slots)

    async def both():
        return await asyncio.gather(_peak_processes(first, fifo, 3), _peak_processes(second, fifo, 3))

    assert max(run(both(), within=30)) <= 2


async def _peak_processes(sandbox: Sandbox, fifo: Path, calls: int) -> int:
    """Run `calls` commands blocked on `fifo` until their timeout; the most seen at once."""
    peak = 0
    running = asyncio.gather(*(sandbox.call("bash", {"command": f"head -n 1 {fifo.name}"}) for _ in range(calls)))
    while not running.done():
        peak = max(peak, len(processes_with(fifo.name)))
        await asyncio.sleep(0.05)
    assert all("timed out" in reply for reply in await running)
    return peak


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, None])
def test_a_process_bound_that_would_hang_is_refused(limit):
    with pytest.raises(ValueError, match="max_processes"):
        dci.ProcessSlots(limit)


@pytest.mark.parametrize("name, value", [("timeout_s", 0), ("timeout_s", float("inf")), ("max_output_chars", -5),
                                         ("max_read_bytes", 0), ("max_command_chars", float("nan"))])
def test_a_sandbox_bound_that_cannot_work_is_refused(corpus, name, value):
    with pytest.raises(ValueError, match=name):
        Sandbox(corpus, **{name: value})


def test_sandbox_config_names_the_bad_key():
    with pytest.raises(ValueError, match="sandbox.max_processes must be a positive integer, got 0"):
        dci.SandboxLimits.from_config({"max_processes": 0})
    with pytest.raises(ValueError, match="unknown key.* timeout;"):
        dci.SandboxLimits.from_config({"timeout": 5})


# -- class 7: command parsing is linear and bounded ---------------------------------------------
def test_a_huge_command_is_refused_at_once(corpus):
    """`shlex` is quadratic in the longest argument: a 1 MB pattern took ~17 s to split."""
    sandbox = Sandbox(corpus)
    started = time.perf_counter()
    reply = run(sandbox.call("bash", {"command": "grep " + "a" * 1_000_000 + " ."}), within=60)
    assert "at most 8192" in reply
    assert time.perf_counter() - started < 2


def test_splitting_is_linear_in_the_longest_argument(corpus):
    sandbox = Sandbox(corpus, max_command_chars=3_000_000)
    started = time.perf_counter()
    argv = sandbox.parse("grep -e " + "a" * 1_000_000 + " -e '" + "b" * 1_000_000 + "' .")
    assert [len(a) for a in argv[1:]] == [2, 1_000_000, 2, 1_000_000, 1]
    assert time.perf_counter() - started < 2


_WORD = st.text(alphabet="ab -'\"\\.*x", min_size=0, max_size=12)


@settings(max_examples=400, deadline=None)
@given(st.lists(_WORD, min_size=1, max_size=5).map(" ".join))
def test_split_command_reads_words_as_shlex_does(command):
    """The linear splitter gives shlex's (POSIX) words, or refuses where shlex fails."""
    try:
        expected = shlex.split(command)
    except ValueError:
        with pytest.raises(Refused):
            dci.split_command(command)
        return
    assert dci.split_command(command) == expected


@pytest.mark.parametrize("command", ['grep "$1" .', "grep $# .", 'grep "$@" .', "grep $? ."])
def test_positional_and_special_parameters_are_refused_like_variables(corpus, command):
    """A model that writes `$1` means the shell's value, which there is none of."""
    reply = run(Sandbox(corpus).call("bash", {"command": command}), within=10)
    assert "variable expansion" in reply


# -- class 7: `read` counts lines as grep does, and streams ----------------------------------
SEPARATORS = ["\f", "\v", "\r", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_read_and_grep_agree_on_line_numbers(corpus, separator):
    """`read` split lines with `str.splitlines`, which also breaks at these; grep -n does not."""
    sandbox = Sandbox(corpus)
    (corpus / "odd.txt").write_text(f"one{separator}still one\ntwo\nNEEDLE three\n", encoding="utf-8")
    grep = run(sandbox.bash("grep -n NEEDLE odd.txt"), within=10)
    number = int(grep.split(":", 1)[0])
    assert number == 3
    assert "NEEDLE three" in sandbox.read("odd.txt", offset=number).splitlines()[0]
    assert "of 3;" in sandbox.read("odd.txt")
    assert run(sandbox.bash("wc -l odd.txt"), within=10).split()[0] == "3"


@needs_rg
def test_read_and_rg_agree_on_line_numbers_in_a_crlf_file(corpus):
    sandbox = Sandbox(corpus)
    (corpus / "dos.txt").write_bytes(b"a\r\nb\r\n\r\nNEEDLE\r\nlast without newline")
    assert run(sandbox.bash("rg -n NEEDLE dos.txt"), within=10).startswith("4:")
    page = sandbox.read("dos.txt")
    assert page.splitlines()[3] == "     4\tNEEDLE" and "of 5;" in page and "\r" not in page


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(["x", " ", *SEPARATORS]), max_size=6), min_size=1, max_size=30),
       st.booleans())
def test_read_counts_the_lines_grep_counts(tmp_path_factory, lines, trailing_newline):
    root = tmp_path_factory.mktemp("lines")
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    (root / "f.txt").write_text(text, encoding="utf-8")
    expected = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    page = Sandbox(root, read_window=1000).read("f.txt")
    numbered = [line for line in page.split("\n") if line[:6].strip().isdigit() and "\t" in line]
    assert len(numbered) == expected
    assert (f"of {expected};" in page) or (expected == 0 and "has 0 lines" in page)


def test_read_keeps_only_the_window_in_memory(corpus):
    """`read` loaded the whole file on every call (here 24 MB) to show 200 lines of it."""
    sandbox = Sandbox(corpus)
    (corpus / "big.txt").write_bytes(b"".join(b"line %07d %s\n" % (i, b"x" * 40) for i in range(500_000)))
    tracemalloc.start()
    try:
        page = sandbox.read("big.txt", offset=250_001)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.splitlines()[0].startswith("250001\tline 0250000") and "of 500000;" in page
    assert peak < 4 << 20, f"read held {peak / 2**20:.1f} MiB"


def test_read_scans_at_most_its_byte_bound(corpus):
    sandbox = Sandbox(corpus, max_read_bytes=1000)
    (corpus / "big.txt").write_text("".join(f"line {i}\n" for i in range(1000)))
    page = sandbox.read("big.txt")
    assert "lines 1-123 of at least 123" in page and "first 1000 bytes" in page and page.split("\n")[-2] == "   123\tline 122"
    beyond = sandbox.read("big.txt", offset=900)
    assert "past the end" not in beyond and "offset 900 is past the 123 lines in the first 1000 bytes" in beyond
    (corpus / "one.txt").write_text("w" * 5000)
    assert sandbox.read("one.txt").startswith("     1\twww") and "output truncated" in sandbox.read("one.txt")


def test_one_huge_line_is_clipped_not_held(corpus):
    sandbox = Sandbox(corpus)
    (corpus / "wide.txt").write_bytes(b"y" * 30_000_000 + b"\nsecond\n")
    tracemalloc.start()
    try:
        page = sandbox.read("wide.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "output truncated" in page and "lines 1-2 of 2" in page
    assert peak < 4 << 20


def test_read_does_not_block_the_event_loop(corpus):
    """`call("read")` ran the whole read on the loop: every other episode stalled meanwhile."""
    (corpus / "big.txt").write_bytes(b"z\n" * 2_000_000)
    sandbox = Sandbox(corpus)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    async def both():
        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks
        reply = await sandbox.call("read", {"file": "big.txt", "offset": 1_999_990})
        tick.cancel()
        return reply, ticks - before

    reply, during = run(both(), within=30)
    assert "1999990\tz" in reply and during > 0


# -- class 7: rg ignores ignore files above the corpus ------------------------------------------
@needs_rg
@pytest.mark.parametrize("name", [".ignore", ".rgignore"])
def test_ignore_files_above_the_corpus_hide_nothing(corpus, name):
    (corpus.parent / name).write_text("doc_00002.txt\n")
    reply = run(Sandbox(corpus).bash("rg -l Swedish"), within=10)
    assert reply.strip() == "doc_00002.txt"


@needs_rg
def test_a_gitignore_of_an_enclosing_repository_hides_nothing(corpus):
    (corpus.parent / ".git").mkdir()
    (corpus.parent / ".gitignore").write_text("*.txt\n")
    reply = run(Sandbox(corpus).bash("rg -c Anna"), within=10)
    assert sorted(line.split(":")[0] for line in reply.split()) == ["doc_00001.txt", "doc_00002.txt"]


@needs_rg
def test_lines_of_an_ignore_file_above_the_corpus_never_reach_the_model(corpus):
    """rg reports an unparsable ignore rule with the rule's text: a line of a file outside."""
    (corpus.parent / ".ignore").write_text(f"{{{SECRET}\n")
    reply = run(Sandbox(corpus).call("bash", {"command": "rg -l Anna"}), within=10)
    assert SECRET not in reply and "doc_00001.txt" in reply


# -- class 6: the corpus keeps every paragraph, whatever the document numbers ----------------------
def test_a_repeated_document_number_overwrites_no_paragraph(tmp_path):
    document = "Document 1:\nfirst text\n\nDocument 2:\nsecond text\n\nDocument 1:\nthird text"
    root = materialize_corpus(document, tmp_path / "c")
    texts = sorted(path.read_text() for path in root.iterdir())
    assert len(texts) == 3 and any("first text" in t for t in texts) and any("third text" in t for t in texts)
    reply = run(Sandbox(root).bash("grep -rl text ."), within=10)
    assert len(reply.split()) == 3


def test_zero_padded_numbers_that_collide_keep_both_paragraphs(tmp_path):
    root = materialize_corpus("Document 7:\nseven\n\nDocument 007:\nalso seven", tmp_path / "c")
    assert sorted(p.read_text().split("\n")[1] for p in root.iterdir()) == ["also seven", "seven"]


@pytest.mark.parametrize("digits", [300, 5000])
def test_a_very_long_document_number_is_text_not_a_crash(tmp_path, tiny_tokenizer, digits):
    """`int()` refuses more than 4,300 digits (every method's chunking crashed), and a file
    named after a 300-digit number cannot be created."""
    document = f"Document 1:\nfirst\n\nDocument {'9' * digits}:\nhostile\n\nDocument 2:\nlast"
    paragraphs = split_paragraphs(document)
    assert [p.index for p in paragraphs] == [1, 2] and "hostile" in paragraphs[0].text
    chunks = chunk_document(document, tiny_tokenizer, chunk_size=4096)
    assert "".join(c.text for c in chunks).count("hostile") == 1
    root = materialize_corpus(document, tmp_path / "c")
    assert sorted(p.name for p in root.iterdir()) == ["doc_00001.txt", "doc_00002.txt"]


def test_non_ascii_digits_do_not_pass_for_a_document_number():
    document = "Document 3:\nthree\n\nDocument \u0663:\nnot three"
    assert [p.index for p in split_paragraphs(document)] == [3]
