"""The ParSer lead agent as a verl 0.9.1 agent loop: one `run` = one core episode.

Why it exists: verl's rollout workers call `AgentLoopBase.run(sampling_params, **row)` once per
trajectory and train on the `AgentLoopOutput` it returns. This class turns a dataset row into
the core engine's inputs (question, chunks of the document), runs `parser.episode.EpisodeEngine`
— the same loop eval runs, never a copy — with the lead served by verl's rollout replicas
(`parser.verl.server_manager`) and the subagents by the gateway (`parser.gateway_url`), and
hands back the engine's appended token view: `response_mask` is 1 exactly on lead-generated
tokens, 0 on template/observation tokens.

Registration (verl builds it with `hydra.utils.instantiate` in every rollout worker):

    # configs/train/agent_loop.yaml
    - name: parser_agent
      _target_: parser.verl.agent_loop.ParserAgentLoop

    actor_rollout_ref.rollout.agent.agent_loop_config_path=configs/train/agent_loop.yaml
    # and every dataset row has agent_name = "parser_agent"

Settings live in the trainer config's `parser:` block (gateway URL, subagent client, episode
knobs; see configs/train/parser_base.yaml). `rollout.response_length` caps the response: the
engine stops generating when it is spent, and what an observation pushes past it is cut here.

Dataset row (data issue's verl parquet): `prompt` = chat messages holding only the question
(arrives as `raw_prompt`), `extra_info.context` = the document, `reward_model.ground_truth` =
gold answers. Unknown columns are accepted and ignored.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Mapping
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from parser.backends import build_backend
from parser.chunking import chunk_document
from parser.episode import EpisodeConfig, EpisodeEngine
from parser.methods import Models
from parser.readers import reader_for_episode
from parser.trajectory import Trajectory
from parser.verl.metrics import trajectory_metrics
from parser.verl.reward import ANSWER_KEY, score_answer
from parser.verl.server_manager import ServerManagerBackend

AGENT_NAME = "parser_agent"  # configs/train/agent_loop.yaml `name`; the dataset's agent_name


@dataclasses.dataclass
class EpisodeInputs:
    """What the engine needs from one dataset row."""

    question: str
    document: str
    golds: Any
    doc_id: str


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and DictConfigs from verl's batch -> plain Python."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def episode_inputs(row: Mapping[str, Any]) -> EpisodeInputs:
    """Read question, document, gold answers and a document id from a verl dataset row."""
    extra = _plain(row.get("extra_info")) or {}
    index = _plain(row.get("index", extra.get("index", "")))
    where = f"dataset row index={index!r}"
    question = extra.get("question")
    if not question:
        messages = _plain(row.get("raw_prompt")) or []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise ValueError(f"{where}: no question (neither extra_info.question nor a user message in `prompt`)")
        question = users[-1]["content"]
    document = extra.get("context")
    if not document:
        raise ValueError(f"{where}: extra_info.context (the document) is missing or empty")
    reward_model = _plain(row.get("reward_model")) or {}
    golds = reward_model.get("ground_truth", extra.get("answers"))
    if golds is None or (not isinstance(golds, str) and len(golds) == 0):
        raise ValueError(f"{where}: no gold answers (reward_model.ground_truth / extra_info.answers)")
    doc_id = str(extra.get("id") or extra.get("doc_id") or index)
    return EpisodeInputs(question=str(question), document=str(document), golds=golds, doc_id=doc_id)


def episode_config(settings: Mapping[str, Any], response_length: int) -> EpisodeConfig:
    """`parser.episode` from the trainer config -> EpisodeConfig, bounded by verl's response length."""
    known = {f.name for f in dataclasses.fields(EpisodeConfig)}
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"parser.episode: unknown key(s) {sorted(unknown)}; EpisodeConfig has {sorted(known)}")
    settings = dict(settings)
    if settings.pop("max_response_tokens", None) not in (None, response_length):
        raise ValueError("parser.episode.max_response_tokens must stay null: it is actor_rollout_ref.rollout.response_length")
    config = EpisodeConfig(**settings, max_response_tokens=response_length)
    if config.eval_only_options():
        raise ValueError(f"parser.episode: {', '.join(config.eval_only_options())} re-render the agent's history "
                         "(eval-only): the trajectory would have no token view to train on; unset them for training")
    if config.constrain_lead:
        raise ValueError("parser.episode.constrain_lead masks the lead's sampling distribution, which the actor does "
                         "not recompute under the mask; it is for untrained eval/demo leads, unset it for training")
    return config


