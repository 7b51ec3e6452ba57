"""The CPU smoke run's lead model and data: a tiny lead whose sampled answers are sometimes right.

Why it exists: a GRPO step only moves the weights when a group's rewards differ, and a
random-weight model never writes a parseable answer. So the smoke lead is a tiny real Qwen3
(parser.offline.tiny) taught, in a few seconds of supervised steps, the two ParSer episodes
of one question: query the subagents, read the observation, then answer — right ("Miro Tal",
the loopback subagents' finding) or wrong ("Anna Berg") with equal probability. The
episodes it learns from are recorded through the real episode engine and the subagents over
HTTP, so their token views are exactly what the trainer's rollout will produce. Sampling at
temperature 1 then gives groups with real exact-match variance; no reward is scripted.

    parser loopback --port 31001 --needle "directed by Miro Tal" &
    parser train smoke --out runs/cpu_smoke --gateway-url http://127.0.0.1:31001
    # -> runs/cpu_smoke/{lead,data/train.parquet,data/val.parquet}; recipes/train_cpu_smoke.sh does both

The data are `data_prep.verl_parquet` rows of one synthetic document (the needle among
filler paragraphs), the format every training run reads. Why a `parser` command (parser/cli/) and
not `parser/train/cpu/`: it draws on data_prep (the parquet writer), which no `parser/train` module
may import, and `parser train memagent-smoke` (which builds on a method) reuses its fitting.
"""
from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path
from typing import Any

QUESTION = "Who directed the film Zorvan?"
NEEDLE = "directed by Miro Tal"  # what the loopback subagents answer with (--needle)
ANSWER = "Miro Tal"
WRONG = "Anna Berg"
CALL = "<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
QUERY_TURN = "I need the director.\n</think>\n\n" + CALL.format(QUESTION)
ANSWER_TURN = "The agents found it.\n</think>\n\n<answer>{}</answer>"
# Supervised steps for the smoke lead: the loss reaches its plateau by step ~90 (0.024 at 90, 0.0233
# at 100, 0.0223 at 200, with an Adam spike to 0.45 at 140 between); each step is ~0.12 CPU-s.
FIT_STEPS = 100


def document(n_filler: int = 8) -> str:
    from parser.text.chunking import render_paragraphs

    paragraphs = [f"Filler {i}\nNothing about films here, only weather number {i}." for i in range(1, n_filler + 1)]
    paragraphs.insert(n_filler // 2, f"Zorvan\nZorvan is a 1981 film {NEEDLE}.")
    return render_paragraphs(paragraphs)


def eval_rows(n: int) -> list[dict[str, Any]]:
    """`n` eval rows (data_prep's row shape) over the smoke document."""
    return [{"index": i, "id": f"zorvan-{i}", "question": QUESTION, "answers": [ANSWER], "context": document(),
             "num_docs": 9} for i in range(n)]


def write_data(out: Path, n_train: int = 16, n_val: int = 2) -> tuple[Path, Path]:
    from data_prep.verl_parquet import write_rl_parquet

    train = write_rl_parquet(out / "train.parquet", eval_rows(n_train), data_source="cpu_smoke")
    val = write_rl_parquet(out / "val.parquet", eval_rows(n_val), data_source="cpu_smoke", split="val")
    return train, val


class _ScriptedLead:
    """verl's server-manager contract replaying one scripted episode (query turn, answer turn)."""

    def __init__(self, tokenizer: Any, answer: str):
        self.turns = [QUERY_TURN, ANSWER_TURN.format(answer)]
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.tokenizer = tokenizer
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end]
        return TokenOutput(token_ids=ids, stop_reason="stop", extra_fields={"global_steps": 0})


