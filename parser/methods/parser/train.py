"""The ParSer lead agent as a verl 0.9.1 agent loop: one `run` = one core episode.

Why it exists: verl's rollout workers call `AgentLoopBase.run(sampling_params, **row)` once per
trajectory and train on the `AgentLoopOutput` it returns. This class turns a dataset row into
the core engine's inputs (question, chunks of the document), runs `parser.engine.episode.EpisodeEngine`
— the same loop eval runs, never a copy — with the lead served by verl's rollout replicas
(`parser.train.server_manager`) and the subagents by the gateway (`parser.gateway_url`), and
hands back the engine's appended token view: `response_mask` is 1 exactly on lead-generated
tokens, 0 on template/observation tokens.

Registration (verl builds it with `hydra.utils.instantiate` in every rollout worker):

    # configs/train/agent_loop.yaml
    - name: parser_agent
      _target_: parser.train.agent_loop.ParserAgentLoop

    actor_rollout_ref.rollout.agent.agent_loop_config_path=configs/train/agent_loop.yaml
    # and every dataset row has agent_name = "parser_agent"

Settings live in the trainer config's `parser:` block (gateway URL, subagent client, episode
knobs; see configs/train/parser_base.yaml). `rollout.response_length` caps the response: the
engine stops generating when it is spent, and what an observation pushes past it is cut here.

Dataset row (`data_prep.verl_parquet`): `prompt` = chat messages holding only the question
(arrives as `raw_prompt`), `extra_info.context` = the document, `reward_model.ground_truth` =
gold answers. The authors' released parquet (a top-level `context`, the question in `prompt[0]`)
loads as it is (`parser.records.rl_rows`). Unknown columns are accepted and ignored.

With `parser.info_gain.enable` (InfoMem, configs/train/parser_4b_infomem.yaml) a successful
trajectory also carries its answer-conditioned evidence gain in `extra_fields["info_gain"]`,
scored by the policy or the frozen subagent model (`parser.info_gain`, `parser.train.infomem.group`);
the reward here stays EM, and the replay buffer composes the group's rewards.

The protocol object (`parser.engine.protocol`) is chosen once per worker from `parser.episode.protocol`
and handed to the chunking, the reader, the engine, the reward and the mask, exactly as eval's
`parser.methods.parser.ParSerMethod` does. With `release` (configs/train/parser_4b_release.yaml)
the reward is the release's training EM and its invalid-turn mask rule applies: an invalid
turn's tokens train only in an episode rewarded below 0.2 (`parser.text.release.INVALID_MASK_REWARD`).
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Mapping
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from parser.serving.backends import build_backend
from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.train.infomem.gain import SUCCESS, GainRecord, GainScorer, InfoGainConfig, evidence_text, matched_gold
from parser.serving.backends.models import Models
from parser.engine.protocol import protocol_for
from parser.engine.readers import reader_for_episode
from parser.serving.retry import RetryingBackend, RetryPolicy
from parser.records.trajectory import Trajectory
from parser.train.metrics import trajectory_metrics
from parser.records.rl_rows import episode_inputs
from parser.train.reward import ANSWER_KEY, PROTOCOL_KEY, episode_reward, gold_answers
from parser.train.server_manager import ServerManagerBackend

AGENT_NAME = "parser_agent"  # configs/train/agent_loop.yaml `name`; the dataset's agent_name


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
    if config.constrain_lead:
        raise ValueError("parser.episode.constrain_lead masks the lead's sampling distribution, which the actor does "
                         "not recompute under the mask; it is for untrained eval/demo leads, unset it for training")
    return config


class _WorkerState:
    """Per rollout-worker objects shared by every trajectory it runs (verl instantiates a new
    agent loop per trajectory): the episode's protocol object, the gateway session, the subagent
    reader, and one engine per (event loop, sampling policy) so `EpisodeConfig.max_concurrency`
    bounds the whole worker."""

    def __init__(self, settings: Mapping[str, Any], response_length: int):
        self.config = episode_config(settings.get("episode", {}), response_length)
        self.protocol = protocol_for(self.config)
        if not settings.get("gateway_url"):
            raise ValueError("parser.gateway_url is not set: the subagents' gateway (sglang-router) URL")
        # the gateway client and the subagent tokenizer (chunks are counted in its tokens)
        self.backend, self.subagent_tokenizer = build_backend(settings["subagent"])
        subagents = Models(lead=None, lead_tokenizer=None, subagent=self.backend, subagent_tokenizer=self.subagent_tokenizer)
        self.reader = reader_for_episode(settings.get("reader"), subagents, self.config, self.protocol)
        if "reward" not in settings:
            raise ValueError("parser.reward is not set: the episode reward's name (parser.train.reward.REWARDS); "
                             "compose from configs/train/parser_base.yaml")
        self.reward = episode_reward(settings["reward"])
        self.engines: dict[tuple[int, tuple], EpisodeEngine] = {}
        self.info_gain = InfoGainConfig.from_settings(settings.get("info_gain"))
        self.gain_scorers: dict[tuple[int, int], GainScorer] = {}

    def engine(self, server_manager: Any, lead_tokenizer: Any, sampling_params: Mapping[str, Any]) -> EpisodeEngine:
        stop_ids = self.protocol.chat.stop_token_ids(lead_tokenizer)
        lead = ServerManagerBackend(server_manager, sampling_params, stop_token_ids=stop_ids)
        key = (id(asyncio.get_running_loop()), id(server_manager), tuple(sorted(lead.policy.items())))
        if key not in self.engines:
            self.engines[key] = EpisodeEngine(lead, lead_tokenizer, self.reader, self.config, self.protocol)
        return self.engines[key]


    def gain_scorer(self, server_manager: Any, lead_tokenizer: Any) -> GainScorer:
        """InfoMem's scorer for this worker: the policy through verl's rollout servers, or the
        frozen subagent model through the gateway client (`parser.info_gain.scorer`)."""
        key = (id(asyncio.get_running_loop()), id(server_manager) if self.info_gain.scorer == "policy" else 0)
        if key not in self.gain_scorers:
            if self.info_gain.scorer == "policy":
                scorer, tokenizer = ServerManagerBackend(server_manager, {}), lead_tokenizer
            else:
                scorer, tokenizer = self.backend, self.subagent_tokenizer
            self.gain_scorers[key] = GainScorer(RetryingBackend(scorer, RetryPolicy.of(self.config)), tokenizer, self.info_gain)
        return self.gain_scorers[key]


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


def to_agent_loop_output(trajectory: Trajectory, reward: float, response_length: int, with_logprobs: bool,
                         protocol_key: str, weight_versions: Mapping[str, Any] | None = None) -> AgentLoopOutput:
    """The engine's token view, cut to `response_length`, as verl's AgentLoopOutput.
    `weight_versions` (min/max_global_steps from the server manager) ride in `extra_fields`,
    where verl's trainer reads them, and `protocol_key` (`Protocol.key`) for the reward function."""
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
            PROTOCOL_KEY: protocol_key,
            "parser_stats": stats,
            "reward_extra_info": {"acc": reward},
            "turn_scores": [],
            "tool_rewards": [],
            **dict(weight_versions or {}),
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
        chunks = await self.loop.run_in_executor(None, state.protocol.chunk, inputs.context, state.subagent_tokenizer)
        engine = state.engine(self.server_manager, self.tokenizer, sampling_params)
        request_id = uuid4().hex
        try:
            trajectory = await engine.run(inputs.question, chunks, doc_id=inputs.id, request_id=request_id)
        finally:
            weight_versions = engine.lead.take_weight_versions(request_id)
        if not trajectory.token_view_valid:
            raise ValueError(f"trajectory {inputs.id!r} has an approximate token view ({trajectory.token_view_note}); "
                             "serve the lead from a backend that returns token ids")
        if len(trajectory.prompt_ids) > self.prompt_length:
            raise ValueError(
                f"lead prompt has {len(trajectory.prompt_ids)} tokens > actor_rollout_ref.rollout.prompt_length="
                f"{self.prompt_length} (data.max_prompt_length); raise it — a cut system prompt is not trainable"
            )
        reward = state.reward(trajectory, inputs.answers, state.protocol)
        state.protocol.mask_invalid_turns(trajectory, reward)
        output = to_agent_loop_output(
            trajectory, reward, self.response_length, with_logprobs=bool(sampling_params.get("logprobs")),
            protocol_key=state.protocol.key, weight_versions=weight_versions,
        )
        if state.info_gain.enable:  # InfoMem: only a successful trajectory's evidence is scored
            if reward >= SUCCESS:
                gold = matched_gold(trajectory.answer, gold_answers(inputs.answers), state.protocol.exact_match)
                record = await state.gain_scorer(self.server_manager, self.tokenizer).gain(
                    inputs.question, evidence_text(trajectory), gold, request_id=request_id)
            else:
                record = GainRecord(gain=None, scorer=state.info_gain.scorer, prompt_version=state.info_gain.prompt_version,
                                    error="not a successful trajectory")
            output.extra_fields["info_gain"] = record.to_dict()
        return output
