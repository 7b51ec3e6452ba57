"""Evaluation: run a method over a dataset (`eval.run`), build the paper's tables and figures
(`eval.report`), and look at trajectories (`eval.viewer`). See docs/architecture.md.

The eval configs' own resolvers are registered here, so every way of composing them (the entry
points, `hydra.compose` in scripts and tests) resolves them alike:

- `${order_label:MemAgent,${.order}}` -> `MemAgent` / `MemAgent (CL-order)`; a third argument
  `true` names document order too (`CoA (document)`); `parser.engine.ordering.order_label`.
- `${order_suffix:${oc.select:method.order,document}}` -> `""` / `_chow_liu`: each reading
  order of a sequential method evaluates into its own run folder.
- `${file_stem:${.path}}` -> `mine` for `data/mine.jsonl`: `dataset=files` names its rows (and its
  run folder) after the file.
"""
from pathlib import Path

from omegaconf import OmegaConf

from parser.engine.ordering import order_label, order_suffix

OmegaConf.register_new_resolver("order_label", lambda method, order, show_document=False: order_label(
    str(method), str(order), str(show_document).lower() == "true"), replace=True)
OmegaConf.register_new_resolver("order_suffix", lambda order: order_suffix(str(order)), replace=True)
OmegaConf.register_new_resolver("file_stem", lambda path: Path(str(path)).name.split(".")[0], replace=True)
