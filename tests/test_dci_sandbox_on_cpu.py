"""The DCI sandbox: the tools work, and every way out of the corpus is refused.

    .venv/bin/pytest tests/test_dci_sandbox_on_cpu.py -q

A real corpus in a temp dir, real `grep`/`find`/... processes; a "secret" file and a
canary path sit *outside* the corpus, and each test checks that their content never comes
back and that nothing is created outside. `rg` cases are skipped (with the reason) when
ripgrep is not installed.
"""
from __future__ import annotations

import asyncio
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parser.engine.sandbox.tools import Refused, Sandbox, _locate, materialize_corpus
from parser.engine.sandbox.options import GRAMMARS, OptionRefused, check_options
from parser.text.chunking import render_paragraphs

SECRET = "TOP-SECRET-7f3a"
# ripgrep comes with the baselines extra; where extras are required (make test), a missing rg fails
needs_rg = pytest.mark.skipif(_locate("rg") is None and os.environ.get("PARSER_REQUIRE_EXTRAS") != "1",
                              reason="ripgrep (rg) is not installed; pip install ripgrep (wheel) or apt-get install ripgrep")


@pytest.fixture()
def world(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n", encoding="utf-8")
    document = render_paragraphs([
        "Film X\nFilm X is a 1999 drama directed by Anna Berg.",
        "Anna Berg\nAnna Berg (1950-2011) was a Swedish director.",
        "Lake Y\nLake Y lies north of the town.",
    ])
    corpus = materialize_corpus(document, tmp_path / "corpus")
    (corpus / "escape_link").symlink_to(outside / "secret.txt")
    (corpus / "escape_dir").symlink_to(outside, target_is_directory=True)
    return Sandbox(corpus, timeout_s=10), outside, tmp_path


def run(coro):
    return asyncio.run(coro)


def outside_untouched(outside):
    return sorted(os.listdir(outside)) == ["secret.txt"] and (outside / "secret.txt").read_text() == f"{SECRET}\n"


# -- the tools work -----------------------------------------------------------------------
def test_materialize_writes_one_file_per_paragraph(world):
    sandbox, _, _ = world
    assert sorted(p.name for p in sandbox.root.glob("doc_*.txt")) == ["doc_00001.txt", "doc_00002.txt", "doc_00003.txt"]
    assert (sandbox.root / "doc_00002.txt").read_text().startswith("Document 2:\nAnna Berg\n")


def test_grep_finds_the_paragraph(world):
    sandbox, _, _ = world
    out = run(sandbox.bash("grep -rn 'directed by' ."))
    assert "doc_00001.txt:3:Film X is a 1999 drama directed by Anna Berg." in out
    assert run(sandbox.bash("grep -r 'no such phrase' .")) == "(no matches)"


@needs_rg
def test_rg_finds_the_paragraph(world):
    sandbox, _, _ = world
    out = run(sandbox.bash("rg -l 'Swedish director'"))
    assert out.strip() == "doc_00002.txt"


def test_ls_find_head_wc(world):
    sandbox, _, _ = world
    assert "doc_00003.txt" in run(sandbox.bash("ls"))
    assert "./doc_00001.txt" in run(sandbox.bash("find . -name 'doc_*' -type f"))
    assert run(sandbox.bash("head -n 2 doc_00003.txt")).splitlines() == ["Document 3:", "Lake Y"]
    assert run(sandbox.bash("wc -l doc_00001.txt")).split()[0] == "3"
    assert "doc_00002.txt" in run(sandbox.bash("find . \\( -name 'doc_00002*' -o -name nothing \\) -print"))


def test_read_numbers_lines_and_pages(world, tmp_path):
    sandbox, _, _ = world
    (sandbox.root / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 451)))
    first = sandbox.read("long.txt")
    assert first.splitlines()[0] == "     1\tline 1" and "   200\tline 200" in first and "line 201" not in first
    assert "call read with offset=201" in first
    last = sandbox.read("long.txt", offset=401)
    assert last.splitlines()[0] == "   401\tline 401" and "end of file" in last