async def record_episodes(settings: dict[str, Any], tokenizer: Any, response_length: int) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) of the right and the wrong episode, run by the real episode engine."""
    from parser.engine.episode import EpisodeEngine
    from parser.train.worker import WorkerState, close_worker_state
    from parser.train.server_manager import ServerManagerBackend

    state = WorkerState(settings, response_length)
    chunks = state.protocol.chunk(document(), state.subagent_tokenizer)
    sequences = []
    try:
        for answer in (ANSWER, WRONG):
            lead = ServerManagerBackend(_ScriptedLead(tokenizer, answer), {"temperature": 1.0})
            engine = EpisodeEngine(lead, tokenizer, state.reader, state.config, state.protocol)
            trajectory = await engine.run(QUESTION, chunks, doc_id="zorvan", request_id=f"record-{answer}")
            if trajectory.answer != answer:
                raise RuntimeError(f"recording the smoke episode failed: answer {trajectory.answer!r} "
                                   f"(stop {trajectory.stop_reason}); is the gateway a loopback with --needle?")
            ids = list(trajectory.prompt_ids) + list(trajectory.response_ids)
            sequences.append((ids, [0] * len(trajectory.prompt_ids) + list(trajectory.response_mask)))
    finally:
        await state.backend.aclose()
        await close_worker_state()
    return sequences


def teach_lead(tokenizer: Any, sequences: list[tuple[list[int], list[int]]], steps: int, seed: int = 0):
    """A tiny Qwen3 fitted to the episodes' lead tokens (observations and prompt masked out).

    The loss is the causal LM loss on the lead tokens (each sequence's mean, averaged), with the
    LM head applied only where the next token is the lead's: the same loss as `labels` with -100
    elsewhere (equal to 1e-6 on these episodes), for ~20% less CPU (15-70 lead tokens in
    170-1,150-token sequences)."""
    import torch
    import torch.nn.functional as F

    from parser.offline import tiny_qwen3

    model = tiny_qwen3(tokenizer, seed=seed).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = []
    for ids, mask in sequences:
        inputs = torch.tensor([ids])
        predicting = torch.tensor(mask[1:]).nonzero().squeeze(1)  # positions whose next token is the lead's
        batch.append((inputs, predicting, inputs[0, 1:][predicting]))
    for _ in range(steps):
        loss = sum(F.cross_entropy(model.lm_head(model.model(input_ids=inputs).last_hidden_state[0, predicting]), labels)
                   for inputs, predicting, labels in batch) / len(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), float(loss.detach())


def cached_lead(name: str, tokenizer: Any, sequences: list[tuple[list[int], list[int]]], steps: int,
                target: Path, cache: bool) -> Path:
    """`teach_lead` on `sequences`, saved with its tokenizer under the asset cache as `name`, keyed
    by the sequences and steps (they change whenever the prompts, tokenizer or settings do)."""
    import hashlib

    from parser.offline.assets import cached_directory

    def fit(directory: Path) -> None:
        model, _ = teach_lead(tokenizer, sequences, steps=steps)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    key = hashlib.sha256(repr((sequences, steps)).encode()).hexdigest()[:16]
    return cached_directory(name, key, target, fit, cache=cache)


def build(out: str | Path, gateway_url: str, steps: int = FIT_STEPS, cache: bool = True) -> dict[str, str]:
    """Write the smoke lead (weights + tokenizer) and the parquet files under `out`. The lead is
    cached under the asset cache, keyed by the recorded episodes (they change whenever the
    prompts, tokenizer or episode settings do), so reruns skip the fitting (~12 CPU-s)."""

    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from parser.offline import byte_bpe_tokenizer
    from parser.train.train import CONFIG_DIR

    out = Path(out)
    random.seed(0)
    torch.manual_seed(0)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name="train/cpu_smoke", overrides=[f"parser.gateway_url={gateway_url}"])
    settings = OmegaConf.to_container(config.parser, resolve=True)
    tokenizer = byte_bpe_tokenizer()
    sequences = asyncio.run(record_episodes(settings, tokenizer, int(config.data.max_response_length)))
    lead = cached_lead("cpu_smoke_lead", tokenizer, sequences, steps, out / "lead", cache)
    train, val = write_data(out / "data")
    return {"lead": str(lead), "train_files": str(train), "val_files": str(val),
            "episode_tokens": str(len(sequences[0][0]))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for lead/ and data/")
    ap.add_argument("--gateway-url", required=True, help="loopback subagents started with --needle")
    ap.add_argument("--steps", type=int, default=FIT_STEPS, help="supervised steps for the tiny lead")
    args = ap.parse_args(argv)
    for key, value in build(args.out, args.gateway_url, args.steps).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
