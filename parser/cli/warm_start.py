"""The CPU learning run's lead: a tiny Qwen3 warm-started on episodes the engine recorded.

Why it exists: RL only improves a policy that is already partly right — a GRPO group whose
trajectories all fail (or all succeed) has zero advantage and teaches nothing. A random-weight
model never writes a tool call, so the learning run (configs/train/cpu_learn.yaml) starts from a
tiny real Qwen3 taught by a short supervised phase, the way an RL run starts from an
instruction-tuned checkpoint. What it is taught:

- demonstrations recorded through the real episode engine against the frozen readers over HTTP
  (`parser.serving.world_reader` behind the loopback worker), so every token view is exactly
  what the trainer's rollouts produce;
- each demonstration asks one query per hop of the question's chain (the hop-2 query is built
  from the hop-1 finding the observation returned), then answers with the last finding;
- a *premature* demonstrator: on two-hop questions it takes the second hop only with
  probability `follow_up` and otherwise answers with the first hop's finding (the intermediate
  entity, which is wrong). That is the weakness of an untrained lead that RL is meant to fix
  (the paper's training dynamics: more queries, more turns), and it gives GRPO groups reward
  variance. The held-out success it starts from is measured, not scripted;
- the answer after the last hop's finding once more, from a copy of each full two-hop chain
  trained on that turn only (weight `answer_turn`): the turn RL's follow-up queries lead into
  must not be the one the warm start writes worst.

The tokenizer is this recipe's own: `parser.offline.tiny.bpe_tokenizer` fitted to the recorded
episodes' text (prompt, tool calls, observations) and the *training* world's paragraphs, so
names are a few tokens and the system prompt ~500 instead of ~1,000. Held-out names are made of
the same syllables and never seen as words.

    parser loopback --port 31001 --reader world &
    parser train warm-start --data runs/learn/data --out runs/learn/lead --gateway-url http://127.0.0.1:31001
    # -> runs/learn/lead/{config.json,model.safetensors,tokenizer files}; recipes/train_cpu_learn.sh runs it

Settings (model size, steps, learning rate, `follow_up`) are `parser.warm_start` in
configs/train/cpu_learn.yaml. The result is cached under the asset cache, keyed by the recorded
episodes and those settings, so a rerun (or the suite's smoke) skips the fitting. A `parser`
command (parser/cli/) rather than `parser/train/cpu/` because it reads data_prep's output as
data_prep wrote it (the synthetic world's name lexicon, by the size on the data's card), and no
`parser/train` module may import data_prep.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import re
import time
from pathlib import Path
from typing import Any, Sequence

from parser.serving.world_reader import QUERY_TEMPLATES

# The demonstrator's turns (thinking mode: the generation prompt has opened <think>).
QUERY_TURN = ("I need the {relation}.\n</think>\n\n<tool_call>\n<function=query_agents>\n<parameter=query>\n"
              "{query}\n</parameter>\n</function>\n</tool_call>")
ANSWER_TURN = "I have the answer.\n</think>\n\n<answer> {answer}</answer>"
_FINDING = re.compile(r"\] answer: (.*?) \| evidence")
_TOOL_RESPONSE = "<tool_response>"


@dataclasses.dataclass
class Plan:
    """One demonstration: the question's chain of relations, from its first entity."""

    subject: str  # the entity the question names
    relations: list[str]  # one per hop, in reasoning order
    hops: int  # how many hops this demonstration takes before it answers
    turns: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any], hops: int | None = None) -> "Plan":
        evidences = (row.get("meta") or {}).get("evidences")
        if not evidences:
            raise ValueError(f"row {row.get('id')!r}: no meta.evidences (build it with data_prep's synthetic world)")
        relations = [relation for _, relation, _ in evidences]
        unknown = [r for r in relations if r not in QUERY_TEMPLATES]
        if unknown:
            raise ValueError(f"row {row.get('id')!r}: no query template for relation(s) {unknown}")
        return cls(subject=evidences[0][0], relations=relations, hops=len(relations) if hops is None else hops)