class _WorkerState:
    """Per rollout-worker objects shared by every trajectory it runs (verl instantiates a new
    agent loop per trajectory): the gateway session, the subagent reader, and one engine per
    (event loop, sampling policy) so `EpisodeConfig.max_concurrency` bounds the whole worker."""

    def __init__(self, settings: Mapping[str, Any], response_length: int):
        self.config = episode_config(settings.get("episode", {}), response_length)
        if not settings.get("gateway_url"):
            raise ValueError("parser.gateway_url is not set: the subagents' gateway (sglang-router) URL")
        # the gateway client and the subagent tokenizer (chunks are counted in its tokens)
        self.backend, self.subagent_tokenizer = build_backend(settings["subagent"])
        subagents = Models(lead=None, lead_tokenizer=None, subagent=self.backend, subagent_tokenizer=self.subagent_tokenizer)
        self.reader = reader_for_episode(settings.get("reader"), subagents, self.config)
        self.engines: dict[tuple[int, tuple], EpisodeEngine] = {}

    def engine(self, server_manager: Any, lead_tokenizer: Any, sampling_params: Mapping[str, Any]) -> EpisodeEngine:
        lead = ServerManagerBackend(server_manager, sampling_params)
        key = (id(asyncio.get_running_loop()), id(server_manager), tuple(sorted(lead.policy.items())))
        if key not in self.engines:
            self.engines[key] = EpisodeEngine(lead=lead, lead_tokenizer=lead_tokenizer, reader=self.reader, config=self.config)
        return self.engines[key]


_STATE: dict[str, _WorkerState] = {}


async def close_worker_state() -> None:
    """Close the gateway sessions of this process (tests; Ray workers just exit)."""
    while _STATE:
        _, state = _STATE.popitem()
        await state.backend.aclose()


def _worker_state(settings: Mapping[str, Any], response_length: int) -> _WorkerState:
    key = repr((sorted(settings.items()), response_length))
    if key not in _STATE:
        _STATE[key] = _WorkerState(settings, response_length)
    return _STATE[key]


def to_agent_loop_output(trajectory: Trajectory, reward: float, response_length: int, with_logprobs: bool) -> AgentLoopOutput:
    """The engine's token view, cut to `response_length`, as verl's AgentLoopOutput."""
    n = min(len(trajectory.response_ids), response_length)
    lead_s = sum(t.lead_latency_s for t in trajectory.turns)
    scatter_s = sum(t.scatter_latency_s for t in trajectory.turns)
    stats = trajectory_metrics(trajectory)
    stats["truncated"] = float(len(trajectory.response_ids) > response_length)
    return AgentLoopOutput(
        prompt_ids=list(trajectory.prompt_ids),
        response_ids=list(trajectory.response_ids[:n]),
        response_mask=list(trajectory.response_mask[:n]),
        response_logprobs=list(trajectory.response_logprobs[:n]) if with_logprobs else None,
        reward_score=reward,
        # chat messages after the system prompt: user question, assistant turns, observations
        num_turns=max(len(trajectory.messages) - 1, 1),
        metrics=AgentLoopMetrics(generate_sequences=lead_s, tool_calls=scatter_s),
        extra_fields={
            ANSWER_KEY: trajectory.answer,
            "parser_stats": stats,
            "reward_extra_info": {"acc": reward},
            "turn_scores": [],
            "tool_rewards": [],
        },
    )


class ParserAgentLoop(AgentLoopBase):
    """verl agent loop running one ParSer episode per call (see module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        settings = self.config.get("parser")
        if settings is None:
            raise ValueError("trainer config has no `parser:` block (gateway_url, subagent, episode); "
                             "compose from configs/train/parser_base.yaml")
        self.settings = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else dict(settings)
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.state = _worker_state(self.settings, self.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        inputs = episode_inputs(kwargs)
        state = self.state
        chunks = await self.loop.run_in_executor(
            None, chunk_document, inputs.document, state.subagent_tokenizer, state.config.chunk_size
        )
        engine = state.engine(self.server_manager, self.tokenizer, sampling_params)
        trajectory = await engine.run(inputs.question, chunks, doc_id=inputs.doc_id, request_id=uuid4().hex)
        if not trajectory.token_view_valid:
            raise ValueError(f"trajectory {inputs.doc_id!r} has an approximate token view ({trajectory.token_view_note}); "
                             "serve the lead from a backend that returns token ids")
        if len(trajectory.prompt_ids) > self.prompt_length:
            raise ValueError(
                f"lead prompt has {len(trajectory.prompt_ids)} tokens > actor_rollout_ref.rollout.prompt_length="
                f"{self.prompt_length} (data.max_prompt_length); raise it — a cut system prompt is not trainable"
            )
        reward = score_answer(trajectory.answer, inputs.golds)
        return to_agent_loop_output(
            trajectory, reward, self.response_length, with_logprobs=bool(sampling_params.get("logprobs"))
        )
