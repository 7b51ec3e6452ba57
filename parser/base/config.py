"""`EpisodeConfig`: every knob of one agent episode, defined once.

Why a module of its own: the engine (`parser.engine.episode`), the tool sets (`parser.engine.tools`), the
readers, eval and the verl agent loop all read these values, and this file imports nothing from
the package, so any of them can depend on it without a cycle. The YAML presets in
`configs/episode/` (train = paper Table 9, eval = the paper's inference changes, cpu = CPU-sized
budgets) set these fields; `tests/test_configs_on_cpu.py` keeps `train.yaml` equal to the
defaults here.

    EpisodeConfig(**OmegaConf.to_container(cfg.episode))
    episode_preset("eval", max_turns=8)     # configs/episode/eval.yaml (composed by Hydra), one field overridden
    episode_section("dci", max_turns=8)     # the same as plain values, the DCI agent's turn_rules included
    config, rules = with_turn_rules(method_cfg["episode"], "dci")   # a composed section + its tool set's rules

A baseline's episode reaches it only through its Hydra-composed method config: a preset of the
same folder (`configs/method/dci.yaml`: `/episode@episode: dci`, shared with ParSer's DCI subagent
through `dci_reader.yaml`) or the training preset plus an `episode:` section of the method's own
(`configs/method/rag.yaml`). `compose_preset` is Hydra's compose for a caller outside a Hydra app.
Their `turn_rules:` section is not the engine's: it goes to the baseline's tool set
(`parser.engine.tools.TurnRules`), where its reference protocol departs from Algorithm 1.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from parser.base.domains import problem
from parser.base.resources import config_dir

CONFIGS = config_dir()
PROTOCOLS = ("parser", "release")  # whose behaviour the engine has; parser/engine/protocol.py, docs/fidelity.md


@dataclasses.dataclass
class EpisodeConfig:
    """Defaults are the paper's training settings (Table 9); eval overrides them in
    `configs/episode/eval.yaml` (12 turns, chunk 4096, lead temperature 0)."""

    max_turns: int = 9
    max_tokens_per_turn: int = 2048
    max_response_tokens: int | None = None  # verl's rollout.response_length; None = unbounded
    chunk_size: int = 512  # subagent chunk, tokens of the subagent tokenizer
    lead_temperature: float = 1.0
    lead_top_p: float = 1.0
    lead_top_k: int = -1
    lead_thinking: bool = True
    subagent_temperature: float = 0.7
    subagent_max_tokens: int = 512
    observation_token_budget: int = 4096  # per query; what is cut is said
    merge_identical_answers: bool = True
    max_concurrency: int = 512  # subagent requests in flight per engine (all its episodes)
    max_tool_calls_per_turn: int = 16  # calls run per lead turn; later ones are answered "not run"
    max_subagent_requests_per_turn: int = 32768  # queries x chunks per turn; queries past it are "not run" (one always runs)
    request_timeout_s: float = 300.0
    max_attempts: int = 4  # per subagent request and lead generation, for retryable errors (5xx, connection, timeout)
    retry_backoff_s: float = 0.5  # first backoff; grows exponentially with jitter
    prompt_version: str = "v1"  # parser/engine/prompts/<version>/
    # constrained decoding (parser.episode's docstring); off in the paper's settings
    constrain_subagents: bool = False  # subagent replies under the finding's JSON schema
    constrain_lead: bool = False  # one tool call or one <answer> per lead turn (not for training)
    distinct_queries: bool = False  # with constrain_lead: the constraint refuses a query the lead asked before, verbatim
    query_first: bool = False  # with constrain_lead: no <answer> before the lead's first query (it reads before it answers)
    answer_last_turn: bool = False  # with constrain_lead: the last of max_turns turns may only be an <answer>
    # the loss on turns that were neither a usable call nor an answer: trained as generated (the paper
    # says nothing else), or masked out (a small lead's garbage turns, docs/learning.md); parser protocol
    train_invalid_turns: bool = True
    protocol: str = "parser"  # "release": the authors' release, row by row (parser.engine.protocol, docs/fidelity.md)
    protocol_release: dict[str, Any] = dataclasses.field(default_factory=lambda: {"repo": None})  # repo: its checkout

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {self.protocol!r}")
        self.protocol_release = dict(self.protocol_release or {})
        for option in ("distinct_queries", "query_first", "answer_last_turn"):
            if getattr(self, option) and not self.constrain_lead:
                raise ValueError(f"{option} is part of the lead constraint: set constrain_lead too")
        self._check_bounds()
        if self.answer_last_turn and self.query_first and self.max_turns < 2:
            raise ValueError("answer_last_turn with query_first needs max_turns >= 2: a single turn could neither "
                             "query (it is the last) nor answer (no query yet)")

    def _check_bounds(self) -> None:
        """Refuse, naming the field, a value outside its setting's domain (`parser.base.domains`):
        `max_concurrency: 0` made every episode wait for ever on its first subagent request,
        `chunk_size: 0` never ended the chunker, a NaN timeout never fired."""
        for field in dataclasses.fields(self):
            said = problem(f"episode.{field.name}", getattr(self, field.name))
            if said:
                raise ValueError(said)

    def constraints(self) -> list[str]:
        """The constrained-decoding options that are on (recorded in trajectories and manifests)."""
        return [name for name, on in (("subagents: json_schema", self.constrain_subagents),
                                      ("lead: one action per turn", self.constrain_lead),
                                      ("lead: no query asked twice", self.distinct_queries),
                                      ("lead: a query before any answer", self.query_first),
                                      ("lead: the last turn answers", self.answer_last_turn)) if on]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "episode") -> "EpisodeConfig":
        """`EpisodeConfig(**values)`, refusing an unknown key by name with the nearest valid one
        (`episode.max_turn` -> "did you mean max_turns?"), so a typo fails before any model loads."""
        check_keys(values, cls, where)
        return cls(**values)


def preset_spelling(overrides: list[str]) -> list[str]:
    """`models=<preset>` (the demo's spelling) as `backend@models=<preset>` for entry points where
    `models` is a composed section, which a plain value would replace and break (eval.run, ask)."""
    return [f"backend@{o}" if o.startswith("models=") else o for o in overrides]


class ConfigError(ValueError):
    """A setting that cannot be: entry points print it as one line and exit 2."""


def check_keys(values: Mapping[str, Any], schema: type, where: str) -> None:
    """Refuse keys that are not fields of the dataclass `schema`, naming each with its nearest
    valid spelling and the whole list when none is near."""
    import difflib

    known = [f.name for f in dataclasses.fields(schema)]
    unknown = [key for key in values if key not in known]
    if unknown:
        hints = []
        for key in unknown:
            near = difflib.get_close_matches(str(key), known, n=1)
            hints.append(f"{where}.{key} (did you mean {where}.{near[0]}?)" if near else f"{where}.{key}")
        raise ConfigError(f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"valid {where} keys: {', '.join(known)}")


def check_episode_keys(values: Any, where: str = "episode") -> None:
    """An episode section's keys are `EpisodeConfig`'s (plus a baseline preset's `turn_rules`, its
    tool set's): refused by name before anything is built. None or a non-mapping passes (its
    owner refuses it)."""
    if isinstance(values, Mapping):
        check_keys({k: v for k, v in values.items() if k != "turn_rules"}, EpisodeConfig, where)


def compose_preset(group: str, name: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """`configs/<group>/<name>.yaml` as Hydra composes it (its defaults list, `_self_`, Hydra
    `overrides`): a `DictConfig`, not yet resolved. Inside a running Hydra app (eval.run, a test's
    `initialize_config_dir`) that app's state is set aside for the compose and put back."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    path = CONFIGS / group / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
        raise FileNotFoundError(f"{group} preset {name!r}: no {path} (known: {', '.join(known)})")
    outer = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
            composed = compose(config_name=f"{group}/{name}", overrides=list(overrides))
    finally:
        GlobalHydra.instance().hydra = outer
    return composed[group]


def episode_section(name: str, **overrides: Any) -> dict[str, Any]:
    """`configs/episode/<name>.yaml` composed by Hydra, as plain values (a baseline's `turn_rules`
    included), with `overrides` on top: what a method config's `episode` section holds."""
    from omegaconf import OmegaConf

    return {**OmegaConf.to_container(compose_preset("episode", name), resolve=True), **overrides}


def episode_preset(name: str, **overrides: Any) -> EpisodeConfig:
    """The `EpisodeConfig` of `configs/episode/<name>.yaml`, with `overrides` on top."""
    return EpisodeConfig.from_mapping(episode_section(name, **overrides))


def with_turn_rules(section: Mapping[str, Any], where: str) -> tuple[EpisodeConfig, dict[str, Any]]:
    """A baseline's composed `episode` section (its preset with the run's overrides, as its method
    config composes it) -> the engine's `EpisodeConfig` and the `turn_rules` for its tool set."""
    values = dict(section)
    rules = dict(values.pop("turn_rules", None) or {})
    return EpisodeConfig.from_mapping(values, f"{where}.episode"), rules


