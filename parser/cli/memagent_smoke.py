"""The CPU memory-agent run's lead and data: a tiny MemAgent whose sampled answers are sometimes right.

Why it exists: to show that verl's trainer trains a memory agent (parser.methods.memagent.train,
train/memagent_cpu) the policy must write memory updates and a `\\boxed{}` answer that is right in
some trajectories of a group and wrong in others; a random-weight model writes neither. So, as
`parser train smoke` does for the ParSer lead, a tiny real Qwen3 is taught in a few
seconds of supervised steps the conversations of one MemAgent read of the smoke document —
copy the needle's fact into the memory when the chunk holds it, keep the memory otherwise, then
answer right ("Miro Tal") or wrong ("Anna Berg") with equal probability. The conversations it
learns from are recorded through the real memory agent (`parser.methods.memagent`) and the
training loop's own recording lead, so their token streams are exactly what the rollout makes.

    parser train memagent-smoke --out runs/memagent_cpu
    parser train --config-name train/memagent_cpu actor_rollout_ref.model.path=runs/memagent_cpu/lead \\
        data.train_files=runs/memagent_cpu/data/train.parquet data.val_files=runs/memagent_cpu/data/val.parquet

A `parser` command (parser/cli/) because it builds on the memagent method and the trainer's
server manager: a method's module may import `parser.train` only from its train.py, and
`parser/train` never imports a method.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
from pathlib import Path
from typing import Any

from parser.cli.train_smoke import ANSWER, NEEDLE, QUESTION, WRONG, cached_lead, document, eval_rows

FACT = "Zorvan was directed by Miro Tal."
AGENT_NAME = "memagent_agent"
# Supervised steps for the memory-agent lead (12 conversations): the loss levels off by step ~140
# (0.0221 at 100, 0.0103 at 140, 0.0092 at 200); each step is ~0.14 CPU-s.
FIT_STEPS = 140


class _ScriptedMemory:
    """verl's server-manager contract writing one MemAgent read: the fact once its chunk is seen."""

    def __init__(self, tokenizer: Any, answer: str):
        self.tokenizer, self.answer = tokenizer, answer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        user = self.tokenizer.decode(prompt_ids).rsplit("<|im_start|>user\n", 1)[1]
        memory = re.search(r"<memory>\n(.*?)\n</memory>", user, re.S).group(1)
        if "<section>" in user:
            reply = FACT if NEEDLE in user.split("<section>", 1)[1] or FACT in memory else "Nothing about the director yet."
        else:
            reply = f"\\boxed{{{self.answer}}}"
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end]
        return TokenOutput(token_ids=ids, stop_reason="stop", extra_fields={"global_steps": 0})


async def record_conversations(method_settings: dict[str, Any], tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) of every conversation of a right and a wrong read."""
    from parser.serving.backends.models import Models
    from parser.text.chat_format import CHATML
    from parser.methods import build_method
    from parser.methods.base import Sample
    from parser.methods.memagent.train import RecordingLead, method_settings as split_settings
    from parser.train.server_manager import ServerManagerBackend

    config, _ = split_settings(method_settings)
    sequences = []
    for answer in (ANSWER, WRONG):
        server = ServerManagerBackend(_ScriptedMemory(tokenizer, answer), {"temperature": 1.0},
                                      stop_token_ids=CHATML.stop_token_ids(tokenizer))
        lead = RecordingLead(server, tokenizer)
        method = build_method(config, Models(lead=lead, lead_tokenizer=tokenizer))
        result = await method.run(Sample(id=f"record-{answer}", question=QUESTION, answers=[ANSWER], context=document()))
        if result.answer != answer or FACT not in result.trace.extras.get("final_memory", ""):
            raise RuntimeError(f"recording the memory-agent read failed: answer {result.answer!r}, memory "
                               f"{result.trace.extras.get('final_memory')!r}")
        sequences += [(c.prompt_ids + c.response_ids, [0] * len(c.prompt_ids) + [1] * len(c.response_ids))
                      for c in lead.conversations]
    return sequences


def build(out: str | Path, steps: int = FIT_STEPS, cache: bool = True) -> dict[str, str]:
    """The lead (weights + tokenizer) and the parquet files under `out`; the lead is cached under
    the asset cache, keyed by the recorded conversations (as `parser.cli.train_smoke.build`)."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from data_prep.verl_parquet import write_rl_parquet
    from parser.offline import byte_bpe_tokenizer
    from parser.train.train import CONFIG_DIR

    out = Path(out)
    random.seed(0)
    torch.manual_seed(0)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name="train/memagent_cpu")
    tokenizer = byte_bpe_tokenizer()
    sequences = asyncio.run(record_conversations(OmegaConf.to_container(config.parser.memagent, resolve=True), tokenizer))
    lead = cached_lead("memagent_smoke_lead", tokenizer, sequences, steps, out / "lead", cache)
    data = out / "data"
    train = write_rl_parquet(data / "train.parquet", eval_rows(16), data_source="memagent_cpu", agent_name=AGENT_NAME)
    val = write_rl_parquet(data / "val.parquet", eval_rows(2), data_source="memagent_cpu", split="val", agent_name=AGENT_NAME)
    return {"lead": str(lead), "train_files": str(train), "val_files": str(val),
            "conversations": str(len(sequences) // 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for lead/ and data/")
    ap.add_argument("--steps", type=int, default=FIT_STEPS, help="supervised steps for the tiny lead")
    args = ap.parse_args(argv)
    for key, value in build(args.out, args.steps).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
