"""The protocol is chosen once: no code outside `parser/engine/protocol.py` asks "which protocol am I?".

    .venv/bin/pytest tests/test_protocol_on_cpu.py -q

The bug this pins: eval chunked with this project's rule under `protocol: release` because one
call site forgot to pass the protocol's name on. Now `protocol_for(config)` is the only reader of
`EpisodeConfig.protocol`, and the scan below refuses, anywhere in parser/, eval/, data_prep/ and
scripts/, a comparison against a protocol's name or against a `.protocol` value, a protocol name
passed down as a `protocol=` string, and the old `check_protocol`. The scan is checked against
the shapes it must catch, so it cannot pass by seeing nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from parser.text.chat_format import CHATML
from parser.base.config import PROTOCOLS, EpisodeConfig
from parser.engine.protocol import ParserProtocol, ReleaseProtocol, protocol_for

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("parser", "eval", "data_prep", "scripts")
DEFINING = {ROOT / "parser" / "engine" / "protocol.py"}  # the module that defines the two objects


def _names(node: ast.AST) -> bool:
    """A protocol's name as a literal, or a `.protocol` / `protocol` value."""
    if isinstance(node, ast.Constant):
        return node.value in PROTOCOLS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names(e) for e in node.elts)
    return (isinstance(node, ast.Attribute) and node.attr == "protocol") or (isinstance(node, ast.Name) and node.id == "protocol")


def _validates_a_key(node: ast.Compare) -> bool:
    """`name in PROTOCOLS`: checking a key against the table of keys decides nothing."""
    return all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and all(
        isinstance(c, ast.Name) and c.id == "PROTOCOLS" for c in node.comparators)


def protocol_decisions(source: str) -> list[str]:
    """Every place `source` decides by a protocol's name, as `line: what`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and not _validates_a_key(node) and any(_names(n) for n in [node.left, *node.comparators]):
            found.append(f"{node.lineno}: compares a protocol name ({ast.unparse(node)})")
        elif isinstance(node, ast.Call):
            if any(k.arg == "protocol" and (_names(k.value) or isinstance(k.value, ast.Constant)) for k in node.keywords):
                found.append(f"{node.lineno}: passes a protocol name down ({ast.unparse(node)[:80]})")
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if function == "check_protocol":
                found.append(f"{node.lineno}: asks which protocol ({ast.unparse(node)[:80]})")
        elif isinstance(node, ast.match_case) and _names(node.pattern.value if isinstance(node.pattern, ast.MatchValue) else ast.Pass()):
            found.append(f"{node.pattern.lineno}: matches a protocol name")
    return found


def test_no_protocol_name_is_compared_outside_the_protocol_module():
    offenders = {}
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path not in DEFINING and (found := protocol_decisions(path.read_text(encoding="utf-8"))):
                offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


@pytest.mark.parametrize("source", [
    'if cfg.protocol == "release": pass',
    'if "release" != name: pass',
    'ok = config.protocol in ("parser", "release")',
    'ok = config.protocol in RELEASES',
    'x = protocol == other',
    'chunk_document(doc, tok, 512, protocol="release")',
    'normalize_answer(text, protocol=cfg.protocol)',
    'check_protocol(name)',
    'match name:\n    case "release": pass',
])
def test_the_scan_catches_each_shape_of_a_protocol_decision(source):
    assert protocol_decisions(source)


def test_the_scan_lets_the_object_be_handed_down():
    assert protocol_decisions("chunks = protocol_obj.chunk(doc, tok)\nengine = E(lead, tok, reader, config, self.protocol)\n"
                              "reward = state.protocol.exact_match(a, g)\nkind = cfg.get('type') == 'subagent'\n"
                              "if self.protocol not in PROTOCOLS: raise ValueError") == []


def test_each_key_names_its_object_and_only_there():
    assert [type(protocol_for(EpisodeConfig(protocol=key))) for key in PROTOCOLS] == [ParserProtocol, ReleaseProtocol]
    assert [cls.key for cls in (ParserProtocol, ReleaseProtocol)] == list(PROTOCOLS)
    assert protocol_for(EpisodeConfig()).chat is CHATML


def test_parser_protocol_trains_invalid_turns_unless_the_config_masks_them():
    """`train_invalid_turns` (the paper's default: trained as generated) is decided by the
    protocol object once the reward is known; false masks an invalid turn's tokens in every
    episode, rewarded or not. The release has its own rule and refuses the option."""
    from parser.records.trajectory import Trajectory

    def settled(config: EpisodeConfig, reward: float, spans=((3, 6),)) -> list[int]:
        trajectory = Trajectory("q", "d", 1, response_mask=[1, 1, 0, 1, 1, 1, 0, 1], invalid_turn_spans=list(spans))
        protocol_for(config).mask_invalid_turns(trajectory, reward)
        return trajectory.response_mask

    for reward in (0.0, 1.0):
        assert settled(EpisodeConfig(), reward) == [1, 1, 0, 1, 1, 1, 0, 1]
        assert settled(EpisodeConfig(train_invalid_turns=False), reward) == [1, 1, 0, 0, 0, 0, 0, 1]
    # nothing but invalid turns: kept, or verl would get a batch that trains no token (the smoke's lead)
    everything = ((0, 2), (3, 6), (7, 8))
    assert settled(EpisodeConfig(train_invalid_turns=False), 0.0, everything) == [1, 1, 0, 1, 1, 1, 0, 1]
    with pytest.raises(ValueError, match="train_invalid_turns"):
        protocol_for(EpisodeConfig(protocol="release", train_invalid_turns=False))