class Demonstrator:
    """verl's server-manager contract (`generate(request_id, prompt_ids=, sampling_params=)`)
    playing each request's `Plan`: it reads the last observation back from the prompt, so the
    next query uses the finding the readers really returned."""

    def __init__(self, tokenizer: Any, plans: dict[str, Plan]):
        self.tokenizer = tokenizer
        self.plans = plans
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def _last_finding(self, prompt_ids: list[int]) -> str | None:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        found = _FINDING.findall(text[text.rfind(_TOOL_RESPONSE):]) if _TOOL_RESPONSE in text else []
        return found[0] if found else None

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        plan = self.plans[request_id]
        finding = self._last_finding(prompt_ids) if plan.turns else plan.subject
        if plan.turns < plan.hops and finding is not None:
            relation = plan.relations[plan.turns]
            text = QUERY_TURN.format(relation=relation, query=QUERY_TEMPLATES[relation].format(finding))
        else:
            text = ANSWER_TURN.format(answer=finding or "unknown")
        plan.turns += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end]
        return TokenOutput(token_ids=ids, stop_reason="stop", extra_fields={"global_steps": 0})


@dataclasses.dataclass
class Episode:
    ids: list[int]  # prompt + response
    mask: list[int]  # 1 on lead-generated tokens
    prompt_len: int
    reward: float
    turns: int
    row_id: str
    hops: int


async def record(rows: Sequence[dict[str, Any]], settings: dict[str, Any], tokenizer: Any, response_length: int,
                 hops_of: Sequence[int | None]) -> list[Episode]:
    """Run one demonstration per row through the real episode engine (readers over HTTP)."""
    from parser.engine.episode import EpisodeEngine
    from parser.train.worker import WorkerState, close_worker_state
    from parser.train.reward import score_answer
    from parser.train.server_manager import ServerManagerBackend

    state = WorkerState(settings, response_length)
    plans = {f"demo-{i}": Plan.from_row(row, hops) for i, (row, hops) in enumerate(zip(rows, hops_of, strict=True))}
    lead = ServerManagerBackend(Demonstrator(tokenizer, plans), {"temperature": 1.0},
                                stop_token_ids=state.protocol.chat.stop_token_ids(tokenizer))
    engine = EpisodeEngine(lead, tokenizer, state.reader, state.config, state.protocol)

    async def one(i: int, row: dict[str, Any]) -> Episode:
        chunks = state.protocol.chunk(row["context"], state.subagent_tokenizer)
        trajectory = await engine.run(row["question"], chunks, doc_id=str(row["id"]), request_id=f"demo-{i}")
        ids = list(trajectory.prompt_ids) + list(trajectory.response_ids)
        return Episode(ids=ids, mask=[0] * len(trajectory.prompt_ids) + list(trajectory.response_mask),
                       prompt_len=len(trajectory.prompt_ids), reward=score_answer(trajectory.answer, row["answers"], state.protocol),
                       turns=trajectory.num_turns, row_id=str(row["id"]), hops=plans[f"demo-{i}"].hops)

    try:
        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(rows))))
    finally:
        await state.backend.aclose()
        await close_worker_state()


def demonstrations(rows: Sequence[dict[str, Any]], follow_up: float) -> tuple[list[dict[str, Any]], list[int | None], list[float]]:
    """Rows, hop counts and sampling weights of the warm-start set: every one-hop row once; every
    multi-hop row twice — the whole chain (weight `follow_up`) and stopped after its first hop
    (weight 1 - follow_up)."""
    out_rows, hops, weights = [], [], []
    for row in rows:
        chain = len(row["meta"]["evidences"])
        if chain == 1:
            out_rows.append(row), hops.append(None), weights.append(1.0)
            continue
        out_rows += [row, row]
        hops += [None, 1]
        weights += [follow_up, 1.0 - follow_up]
    return out_rows, hops, weights


def answer_turn_copies(episodes: Sequence[Episode], hops: Sequence[int | None],
                       weight: float) -> tuple[list[Episode], list[float]]:
    """A copy of every full multi-hop demonstration whose loss covers only its last turn, the
    answer after the findings of every hop, and the copies' sampling weights (`weight` each). Why: the full chain is drawn with weight `follow_up`,
    so a lead warm-started on it alone writes that answer turn badly (a third of its greedy third
    turns were invalid, docs/learning.md) and RL that teaches the follow-up lands in a turn that
    scores 0. Training the answer turn alone teaches what to do after a second finding without
    teaching the decision to ask for it, which is what RL is left to learn."""
    if not weight:
        return [], []
    copies = [dataclasses.replace(e, mask=_last_turn(e.mask)) for e, h in zip(episodes, hops, strict=True) if h is None and e.hops > 1]
    return copies, [weight] * len(copies)


