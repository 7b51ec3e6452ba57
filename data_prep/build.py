"""Build a dataset from a Hydra config in ``configs/data/`` (one config per recipe and source).

    parser data --config-name synthetic_eval                 # offline, CI/demo data
    parser data --config-name hotpotqa_eval out_dir=data/hqa_val num_questions=128
    parser data --config-name twowiki_eval same_questions=false   # ReMemR1's behaviour
    parser data --config-name hotpotqa_train knowledge_filter.backend.base_url=http://127.0.0.1:30000
    parser data --config-name controlled_position source=synthetic_source

Every config names its recipe by `_target_` (a function in `data_prep.recipes`, e.g.
`_target_: data_prep.recipes.eval_grid`; the old `recipe: eval_grid` still builds for one release);
the other keys are that function's arguments. `tokenizer` (a name or path, optional) adds token
statistics to cards.
"""
from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from data_prep import recipes
from data_prep.records import DataError
from parser.base.instantiate import build, locate, with_target
from parser.base.resources import config_dir


def run(cfg: dict[str, Any]) -> Any:
    cfg = with_target(cfg, where="data config", aliases=recipes.RECIPE_ALIASES)
    tokenizer_name = cfg.pop("tokenizer", None)
    deps: dict[str, Any] = {"name": cfg["name"]} if "name" in cfg else {}  # train_set's: its files', not the config's
    if tokenizer_name and locate(cfg.get("_target_"), where="data config") is recipes.eval_grid:
        from transformers import AutoTokenizer

        deps.update(tokenizer=AutoTokenizer.from_pretrained(tokenizer_name), tokenizer_name=tokenizer_name)
    return build(cfg, where="data config", **deps)


@hydra.main(config_path=str(config_dir("data")), config_name="synthetic_eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        written = run(OmegaConf.to_container(cfg, resolve=True))
    except DataError as error:  # bad input: say which file, record and field, and exit non-zero
        print(f"data_prep.build: error: {error}", file=sys.stderr)
        sys.exit(2)
    for key, path in (written.items() if isinstance(written, dict) else [("", written)]):
        print(f"{key}\t{path}")


if __name__ == "__main__":
    main()
