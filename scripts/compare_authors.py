"""Count what still differs between MemAgent's and ReMemR1's own code and this project's, rule by rule.

Issue 56 was filed with counts ("49 of 500 verdicts differ, ..., 266 + 238 recall ties") measured by
running the authors' functions beside the project's; this script is that measurement, so anyone can
re-run it. It imports their modules by path from an exported copy of their repositories (nothing of
theirs is copied into the project), feeds both sides the same seeded inputs (synthetic HotpotQA-shaped
samples from `data_prep.synthetic_world`, with adversarial strings mixed in: control tokens, U+2060,
`</think>`, recall tags, odd lengths, ties) and prints one table: per rule, the inputs, how many
differ, and what the project claims (0 where it claims parity; otherwise the count is what the
named default changes, reported as such). Prompts are compared as the model sees them: both sides'
user messages rendered by the same chat template (the real Qwen3 tokenizer, `parser.offline`).

    git clone --bare https://github.com/BytedTsinghua-SIA/MemAgent /tmp/MemAgent.git   # or any copy of it
    git clone --bare https://github.com/syr-cn/ReMemR1 /tmp/ReMemR1.git
    mkdir -p /tmp/authors/memagent /tmp/authors/rememr1
    git --git-dir /tmp/MemAgent.git archive 76b7a65 taskutils | tar -x -C /tmp/authors/memagent
    git --git-dir /tmp/ReMemR1.git archive 43e69f3 taskutils/memory_eval | tar -x -C /tmp/authors/rememr1
    PYTHONPATH=. python scripts/compare_authors.py --memagent /tmp/authors/memagent --rememr1 /tmp/authors/rememr1

The commits are the ones docs/fidelity.md pins. About 5 minutes for the default 500 inputs per rule
on 2 CPU cores.

Stubbed, only so that their modules import (none is called by what is compared): `openai`, `rich`,
`fire` and `memory_data.utils` for MemAgent's `taskutils/memory_data/filter.py` (its API clients, its
CLI, its task runner). Their HTTP session (`utils/aio.py` `get_async_client`) is replaced in their eval
modules by a scripted one that records each request's messages and answers with the replies the
project's method also gets; their eval's module constants (chunk size, context cap) are set per sample
as their environment variables would set them. ReMemR1's recall ties follow the string hash seed, so
the script runs itself under `--hash-seed` (PYTHONHASHSEED, default 0).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import io
import os
import random
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable

from data_prep.knowledge_filter import is_correct
from data_prep.synthetic_world import build_synthetic_eval
from parser.methods import Sample, method_class, method_config
from parser.serving.backends.models import Models
from parser.serving.types import BackendError, Completion
from parser.text.chat_format import CHATML
from parser.text.reward import MEMAGENT_SCORER, normalize_answer, sub_em

# What the adversarial inputs are made of: the chat format's control strings, the WORD JOINER the
# project inserts, thinking and recall tags, boxes, and whitespace-only pieces.
ADVERSARIAL = ["<|im_end|>", "<|im_start|>user\n", "<|im_start|>assistant\n", "<|endoftext|>", "\u2060", "<|im\u2060_end|>",
               "</think>", "<think>", "<recall>", "</recall>", "\\boxed{", "}", "  ", "\n\n", "<|vision_start|>"]
UNSEEN = "qzxv"  # a recall query sharing no token with any memory: every cosine is 0, a tie


# -- their modules, imported by path ----------------------------------------------------------------
@contextlib.contextmanager
def isolated_import(paths: list[Path], stubs: dict[str, types.ModuleType]):
    """`paths` first on sys.path and `stubs` in sys.modules while importing; afterwards the modules this
    imported from `paths` are forgotten by name (their functions keep their globals), so MemAgent's and
    ReMemR1's packages of the same name (`utils`) can both be loaded; what the stubs hid comes back."""
    before = dict(sys.modules)
    sys.modules.update(stubs)
    sys.path[:0] = [str(p) for p in paths]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # their envs.py prints its settings
            yield
    finally:
        del sys.path[: len(paths)]
        roots = tuple(str(p) for p in paths)
        for name, module in list(sys.modules.items()):
            if name in stubs or str(getattr(module, "__file__", None) or "").startswith(roots):
                del sys.modules[name]
        sys.modules.update({name: before[name] for name in stubs if name in before})


def stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def load_authors(memagent: Path, rememr1: Path) -> dict[str, types.ModuleType]:
    memagent, rememr1 = memagent.resolve(), rememr1.resolve()  # their modules are forgotten by file path
    for root, needed in ((memagent, "taskutils/memory_data/filter.py"), (memagent, "taskutils/memory_eval/utils/recurrent.py"),
                         (rememr1, "taskutils/memory_eval/utils/rememr1.py")):
        if not (root / needed).is_file():
            raise SystemExit(f"{root / needed}: missing; export the authors' files first (see this script's docstring)")
    unused = lambda *a, **k: None  # noqa: E731
    filter_stubs = {"openai": stub("openai", AsyncOpenAI=unused, OpenAI=unused), "rich": stub("rich", print=unused),
                    "fire": stub("fire", Fire=unused), "memory_data": stub("memory_data", __path__=[]),
                    "memory_data.utils": stub("memory_data.utils", async_main=unused)}
    with isolated_import([memagent / "taskutils/memory_data"], filter_stubs):
        their_filter = importlib.import_module("filter")
    with isolated_import([memagent / "taskutils/memory_eval"], {}):
        memagent_utils = importlib.import_module("utils")
        memagent_eval = importlib.import_module("utils.recurrent")
    with isolated_import([rememr1 / "taskutils/memory_eval"], {}):
        rememr1_eval = importlib.import_module("utils.rememr1")
    return {"filter": their_filter, "scorer": memagent_utils, "memagent": memagent_eval, "rememr1": rememr1_eval}


class ScriptedSession:
    """Stands in for their aiohttp session: records each request's user message, answers `reply(i)`."""

    def __init__(self, reply: Callable[[int], str]):
        self.reply, self.messages = reply, []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def post(self, url: str, headers: dict, json: dict):
        self.messages.append(json["messages"][0]["content"])
        return ScriptedResponse(self.reply(len(self.messages) - 1))


class ScriptedResponse:
    status = 200

    def __init__(self, text: str):
        self.text = text

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def json(self):
        return {"choices": [{"message": {"content": self.text}}]}


def their_prompts(module: types.ModuleType, sample: dict, reply: Callable[[int], str], tokenizer: Any,
                  chunk_size: int, max_context: int | None) -> list[str]:
    """Their `async_query_llm`, unchanged, with the scripted session; each request's user message."""
    session = ScriptedSession(reply)

    async def client():
        return session

    module.get_async_client = client
    module.RECURRENT_CHUNK_SIZE, module.RECURRENT_MAX_CONTEXT_LEN = chunk_size, max_context or 10**9
    item = {"_id": 1, "context": sample["context"], "input": sample["question"]}  # _id 0 would print every call
    with contextlib.redirect_stdout(io.StringIO()):
        asyncio.run(module.async_query_llm(item, "model", tokenizer))
    return session.messages


# -- the project's side ------------------------------------------------------------------------------
class ScriptedBackend:
    """Stands in for the served checkpoint: records each rendered prompt, answers `reply(i)`."""

    def __init__(self, reply: Callable[[int], str]):
        self.reply, self.prompts = reply, []

    async def generate(self, prompt, sampling, *, routing_key=None, request_id=None) -> Completion:
        if sampling.constraint is not None:  # its replies are fixed: it cannot honour a grammar
            raise BackendError("compare_authors: a scripted reply cannot honour a constraint", retryable=False)
        self.prompts.append(prompt)
        return Completion(text=self.reply(len(self.prompts) - 1))

    async def aclose(self) -> None:
        pass


