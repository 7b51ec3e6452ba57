"""What one verl rollout worker builds once for every episode-engine trajectory it runs.

Why it exists: verl instantiates a new agent loop per trajectory, but the gateway session, the
subagent reader, the protocol object and the engines must be one per worker process, so that
`EpisodeConfig.max_concurrency` bounds the whole worker and the gateway sees one pooled client.
ParSer's agent loop (`parser.methods.parser.train`) reads them from here, and so do the CPU runs
that record episodes without an agent loop (`parser train smoke`, `parser train warm-start`). It
imports no method: a loop that needs one imports this module, never the other way round.

    state = worker_state(settings, response_length)    # `settings`: the trainer config's `parser:` block
    engine = state.engine(server_manager, tokenizer, sampling_params)
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Mapping

from parser.base.config import EpisodeConfig
from parser.engine.episode import EpisodeEngine
from parser.engine.protocol import protocol_for
from parser.engine.readers import reader_for_episode
from parser.serving.backends import build_backend
from parser.serving.backends.models import Models
from parser.serving.retry import RetryingBackend, RetryPolicy
from parser.train.infomem.gain import GainScorer, InfoGainConfig
from parser.train.reward import episode_reward
from parser.train.server_manager import ServerManagerBackend


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


class WorkerState:
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


_STATE: dict[str, WorkerState] = {}


async def close_worker_state() -> None:
    """Close the gateway sessions of this process (tests; Ray workers just exit)."""
    while _STATE:
        _, state = _STATE.popitem()
        await state.backend.aclose()


def worker_state(settings: Mapping[str, Any], response_length: int) -> WorkerState:
    """This process's `WorkerState` for these settings (built on the first trajectory)."""
    key = repr((sorted(settings.items()), response_length))
    if key not in _STATE:
        _STATE[key] = WorkerState(settings, response_length)
    return _STATE[key]
