"""InfoMem for the ParSer lead: did the rounds gather evidence that supports the gold answer?

Why it exists: the lead is trained on binary exact match, which says nothing about *how* a right
answer was reached. InfoMem (Han et al., arXiv 2606.03329) rewards a memory agent's final memory
by how much it raises the log-likelihood of the gold answer. ParSer's "final memory" is what the
lead gathered: the observations of its `query_agents` calls (the findings with their quoted
evidence). For one trajectory i of a GRPO group,

    gain_i = mean_t log p(y_t | S(q, E_i), y_<t) - mean_t log p(y_t | S(q), y_<t)
    R_i    = EM_i + beta * 1[EM_i = 1] * Norm_group(gain)_i

with y the gold answer the lead matched, q the question, E_i its gathered findings, S the fixed,
versioned scoring prompt (`prompts/scoring/<version>/` beside this file, rendered with the scorer's chat
template, thinking off), and the scorer either the policy itself or the frozen subagent model
(`InfoGainConfig.scorer`). The gain is computed only for EM = 1 (the paper's gating: a wrong
answer's evidence is not rewarded) and normalised over the group's successful trajectories:

| normalization | Norm(gain)_i over the successes S of the group | |
|---|---|---|
| zscore (default) | (gain_i - mean_S) / std_S; 0 when |S| < 2 or std_S < eps | the paper: "normalised before composition" |
| center | gain_i - mean_S; 0 when |S| < 2 | keeps the gain's scale |
| none | gain_i | the paper's losing ablation |

What the public record fixes: the abstract (verified) says per-token log-likelihood of the
ground-truth answer, successful trajectories only, normalised before composition, conditioned on
the answer rather than the query. beta = 0.2 and the exact normaliser come from a secondary
summary; neither the paper's method section nor its code (GenSouKa1/InfoMem) could be read here,
so both are configuration (docs/info_gain.md says what was checked).

Two choices made here, not in the paper: a trajectory that gathered no findings has gain 0
exactly (its scoring prompt would be the no-evidence one), and untrusted text (question,
findings, gold answer) goes through `CHATML.neutralize`, so a document that quotes
`<|im_end|>` or `</think>` cannot end the scorer's turn or its thinking. A scoring call that still fails after the episode's
retries, or answers with log-probs that are missing or not finite, leaves the trajectory with no
gain (Norm 0: its reward is its EM), recorded as a scoring failure, never fatal and never a number.

No verl import: the agent loop computes gains (`GainScorer`), the replay buffer composes groups
(`parser.train.infomem.group`), and the tests check the formula by hand.

    config = InfoGainConfig(enable=True, beta=0.2, normalization="zscore", scorer="subagent")
    scorer = GainScorer(RetryingBackend(backend, RetryPolicy.of(episode)), tokenizer, config)
    record = await scorer.gain(question, evidence_text(trajectory), gold)
    rewards = compose([1.0, 1.0, 0.0], [0.8, -0.1, None], config)   # one GRPO group
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from parser.engine.prompts import PromptSet
from parser.serving.types import BackendError, Scorer
from parser.text.chat_format import CHATML
from parser.text.reward import exact_match
from parser.records.trajectory import Trajectory

NORMALIZATIONS = ("zscore", "center", "none")
SCORERS = ("policy", "subagent")
SUCCESS = 1.0  # EM that counts as a successful trajectory
SCORING_FAILED = "scoring failed"  # GainRecord.error prefix when the scorer did not answer

# The answer-scoring prompts (`prompts/scoring/<version>/` here): what the scorer reads before the
# gold answer, with and without the gathered findings. Gains computed under two versions are not
# comparable, so any change is a new version.
SCORING = PromptSet(__package__, {
    "info_gain": {"question", "evidence"},
    "info_gain_no_evidence": {"question"},
}, "prompts/scoring")


@dataclasses.dataclass(frozen=True)
class InfoGainConfig:
    """`parser.info_gain` in the trainer config (configs/train/parser_base.yaml: off)."""

    enable: bool = False
    beta: float = 0.2  # weight of the normalised gain next to the 0/1 outcome
    normalization: str = "zscore"  # zscore | center | none (see the module docstring)
    scorer: str = "subagent"  # policy (verl's rollout servers) | subagent (the frozen model behind the gateway)
    prompt_version: str = "v1"  # prompts/scoring/<version>/ (SCORING)
    max_evidence_tokens: int = 4096  # findings beyond this many scorer tokens are cut (recorded)
    eps: float = 1e-6  # a group whose gains spread less than this gets no bonus (zscore)
    chat_template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"enable_thinking": False})

    def __post_init__(self) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"parser.info_gain.normalization={self.normalization!r}; expected one of {NORMALIZATIONS}")
        if self.scorer not in SCORERS:
            raise ValueError(f"parser.info_gain.scorer={self.scorer!r}; expected one of {SCORERS}")
        if not (_number(self.beta) and math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"parser.info_gain.beta={self.beta!r}; expected a finite number > 0 "
                             "(to train on EM alone, set enable: false)")
        if not (_number(self.eps) and math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"parser.info_gain.eps={self.eps!r}; expected a finite number > 0 "
                             "(zscore divides by a spread at least this large)")
        if self.max_evidence_tokens < 1:
            raise ValueError(f"parser.info_gain.max_evidence_tokens={self.max_evidence_tokens}; expected >= 1")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> "InfoGainConfig":
        settings = dict(settings or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"parser.info_gain: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**settings)


# ---------------------------------------------------------------------- the formula
# The largest |gain| taken as a measurement, in nats per answer token. A real scorer's per-token
# log-likelihoods differ by tens of nats at most (a softmax over logits of a bf16/fp32 model); a
# gain beyond this bound is a broken scorer, recorded as a scoring failure like a NaN. It also
# keeps every sum and square below float overflow, so a group's rewards are finite by construction.
MAX_ABS_GAIN = 1e6


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def usable_gain(value: Any) -> bool:
    """Whether `value` is a gain to compose: a finite number within MAX_ABS_GAIN (else: no gain)."""
    return _number(value) and math.isfinite(value) and abs(value) <= MAX_ABS_GAIN


def mean_logprob(values: Sequence[float]) -> float:
    """Per-token mean log-likelihood (the paper's length normalisation). Each term is divided
    before summing, so finite values never overflow."""
    if not values:
        raise ValueError("mean_logprob of no tokens")
    return sum(v / len(values) for v in values)


def info_gain(with_evidence: Sequence[float], without_evidence: Sequence[float]) -> float:
    """mean log p(gold | question, findings) - mean log p(gold | question)."""
    return mean_logprob(with_evidence) - mean_logprob(without_evidence)


def normalize_group(gains: Sequence[float | None], method: str = "zscore", eps: float = 1e-6) -> list[float]:
    """Norm(gain) for each member of one GRPO group; None (not a success, or no gain) -> 0, and so
    does a gain that is not `usable_gain` (NaN, inf, beyond MAX_ABS_GAIN): one bad number never
    reaches the others' statistics. Always finite."""
    if method not in NORMALIZATIONS:
        raise ValueError(f"normalization {method!r}; expected one of {NORMALIZATIONS}")
    if not (_number(eps) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"normalize_group: eps={eps!r}; expected a finite number > 0")
    kept = [float(g) if usable_gain(g) else None for g in gains]
    present = [g for g in kept if g is not None]
    if method == "none":
        return [0.0 if g is None else g for g in kept]
    if len(present) < 2:  # one success has nothing to be compared with
        return [0.0] * len(gains)
    mean = sum(g / len(present) for g in present)
    scale = 1.0
    if method == "zscore":
        std = math.sqrt(sum((g - mean) ** 2 for g in present) / len(present))  # population std of the successes
        if std < eps:
            return [0.0] * len(gains)
        scale = std
    return [0.0 if g is None else (g - mean) / scale for g in kept]


def compose(outcomes: Sequence[float], gains: Sequence[float | None], config: InfoGainConfig) -> list[float]:
    """R_i = outcome_i + beta * 1[outcome_i = 1] * Norm(gain)_i over one group. A gain on an
    unsuccessful trajectory is ignored (gating holds even if one was computed). An outcome is an
    EM (0 or 1): anything not finite is a bug upstream, refused here rather than trained on."""
    if len(outcomes) != len(gains):
        raise ValueError(f"compose: {len(outcomes)} outcomes but {len(gains)} gains")
    for i, o in enumerate(outcomes):
        if not (_number(o) and math.isfinite(o)):
            raise ValueError(f"compose: outcome {i} is {o!r}, not a finite EM")
    gated = [g if o >= SUCCESS else None for o, g in zip(outcomes, gains, strict=True)]
    norm = normalize_group(gated, config.normalization, config.eps)
    return [float(o) + config.beta * (1.0 if o >= SUCCESS else 0.0) * n for o, n in zip(outcomes, norm, strict=True)]


# ---------------------------------------------------------------------- what is scored
def matched_gold(answer: str | None, golds: Iterable[str],
                 match: Callable[[str | None, list[str]], float] = exact_match) -> str | None:
    """The first gold answer the lead's answer matches under `match` (the protocol's EM): the
    one whose likelihood is scored."""
    return next((g for g in golds if match(answer, [g]) >= SUCCESS), None)


def evidence_text(trajectory: Trajectory) -> str:
    """The lead's gathered findings, as it saw them: the observations of its queries that
    returned at least one finding, in order ("" when none did)."""
    return "\n\n".join(q.observation for t in trajectory.turns for q in t.queries if q.findings)


@dataclasses.dataclass
class GainRecord:
    """One trajectory's gain and how it was obtained (`AgentLoopOutput.extra_fields["info_gain"]`)."""

    gain: float | None
    scorer: str
    prompt_version: str
    lp_with: float | None = None  # mean log p(gold | question, findings)
    lp_without: float | None = None  # mean log p(gold | question)
    answer_tokens: int = 0
    evidence_tokens: int = 0
    evidence_truncated: bool = False
    error: str | None = None  # why there is no gain (not a success, no matching gold, scoring failed)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class GainScorer:
    """Scores a trajectory's gain with a `Scorer` and that scorer's tokenizer. Hand it the scorer
    wrapped in the one retry policy (`parser.serving.retry.RetryingBackend`); a call that fails for good
    leaves the trajectory without a gain, recorded."""

    def __init__(self, scorer: Scorer, tokenizer: Any, config: InfoGainConfig):
        self.scorer, self.tokenizer, self.config = scorer, tokenizer, config

    # -------------------------------------------------------------- tokens
    def _plain(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _untrusted(self, text: str) -> list[int]:
        """Text from the document, the dataset or a model, through the project's one rule for
        untrusted text (`CHATML.neutralize`): no control token of the scorer's template comes out,
        the added tags (`<think>`, `<tool_call>`, ...) included, which `split_special_tokens`
        leaves whole because the tokenizer does not mark them special."""
        return self._plain(CHATML.neutralize(text, self.tokenizer))

    def prompt_ids(self, question: str, evidence: str | None) -> list[int]:
        """The scoring prompt as the scorer's chat template renders it, ending where the answer
        begins. Fields are spliced in as token ids between the template's own pieces."""
        name = "info_gain" if evidence is not None else "info_gain_no_evidence"
        marks = {"question": "\x00QUESTION\x00", "evidence": "\x00EVIDENCE\x00"}
        fields = {k: v for k, v in marks.items() if k in SCORING.fields[name]}
        user = SCORING.render(name, self.config.prompt_version, **fields)
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                      add_generation_prompt=True, **dict(self.config.chat_template_kwargs))
        values = {marks["question"]: question, marks["evidence"]: evidence or ""}
        ids: list[int] = []
        rest = rendered
        while rest:
            cut = min(((rest.find(m), m) for m in values if m in rest), default=None)
            if cut is None:
                ids += self._plain(rest)
                break
            at, mark = cut
            ids += self._plain(rest[:at]) + self._untrusted(values[mark])
            rest = rest[at + len(mark):]
        return ids

    def _evidence(self, evidence: str) -> tuple[str, int, bool]:
        """The findings cut to `max_evidence_tokens` scorer tokens: (text, tokens, cut?)."""
        ids = self._untrusted(evidence)
        if len(ids) <= self.config.max_evidence_tokens:
            return evidence, len(ids), False
        keep = ids[: self.config.max_evidence_tokens]
        return self.tokenizer.decode(keep), len(keep), True

    # -------------------------------------------------------------- scoring
    async def gain(self, question: str, evidence: str, gold: str | None, request_id: str | None = None) -> GainRecord:
        """This trajectory's gain (a successful one: `gold` is the answer it matched)."""
        record = GainRecord(gain=None, scorer=self.config.scorer, prompt_version=self.config.prompt_version)
        if gold is None:
            record.error = "no gold answer matched"
            return record
        answer = self._untrusted(gold)
        record.answer_tokens = len(answer)
        if not answer:
            record.error = "the gold answer has no tokens"
            return record
        if not evidence:
            record.gain = 0.0  # no findings gathered: conditioning on them changes nothing
            return record
        evidence, record.evidence_tokens, record.evidence_truncated = self._evidence(evidence)
        try:
            with_lps, without_lps = await asyncio.gather(
                self.scorer.score(self.prompt_ids(question, evidence), answer, request_id=request_id),
                self.scorer.score(self.prompt_ids(question, None), answer, request_id=request_id))
        except (BackendError, asyncio.TimeoutError) as error:
            record.error = f"{SCORING_FAILED}: {type(error).__name__}: {str(error)[:300]}"
            return record
        bad = _unusable_scores(with_lps, len(answer), "with findings") or _unusable_scores(
            without_lps, len(answer), "without findings")
        if bad:  # a scorer that answered with nothing usable failed, like one that never answered
            record.error = f"{SCORING_FAILED}: {bad}"
            return record
        record.lp_with, record.lp_without = mean_logprob(with_lps), mean_logprob(without_lps)
        gain = record.lp_with - record.lp_without
        if not usable_gain(gain):
            record.error = f"{SCORING_FAILED}: gain {gain!r} is beyond {MAX_ABS_GAIN:g} nats per token"
            return record
        record.gain = gain
        return record


def _unusable_scores(values: Any, expected: int, which: str) -> str | None:
    """Why the scorer's log-probs for the gold answer cannot be used (None: they can): one finite
    number per answer token. The `Scorer` contract promises this; a scorer that breaks it is
    recorded as a scoring failure, never turned into a number."""
    if not isinstance(values, (list, tuple)) or len(values) != expected:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        return f"the scorer gave {got} log-probs {which} for the {expected} answer tokens"
    for i, v in enumerate(values):
        if not (_number(v) and math.isfinite(v)):
            return f"the scorer's log-prob {which} for answer token {i} is {v!r}"
    return None
