"""Ask your own document: one file (or stdin) and one or more questions, answered with evidence.

    parser ask notes.md "Who founded the lab?"                  # ParSer on this machine's default models
    parser ask notes.md "Who founded it?" "When?" models=tiny_cpu   # any backend preset (configs/backend/)
    cat report.txt | parser ask - "What failed?" --json out.jsonl    # stdin; trajectories as JSONL
    parser ask paper.md "Q?" method=memagent                    # any method (configs/method/)
    parser ask paper.md "Q?" method=rlm                         # the peers: rlm, infmem (on a CPU: rlm_cpu, infmem_cpu)
    parser ask notes.md "Q?" backend@models=openai models.lead.base_url=http://127.0.0.1:8000

    from parser.cli.ask import ask
    for reply in ask("notes.md", ["Who founded the lab?"], models="tiny_cpu"):
        print(reply.answer, reply.evidence)

The file is read as the method's document: text or Markdown as it is (plain text needs no
`Document i:` headers; the protocol's chunker windows it), JSONL as one passage per line (a JSON
string, or an object's `text`, `content` or `context`), rendered as numbered documents. Settings
are Hydra overrides (`key=value`) of `configs/ask.yaml`, the same presets eval.run composes. A
`key=value` word is a setting when its key starts with one of ask's own (`models`,
`backend@models`, `method`, `cpu_budgets`); another `word=...` is refused, naming it, never taken
for a question or a setting in silence. A question that starts with `word=` goes after `--`, where
every word is a question:

    parser ask notes.md models=tiny_cpu -- "x=3: what is x?"

Each
round is printed as it ends; then the answer and the findings it rests on: the chunk each came
from and its quote, checked verbatim against that chunk's text; "quote found in the chunk" is
printed only for a quote that also states the answer with something said about it
(`parser.text.quotes`), never for "the" or "in 1997".

Nothing loads until everything it needs is known to be usable: the file decodes as UTF-8 (else
`file:line` and the byte), holds no NUL byte, is not a directory, empty or over
`MAX_DOCUMENT_BYTES`, no question is blank, the settings compose, and the `--json` destination
opens for writing (not the document itself, not a FIFO nobody reads); each is one line and exit 2. Each
answer's `--json` line is written and flushed as soon as it exists, so Ctrl-C (or SIGTERM, exit
130) or a server that fails for good (one line naming it and the reason, exit 1) on question 3
keeps questions 1 and 2.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Sequence

import orjson

from parser.engine import progress
from parser.text.chunking import Chunk, render_paragraphs
from parser.text.quotes import check_quote
from parser.base.config import ConfigError, check_episode_keys, preset_spelling
from parser.base.resources import config_dir
from parser.base.signals import stop_on_signals
from parser.cli.output import open_output, write_line
from parser.records.trace import Trace
from parser.records.trajectory import Trajectory
from parser.serving.types import BackendError
from parser.text.reward import normalize_answer

CONFIG_DIR = config_dir()
MAX_DOCUMENT_BYTES = 64 * 2**20  # 64 MiB, ~16M tokens: 16 times the longest context in the paper's grid
PASSAGE_FIELDS = ("text", "content", "context")  # what a JSONL line's passage may be called
OVERRIDE = re.compile(r"^[+~]?([A-Za-z_][\w@./-]*)=")  # `key=value` (a question has a space before any `=`)
QUESTIONS_ONLY = "--"  # every word after it is a question, whatever it looks like


@dataclasses.dataclass
class Evidence:
    """One finding the answer rests on: the chunk it came from, its quote, whether the quote occurs
    verbatim in that chunk (a reader may paraphrase or invent; this says which) and whether it
    verifies the finding's answer (`parser.text.quotes`: "in 1997" or "the" does not)."""

    chunk_index: int
    agent: str
    answer: str
    quote: str
    in_chunk: bool
    verifies: bool
    check: str  # what is printed beside it (`parser.text.quotes.check_quote`)


@dataclasses.dataclass
class Reply:
    question: str
    answer: str | None
    evidence: list[Evidence]
    record: dict[str, Any]  # the method's result as a JSON row (`MethodResult.to_dict`: its trace under `record`)


