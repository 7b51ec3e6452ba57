"""The outer edge of verl's rollout, faked for CPU tests of `parser.train` (helpers, not tests).

verl's agent loop reaches the lead only through `server_manager.generate(request_id,
prompt_ids=, sampling_params=) -> TokenOutput`; on a cluster that is SGLang. Here it is a tiny
real model in process, either sampling freely (`TinyModelServerManager`) or replaying scripted
generations whose log-probs the same tiny model computes (`ScriptedServerManager`) — so a test
can make the lead call tools and answer, and still get real rollout log-probs. Everything
between (verl's AgentLoopWorker, Hydra instantiation, our agent loop, the episode engine, HTTP
subagents, verl's post-processing) is the real code.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

CALL = "<tool_call>\n<function=query_agents>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
NEEDLE = "directed by Miro Tal"
ANSWER = "Miro Tal"
# One query, then the answer: the paper's shortest useful episode.
SCRIPT = [
    ("I need the director.\n</think>\n\n" + CALL.format("Who directed the film Zorvan?"), "stop"),
    ("The agents found it.\n</think>\n\n<answer>Miro Tal</answer>", "stop"),
]
# A sibling in the same GRPO group that answers wrongly (reward 0), so advantages are non-zero.
WRONG_SCRIPT = [SCRIPT[0], ("I will guess.\n</think>\n\n<answer>Anna Berg</answer>", "stop")]
QUESTIONS = ["Who directed the film Zorvan?", "Which person directed Zorvan?"]


def document(n_filler: int = 8) -> str:
    from parser.text.chunking import render_paragraphs

    paragraphs = [f"Filler {i}\nNothing about films here, only weather number {i}." for i in range(1, n_filler + 1)]
    paragraphs.insert(n_filler // 2, f"Zorvan\nZorvan is a 1981 film {NEEDLE}.")
    return render_paragraphs(paragraphs)


def dataset_row(index: int = 0, question: str = "Who directed the film Zorvan?") -> dict[str, Any]:
    """A row as data_prep.verl_parquet writes it, as verl's RLHFDataset hands it to the loop."""
    from data_prep.verl_parquet import rl_row

    row = rl_row(
        {"index": index, "id": f"doc-{index}", "question": question, "answers": [ANSWER], "context": document(),
         "num_docs": 9},
        data_source="synthetic",
    )
    row["raw_prompt"] = row.pop("prompt")
    return row


@dataclasses.dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]