def _last_turn(mask: Sequence[int]) -> list[int]:
    """`mask` with only its last run of 1s (the last lead turn) kept."""
    end = max(i for i, m in enumerate(mask) if m) + 1
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return [0] * start + [1] * (end - start) + [0] * (len(mask) - end)


def fit_tokenizer(episodes: Sequence[Episode], tokenizer: Any, paragraphs: Sequence[str], vocab_size: int,
                  words: Sequence[str] = (), episode_weight: int = 10, word_weight: int = 50) -> Any:
    """A BPE tokenizer fitted to the demonstrations' text (counted `episode_weight` times, so the
    prompt and the tool-call format get whole-word merges), the training world's paragraphs, and
    the name lexicon's `words` (counted `word_weight` times, so each is one token after a space)."""
    from parser.offline.tiny import bpe_tokenizer

    texts = [tokenizer.decode(e.ids, skip_special_tokens=False) for e in episodes]
    lexicon = [" " + " ".join(words)] * word_weight if words else []
    return bpe_tokenizer(texts * episode_weight + list(paragraphs) + lexicon, vocab_size)


def _common_prefix(sequences: Sequence[list[int]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences):
            return i
    return n


def _log(phase: str, losses: Sequence[float], step: int, steps: int, every: int, started: float) -> None:
    if every and (step + 1) % every == 0:
        recent = losses[-every:]
        print(f"[{phase}] step {step + 1}/{steps} loss {sum(recent) / len(recent):.4f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


def copy_curriculum(net: Any, tokenizer: Any, names: Sequence[str], *, steps: int, batch_size: int, lr: float,
                    seed: int, log_every: int = 200) -> list[float]:
    """Teach `net` to copy: short sequences "A, B, C. A, B, C." of training-world names, loss on the
    repeat. A lead must copy names it has never seen (from the question into a query, from a
    finding into the next query and the answer); from the demonstrations alone a 4-layer model had
    not learned it after 1,200 steps (17.6% of name tokens right, docs/learning.md). Short
    sequences without the 500-token prompt make each step cheap."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    pad, losses, started = tokenizer.pad_token_id, [], time.perf_counter()
    for step in range(steps):
        pairs = []
        for _ in range(batch_size):
            text = tokenizer.encode(" " + ", ".join(rng.sample(list(names), rng.randint(1, 3))) + ".",
                                    add_special_tokens=False)
            pairs.append(text)
        width = 2 * max(len(t) for t in pairs)
        inputs = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        for row, text in enumerate(pairs):
            inputs[row, : 2 * len(text)] = torch.tensor(text + text)
            labels[row, len(text): 2 * len(text)] = torch.tensor(text)
        loss = net(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        _log("copy", losses, step, steps, log_every, started)
    return losses


def warm_start(tokenizer: Any, episodes: Sequence[Episode], weights: Sequence[float], *, model: dict[str, Any],
               steps: int, batch_size: int, lr: float, seed: int, names: Sequence[str] = (), copy_steps: int = 0,
               copy_batch_size: int = 32, log_every: int = 50):
    """A tiny Qwen3 taught to copy names (`copy_curriculum`, if `copy_steps`), then fitted to the lead
    tokens of `episodes` (observations and prompt masked out), episodes drawn by `weights`. The
    shared system prompt runs once per step without gradient (its states are the same for every
    episode), the rest per episode: ~3x less compute."""
    import torch

    from parser.offline import tiny_qwen3

    rng = random.Random(seed)
    net = tiny_qwen3(tokenizer, seed=seed, **model).train()
    if copy_steps:
        copy_curriculum(net, tokenizer, names, steps=copy_steps, batch_size=copy_batch_size, lr=lr, seed=seed)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    shared = min(_common_prefix([e.ids for e in episodes]), min(e.prompt_len for e in episodes) - 1)
    prefix = torch.tensor([episodes[0].ids[:shared]])
    pad = tokenizer.pad_token_id
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(steps):
        batch = rng.choices(episodes, weights=weights, k=batch_size)
        width = max(len(e.ids) for e in batch) - shared
        inputs = torch.full((batch_size, width), pad)
        labels = torch.full((batch_size, width), -100)
        for row, e in enumerate(batch):
            ids, mask = torch.tensor(e.ids[shared:]), torch.tensor(e.mask[shared:])
            inputs[row, : len(ids)] = ids
            labels[row, : len(ids)] = torch.where(mask == 1, ids, torch.tensor(-100))
        with torch.no_grad():
            cache = net(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(batch_size)
        # right padding: a pad only ever follows the tokens that count, so no attention mask
        loss = net(input_ids=inputs, labels=labels, past_key_values=cache, use_cache=True).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        _log("warm start", losses, step, steps, log_every, started)
    return net.eval(), losses


# ---------------------------------------------------------------------------------------------- build

def _settings(gateway_url: str, overrides: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
    """The learning run's `parser:` block (episode, readers, warm start) and response length."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from parser.train.train import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name="train/cpu_learn", overrides=[f"parser.gateway_url={gateway_url}", *overrides])
    return OmegaConf.to_container(config.parser, resolve=True), int(config.data.max_response_length)


def _lexicon(data: str | Path) -> list[str]:
    """The name lexicon the data was built with (its card's `lexicon`), or none."""
    from data_prep.synthetic_world import lexicon_words

    card = Path(data) / "warmup.json.card.json"
    size = json.loads(card.read_text())["config"].get("lexicon") if card.is_file() else None
    return lexicon_words(int(size)) if size else []


def build(data: str | Path, out: str | Path, gateway_url: str, overrides: Sequence[str] = (), cache: bool = True) -> dict[str, Any]:
    """Record the demonstrations of `data/warmup.json`, fit the tokenizer and the lead, write
    them to `out` (a Hugging Face model directory, tokenizer included)."""
    from parser.records.jsonl import read_records

    from parser.offline import byte_bpe_tokenizer
    from parser.offline.assets import cached_directory

    settings, response_length = _settings(gateway_url, overrides)
    cfg = settings.pop("warm_start")
    rows = read_records(Path(data) / "warmup.json")
    demo_rows, hops, weights = demonstrations(rows, float(cfg["follow_up"]))
    paragraphs = list(dict.fromkeys(p for row in rows for p in row["context"].split("\n\n")))
    # the tokenizer is fitted to the text of a first recording, then every episode is recorded with it
    probe = asyncio.run(record(demo_rows[:64], settings, byte_bpe_tokenizer(), response_length, hops[:64]))
    tokenizer = fit_tokenizer(probe, byte_bpe_tokenizer(), paragraphs, int(cfg["vocab_size"]), words=_lexicon(data))
    episodes = asyncio.run(record(demo_rows, settings, tokenizer, response_length, hops))
    full = [e for e, h in zip(episodes, hops, strict=True) if h is None]
    solved = sum(e.reward for e in full) / len(full)
    if solved < 0.99:
        raise RuntimeError(f"only {solved:.0%} of the full-chain demonstrations reached the gold answer: are the "
                           "subagents the world reader (parser loopback --reader world)?")
    copies, copy_weights = answer_turn_copies(episodes, hops, float(cfg["answer_turn"]))
    episodes, weights = episodes + copies, list(weights) + copy_weights
    train = {k: cfg[k] for k in ("model", "steps", "batch_size", "lr", "seed", "copy_steps", "copy_batch_size")}
    key = hashlib.sha256(repr(([(e.ids, e.mask) for e in episodes], weights, train, tokenizer.get_vocab() and
                               sorted(tokenizer.get_vocab().items()))).encode()).hexdigest()[:16]

    names = sorted({p.split("\n")[1] for p in paragraphs if p.startswith("Document ") and p.count("\n") >= 2})

    def fit(directory: Path) -> None:
        model, _ = warm_start(tokenizer, episodes, weights, names=names, **train)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    out = cached_directory("cpu_learn_lead", key, Path(out), fit, cache=cache)
    return {"lead": str(out), "demonstrations": len(episodes), "prompt_tokens": episodes[0].prompt_len,
            "episode_tokens": max(len(e.ids) for e in episodes), "cache_key": key}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="data_prep's learn_cpu output (warmup.json)")
    ap.add_argument("--out", required=True, help="directory for the lead (weights + tokenizer)")
    ap.add_argument("--gateway-url", required=True, help="the world readers (loopback --reader world)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of train/cpu_learn (e.g. parser.warm_start.steps=50)")
    args = ap.parse_args(argv)
    for key, value in build(args.data, args.out, args.gateway_url, args.overrides).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