def read_document(path: str | Path) -> str:
    """The document in `path` (`-`: stdin). JSONL: one passage per line, as numbered documents.
    What cannot be read as text is refused before any model loads, naming the file (and line):
    a directory, a missing or unreadable file, bytes that are not UTF-8, nothing at all. JSONL
    records end at `\\n` only: U+2028, U+2029 and U+0085 are characters inside a JSON string
    (`str.splitlines` cut the record there)."""
    name = "stdin (-)" if str(path) == "-" else str(path)
    text = _decoded(_read_bytes(path), name)
    if str(path).endswith(".jsonl"):
        passages = []
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                raise ConfigError(f"{name}:{number}: not JSON ({err})") from None
            if isinstance(value, dict):
                value = next((value[f] for f in PASSAGE_FIELDS if isinstance(value.get(f), str)), None)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{name}:{number}: expected a JSON string or an object with a text field "
                                  f"({', '.join(PASSAGE_FIELDS)})")
            passages.append(value.strip())
        text = render_paragraphs(passages) if passages else ""
    if not text.strip():
        raise ConfigError(f"{name}: the document is empty")
    return text


def _read_bytes(path: str | Path) -> bytes:
    """At most `MAX_DOCUMENT_BYTES` (a bigger file is refused by its size, unread; a device or a
    pipe that never ends, such as /dev/zero, once that much has come)."""
    name = "stdin (-)" if str(path) == "-" else str(path)
    try:
        if str(path) == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # bytes, so the decoding below is ours, not the locale's
            data = stdin.read(MAX_DOCUMENT_BYTES + 1) if stdin is not None else sys.stdin.read(MAX_DOCUMENT_BYTES + 1).encode("utf-8")
        else:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size > MAX_DOCUMENT_BYTES:
                    raise ConfigError(f"{name}: {size:,} bytes, over the {MAX_DOCUMENT_BYTES:,} a document may be")
                data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a file; give one text, Markdown or JSONL file") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ConfigError(f"{name}: more than the {MAX_DOCUMENT_BYTES:,} bytes a document may be")
    return data


def _decoded(data: bytes, name: str) -> str:
    """UTF-8 (a leading byte-order mark dropped), else refused with the line and byte that are not.
    A NUL byte is refused too: no text has one, and UTF-16 without its byte-order mark (ASCII
    text with a NUL after each letter) is valid UTF-8."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{name}:{line}: not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); "
                          "convert it first, e.g. iconv -t UTF-8") from None
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise ConfigError(f"{name}:{line}: a NUL byte (byte {nul}): not a text file "
                          "(UTF-16? convert it first, e.g. iconv -f UTF-16 -t UTF-8)")
    return text


def evidence_for(answer: str | None, trace: Trace | None, chunks: Sequence[Chunk]) -> list[Evidence]:
    """The findings that agree with `answer` (normalised, one containing the other), each quote
    checked against its chunk; none agreeing: every finding of the episode, so nothing read is hidden.
    A method that runs no episode (its trace is not a `Trajectory`) has no findings."""
    turns = trace.turns if isinstance(trace, Trajectory) else []
    findings = [f for turn in turns for q in turn.queries for f in q.findings]
    if not findings:
        return []
    target = normalize_answer(answer or "")
    agreeing = [f for f in findings if target and _agrees(normalize_answer(f.answer), target)]
    texts = {chunk.index: chunk.text for chunk in chunks}
    seen, out = set(), []
    for finding in agreeing or findings:
        for agent in [finding.agent, *finding.merged_agents]:
            index = int(agent.rsplit("_", 1)[-1])
            key = (index, finding.answer, finding.evidence)
            if key in seen:
                continue
            seen.add(key)
            quote = finding.evidence or ""
            verdict = check_quote(quote, finding.answer, texts.get(index, ""))
            out.append(Evidence(index, agent, finding.answer, quote, verdict.in_chunk, verdict.verifies, verdict.label))
    return out


def _agrees(found: str, answer: str) -> bool:
    return bool(found) and (found in answer or answer in found)


def setting_names() -> set[str]:
    """What a setting's key may start with: configs/ask.yaml's own keys and each entry of its
    defaults list (`backend@models` and its package `models`, `method`)."""
    from omegaconf import OmegaConf

    primary = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "ask.yaml"))
    names = {key for key in primary if key != "defaults"}
    for entry in primary.get("defaults", []):
        key = next(iter(entry)) if isinstance(entry, dict) else entry
        if key != "_self_":
            names |= {key, key.split("@")[-1]}
    return names


def split_words(words: Sequence[str], after: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(questions, settings) of the command's words. A word `key=value` is a setting when `key`
    starts with one of `setting_names()` (the rest of the key is checked when the settings
    compose, with "did you mean"); a `key=value` word whose key names no setting is refused, naming
    it and the way to ask it, so neither a question nor a mistyped setting is ever taken for the
    other in silence. `after` (the words after `--`) are questions, whatever they look like."""
    names, questions, settings = setting_names(), [], []
    for word in words:
        match = OVERRIDE.match(word)
        if match is None:
            questions.append(word)
            continue
        top = match.group(1).split(".", 1)[0]
        if match.group(1) in names or top in names:
            settings.append(word)
            continue
        near = difflib.get_close_matches(top, sorted(names), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{word!r} looks like a setting, but {top!r} is none of parser ask's ({', '.join(sorted(names))})"
                          f"{hint}; to ask it as a question, put it after `--`: parser ask FILE -- {shlex.quote(word)}")
    return questions + list(after), settings


