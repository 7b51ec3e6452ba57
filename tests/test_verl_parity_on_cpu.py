"""Train/eval parity: eval's "parser" method and the verl agent loop run the same episode.

    .venv/bin/pytest tests/test_verl_parity_on_cpu.py -q

Same scripted lead outputs, same loopback HTTP subagents, same episode settings (the shipped
training config's `parser.episode`). Eval goes through `parser.methods.parser.ParSerMethod`;
training through verl's AgentLoopWorker and `parser.verl.agent_loop.ParserAgentLoop`. The lead
must see the same token stream every turn, the trained mask must be the eval lead's generated
spans, and both must end with the same answer.
"""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl_fakes import ANSWER, NEEDLE, SCRIPT, ScriptedServerManager, dataset_row, run_verl_worker, save_tiny_model, train_config  # noqa: E402

from parser.backends.base import Completion  # noqa: E402
from parser.backends.http import HttpBackend  # noqa: E402
from parser.backends.models import Models  # noqa: E402
from parser.methods.base import Sample  # noqa: E402
from parser.methods.parser import ParSerMethod  # noqa: E402
from parser.testing.loopback import start_loopback  # noqa: E402
from parser.verl.agent_loop import episode_config  # noqa: E402
from parser.verl.reward import ANSWER_KEY  # noqa: E402


class ScriptedLead:
    """The eval side's lead: the same script, through the core Backend interface."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prompts: list[list[int]] = []
        self.generated: list[list[int]] = []

    async def generate(self, prompt, sampling, **_):
        text, finish = SCRIPT[len(self.prompts)]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + ([self.end] if finish == "stop" else [])
        self.prompts.append(list(prompt))
        self.generated.append(ids)
        return Completion(text="", token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason=finish)

    async def aclose(self):
        pass


@pytest.fixture(scope="module")
def both_paths(tiny_qwen3_5_model, tiny_tokenizer, tmp_path_factory):
    model_dir = save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path_factory.mktemp("tiny-lead")))
    row = dataset_row(0)
    with start_loopback("subagent-w1", needle=NEEDLE, needle_answer=ANSWER) as loopback:
        config = train_config(loopback.url, model_dir)
        manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer)
        out = run_verl_worker(config, manager, [row])
        train_records = sorted((r.routing_key, r.prefix_hash) for r in loopback.worker.records)

        loopback.worker.records.clear()
        lead = ScriptedLead(tiny_tokenizer)
        episode = episode_config(OmegaConf.to_container(config.parser.episode), 10**9)
        episode.max_response_tokens = None  # eval has no response budget
        models = Models(lead=lead, lead_tokenizer=tiny_tokenizer, subagent=HttpBackend(loopback.url),
                        subagent_tokenizer=tiny_tokenizer)
        method = ParSerMethod(models, episode=episode)
        sample = Sample(id=row["extra_info"]["id"], question=row["extra_info"]["question"],
                        answers=row["extra_info"]["answers"], context=row["extra_info"]["context"])
        result = asyncio.run(method.run(sample))
        asyncio.run(models.subagent.aclose())
        eval_records = sorted((r.routing_key, r.prefix_hash) for r in loopback.worker.records)
    return out, manager, lead, result, train_records, eval_records


def test_same_prompt_token_stream_every_turn(both_paths):
    out, manager, lead, *_ = both_paths
    assert [r.prompt_ids for r in manager.requests] == lead.prompts


def test_same_full_stream_and_mask(both_paths):
    out, _, lead, *_ = both_paths
    stream = lead.prompts[-1] + lead.generated[-1]
    eval_mask = [0] * len(stream)
    for prompt, generated in zip(lead.prompts, lead.generated):
        eval_mask[len(prompt) : len(prompt) + len(generated)] = [1] * len(generated)
    p = out.batch["prompts"].shape[1]
    valid = out.batch["attention_mask"][0].bool()
    train_stream = out.batch["input_ids"][0][valid].tolist()
    assert train_stream == stream
    prompt_len = int(valid[:p].sum())
    train_mask = out.batch["response_mask"][0][valid[p:]].tolist()
    assert train_mask == eval_mask[prompt_len:] and not any(eval_mask[:prompt_len])


def test_same_answer_turns_and_subagent_requests(both_paths):
    out, _, _, result, train_records, eval_records = both_paths
    assert result.answer == out.non_tensor_batch[ANSWER_KEY][0] == ANSWER
    assert result.steps == out.non_tensor_batch["parser_stats"][0]["turns"] == 2
    assert train_records == eval_records and train_records  # same (chunk, prompt prefix) requests
