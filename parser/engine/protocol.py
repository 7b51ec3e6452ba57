"""The protocol object: everything that differs between this project and the authors' release, chosen once.

Why: the one episode engine speaks two protocols (docs/fidelity.md): `parser`, this project's
(the paper's prompts, turn rules and observation; the default), and `release`, the authors'
release code's (`parser.text.release`), so that the released checkpoint runs on the inputs it was
trained on. When each difference was re-decided by name at its call site, the one site that
forgot (eval's chunking) fed the checkpoint the wrong chunks. Now `protocol_for(config)` turns
`EpisodeConfig.protocol` into an object — the only place a protocol's name is read — and that
object is handed to everything that differs: the subagents' chunks, the lead's prompts and tool
schema, the subagent prompt, a turn's budget and parse, the gathered observation, how an
episode ends and what its answer is, the reward and the invalid-turn mask, and the chat-format
tokens. Nothing outside this module compares a protocol's name (tests/test_protocol_on_cpu.py
scans the code for it).

    protocol = protocol_for(config)                          # ParserProtocol | ReleaseProtocol
    chunks = protocol.chunk(document, subagent_tokenizer)    # what each subagent reads
    engine = EpisodeEngine(lead, tokenizer, reader, config, protocol)
    reward = protocol.exact_match(trajectory.answer, golds)

Across a process boundary a protocol travels as its `key` (verl's `extra_info`); `protocol_for`
turns the key back into the object there too.
"""
from __future__ import annotations

import abc
import functools
from typing import Any, Callable, Iterable

from parser.engine import gather, prompts

from parser.text import release, reward
from parser.text.actions import TOOL_NAME, LeadAction, parse_lead_output, parse_release_turn
from parser.text.chat_format import CHATML, ChatFormat
from parser.text.chunking import Chunk, chunk_document, release_chunks
from parser.base.config import EpisodeConfig
from parser.records.trajectory import Trajectory


class Protocol(abc.ABC):
    """What differs between the two protocols, as one object built from an `EpisodeConfig`."""

    key: str  # EpisodeConfig.protocol; what crosses a process boundary
    chat: ChatFormat = CHATML  # end-of-turn and stop tokens of the lead's chat template
    ends_on_empty_generation: bool  # a lead generation of no tokens ends the episode (else: an invalid step)
    closes_answer_turn: bool  # the answer turn gets the end-of-turn token (mask 0) when it did not emit it

    def __init__(self, config: EpisodeConfig):
        self.config = config

    # -- inputs ----------------------------------------------------------------------------
    @abc.abstractmethod
    def chunk(self, document: str, tokenizer: Any) -> list[Chunk]:
        """The subagents' chunks of `document` (`config.chunk_size` tokens of `tokenizer`)."""

    @abc.abstractmethod
    def lead_tools(self) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def lead_system(self) -> str: ...

    @abc.abstractmethod
    def lead_user(self, question: str) -> str: ...

    @abc.abstractmethod
    def invalid_hint(self) -> str:
        """The message after a turn with neither a usable call nor an answer."""

    @abc.abstractmethod
    def subagent_prompt(self, chunk: str, query: str) -> str:
        """The subagent's one user message for (chunk, query)."""

    @abc.abstractmethod
    def untrusted(self, text: str, tokenizer: Any) -> str:
        """Text from outside (a document, a question, a finding, a tool's output, a query the lead
        wrote) as it may enter a prompt `tokenizer` encodes."""

    def check_toolset(self, names: Iterable[str]) -> None:
        """Refuse a tool set this protocol has no rules for."""

    def check_reader(self, kind: str) -> None:
        """Refuse a chunk reader type (`parser.engine.readers`) this protocol has no rules for."""

    # -- one turn ----------------------------------------------------------------------------
    @abc.abstractmethod
    def turn_budget(self, used: int) -> int:
        """New tokens the next lead turn may take, `used` response tokens in; <= 0 ends the episode."""

    @abc.abstractmethod
    def parse_turn(self, text: str, tool_names: Iterable[str] | None, thinking_open: bool = False) -> LeadAction:
        """One lead generation -> its action. `thinking_open`: the generation prompt opened `<think>`."""

    @abc.abstractmethod
    def gather(self, query: str, replies: gather.Replies, count_tokens: Callable[[str], int]) -> gather.Gathered:
        """One query's replies (chunk index, text or None for a failure) -> the observation."""

    # -- the episode's end ---------------------------------------------------------------------
    @abc.abstractmethod
    def final_answer(self, trajectory: Trajectory) -> str | None: ...

    @abc.abstractmethod
    def exact_match(self, prediction: str | None, golds: str | Iterable[str]) -> float:
        """The training reward (binary EM of the final answer)."""

    def mask_invalid_turns(self, trajectory: Trajectory, reward: float) -> None:
        """Settle the mask of invalid turns once the reward is known: `train_invalid_turns: false`
        masks them, except in a trajectory with no other lead token (verl refuses a batch that
        trains no token: a lead that emits only garbage still gets its gradient)."""
        invalid = sum(sum(trajectory.response_mask[start:end]) for start, end in trajectory.invalid_turn_spans)
        if not self.config.train_invalid_turns and invalid < sum(trajectory.response_mask):
            trajectory.mask_invalid_turns(trainable=False)