def compose(overrides: Sequence[str]) -> Any:
    """configs/ask.yaml with `overrides`, through Hydra's compose API (positional arguments are
    the file and the questions, so this entry point cannot be a `@hydra.main`). `models=<preset>`
    is the demo's spelling of `backend@models=<preset>`; both work. Checked before anything loads
    (`parser.base.settings`): a made-up `+key`, a typo, a value outside its domain is a ConfigError."""
    from parser.base.settings import compose_checked

    return compose_checked(CONFIG_DIR, "ask", preset_spelling(overrides))


def build(cfg: Any) -> tuple[Any, dict[str, Any]]:
    """(method, models config) for `cfg`: the backend preset (`models: auto` picks what this
    machine can run, as the demo does), CPU budgets for in-process models on a CPU."""
    from omegaconf import OmegaConf

    from parser.serving.backends.models import build_models
    from parser.cli.demo import choose_backend, cpu_episode, needs_cpu_budgets
    from parser.methods import build_method

    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    check_episode_keys(method_cfg.get("episode"), "method.episode")  # before any model loads
    if cfg.get("models") is None:  # no preset named: what this machine can run, as the demo chooses
        preset, reason = choose_backend("auto")
        print(f"models: {preset} ({reason})", file=sys.stderr)
        models_cfg = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "backend" / f"{preset}.yaml"), resolve=True)
    else:
        models_cfg = OmegaConf.to_container(cfg.models, resolve=True)
    if "episode" in method_cfg and cfg.cpu_budgets and needs_cpu_budgets(models_cfg):
        method_cfg["episode"] = cpu_episode(method_cfg["episode"])
    return build_method(method_cfg, build_models(models_cfg)), models_cfg


class QuestionFailed(RuntimeError):
    """A question that got no fair run (`MethodResult.failed`: every subagent call failed, the
    first failure named); the questions after it would fail the same way, so asking stops."""


async def ask_async(document: str, questions: Iterable[str], cfg: Any, echo: bool = True,
                    on_reply: Callable[[Reply], None] | None = None, method: Any = None) -> list[Reply]:
    """Each question in turn on one method (`method`, else built from `cfg`; closed at the end);
    `on_reply` gets each reply as soon as it exists (the command writes and flushes its `--json`
    line there, so an interrupt or a failure later keeps it)."""
    from parser.cli.demo import print_turn
    from parser.methods import Sample

    method = method or build(cfg)[0]
    replies = []
    try:
        protocol, models = getattr(method, "protocol", None), getattr(method, "models", None)
        chunks = protocol.chunk(document, models.subagent_tokenizer) if protocol and models else []
        if echo:
            print(f"the document: {method.reading.format(chunks=len(chunks))}", flush=True)
        for number, question in enumerate(questions):
            sample = Sample(id=f"ask-{number}", question=question.strip(), answers=[], context=document)
            if echo:
                print(f"\n=== {sample.question}", flush=True)
            with progress.listening(lambda _doc, turn: print_turn(turn, len(chunks)) if echo else None):
                result = await method.run(sample)
            if result.failed:
                raise QuestionFailed(f"{sample.question!r}: {result.failed}")
            reply = Reply(sample.question, result.answer, evidence_for(result.answer, result.trace, chunks), result.to_dict())
            if echo:
                print_reply(reply)
            if on_reply is not None:
                on_reply(reply)
            replies.append(reply)
    finally:
        await method.aclose()
    return replies