def test_read_keeps_head_and_bash_keeps_tail_of_long_output(world):
    sandbox, _, _ = world
    (sandbox.root / "big.txt").write_text("".join(f"match {i:06d}\n" for i in range(30_000)))
    read = sandbox.read("big.txt")  # 200 short lines: under the cap
    assert "match 000000" in read
    (sandbox.root / "wide.txt").write_text("x" * 50_000 + "\n")
    wide = sandbox.read("wide.txt")
    assert wide.startswith("     1\txxx") and "output truncated: showing the first 20000" in wide
    out = run(sandbox.bash("grep match big.txt"))
    assert out.startswith("[output truncated: showing the last 20000")
    assert out.rstrip().endswith("match 029999") and "match 000000" not in out
    assert len(out) < 20_000 + 300


# -- every escape is refused --------------------------------------------------------------
@pytest.mark.parametrize(
    "command, message",
    [
        ("grep -r Anna . ; cat ../outside/secret.txt", "command chaining (;)"),
        ("grep -r Anna . && cat ../outside/secret.txt", "command chaining"),
        ("grep -r Anna . | sh", "pipes (|)"),
        ("grep -r Anna . || true", "pipes (|)"),
        ("grep `cat ../outside/secret.txt` .", "backticks"),
        ("grep \"`id`\" .", "backticks"),
        ("grep $(cat ../outside/secret.txt) .", "command substitution"),
        ("grep \"$(id)\" .", "command substitution"),
        ("grep $HOME .", "variable expansion"),
        ("grep -r Anna . > ../outside/pwned.txt", "redirection (>)"),
        ("grep -r Anna . >> ../outside/pwned.txt", "redirection (>)"),
        ("grep Anna < ../outside/secret.txt", "redirection (<)"),
        ("grep -r Anna . &", "background"),
        ("grep -r Anna .\ncat ../outside/secret.txt", "newlines"),
        ("(grep -r Anna .)", "subshells"),
        ("grep -r TOP ../outside", "outside the corpus"),
        ("grep -r TOP ..", "outside the corpus"),
        ("head -n 5 ../outside/secret.txt", "outside the corpus"),
        ("wc -l {outside}/secret.txt", "outside the corpus"),
        ("ls /", "outside the corpus"),
        ("find / -name secret.txt", "outside the corpus"),
        ("head escape_link", "outside the corpus"),
        ("grep -r TOP escape_dir", "outside the corpus"),
        ("grep -r TOP escape_dir/", "outside the corpus"),
        ("grep -f ../outside/secret.txt -r .", "outside the corpus"),
        ("grep -rf../outside/secret.txt .", "outside the corpus"),
        ("grep --file=../outside/secret.txt -r .", "outside the corpus"),
        ("grep -R TOP .", "follows symlinks"),
        ("ls -L escape_dir", "follows symlinks"),
        ("wc --files0-from=list.txt", "reads a list of arbitrary files"),
        ("find . -exec cat {{}} ;", "command chaining"),
        ("find . -exec cat {{}} \\;", "find -exec is not allowed"),
        ("find . -execdir cat {{}} +", "find -execdir is not allowed"),
        ("find . -delete", "find -delete is not allowed"),
        ("find . -fprint ../outside/pwned.txt", "find -fprint is not allowed"),
        ("find . -fprintf out.txt %p", "find -fprintf is not allowed"),
        ("find -L . -name x", "find -L is not allowed"),
        ("find . -follow", "find -follow is not allowed"),
        ("cat doc_00001.txt", "command 'cat' is not allowed"),
        ("python -c 'print(1)'", "command 'python' is not allowed"),
        ("sh -c 'cat ../outside/secret.txt'", "command 'sh' is not allowed"),
        ("rm -rf .", "command 'rm' is not allowed"),
        ("tee ../outside/pwned.txt", "command 'tee' is not allowed"),
        ("/bin/cat doc_00001.txt", "command '/bin/cat' is not allowed"),
        ("grep 'unterminated .", "unterminated"),
        ("", "non-empty"),
    ],
)
def test_escape_attempts_are_refused(world, command, message):
    sandbox, outside, tmp_path = world
    command = command.format(outside=outside)
    with pytest.raises(Refused) as refused:
        run(sandbox.bash(command))
    assert message in str(refused.value)
    reply = run(sandbox.call("bash", {"command": command}))  # the model sees the message, not a crash
    assert reply.startswith("Error: ") and message in reply and SECRET not in reply
    assert outside_untouched(outside)
    assert not (tmp_path / "pwned.txt").exists() and not (sandbox.root / "out.txt").exists()


