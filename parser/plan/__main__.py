"""`parser plan [calibrate|validate|table2] [Hydra overrides]` (default: plan).

Each command has its config in configs/plan/<command>.yaml; override keys on the command line,
e.g. `parser plan cluster.subagent_gpus=16 workload.concurrency=32`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from parser.base.resources import config_dir

CONFIG_DIR = str(config_dir("plan"))
COMMANDS = ("plan", "calibrate", "validate", "table2")


def _out_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def _container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def run_plan(cfg: DictConfig) -> None:
    from parser.plan import planner

    planner.main(_container(cfg), _out_dir())


def run_calibrate(cfg: DictConfig) -> None:
    from parser.plan import calibrate

    calibrate.main(_container(cfg), _out_dir())


def run_validate(cfg: DictConfig) -> None:
    from parser.plan import validate

    cfg = _container(cfg)
    validate.main(cfg["validate"], _out_dir(), paper=cfg["paper"])


def run_table2(cfg: DictConfig) -> None:
    from parser.plan import table2

    table2.main(_container(cfg), _out_dir())


def main() -> None:
    argv = sys.argv[1:]
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "plan"
    sys.argv = [f"{sys.argv[0]} {command}", *argv]
    task = {"plan": run_plan, "calibrate": run_calibrate, "validate": run_validate, "table2": run_table2}[command]
    hydra.main(version_base=None, config_path=CONFIG_DIR, config_name=command)(task)()


if __name__ == "__main__":
    main()