class ParserProtocol(Protocol):
    """This project's protocol: the paper's prompts (`parser/engine/prompts/<prompt_version>/`), turn rules
    (`parser.text.actions.parse_lead_output`), observation (`parser.engine.gather.gather`) and chunking."""

    key = "parser"
    ends_on_empty_generation = False
    closes_answer_turn = True

    def chunk(self, document: str, tokenizer: Any) -> list[Chunk]:
        return chunk_document(document, tokenizer, self.config.chunk_size)

    def lead_tools(self) -> list[dict[str, Any]]:
        return prompts.lead_tools(self.config.prompt_version)

    def lead_system(self) -> str:
        return prompts.render("lead_system", self.config.prompt_version)

    def lead_user(self, question: str) -> str:
        return prompts.render("lead_user", self.config.prompt_version, question=question)

    def invalid_hint(self) -> str:
        return prompts.render("invalid_action", self.config.prompt_version)

    def subagent_prompt(self, chunk: str, query: str) -> str:
        return prompts.render("subagent", self.config.prompt_version, chunk=chunk, query=query)

    def untrusted(self, text: str, tokenizer: Any) -> str:
        """Never a control token: a `<|im_end|>` in a document was a real end of turn in the
        lead's and the readers' inputs (and in the loss mask built on them)."""
        return self.chat.neutralize(text, tokenizer)

    def turn_budget(self, used: int) -> int:
        """`max_tokens_per_turn`, and never past `max_response_tokens` in all."""
        budget = self.config.max_tokens_per_turn
        if self.config.max_response_tokens is not None:
            budget = min(budget, self.config.max_response_tokens - used)
        return budget

    def parse_turn(self, text: str, tool_names: Iterable[str] | None, thinking_open: bool = False) -> LeadAction:
        return parse_lead_output(text, tool_names, thinking_open=thinking_open)

    def gather(self, query: str, replies: gather.Replies, count_tokens: Callable[[str], int]) -> gather.Gathered:
        return gather.gather(query, replies, count_tokens=count_tokens, token_budget=self.config.observation_token_budget,
                             merge=self.config.merge_identical_answers, version=self.config.prompt_version)

    def final_answer(self, trajectory: Trajectory) -> str | None:
        """The answer of the turn that ended the episode (paper Algorithm 1, l. 21)."""
        return trajectory.answer

    def exact_match(self, prediction: str | None, golds: str | Iterable[str]) -> float:
        return reward.exact_match(prediction, golds)


