"""Every numeric setting's domain, declared once: what `limit`, `chunk_size`, a `timeout_s` may be.

Why it exists: a value outside its domain used to reach the code that reads it. `limit=-1` kept
all samples but the last, `chunk_size=0` hung the chunker, `timeout_s=nan` never timed out,
`state_token_budget=0` crashed mid-episode, `serve --port -1` failed after the model loaded. Each
entry point checked a few keys its own way. Now a setting's domain is a row of `DOMAINS` (by the
setting's name, wherever it sits in a composed config), or of `RULES` for a family that follows a
naming convention (`*_tokens`, `*_timeout_s`, `max_*`, ...), and the one check, `problem`, is
applied where configs are composed (`parser.base.settings`: eval, demo, ask), where the episode's
knobs are built (`EpisodeConfig`), and to `serve`'s flags (`argparse_type`). A refusal names the
key, the value and the domain:

    problem("limit", -1)            # "limit=-1: expected an integer >= 1, or null"
    problem("models.subagent.timeout_s", float("nan"))   # "...: expected a finite number > 0"
    problem("method.note", "x")     # None: not a numeric setting

Never imports anything of the project: every floor may use it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any, Callable

SEED_MAX = 2**32 - 1  # numpy's seed range (eval seeds numpy, torch and python with it)


@dataclasses.dataclass(frozen=True)
class Domain:
    """A numeric setting's values: an integer or a finite number, from `low` (or above it, `open`)
    to `high`, with `also` (a value meaning "off", such as -1) and null where `nullable`. `each`:
    the setting is a list and every element is in the domain (`lengths: [50, 100]`)."""

    integer: bool
    low: float = -math.inf
    high: float = math.inf
    open: bool = False
    nullable: bool = False
    also: tuple[int, ...] = ()
    each: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        low, high = _number(self.low), _number(self.high)
        if self.low > -math.inf and self.high < math.inf:
            span = f" in {'(' if self.open else '['}{low}, {high}]"
        elif self.low > -math.inf:
            span = f" {'>' if self.open else '>='} {low}"
        else:
            span = f" <= {high}" if self.high < math.inf else ""
        text = kind + span + "".join(f", or {a} (off)" for a in self.also) + (", or null" if self.nullable else "")
        return f"a list of {text.replace('an integer', 'integers').replace('a finite number', 'finite numbers')}" \
            if self.each else text

    def holds(self, value: Any) -> bool:
        if self.each:
            one = dataclasses.replace(self, each=False, nullable=False)
            return (value is None and self.nullable) or (isinstance(value, (list, tuple)) and all(one.holds(v) for v in value))
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        return (value > self.low if self.open else value >= self.low) and value <= self.high


def _number(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:g}"


COUNT = Domain(integer=True, low=1)  # something there must be at least one of
OPTIONAL_COUNT = Domain(integer=True, low=1, nullable=True)  # ... or null: no bound
NON_NEGATIVE = Domain(integer=True, low=0)
DURATION = Domain(integer=False, low=0, open=True)  # a deadline or timeout: 0 would end everything at once
DELAY = Domain(integer=False, low=0)  # a wait that may be none
TEMPERATURE = Domain(integer=False, low=0)
PROBABILITY_MASS = Domain(integer=False, low=0, high=1, open=True)  # top_p, a memory fraction
PORT = Domain(integer=True, low=0, high=65535)  # 0: any free port

# A setting's domain by its name, wherever it sits (eval's `limit`, `method.episode.chunk_size`,
# `models.subagent.timeout_s`, the demo's `length`, serve's `port`). Checked before RULES.
DOMAINS: dict[str, Domain] = {
    # eval.run (configs/eval/default.yaml)
    "limit": OPTIONAL_COUNT,  # samples per subset; null = all (0 or -1 used to slice the list)
    "runs": COUNT,
    "concurrency": COUNT,
    "warmup": NON_NEGATIVE,
    "stop_after_failures": OPTIONAL_COUNT,  # null: never stop
    "seed": Domain(integer=True, low=0, high=SEED_MAX),
    "world_seed": Domain(integer=True, low=0, high=SEED_MAX),
    "lengths": Domain(integer=True, low=1, each=True, nullable=True),  # null: a dataset file's own
    "num_questions": COUNT,
    "pad": NON_NEGATIVE,
    # the demo (configs/demo.yaml)
    "num_samples": COUNT,
    "length": COUNT,  # paragraphs per document
    "workers": NON_NEGATIVE,  # 0: in process
    # the episode (parser.base.config.EpisodeConfig) and the methods
    "chunk_size": COUNT,
    "max_response_tokens": OPTIONAL_COUNT,  # verl's response_length; null = unbounded
    "max_context_tokens": OPTIONAL_COUNT,  # MemAgent's truncation; null = none
    "observation_token_budget": COUNT,
    "state_token_budget": COUNT,  # LongHarness: the lead's whole prompt
    "lead_top_p": PROBABILITY_MASS,
    "top_p": PROBABILITY_MASS,
    "lead_top_k": Domain(integer=True, low=1, also=(-1,)),
    "top_k": COUNT,  # agentic RAG's chunks per query
    # RLM's budgets (configs/method/rlm.yaml, rlms' names); null: no limit, as rlms' None
    "max_timeout": Domain(integer=False, low=0, open=True, nullable=True),  # wall seconds
    "max_tokens": OPTIONAL_COUNT,
    "max_errors": OPTIONAL_COUNT,
    "batch_size": COUNT,
    "read_window": COUNT,
    "mem_fraction_static": PROBABILITY_MASS,
    # serve (parser.serving.server) and the gateway's processes
    "port": PORT,
    "base_port": PORT,
    "prometheus_port": PORT,
    "context_length": OPTIONAL_COUNT,  # null: the model's own
    "num": COUNT,  # gateway workers
}

# Families named by convention, for settings without a row of their own (first match wins).
RULES: tuple[tuple[re.Pattern[str], Domain], ...] = (
    (re.compile(r"(^|_)timeout_s$|_timeout_secs$"), DURATION),
    (re.compile(r"(^|_)temperature$"), TEMPERATURE),
    (re.compile(r"_tokens$|_chars$|_bytes$"), COUNT),
    (re.compile(r"^max_"), COUNT),
    (re.compile(r"_s$"), DELAY),
)


def domain_of(name: str) -> Domain | None:
    """The declared domain of a setting called `name` (the last part of its dotted key), or None."""
    if name in DOMAINS:
        return DOMAINS[name]
    return next((domain for pattern, domain in RULES if pattern.search(name)), None)


def problem(key: str, value: Any) -> str | None:
    """"key=value: expected <domain>" when `value` is outside the domain of the setting `key`
    names (its last dotted part); None when it is inside, or the setting has no numeric domain.
    A section (a mapping) is not a value: its keys are checked one by one (`problems`); a mapping
    given where the config holds a number is `parser.base.settings`' to refuse (`workers` is the
    demo's count and the gateway's section)."""
    domain = domain_of(key.rsplit(".", 1)[-1])
    if domain is None or isinstance(value, dict) or domain.holds(value):
        return None
    return f"{key}={value!r}: expected {domain.describe()}"


def problems(tree: Any, where: str = "") -> list[str]:
    """Every value of a plain config tree (dicts and lists, as `OmegaConf.to_container` gives)
    that is outside its setting's domain, each named by its dotted key."""
    found: list[str] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            path = f"{where}.{key}" if where else str(key)
            said = problem(path, value) if isinstance(key, str) else None
            if said:
                found.append(said)
            elif isinstance(value, (dict, list)):
                found += problems(value, path)
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            if isinstance(value, (dict, list)):
                found += problems(value, f"{where}[{i}]")
    return found


def removal_problem(key: str) -> str | None:
    """"~key: ..." when `key` names a numeric setting: its reader needs a value (a removed `runs`
    ended in a TypeError deep in eval); a nullable one is switched off with null instead."""
    domain = domain_of(key.rsplit(".", 1)[-1])
    if domain is None:
        return None
    instead = f"set {key}=null to switch it off, or a value" if domain.nullable else "set a value"
    return f"~{key}: a setting cannot be removed; {instead} ({domain.describe()})"


def argparse_type(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type=` for a flag whose setting is `name`: the text parsed, then held to the
    domain, so a value outside it is argparse's one-line usage error (exit 2) before anything loads."""
    def checked(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if parse is int else 'a number'}") from None
        domain = domain_of(name)
        if domain is not None and not domain.holds(value):  # a flag has no null: leaving it out is the default
            raise argparse.ArgumentTypeError(f"{text}: expected {dataclasses.replace(domain, nullable=False).describe()}")
        return value

    checked.__name__ = name  # argparse names the type in some messages
    return checked
