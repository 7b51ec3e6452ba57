"""MemAgent (and ReMemR1) as a verl 0.9.1 agent loop: one trajectory = the several conversations
of one memory agent's read, trained by the same trainer as the ParSer lead.

Why it exists: InfoMem's own setting is a chunk-wise memory agent trained with GRPO, every memory
update a conversation of its own and the final reward shared. verl 0.9.1 allows exactly that on
its v1 (TransferQueue) trainer, which ParSer trains with: `AgentLoopBase.run` may return a *list*
of `AgentLoopOutput`s; `AgentLoopWorkerTQ._agent_loop_postprocess` stores each under the key
`{uid}_{session}_{index}`, copies the last output's reward to the others, and
`compute_advantage_for_multi_trajectories` computes GRPO over each session's last output and
broadcasts its advantage to every output of the session. (verl's older `AgentLoopWorker`,
the non-TransferQueue path, takes one output per run; this loop needs `trainer.use_v1`.)

The memory agent is the eval baseline itself, never a copy, built as eval builds it
(`build_method(method_config(parser.memagent.method, **parser.memagent))`): MemAgent, or a method
that trains through this loop (ReMemR1, `configs/method/rememr1.yaml`), whose class is MemAgent's
or a subclass of it. Its lead backend is `RecordingLead`, which turns each rendered prompt into token ids,
generates through verl's rollout servers (`parser.train.server_manager`), and keeps every
conversation's exact token stream — prompt ids as sent, the generated ids with their rollout
log-probs — from which the outputs are built (mask 1 on every generated token: a memory agent's
response is all its own). The final call uses MemAgent's training prompt (`answer_mode: boxed`,
unless `parser.memagent.answer_mode` says otherwise), and the reward is `parser.memagent.reward`:
`memagent` (default) is MemAgent's RL reward (`parser.methods.memagent.rules.memagent_rl_reward`: the last
`\\boxed{}` within the final reply's last 300 characters, lowercased, equal to a lowercased gold
after MemAgent's math-string normaliser); `exact_match` is this project's EM of the answer the
method extracted (its `answer_mode`, `lenient_extraction`). With
`parser.info_gain.enable` the final memory is the evidence InfoMem scores (`parser.info_gain`),
and the replay buffer composes the group (`parser.train.infomem.group`).

Registration (configs/train/agent_loop.yaml) and settings (the trainer config's `parser:` block):

    - name: memagent_agent
      _target_: parser.methods.memagent.train.MemAgentAgentLoop

    parser.memagent: {method: memagent, reward: memagent, answer_mode: boxed, chunk_size: 5000, ...}
    # dataset rows with agent_name = memagent_agent (data_prep.verl_parquet.write_rl_parquet(agent_name=...))
    parser train --config-name train/memagent_4b parser.gateway_url=http://127.0.0.1:30000
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Mapping
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from parser.base.config import EpisodeConfig
from parser.engine.protocol import protocol_for
from parser.methods import build_method, method_class, method_config
from parser.methods.base import Sample
from parser.methods.memagent.method import NO_MEMORY, MemAgentMethod
from parser.methods.memagent.rules import memagent_rl_reward
from parser.records.rl_rows import episode_inputs
from parser.serving.backends.models import Models
from parser.serving.retry import RETRY_KEYS, RetryingBackend, RetryPolicy
from parser.serving.types import Completion, Prompt, SamplingParams
from parser.text.chat_format import CHATML
from parser.train.infomem.gain import SUCCESS, GainRecord, GainScorer, InfoGainConfig, matched_gold
from parser.train.reward import ANSWER_KEY, PROTOCOL_KEY, gold_answers, score_answer
from parser.train.server_manager import ServerManagerBackend

AGENT_NAME = "memagent_agent"  # configs/train/agent_loop.yaml `name`; the dataset's agent_name
REWARD_RULES = ("memagent", "exact_match")  # parser.memagent.reward
NO_SUBAGENT_SCORER = "parser.info_gain.scorer: a memory agent has no subagent model; score with the policy"


@dataclasses.dataclass
class Conversation:
    """One model call of the memory agent, as the rollout saw it."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None