@needs_rg
@pytest.mark.parametrize(
    "command, message",
    [
        ("rg --pre cat TOP .", "runs an external program"),
        ("rg --pre=cat TOP .", "runs an external program"),
        ("rg --hostname-bin=id TOP .", "runs an external program"),
        ("rg -z TOP .", "decompression"),
        ("rg -L TOP .", "follows symlinks"),
        ("rg --follow TOP .", "follows symlinks"),
        ("rg -nL TOP .", "follows symlinks"),
        ("rg TOP ../outside", "outside the corpus"),
        ("rg --ignore-file=../outside/secret.txt TOP", "outside the corpus"),
        ("rg TOP escape_dir", "outside the corpus"),
    ],
)
def test_rg_escape_attempts_are_refused(world, command, message):
    sandbox, outside, _ = world
    with pytest.raises(Refused) as refused:
        run(sandbox.bash(command))
    assert message in str(refused.value)
    assert outside_untouched(outside)


def test_recursive_search_does_not_follow_symlinks_out(world):
    sandbox, outside, _ = world
    out = run(sandbox.bash("grep -r TOP ."))
    assert SECRET not in out
    if _locate("rg"):
        assert SECRET not in run(sandbox.bash("rg TOP"))
        assert SECRET not in run(sandbox.bash("rg -uuu TOP ."))
    assert SECRET not in run(sandbox.bash("find . -name 'secret*'"))
    assert outside_untouched(outside)


def test_read_refuses_paths_outside(world):
    sandbox, outside, _ = world
    for path in ("../outside/secret.txt", str(outside / "secret.txt"), "escape_link", "escape_dir/secret.txt", "/etc/passwd"):
        with pytest.raises(Refused, match="outside the corpus"):
            sandbox.read(path)
        reply = run(sandbox.call("read", {"file": path}))
        assert reply.startswith("Error: ") and SECRET not in reply
    with pytest.raises(Refused, match="not a file"):
        sandbox.read(".")


def test_timeout_stops_the_command(world):
    sandbox, _, _ = world
    slow = Sandbox(sandbox.root, timeout_s=0.5)
    os.mkfifo(sandbox.root / "pipe")  # opening a FIFO with no writer blocks forever
    out = run(slow.bash("head -n 1 pipe"))
    assert "timed out" in out


def test_absolute_paths_inside_the_corpus_are_fine(world):
    sandbox, _, _ = world
    out = run(sandbox.bash(f"grep -l Swedish {sandbox.root}/doc_00002.txt"))
    assert out.strip().endswith("doc_00002.txt")


def test_without_rg_the_model_is_told_to_use_grep(world, monkeypatch):
    sandbox, _, _ = world
    import parser.engine.sandbox.tools as dci

    real = dci._locate
    monkeypatch.setattr(dci, "_locate", lambda name: None if name == "rg" else real(name))
    bare = Sandbox(sandbox.root)
    assert "rg" not in bare.programs
    assert "use grep instead" in run(bare.call("bash", {"command": "rg Anna"}))
    assert "doc_00002.txt" in run(bare.bash("grep -rl Swedish ."))


