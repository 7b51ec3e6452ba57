"""One instantiate (`parser.base.instantiate.build`): a config names what builds it by `_target_`.

    .venv/bin/pytest tests/test_instantiate_on_cpu.py -q

Pins: the call (keys + deps, `name`/`label` dropped), an error that names the config section and
the path, every `_target_` shipped under configs/ importable (so no config rots), and each old
`type:` / `kind:` / `recipe:` form still building what its `_target_` builds, with a FutureWarning
that says what to write instead (old configs work for one release).
"""
from __future__ import annotations

import asyncio
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from data_prep import recipes
from data_prep.build import run as build_data
from parser.base.config import episode_preset, episode_section
from parser.base.instantiate import build, locate, with_target
from parser.engine import readers, scorers
from parser.engine.protocol import protocol_for
from parser.serving import backends, gateway
from parser.serving.backends.models import Models

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_build_calls_the_target_with_the_other_keys_and_the_deps():
    built = build({"_target_": "fractions.Fraction", "numerator": 3, "name": "a row", "label": "A"},
                  where="t", denominator=4)
    assert built == Fraction(3, 4)  # name and label are the section's, not arguments


def test_build_reaches_a_classmethod_path():
    backend, tokenizer = build({"_target_": backends.TRANSFORMERS, "model": "tiny-qwen3.5", "max_batch_size": 2},
                               where="models.lead", role="models.lead")
    assert type(backend).__name__ == "TransformersBackend" and backend.max_batch_size == 2 and tokenizer.chat_template
    asyncio.run(backend.aclose())


@pytest.mark.parametrize("path", ["parser.serving.backends.no_such_module.Backend",
                                  "parser.serving.backends.transformers.NoSuchBackend", ""])
def test_a_target_that_does_not_import_names_the_section_and_the_path(path):
    with pytest.raises(ValueError, match=rf"^models\.subagent: .*{path}"):
        build({"_target_": path}, where="models.subagent")


def test_a_section_without_target_names_itself():
    with pytest.raises(ValueError, match=r"^knowledge_filter\.backend: no _target_"):
        build({"base_url": "http://127.0.0.1:1"}, where="knowledge_filter.backend")
    with pytest.raises(ValueError, match=r"method config 'rag' has no _target_"):
        from parser.methods import build_method

        build_method({"name": "rag"}, models=None)