class RecordingLead:
    """The memory agent's lead backend during training: rendered text in, token ids to verl's
    rollout (`ServerManagerBackend`), each call's token stream recorded in order."""

    def __init__(self, lead: ServerManagerBackend, tokenizer: Any):
        self.lead, self.tokenizer = lead, tokenizer
        self.conversations: list[Conversation] = []

    async def generate(self, prompt: Prompt, sampling: SamplingParams, *, routing_key: str | None = None,
                       request_id: str | None = None) -> Completion:
        if not isinstance(prompt, str):
            raise TypeError("RecordingLead takes the memory agent's rendered prompts (text)")
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
        completion = await self.lead.generate(ids, sampling, routing_key=routing_key, request_id=request_id)
        self.conversations.append(Conversation(ids, list(completion.token_ids), completion.logprobs))
        completion.text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        return completion

    async def aclose(self) -> None:
        """Nothing to close: verl owns the rollout client."""


def method_settings(settings: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """`parser.memagent` -> (the memory agent's method config, reward rule). The config is eval's
    (`configs/method/<method>.yaml`) with these keys on top; sampling is verl's (rollout.*); the
    final prompt is MemAgent's training one (`answer_mode: boxed`) unless set."""
    settings = dict(settings or {})
    name = settings.pop("method", "memagent")
    reward = settings.pop("reward", "memagent")
    if reward not in REWARD_RULES:
        raise ValueError(f"parser.memagent.reward={reward!r}; expected one of {REWARD_RULES}")
    settings.setdefault("answer_mode", "boxed")
    for key in ("temperature", "top_p"):
        if key in settings:
            raise ValueError(f"parser.memagent.{key}: training samples with actor_rollout_ref.rollout.{key}; remove it")
    settings.pop("label", None)
    config = method_config(name, **settings)
    if not issubclass(method_class(config["_target_"]), MemAgentMethod):
        raise ValueError(f"parser.memagent.method={name!r} ({config['_target_']}) is not a memory agent: this loop "
                         "trains MemAgent and the methods built on it (MemAgentMethod subclasses)")
    return config, reward


_METHOD_SETTINGS: dict[str, tuple[dict[str, Any], str]] = {}


def _method_settings_once(settings: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """`method_settings`, composed once per process: verl builds a new loop for every trajectory."""
    key = repr(sorted(settings.items()))
    if key not in _METHOD_SETTINGS:
        _METHOD_SETTINGS[key] = method_settings(settings)
    return _METHOD_SETTINGS[key]


class MemAgentAgentLoop(AgentLoopBase):
    """verl agent loop running one MemAgent/ReMemR1 read per call (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        settings = self.config.get("parser") or {}
        settings = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else dict(settings)
        self.info_gain = InfoGainConfig.from_settings(settings.get("info_gain"))
        if self.info_gain.enable and self.info_gain.scorer != "policy":
            raise ValueError(NO_SUBAGENT_SCORER)
        episode = settings.get("episode") or {}
        retry = {key: episode[key] for key in RETRY_KEYS if key in episode}  # parser.episode's, as for the lead
        self.retry = RetryPolicy.from_section(retry)
        # the method's retries too, unless parser.memagent.retry sets its own
        self.method_config, self.reward_rule = _method_settings_once({"retry": retry, **(settings.get("memagent") or {})})
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.protocol = protocol_for(EpisodeConfig())  # this project's EM, for reward: exact_match

    @classmethod
    def check_config(cls, config: Any) -> list[str]:
        """What this loop needs of a composed trainer config, before launch (`parser.train.config_checks`
        asks the loop its config selects): a `parser.memagent` block that builds a memory agent, and
        InfoMem scored by the policy. No gateway: a memory agent reads every chunk itself."""
        settings = config.parser
        if settings.get("memagent") is None:
            return ["parser.memagent is not set: the memory agent's settings (compose from configs/train/memagent_4b.yaml)"]
        problems = []
        try:
            method_settings(OmegaConf.to_container(settings.memagent, resolve=True))
        except (ValueError, ImportError, FileNotFoundError) as error:
            problems.append(str(error))
        info_gain = settings.get("info_gain") or {}
        if info_gain.get("enable") and info_gain.get("scorer") != "policy":
            problems.append(NO_SUBAGENT_SCORER)
        return problems

    def reward(self, result: Any, golds: list[str]) -> float:
        """`parser.memagent.reward` of one read: MemAgent's rule on the final reply, or EM of the answer."""
        if self.reward_rule == "memagent":
            return memagent_rl_reward(result.trace.final_reply, golds)
        return score_answer(result.answer, golds, self.protocol)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        inputs = episode_inputs(kwargs)
        golds = gold_answers(inputs.answers)
        server = ServerManagerBackend(self.server_manager, sampling_params, stop_token_ids=CHATML.stop_token_ids(self.tokenizer))
        lead = RecordingLead(server, self.tokenizer)
        method = build_method(self.method_config, Models(lead=lead, lead_tokenizer=self.tokenizer))
        request_id = uuid4().hex
        started = asyncio.get_running_loop().time()
        try:
            result = await method.run(Sample(id=request_id, question=inputs.question, answers=golds, context=inputs.context))
        finally:
            versions = server.take_weight_versions(request_id)
        for i, conv in enumerate(lead.conversations):
            if len(conv.prompt_ids) > self.prompt_length:
                raise ValueError(f"memory-agent call {i} has a {len(conv.prompt_ids)}-token prompt > "
                                 f"actor_rollout_ref.rollout.prompt_length={self.prompt_length} (data.max_prompt_length): "
                                 "raise it, or lower parser.memagent.chunk_size / max_memory_tokens")
        reward = self.reward(result, golds)
        wall = asyncio.get_running_loop().time() - started
        extra: dict[str, Any] = {ANSWER_KEY: result.answer, PROTOCOL_KEY: self.protocol.key, "reward_extra_info": {"acc": reward},
                                 "turn_scores": [], "tool_rewards": [], **versions,
                                 "memagent_stats": {"conversations": float(len(lead.conversations)),
                                                    "num_chunks": float(result.trace.num_chunks)}}
        if self.info_gain.enable:
            extra["info_gain"] = (await self._gain(inputs.question, result, golds, reward, request_id)).to_dict()
        with_logprobs = bool(sampling_params.get("logprobs"))
        outputs = []
        for i, conv in enumerate(lead.conversations):
            n = min(len(conv.response_ids), self.response_length)
            last = i == len(lead.conversations) - 1
            outputs.append(AgentLoopOutput(
                prompt_ids=conv.prompt_ids,
                response_ids=conv.response_ids[:n],
                response_mask=[1] * n,
                response_logprobs=list(conv.logprobs[:n]) if with_logprobs and conv.logprobs else None,
                reward_score=reward,
                num_turns=2,
                metrics=AgentLoopMetrics(generate_sequences=wall if last else 0.0),
                # every output carries the weight versions verl's staleness accounting reads
                extra_fields=dict(extra) if last else {"reward_extra_info": {"acc": reward}, **versions},
            ))
        return outputs

    async def _gain(self, question: str, result: Any, golds: list[str], reward: float, request_id: str) -> GainRecord:
        if reward < SUCCESS:
            return GainRecord(gain=None, scorer=self.info_gain.scorer, prompt_version=self.info_gain.prompt_version,
                              error="not a successful trajectory")
        scorer = GainScorer(RetryingBackend(ServerManagerBackend(self.server_manager, {}), self.retry), self.tokenizer,
                            self.info_gain)
        memory = str(result.trace.extras.get("final_memory") or "")
        memory = "" if memory == NO_MEMORY else memory  # nothing was ever written: no evidence
        gold = matched_gold(result, golds, self.reward)  # the first gold the reward rule accepts
        return await scorer.gain(question, memory, gold, request_id=request_id)

