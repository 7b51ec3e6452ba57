"""The Varnholm document and episode settings shared by tests/servers/ (direct and through smg).

Imported by name (`from varnholm import ...`): pytest puts this folder on sys.path, as it does
for tests/verl_fakes.py.
"""
from __future__ import annotations

from parser.engine.episode import EpisodeConfig

# A document where one paragraph holds the answer; the rest is distinct filler.
NEEDLE = "The lighthouse keeper of Varnholm was Edda Quist, appointed in 1887."
QUESTION = "Who was the lighthouse keeper of Varnholm?"


def document(paragraphs: int) -> str:
    filler = [f"Paragraph {i}: the weather station at post {i} logged {i % 7 + 2} days of rain in season {i}." for i in range(paragraphs)]
    filler.insert(paragraphs // 2, NEEDLE)
    return "\n\n".join(filler)


def episode_config(**overrides) -> EpisodeConfig:
    return EpisodeConfig(**{"max_turns": 3, "max_tokens_per_turn": 64, "lead_temperature": 0.0, "lead_thinking": False,
                            "subagent_temperature": 0.0, "subagent_max_tokens": 48, "constrain_lead": True,
                            "constrain_subagents": True, "retry_backoff_s": 0.1, **overrides})
