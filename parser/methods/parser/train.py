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
      _target_: parser.methods.parser.train.ParserAgentLoop

    actor_rollout_ref.rollout.agent.agent_loop_config_path=configs/train/agent_loop.yaml
    # and every dataset row has agent_name = "parser_agent"

Settings live in the trainer config's `parser:` block (gateway URL, subagent client, episode
knobs; see configs/train/parser_base.yaml). `rollout.response_length` caps the response: the
engine stops generating when it is spent, and what an observation pushes past it is cut here.
What a rollout worker builds once for all its trajectories (gateway session, reader, engines)
is `parser.train.worker`'s.

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

from typing import Any, Mapping
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from parser.records.rl_rows import episode_inputs
from parser.records.trajectory import Trajectory
from parser.train.infomem.gain import SUCCESS, GainRecord, evidence_text, matched_gold
from parser.train.metrics import trajectory_metrics
from parser.train.reward import ANSWER_KEY, PROTOCOL_KEY, gold_answers
from parser.train.worker import worker_state

AGENT_NAME = "parser_agent"  # configs/train/agent_loop.yaml `name`; the dataset's agent_name


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
        self.state = worker_state(self.settings, self.response_length)

    @classmethod
    def check_config(cls, config: Any) -> list[str]:
        """What this loop needs of a composed trainer config, before launch
        (`parser.train.config_checks` asks the loop its config selects)."""
        problems = []
        settings, rollout = config.parser, config.actor_rollout_ref.rollout
        per_turn = int(settings.episode.max_tokens_per_turn)
        if per_turn > int(rollout.response_length):
            problems.append(f"parser.episode.max_tokens_per_turn={per_turn} > rollout.response_length={rollout.response_length}")
        if not settings.get("gateway_url"):
            problems.append("parser.gateway_url is not set: the subagents' gateway URL "
                            "(export PARSER_GATEWAY_URL=http://host:port or pass parser.gateway_url=...)")
        return problems

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