def print_reply(reply: Reply) -> None:
    print(f"answer: {reply.answer!r}" if reply.answer else "answer: none (the lead did not answer within its turns)", flush=True)
    for item in reply.evidence:
        print(f"  chunk {item.chunk_index} ({item.agent}): {item.answer!r}  \"{item.quote[:160]}\"  [{item.check}]", flush=True)


def ask(path: str | Path, questions: str | Sequence[str], echo: bool = False, **settings: Any) -> list[Reply]:
    """The Python API: `ask("notes.md", "Who?", models="tiny_cpu")`; `settings` are the same keys
    as the command's overrides (`method="memagent"`, ...)."""
    overrides = [f"{key}={value}" for key, value in settings.items()]
    questions = check_questions([questions] if isinstance(questions, str) else list(questions))
    return asyncio.run(ask_async(read_document(path), questions, compose(overrides), echo=echo))


def check_questions(questions: Sequence[str]) -> list[str]:
    """At least one question, none empty or only whitespace (it would cost a whole episode to
    answer nothing); the offending argument is named."""
    if not questions:
        raise ConfigError("give at least one question")
    for number, question in enumerate(questions, start=1):
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"question {number} is empty ({question!r}); ask something")
    return list(questions)


def main(argv: Sequence[str] | None = None) -> None:
    with stop_on_signals():  # Ctrl-C and SIGTERM end it with one line, even started with SIGINT ignored
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
    parser = argparse.ArgumentParser(
        prog="parser ask", description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--json OUT] file question|key=value [...] [-- question [...]]",
        epilog="Settings: key=value Hydra overrides of configs/ask.yaml, e.g. models=tiny_cpu method=memagent "
               "method.episode.max_turns=6 backend@models=openai models.lead.base_url=http://127.0.0.1:8000. "
               f"A key=value word is a setting when its key starts with one of ask's settings ({', '.join(sorted(setting_names()))}); "
               "any other word=... is refused, naming it. A question that starts with word= "
               "goes after --, where every word is a question: parser ask notes.md -- \"x=3: what is x?\"")
    parser.add_argument("file", help="a text, Markdown or JSONL file; - for stdin")
    parser.add_argument("words", nargs="*", metavar="question|key=value", help="one or more questions, and settings")
    parser.add_argument("--json", metavar="OUT", help="write one JSON line per question as it is answered "
                                                      "(answer, evidence, trajectory)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index(QUESTIONS_ONLY) if QUESTIONS_ONLY in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    out, overrides = None, []
    try:  # everything a run needs, checked before any model loads
        words, overrides = split_words(args.words, argv[cut + 1:])
        questions = check_questions(words)
        document = read_document(args.file)
        try:
            cfg = compose(overrides)
        except ConfigError as error:  # a setting with a space in it is more likely a question
            spaced = next((o for o in overrides if " " in o), None)
            raise ConfigError(f"{error}; if {spaced!r} is a question, put it after `--`" if spaced else str(error)) from None
        out = open_output(args.json, args.file) if args.json else None
    except ConfigError as error:
        _stop(f"error: {error}", 2)
    except KeyboardInterrupt:  # e.g. waiting on a terminal's stdin (`parser ask - Q` with nothing piped)
        _stop("interrupted before any model loaded", 130)
    kept = 0

    def keep(reply: Reply) -> None:
        nonlocal kept
        write_line(out, dataclasses.asdict(reply), args.json)
        kept += 1

    def saved() -> str:
        return f"; {kept} of {len(questions)} answers kept in {args.json}" if out else ""

    try:
        method, _ = build(cfg)  # before the event loop: there Ctrl-C would wait for the load to end
        asyncio.run(ask_async(document, questions, cfg, on_reply=keep if out else None, method=method))
    except (ConfigError, FileNotFoundError) as error:
        _stop(f"error: {error}{saved()}", 2)
    except (BackendError, QuestionFailed) as error:  # a server that failed for good: named, with its reason
        _stop(f"error: {error}{saved()}", 1)
    except KeyboardInterrupt:
        _stop(f"interrupted{saved()}", 130)
    finally:
        if out is not None:
            with contextlib.suppress(OSError):  # only a failed line's unflushed bytes (said above): each answer was flushed
                out.close()
    if out:
        print(f"trajectories written to {args.json}", file=sys.stderr)


def _stop(line: str, code: int) -> NoReturn:
    print(f"parser.cli.ask: {line}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