class ReleaseProtocol(Protocol):
    """The authors' release, rule by rule (docs/fidelity.md): its prose read from a checkout
    (`protocol_release.repo`, loaded on first use), its chunk headers, turn rules, observation
    JSON, training EM and invalid-turn mask. Its only tool set is `query_agents`."""

    key = "release"
    ends_on_empty_generation = True  # its loop breaks on a generation without tokens
    closes_answer_turn = False  # its loop appends nothing after the answer turn

    def __init__(self, config: EpisodeConfig):
        if not config.train_invalid_turns:
            raise ValueError("train_invalid_turns: false is the parser protocol's option; the release masks "
                             f"invalid turns by its own rule (rewarded below {release.INVALID_MASK_REWARD} trains them)")
        super().__init__(config)

    @functools.cached_property
    def prose(self) -> release.ReleasePrompts:
        return release.load_release_prompts(self.config.protocol_release.get("repo"))

    def chunk(self, document: str, tokenizer: Any) -> list[Chunk]:
        return release_chunks(document, tokenizer, self.config.chunk_size)

    def lead_tools(self) -> list[dict[str, Any]]:
        return self.prose.tools

    def lead_system(self) -> str:
        return self.prose.lead_system

    def lead_user(self, question: str) -> str:
        return release.USER_TURN.format(question=question)

    def invalid_hint(self) -> str:
        return self.prose.invalid_hint

    def subagent_prompt(self, chunk: str, query: str) -> str:
        return self.prose.subagent_prompt(chunk, query)

    def untrusted(self, text: str, tokenizer: Any) -> str:
        """As it is: the release tokenises documents, findings and tool output with their control
        tokens (docs/fidelity.md), and its checkpoint was trained on that."""
        return text

    def check_toolset(self, names: Iterable[str]) -> None:
        if tuple(names) != (TOOL_NAME,):
            raise ValueError(f"protocol=release is the release's query_agents protocol; tool set {tuple(names)} has none")

    def check_reader(self, kind: str) -> None:
        if kind != "subagent":
            raise ValueError(f"reader type {kind!r} has no release protocol: the release has only the subagent reader")

    def turn_budget(self, used: int) -> int:
        """A full `max_tokens_per_turn` while any response budget is left (the caller cuts the rest)."""
        left = self.config.max_response_tokens is None or used < self.config.max_response_tokens
        return self.config.max_tokens_per_turn if left else 0

    def parse_turn(self, text: str, tool_names: Iterable[str] | None, thinking_open: bool = False) -> LeadAction:
        """The release searches the whole turn, thinking included (docs/fidelity.md row 7)."""
        return parse_release_turn(text)

    def gather(self, query: str, replies: gather.Replies, count_tokens: Callable[[str], int]) -> gather.Gathered:
        return gather.gather_release(replies)

    def final_answer(self, trajectory: Trajectory) -> str | None:
        """The last `<answer>` of all turns joined, as the release scores it."""
        return release.extract_answer("".join(release.strip_trailing_markers(t.text) for t in trajectory.turns))

    def exact_match(self, prediction: str | None, golds: str | Iterable[str]) -> float:
        return reward.release_exact_match(prediction, golds)

    def mask_invalid_turns(self, trajectory: Trajectory, reward: float) -> None:
        """Invalid turns train (mask 1) only in an episode rewarded below `release.INVALID_MASK_REWARD`."""
        trajectory.mask_invalid_turns(trainable=reward < release.INVALID_MASK_REWARD)


_BY_KEY: dict[str, type[Protocol]] = {cls.key: cls for cls in (ParserProtocol, ReleaseProtocol)}


def protocol_for(config: EpisodeConfig) -> Protocol:
    """The protocol object `config.protocol` names: the one place a protocol's name is read."""
    if config.protocol not in _BY_KEY:
        raise ValueError(f"protocol must be one of {', '.join(_BY_KEY)}; got {config.protocol!r}")
    return _BY_KEY[config.protocol](config)