def _targets(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield where, value
            else:
                yield from _targets(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{where}[{i}]")


SHIPPED = sorted((f"{path.relative_to(CONFIGS)}{where}", target)
                 for path in CONFIGS.rglob("*.yaml") for where, target in _targets(yaml.safe_load(path.read_text()), ""))


def test_the_configs_name_a_target_for_every_kind_of_component():
    found = {target for _, target in SHIPPED}
    assert {backends.TRANSFORMERS, readers.DEFAULT, scorers.EMBEDDER, "data_prep.recipes.eval_grid",
            "parser.serving.gateway.sglang_worker"} <= found


@pytest.mark.parametrize("where,target", SHIPPED)
def test_every_shipped_target_imports(where, target):
    assert callable(locate(target, where=where))


def _old(aliases: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(key, value, target) for key, values in aliases.items() for value, target in values.items()]


OLD_FORMS = [*_old(backends.TYPE_ALIASES), *_old(readers.TYPE_ALIASES), *_old(scorers.TYPE_ALIASES),
             *_old(recipes.RECIPE_ALIASES), *_old(gateway.WORKER_ALIASES)]


def test_no_shipped_config_uses_an_old_form():
    old = [(path, line) for path in CONFIGS.rglob("*.yaml") for line in path.read_text().splitlines()
           if any(line.strip().startswith(f"{key}: {value}") for key, value, _ in OLD_FORMS)
           and "router" not in path.parts]  # router.kind picks a launcher module, not a class
    assert not old


@pytest.mark.parametrize("key,value,target", OLD_FORMS)
def test_an_old_form_names_its_target_with_a_warning_saying_what_to_write(key, value, target):
    aliases = next(a for a in (backends.TYPE_ALIASES, readers.TYPE_ALIASES, scorers.TYPE_ALIASES,
                               recipes.RECIPE_ALIASES, gateway.WORKER_ALIASES) if value in a.get(key, {}))
    with pytest.warns(FutureWarning, match=rf"^sec: `{key}: {value}` is deprecated.*write `_target_: {target}`"):
        cfg = with_target({key: value, "x": 1}, where="sec", aliases=aliases)
    assert cfg == {"_target_": target, "x": 1} and callable(locate(target, where="sec"))
    with pytest.warns(FutureWarning):  # the user's old key wins over a shipped _target_ beside it
        assert with_target({key: value, "_target_": "a.b"}, where="sec", aliases=aliases)["_target_"] == target
    with pytest.raises(ValueError, match=rf"^sec: unknown {key} 'nope' \(expected one of .*{value}"):
        with_target({key: "nope"}, where="sec", aliases=aliases)


def _old_and_new(old: dict[str, Any], new: dict[str, Any], builder: Any) -> tuple[Any, Any]:
    with pytest.warns(FutureWarning):
        before = builder(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        after = builder(new)
    return before, after


def test_old_backend_types_build_the_same_backends():
    http = {"base_url": "http://127.0.0.1:1", "preflight": False, "tokenizer": "tiny-qwen3.5"}  # nothing is asked
    for old, new in [({"type": "transformers"}, {"_target_": backends.TRANSFORMERS}),
                     ({"type": "http", **http}, {"_target_": "parser.serving.backends.http_backend", **http})]:
        (before, _), (after, _) = _old_and_new({**old, "model": "tiny-qwen3.5"}, {**new, "model": "tiny-qwen3.5"},
                                               backends.build_backend)
        assert type(before) is type(after)
        asyncio.run(before.aclose())
        asyncio.run(after.aclose())


@pytest.fixture(scope="module")
def models() -> Iterator[Models]:
    backend, tokenizer = backends.build_backend({"_target_": backends.TRANSFORMERS, "model": "tiny-qwen3.5"})
    yield Models(backend, tokenizer, backend, tokenizer)
    asyncio.run(backend.aclose())


@pytest.mark.parametrize("kind,extra", [("subagent", {}), ("thinking", {}),
                                        ("dci", {"episode": episode_section("dci_reader", max_turns=1)})])
def test_old_reader_types_build_the_same_readers(models, kind, extra):
    before, after = _old_and_new({"type": kind, **extra}, {"_target_": readers.TYPE_ALIASES["type"][kind], **extra},
                                 lambda cfg: readers.build_reader(cfg, models))
    assert type(before) is type(after) and before.kind == kind
    before.close()
    after.close()


def test_a_reader_says_its_kind_to_the_protocol_and_takes_the_episode_defaults(models):
    release = episode_preset("eval", protocol="release")
    with pytest.raises(ValueError, match="reader type 'thinking' has no release protocol"):
        readers.reader_for_episode({"_target_": "parser.engine.readers.ThinkingReader"}, models, release,
                                   protocol_for(release))
    episode = episode_preset("eval", subagent_max_tokens=77)
    reader = readers.reader_for_episode(None, models, episode, protocol_for(episode))
    assert isinstance(reader, readers.SubagentReader) and reader.sampling.max_new_tokens == 77


class SharedEmbedder:
    def __call__(self, texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


def test_old_scorer_types_build_the_same_scorers():
    shared = Models(None, None, embedder=SharedEmbedder())
    for kind in ("embedder", "bm25"):
        before, after = _old_and_new({"type": kind, "embedder": {"model": "minilm"}},
                                     {"_target_": scorers.TYPE_ALIASES["type"][kind], "embedder": {"model": "minilm"}},
                                     lambda cfg: scorers.build_scorer(cfg, shared))
        assert type(before) is type(after)
    assert scorers.build_scorer({}, shared).embedder is shared.embedder  # the models config's embedder first


def test_an_old_recipe_writes_the_same_files(tmp_path):
    base = {"source": {"name": "synthetic", "num_questions": 2, "num_paragraphs": 300}, "lengths": [20],
            "num_questions": 2}
    before, after = _old_and_new({"recipe": "eval_grid", **base, "out_dir": str(tmp_path / "old")},
                                 {"_target_": "data_prep.recipes.eval_grid", **base, "out_dir": str(tmp_path / "new")},
                                 build_data)
    assert before[20].read_text() == after[20].read_text()
    with pytest.warns(FutureWarning):
        assert recipes.planned_outputs({"recipe": "eval_grid", **base, "out_dir": str(tmp_path / "old")}) == [before[20]]


@pytest.mark.parametrize("kind", sorted(gateway.WORKER_ALIASES["kind"]))
def test_an_old_worker_kind_launches_the_same_commands(kind):
    block = {"num": 2, "base_port": 31001, "model_path": "M", "module": "parser.serving.loopback", "env": {"A": "1"}}
    before, after = _old_and_new({"kind": kind, **block}, {"_target_": gateway.WORKER_ALIASES["kind"][kind], **block},
                                 gateway.worker_launches)
    assert before == after and after[1].url.endswith(":31002") and after[1].env["A"] == "1"
