"""The exact options each DCI search command may take, read the way the program reads them.

`parser.engine.sandbox.tools.Sandbox` runs model-written `rg`/`grep`/`ls`/`head`/`wc` commands. A denylist of
dangerous spellings cannot hold: GNU tools accept any unambiguous *prefix* of a long option, so
a refused `--dereference-recursive` is still `--deref`, and `--files0-from` is `--files0`. So
this is an allowlist of exact spellings, and arguments are walked as getopt walks them: a
short-option bundle (`-rnA3`) is letters until one that takes a value, whose value is the rest
of the bundle or the next argument; `--name=value` or `--name value`; `--` ends the options.
(`find` has its own expression allowlist in `parser.engine.sandbox.tools`.)

    path_values = check_options("grep", ["-rn", "--include=*.txt", "Anna", "."])
"""
from __future__ import annotations

import dataclasses


class OptionRefused(ValueError):
    """An option outside the allowlist; the message says why and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Grammar:
    flags: str  # single letters without a value, bundled freely (`-rnw`)
    valued: str  # single letters that take a value: glued (`-m5`) or the next argument
    long_flags: frozenset[str]
    long_valued: frozenset[str]
    path_valued: frozenset[str] = frozenset()  # options whose value is a file the tool opens
    digits: bool = False  # `-5`: grep's context / head's line count


def _long(*names: str) -> frozenset[str]:
    return frozenset(f"--{name}" for name in names)


GRAMMARS = {
    "grep": Grammar(
        flags="ivywxclLnhHoqsrEFGPabIZzTU",
        valued="efmABCd",
        long_flags=_long("ignore-case", "no-ignore-case", "invert-match", "word-regexp", "line-regexp", "count",
                         "files-with-matches", "files-without-match", "line-number", "no-filename", "with-filename",
                         "only-matching", "quiet", "silent", "no-messages", "recursive", "extended-regexp",
                         "fixed-strings", "basic-regexp", "perl-regexp", "byte-offset", "text", "null", "null-data",
                         "initial-tab"),
        long_valued=_long("regexp", "file", "max-count", "after-context", "before-context", "context", "include",
                          "exclude", "exclude-dir", "binary-files", "directories"),
        path_valued=frozenset({"-f", "--file"}),
        digits=True,
    ),
    "rg": Grammar(
        flags="iSsvwxclnNHIoqFUPau0bph.",
        valued="efgtTmABCMjrEd",
        long_flags=_long("ignore-case", "smart-case", "case-sensitive", "invert-match", "word-regexp", "line-regexp",
                         "count", "count-matches", "files-with-matches", "files-without-match", "files", "line-number",
                         "no-line-number", "with-filename", "no-filename", "only-matching", "quiet", "fixed-strings",
                         "multiline", "multiline-dotall", "pcre2", "text", "hidden", "no-ignore", "unrestricted",
                         "vimgrep", "column", "heading", "no-heading", "byte-offset", "trim", "null", "stats",
                         "type-list", "no-messages", "json"),
        long_valued=_long("regexp", "file", "glob", "iglob", "type", "type-not", "max-count", "after-context",
                          "before-context", "context", "max-columns", "max-depth", "max-filesize", "threads", "replace",
                          "sort", "sortr", "encoding", "ignore-file"),
        path_valued=frozenset({"-f", "--file", "--ignore-file"}),
    ),
    "ls": Grammar(
        flags="aAlhSrtR1dFpsnUXvmCxgoi",
        valued="",
        long_flags=_long("all", "almost-all", "recursive", "human-readable", "size", "reverse", "classify", "directory"),
        long_valued=_long("sort"),
    ),
    "head": Grammar(flags="qvz", valued="nc", long_flags=_long("quiet", "silent", "verbose", "zero-terminated"),
                    long_valued=_long("lines", "bytes"), digits=True),
    "wc": Grammar(flags="lwcmL", valued="", long_flags=_long("lines", "words", "bytes", "chars", "max-line-length"),
                  long_valued=frozenset()),
}

# Why the options a model most often reaches for are refused (others: "not an allowed option").
WHY = {
    "--pre": "runs an external program", "--pre-glob": "runs an external program",
    "--hostname-bin": "runs an external program", "--search-zip": "runs decompression programs",
    "-z": "runs decompression programs", "--follow": "follows symlinks out of the corpus",
    "-L": "follows symlinks out of the corpus", "-R": "follows symlinks out of the corpus",
    "--dereference-recursive": "follows symlinks out of the corpus",
    "--dereference": "follows symlinks out of the corpus", "--files0-from": "reads a list of arbitrary files",
    "--exclude-from": "reads a list of arbitrary files",
}
_REFUSED_SHORT = {"rg": "zL", "grep": "R", "ls": "L"}  # letters with a WHY entry, per program


def _refuse(program: str, option: str, grammar: Grammar) -> OptionRefused:
    if option.startswith("--"):
        meant = sorted(name for name in WHY if name.startswith(option) and name != option)
        if option in WHY:
            why = WHY[option]
        elif meant:  # a GNU abbreviation: the tool would read it as the full option
            why = f"an abbreviation of {meant[0]}, which {WHY[meant[0]]}"
        else:
            why = "not an allowed option; spell options in full"
        allowed = " ".join(sorted(grammar.long_flags | grammar.long_valued))
    else:
        why = WHY[option] if option[1:] in _REFUSED_SHORT.get(program, "") else "not an allowed option"
        allowed = "-" + "".join(sorted(grammar.flags + grammar.valued))
    return OptionRefused(f"refused: {program} {option} is not allowed ({why}); allowed: {allowed}")


def check_options(program: str, args: list[str]) -> list[str]:
    """Refuse any option outside `program`'s grammar; return what the caller must confine besides
    the plain operands: values of path-valued options (`-fFILE`, `--file=FILE`, `--ignore-file F`)
    and every operand after `--`."""
    grammar = GRAMMARS[program]
    paths: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            paths.extend(args[i:])  # all operands now, even ones that start with '-'
            break
        if arg.startswith("--"):
            name, has_value, value = arg.partition("=")
            if name in grammar.long_flags:
                continue
            if name not in grammar.long_valued:
                raise _refuse(program, name, grammar)
            if not has_value and i < len(args):
                value, i = args[i], i + 1
            if name in grammar.path_valued:
                paths.append(value)
        elif arg.startswith("-") and len(arg) > 1:
            for position, letter in enumerate(arg[1:], start=1):
                if letter in grammar.flags or (grammar.digits and letter.isdigit()):
                    continue
                if letter not in grammar.valued:
                    raise _refuse(program, f"-{letter}", grammar)
                value = arg[position + 1 :]
                if not value and i < len(args):
                    value, i = args[i], i + 1
                if f"-{letter}" in grammar.path_valued:
                    paths.append(value)
                break
    return paths