@functools.cache
def reader_class(method: str) -> type:
    """The class configs/method/<method>.yaml names (composed once: Hydra takes ~0.7 s)."""
    return method_class(method_config(method)["_target_"])


def our_prompts(method: str, sample: dict, reply: Callable[[int], str], tokenizer: Any, chunk_size: int,
                max_context: int | None, **options: Any) -> list[str]:
    """The method as configured (class defaults = configs/method defaults) with `options`; each prompt."""
    backend = ScriptedBackend(reply)
    reader = reader_class(method)(Models(lead=backend, lead_tokenizer=tokenizer), chunk_size=chunk_size,
                                  max_context_tokens=max_context, **options)
    asyncio.run(reader.run(Sample(id="s", question=sample["question"], answers=sample["answers"], context=sample["context"])))
    return backend.prompts


def rendered(tokenizer: Any, message: str) -> str:
    """A user message as `parser.methods.sequential.SequentialMethod` renders it (thinking off)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


# -- seeded inputs ---------------------------------------------------------------------------------
@functools.cache
def synthetic(n: int, seed: int) -> tuple[dict, ...]:
    """`n` HotpotQA-shaped eval rows ("Document i: ..." contexts of 10 paragraphs) of the synthetic world."""
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
        return tuple(build_synthetic_eval(num_questions=n, lengths=(10,), seed=seed, num_paragraphs=max(2000, 6 * n)))


def samples(n: int, seed: int, adversarial: bool) -> list[dict]:
    """`n` synthetic questions with their contexts; with `adversarial`, some contexts and questions
    get adversarial strings at random places."""
    rng = random.Random(seed)
    out = []
    for row in synthetic(n, seed):
        context, question = row["context"], row["question"]
        if adversarial and rng.random() < 0.5:
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(context))
                context = context[:at] + rng.choice(ADVERSARIAL) + context[at:]
        if adversarial and rng.random() < 0.2:
            at = rng.randrange(len(question))
            question = question[:at] + rng.choice(ADVERSARIAL) + question[at:]
        out.append({"context": context, "question": question, "answers": list(row["answers"])})
    return out


def scripted_replies(sample: dict, seed: int, adversarial: bool) -> Callable[[int], str]:
    """Replies as a function of the call's index only, so both sides get the same ones whatever
    their prompts: words of the sample, adversarial strings, recall blocks that overlap a memory,
    share nothing with any (a tie) or are empty, repeated and recall-only replies."""
    words = sample["context"].split()
    cache: dict[int, str] = {}

    def reply(i: int) -> str:
        if i not in cache:
            rng = random.Random(f"{seed}:{i}")
            if i and rng.random() < 0.15:
                cache[i] = reply(i - 1)  # the same memory again
                return cache[i]
            text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
            if adversarial and rng.random() < 0.4:
                at = rng.randrange(len(text) + 1)
                text = text[:at] + rng.choice(ADVERSARIAL) + text[at:] + " end"
            kind = rng.random()
            if kind < 0.3:
                text += f" <recall>{UNSEEN}</recall>"
            elif kind < 0.5:
                text += f" <recall>{rng.choice(words)}</recall>"
            elif kind < 0.55:
                text = "<recall></recall>" if rng.random() < 0.5 else f"<recall>{rng.choice(words)}</recall>"
            if rng.random() < 0.2:
                text += f" Therefore, the answer is {sample['answers'][0]}."
            cache[i] = text
        return cache[i]

    return reply


# -- the rules -------------------------------------------------------------------------------------
def compare_episodes(method: str, module: types.ModuleType, tokenizer: Any, n: int, seed: int, adversarial: bool,
                     odd_caps_only: bool = False, **options: Any) -> tuple[int, int, int]:
    """Of `n` samples: (those where any prompt the model sees differs between their eval loop and the
    method's, those whose untrusted text (document, question, a reply) holds a string that
    neutralising changes, those of the others that differ)."""
    differ = neutralised = differ_elsewhere = 0
    for k, sample in enumerate(samples(n, seed, adversarial)):
        rng = random.Random(seed * 7919 + k)
        length = len(tokenizer.encode(sample["context"].strip()))
        if odd_caps_only:  # one chunk holds the whole kept document: the cut alone decides the prompt
            cap = rng.randrange(1, length, 2)
            chunk = cap
        else:
            cap = rng.choice([None, rng.randint(20, max(21, length))])
            chunk = rng.randint(40, 400)
        reply = scripted_replies(sample, seed * 104729 + k, adversarial)
        messages = their_prompts(module, sample, reply, tokenizer, chunk, cap)
        ours = our_prompts(method, sample, reply, tokenizer, chunk, cap, **options)
        untrusted = [sample["context"], sample["question"], *map(reply, range(len(messages)))]
        held = any(CHATML.neutralize(text, tokenizer) != text for text in untrusted)
        differs = [rendered(tokenizer, m) for m in messages] != ours
        differ, neutralised, differ_elsewhere = differ + differs, neutralised + held, differ_elsewhere + (differs and not held)
    return differ, neutralised, differ_elsewhere


def filter_inputs(n: int, seed: int) -> list[tuple[str, list[str]]]:
    """(closed-book reply, golds): boxed, spaced-box, `\\fbox`, cased, dotted and buried answers, long
    replies whose box is past the last 300 characters, golds that are empty, blank or punctuation."""
    rng = random.Random(seed)
    out = []
    for row in synthetic(n, seed):
        gold = rng.choice([row["answers"][0]] * 6 + ["", " ", ".", "the", "Yes", "50\\%", "a  b"])
        said = rng.choice([gold, gold.lower(), gold.upper(), gold + ".", gold.replace(" ", ""), "wrong", ""])
        reply = rng.choice([f"\\boxed{{{said}}}", f"So \\boxed {said}$ done", f"\\fbox{{{said}}}", f"I think {said}.",
                            f"\\boxed{{{said}}}" + " filler" * rng.randint(40, 60), "filler " * 50 + f"\\boxed{{{said}}}",
                            f"\\boxed{{\\text{{{said}}}}}", f"{rng.choice(ADVERSARIAL)}\\boxed{{{said}}}", said])
        out.append((reply, [gold]))
    return out


def their_verdict(module: types.ModuleType, reply: str, golds: list[str]) -> bool:
    """`filter.py`: a reply counts if its `scores` (boxed, compute_score) or its `contains` is 1."""
    model = {"ground_truth": golds}
    with contextlib.redirect_stdout(io.StringIO()):  # compute_score prints what it catches
        return bool(module.scores(([reply], model))[0] or module.contains(([reply], model))[0])


def scorer_inputs(n: int, seed: int, empty_golds: bool) -> list[tuple[str | None, str]]:
    rng = random.Random(seed)
    empties = ["", "the", " . ", "a", "An!", "..."]
    out = []
    for row in synthetic(n, seed):
        gold = rng.choice(empties) if empty_golds else row["answers"][0]
        pred = rng.choice([None, "", " ", "the", row["answers"][0], row["answers"][0].lower() + "!",
                           f"The {row['answers'][0]} film", "unknown", rng.choice(ADVERSARIAL)])
        out.append((pred, gold))
    return out


def their_sub_em(module: types.ModuleType, pred: str | None, gold: str) -> float:
    """MemAgent's eval: `update_answer(metrics, pred, answers[0]) if item["pred"] else 0`, its Sub_EM."""
    return float(module.sub_exact_match_score(pred, gold)) if pred else 0.0


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--memagent", type=Path, required=True, help="export of BytedTsinghua-SIA/MemAgent (holds taskutils/)")
    args.add_argument("--rememr1", type=Path, required=True, help="export of syr-cn/ReMemR1 (holds taskutils/)")
    args.add_argument("-n", type=int, default=500, help="inputs per rule")
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--hash-seed", default="0", help="PYTHONHASHSEED the comparison runs under (ReMemR1's ties follow it)")
    opts = args.parse_args()
    if os.environ.get("PYTHONHASHSEED") != opts.hash_seed:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": opts.hash_seed})

    from parser.offline import qwen3_tokenizer

    warnings.filterwarnings("ignore", message="The parameter 'token_pattern' will not be used")  # their TfidfVectorizer
    theirs, tok, n, seed = load_authors(opts.memagent, opts.rememr1), qwen3_tokenizer(), opts.n, opts.seed
    verdicts, scored, empty = filter_inputs(n, seed), scorer_inputs(n, seed, False), scorer_inputs(n, seed, True)
    assert all(normalize_answer(g) == "" for _, g in empty)

    def episodes(method: str, adversarial: bool = True, **options: Any) -> tuple[int | str, str]:
        """(differ, claimed) for one method and options; an option this checkout lacks is "n/a"."""
        try:
            differ, neutralised, elsewhere = compare_episodes(method, theirs[method], tok, n, seed, adversarial, **options)
        except (TypeError, ValueError) as error:  # e.g. an older commit without the option
            return "n/a", f"{type(error).__name__}: {error}"[:70]
        verbatim = options.get("untrusted_text") == "verbatim" or not adversarial
        ties = options.get("recall_ties", "latest" if method == "rememr1" else "authors")  # MemAgent recalls nothing
        if not verbatim:
            ties_too = ", and tie order" if ties == "latest" else ""
            return differ, f"only the {neutralised} whose untrusted text it changes{ties_too} (elsewhere: {elsewhere})"
        return differ, "0" if ties == "authors" else "tie order only"

    thinks = [(r, g) for r, g in verdicts if "<think>" in r]
    rows = [
        ("2 filter verdict, replies without <think>", sum(is_correct(r, g) != their_verdict(theirs["filter"], r, g)
                                                          for r, g in verdicts if (r, g) not in thinks), "0"),
        (f"2 filter verdict, the {len(thinks)} replies with <think>",
         sum(is_correct(r, g) != their_verdict(theirs["filter"], r, g) for r, g in thinks), "kept: <think> not read"),
        ("3 odd max_context_tokens: MemAgent prompts", *episodes("memagent", False, odd_caps_only=True)),
        ("4 MemAgent prompts, untrusted_text verbatim", *episodes("memagent", untrusted_text="verbatim")),
        ("4 MemAgent prompts, default (neutralize)", *episodes("memagent")),
        ("4 ReMemR1 prompts, verbatim, recall_ties authors", *episodes("rememr1", untrusted_text="verbatim", recall_ties="authors")),
        ("4 ReMemR1 prompts, neutralize, recall_ties authors", *episodes("rememr1", recall_ties="authors")),
        ("5 ReMemR1 prompts, verbatim, recall_ties latest (default)", *episodes("rememr1", untrusted_text="verbatim")),
        ("4+5 ReMemR1 prompts, every default (neutralize, latest)", *episodes("rememr1")),
        ("6 golds normalising to \"\": sub_em_compat vs theirs",
         sum(sub_em(p, [g], **MEMAGENT_SCORER) != their_sub_em(theirs["scorer"], p, g) for p, g in empty), "0"),
        ("7 sub_em_compat vs their scorer", sum(sub_em(p, [g], **MEMAGENT_SCORER) != their_sub_em(theirs["scorer"], p, g)
                                                for p, g in scored), "0"),
    ]
    print(f"PYTHONHASHSEED={os.environ['PYTHONHASHSEED']} seed={seed} inputs per rule={n}")
    print(f"| {'rule':<58} | differ | claimed |")
    print(f"|{'-' * 60}|--------|---------|")
    for rule, differ, claimed in rows:
        print(f"| {rule:<58} | {differ:>6} | {claimed} |")


if __name__ == "__main__":
    main()