def sequence_logprobs(model: Any, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """log p(token_ids | prompt_ids) under `model`, one value per token (teacher forcing)."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def prompt_logprobs_output(model: Any, ids: list[int], version: int):
    """What verl's SGLang/vLLM rollout server answers to `prompt_logprobs: 0`: one row per token
    (row p holds token p+1's id and logprob), a dummy last row, and one generated token."""
    from verl.workers.rollout.replica import TokenOutput

    lps = sequence_logprobs(model, ids[:1], ids[1:])
    extra = {"global_steps": version, "prompt_ids": [[t] for t in ids[1:]] + [[0]],
             "prompt_logprobs": [[lp] for lp in lps] + [[0.0]]}
    return TokenOutput(token_ids=[ids[-1]], log_probs=None, stop_reason="length", extra_fields=extra)


class TinyModelServerManager:
    """verl's server-manager contract over an in-process tiny model that samples freely."""

    def __init__(self, model: Any, tokenizer: Any):
        from parser.serving.backends.transformers import TransformersBackend

        self.backend = TransformersBackend(model, tokenizer)
        self.requests: list[Request] = []
        self.outputs: list[tuple[str, list[int]]] = []  # (request_id, generated ids)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        from parser.serving.types import SamplingParams

        self.requests.append(Request(request_id, list(prompt_ids), dict(sampling_params)))
        sampling = SamplingParams(
            max_new_tokens=int(sampling_params["max_tokens"]),
            temperature=float(sampling_params["temperature"]),
            top_p=float(sampling_params["top_p"]),
            top_k=int(sampling_params["top_k"]),
            return_logprobs=bool(sampling_params.get("logprobs")),
            seed=len(self.requests),
        )
        out = await self.backend.generate(list(prompt_ids), sampling, request_id=request_id)
        self.outputs.append((request_id, list(out.token_ids)))
        return TokenOutput(token_ids=out.token_ids, log_probs=out.logprobs, stop_reason=out.finish_reason)


class ScriptedServerManager:
    """Replays a script per trajectory (keyed by request_id). Trajectories with the same first
    prompt (one GRPO group) take the scripts in turn, whatever order asyncio starts them in;
    log-probs come from the tiny model."""

    def __init__(self, model: Any, tokenizer: Any, scripts: list[list[tuple[str, str]]] = (SCRIPT,)):
        self.model = model
        self.tokenizer = tokenizer
        self.scripts = list(scripts)
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.requests: list[Request] = []
        self.turns: dict[str, int] = {}
        self.script_of: dict[str, int] = {}
        self.group_counts: dict[tuple[int, ...], int] = {}
        self.first_version = 7
        self.scored: list[list[int]] = []  # prompt_logprobs requests

    def script_ids(self, request_id: str, turn: int, prompt_ids: list[int]) -> tuple[list[int], str]:
        if request_id not in self.script_of:
            key = tuple(prompt_ids)
            self.script_of[request_id] = self.group_counts.get(key, 0) % len(self.scripts)
            self.group_counts[key] = self.group_counts.get(key, 0) + 1
        script = self.scripts[self.script_of[request_id]]
        text, finish = script[turn]
        ids = self.tokenizer.encode(text, add_special_tokens=False) + ([self.end] if finish == "stop" else [])
        return ids, finish

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        if sampling_params.get("prompt_logprobs") is not None:  # a scoring request (InfoMem's policy scorer)
            self.scored.append(list(prompt_ids))
            return prompt_logprobs_output(self.model, list(prompt_ids), self.first_version)
        self.requests.append(Request(request_id, list(prompt_ids), dict(sampling_params)))
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        ids, finish = self.script_ids(request_id, turn, list(prompt_ids))
        ids = ids[: int(sampling_params["max_tokens"])]
        logprobs = sequence_logprobs(self.model, list(prompt_ids), ids) if sampling_params.get("logprobs") else None
        # verl's LLMServerClient tags every call with the weight version that served it; here the
        # weights "move" by one version per turn, as when a sync lands mid-trajectory.
        version = self.first_version + turn
        extra = {"global_steps": version, "min_global_steps": version, "max_global_steps": version}
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=finish, extra_fields=extra)


# ----------------------------------------------------------------------------- verl plumbing
def save_tiny_model(model: Any, tokenizer: Any, path: str) -> str:
    """verl's workers load the lead's tokenizer and HF config from `actor_rollout_ref.model.path`."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_config(gateway_url: str, model_dir: str, overrides: list[str] = ()):  # type: ignore[assignment]
    """The shipped 4B config, shrunk to the tiny model (what `parser.train` would launch)."""
    from hydra import compose, initialize_config_dir

    from parser.train.train import CONFIG_DIR, prepare

    base = [
        f"parser.gateway_url={gateway_url}",
        "parser.subagent.tokenizer=tiny-qwen3.5",
        f"actor_rollout_ref.model.path={model_dir}",
        "data.max_prompt_length=4096",
        "data.max_response_length=2048",
        "parser.episode.chunk_size=64",
        "parser.episode.max_turns=3",
        "actor_rollout_ref.rollout.agent.num_workers=1",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return prepare(compose(config_name="train/parser_4b", overrides=base + list(overrides)))


def run_verl_worker(config: Any, server_manager: Any, rows: list[dict[str, Any]], validate: bool = False):
    """verl's own AgentLoopWorker (in process, no Ray): Hydra-instantiates our loop from the
    agent-loop YAML, runs each row, post-processes into the padded DataProto the trainer gets."""
    import asyncio

    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    from parser.train.worker import close_worker_state

    worker = AgentLoopWorker(config, server_manager)
    non_tensors = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    batch = DataProto.from_dict(non_tensors=non_tensors, meta_info={"global_steps": 1, "validate": validate})

    async def go():
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_worker_state()

    return asyncio.run(go())