# -- options are an allowlist of exact spellings (GNU tools take abbreviations) ---------------
@pytest.mark.parametrize(
    "command, message",
    [
        ("grep --dereference-rec TOP .", "an abbreviation of --dereference-recursive"),
        ("grep --deref TOP .", "follows symlinks"),
        ("wc --files0 list.txt", "an abbreviation of --files0-from"),
        ("wc --files0-f=list.txt", "reads a list of arbitrary files"),
        ("grep --exclude-fr=list.txt -r x .", "reads a list of arbitrary files"),
        ("ls --derefe .", "follows symlinks"),
        ("grep -rnR TOP .", "follows symlinks"),
        ("head --line=3 doc_00001.txt", "spell options in full"),
        ("grep -D skip TOP .", "not an allowed option"),
    ],
)
def test_abbreviated_and_unknown_options_are_refused(world, command, message):
    sandbox, outside, _ = world
    (sandbox.root / "list.txt").write_bytes(str(outside / "secret.txt").encode() + b"\0")
    reply = run(sandbox.call("bash", {"command": command}))
    assert reply.startswith("Error: refused") and message in reply and SECRET not in reply


@settings(max_examples=300, deadline=None)
@given(program=st.sampled_from(sorted(GRAMMARS)), name=st.text(alphabet="abcdefghilmnoprstuvwxyz0-", min_size=1, max_size=24))
def test_a_long_option_passes_only_if_spelled_exactly_as_allowed(program, name):
    """GNU getopt maps a prefix to the option it abbreviates; only an exact allowed spelling
    (which getopt matches before any prefix) may get through."""
    grammar = GRAMMARS[program]
    allowed = grammar.long_flags | grammar.long_valued
    try:
        check_options(program, [f"--{name}", "x"])
    except OptionRefused:
        assert f"--{name}" not in allowed
    else:
        assert f"--{name}" in allowed


def test_glued_and_separate_values_are_read_like_getopt(world):
    sandbox, _, _ = world
    assert "doc_00002.txt" in run(sandbox.bash("grep -rlm1 -e Swedish ."))
    assert "Anna" in run(sandbox.bash("grep -rhA1 --max-count 1 Anna ."))
    assert run(sandbox.call("bash", {"command": "grep -e Anna -f../outside/secret.txt ."})).startswith("Error: refused: path")
    assert run(sandbox.call("bash", {"command": "grep -e x -- -x/../../outside"})).startswith("Error: refused: path")  # operands after --


# -- hard links, swapped symlinks, memory, odd arguments --------------------------------------
def test_hard_links_are_refused_by_read_and_bash(world):
    sandbox, outside, _ = world
    os.link(outside / "secret.txt", sandbox.root / "innocent.txt")
    assert "hard links" in run(sandbox.call("read", {"file": "innocent.txt"}))
    for command in ("grep -r TOP .", "wc -l doc_00001.txt"):
        reply = run(sandbox.call("bash", {"command": command}))
        assert "hard links" in reply and SECRET not in reply
    os.unlink(sandbox.root / "innocent.txt")
    assert "Anna" in run(sandbox.call("bash", {"command": "grep -r Anna ."}))


def test_a_symlink_swapped_in_after_the_check_is_not_followed(world, monkeypatch):
    """A second writer replaces a checked file (or its directory) by a symlink out between
    `resolve` and the open; the open is done without following symlinks, so it fails."""
    sandbox, outside, _ = world
    (sandbox.root / "sub").mkdir()
    (sandbox.root / "sub" / "note.txt").write_text("fine\n")
    real_resolve = Sandbox.resolve

    def resolve_then_swap(self, path):
        resolved = real_resolve(self, path)
        target = sandbox.root / path
        if target.is_dir():
            os.rename(target, sandbox.root / "moved")
            target.symlink_to(outside, target_is_directory=True)
        else:
            target.unlink()
            target.symlink_to(outside / "secret.txt")
        return resolved

    monkeypatch.setattr(Sandbox, "resolve", resolve_then_swap)
    for path in ("doc_00001.txt", "sub"):
        reply = run(sandbox.call("read", {"file": path if path != "sub" else "sub/note.txt"}))
        assert reply.startswith("Error:") and SECRET not in reply, reply


def test_swapped_directory_component_is_not_followed(world, monkeypatch):
    sandbox, outside, _ = world
    (sandbox.root / "sub").mkdir()
    (sandbox.root / "sub" / "secret.txt").write_text("fine\n")
    real_resolve = Sandbox.resolve

    def resolve_then_swap(self, path):
        resolved = real_resolve(self, path)
        os.rename(sandbox.root / "sub", sandbox.root / "moved")
        (sandbox.root / "sub").symlink_to(outside, target_is_directory=True)
        return resolved

    monkeypatch.setattr(Sandbox, "resolve", resolve_then_swap)
    reply = run(sandbox.call("read", {"file": "sub/secret.txt"}))
    assert reply.startswith("Error:") and SECRET not in reply


def test_memory_limit_stops_a_backtracking_regex_before_the_timeout(world):
    """GNU regex with a back-reference grows its state log without bound on a long line."""
    sandbox, _, _ = world
    (sandbox.root / "long.txt").write_text("a" * 200_000 + "\n")
    limited = Sandbox(sandbox.root, timeout_s=20, memory_limit_bytes=64 << 20)
    started = time.perf_counter()
    reply = run(limited.call("bash", {"command": r"grep -E '(a*)*\1$' long.txt"}))
    assert "memory exhausted" in reply and "exit status" in reply
    assert time.perf_counter() - started < 15


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("read", {"file": "doc_00001.txt", "offset": float("inf")}),
        ("read", {"file": "doc_00001.txt", "offset": float("nan")}),
        ("read", {"file": "doc_00001.txt", "offset": "1" * 400}),
        ("read", {"file": "doc_00001.txt", "offset": [3]}),
        ("read", {"file": "doc_\ud800.txt"}),
        ("read", {"file": {"path": "x"}}),
        ("bash", {"command": "grep \udfff ."}),
        ("bash", {"command": ["grep", "x"]}),
        ("bash", ["grep -r x ."]),
        ("read", None),
        ("bash", "grep -r x ."),
    ],
)
def test_odd_argument_values_become_error_text(world, name, arguments):
    sandbox, _, _ = world
    reply = run(sandbox.call(name, arguments))
    assert reply.startswith("Error: ")


def test_numeric_offsets_from_json_still_work(world):
    sandbox, _, _ = world
    for offset in (2, 2.0, "2", " 2 "):
        assert run(sandbox.call("read", {"file": "doc_00001.txt", "offset": offset})).lstrip().startswith("2\t")


@needs_rg
def test_many_rg_threads_still_run_under_the_memory_limit(world):
    """glibc reserves 64 MB per thread arena; without MALLOC_ARENA_MAX, `rg -j 64` under a
    1 GiB address-space limit panics spawning threads and hangs until the timeout."""
    sandbox, _, _ = world
    started = time.perf_counter()
    reply = run(sandbox.call("bash", {"command": "rg -j 64 -c Anna ."}))
    assert "doc_00002.txt" in reply and "exit status" not in reply
    assert time.perf_counter() - started < 5


def test_a_corpus_deeper_than_path_max_keeps_bash_and_is_still_checked(world):
    """A directory chain whose full path is longer than PATH_MAX (4096): listing it by full path
    failed every command; the check now walks it by descriptors, to the bottom."""
    sandbox, outside, _ = world
    name = "d" * 200
    fd = os.open(sandbox.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(30):  # 30 x 201 bytes: past PATH_MAX
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        assert "Anna" in run(sandbox.call("bash", {"command": "grep -r Anna doc_00001.txt"}))
        os.link(outside / "secret.txt", "deep.txt", dst_dir_fd=fd)  # a hard link at the bottom is still found
        reply = run(sandbox.call("bash", {"command": "grep -r Anna doc_00001.txt"}))
        assert "hard links" in reply and "deep.txt" in reply and SECRET not in reply
        os.unlink("deep.txt", dir_fd=fd)
    finally:
        os.close(fd)
