"""Can this machine run the composed training config, and where did the run leave its checkpoint?

Why: on a machine without a GPU, Megatron or the data, `parser train --config-name
train/parser_4b` passed the config checks, printed ~1,000 config lines and hung while Ray waited
for GPUs that were not there. `machine_problems` looks first, before the config is printed or Ray
starts, and `parser.train` refuses with what is missing and what to do. The checks are the
backend's own requirements: a CUDA GPU for every GPU engine (and the GPUs a one-node run asks for),
`megatron.core` for the megatron engine, the rollout server's package, and the train/val files.
`closing_lines` is what a finished run prints: where its checkpoint is and the next commands
(merge to Hugging Face weights -> eval).

    parser train --config-name train/parser_4b     # on a laptop: refused, exit 2
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

GPU_STACK = "pip install -c constraints/gpu-qwen3_5.txt -e '.[train,gateway,gpu]'"
# rollout.name -> the package its server needs (parser_cpu is this project's, always there)
ROLLOUT_PACKAGES = {"sglang": "sglang", "vllm": "vllm"}


class MachineError(RuntimeError):
    """This machine cannot run the config: nothing was started."""


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def machine_problems(config: Any, data_configs: Path, gpus: Callable[[], int] = visible_gpus,
                     has_module: Callable[[str], bool] = importable) -> list[str]:
    """Everything this machine lacks for `config` (a resolved trainer config), each with what to do;
    `data_configs` (configs/data) names the command that writes a missing training file."""
    problems = []
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout
    engine = config.get("model_engine") or config.actor_rollout_ref.actor.get("strategy")
    if trainer.get("device", "cuda") != "cpu":
        found = gpus()
        local = int(trainer.nnodes) == 1 and int(rollout.nnodes) == 1 and not config.ray_kwargs.ray_init.get("address")
        trainer_gpus, rollout_gpus = int(trainer.n_gpus_per_node), int(rollout.n_gpus_per_node)
        needed = max(trainer_gpus, rollout_gpus) if config.actor_rollout_ref.get("hybrid_engine", True) \
            else trainer_gpus + rollout_gpus
        if found == 0:
            problems.append(f"no CUDA GPU is visible (torch.cuda.device_count() = 0): this config trains on GPUs "
                            f"(trainer.device=cuda, model_engine={engine}, rollout {rollout.name}). On a CPU run "
                            "recipes/train_cpu_smoke.sh (train/cpu_smoke) or `make learn` (train/cpu_learn); on a GPU "
                            f"machine check CUDA_VISIBLE_DEVICES and the GPU stack ({GPU_STACK})")
        elif local and found < needed:
            problems.append(f"{needed} GPUs needed on this node (trainer.n_gpus_per_node={trainer_gpus} + "
                            f"actor_rollout_ref.rollout.n_gpus_per_node={rollout_gpus}), {found} visible: lower those "
                            "two settings or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    if engine == "megatron" and not has_module("megatron.core"):
        problems.append(f"megatron.core is not importable: the megatron engine (model_engine=megatron, "
                        f"configs/train/engine/megatron.yaml) needs megatron-core; install the GPU stack: {GPU_STACK}")
    package = ROLLOUT_PACKAGES.get(str(rollout.name))
    if package and not has_module(package):
        problems.append(f"{package} is not importable: actor_rollout_ref.rollout.name={rollout.name} runs its "
                        f"server; install the GPU stack: {GPU_STACK}")
    for key in ("train_files", "val_files"):
        for path in _paths(config.data.get(key)):
            if "://" not in path and not Path(path).exists():
                problems.append(f"data.{key}={path}: no such file. {_data_hint(Path(path), data_configs)}")
    return problems


def check_machine(config: Any, data_configs: Path, **probes: Any) -> None:
    problems = machine_problems(config, data_configs, **probes)
    if problems:
        raise MachineError("this machine cannot run this training config (nothing was started):\n  - "
                           + "\n  - ".join(problems))


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def _data_hint(path: Path, data_configs: Path) -> str:
    """The command that writes a training file: the data config named like it (configs/data/<stem>.yaml)."""
    config = data_configs / f"{path.stem}.yaml"
    if config.is_file():
        return (f"Build it: parser data --config-name {path.stem} out_dir={path.parent} "
                f"(configs/data/{config.name} says what it needs), or pass data.{{train,val}}_files=PATH")
    return "README \"Data\" lists the command that writes each training config's files; or pass the path you have"


def closing_lines(config: Any) -> list[str]:
    """Where the finished run's checkpoint is and what to run next (merge -> eval)."""
    root = Path(str(config.trainer.default_local_dir))
    latest = root / "latest_checkpointed_iteration.txt"
    step = latest.read_text().strip() if latest.is_file() else None
    if step is None:
        return [f"parser.train: finished; no checkpoint under {root} (trainer.save_freq={config.trainer.save_freq})"]
    actor = root / f"global_step_{step}" / "actor"
    merged = root / f"global_step_{step}" / "hf"
    backend = "megatron" if (config.get("model_engine") or "") == "megatron" else "fsdp"
    preset = " --config-name tiny_cpu" if config.trainer.get("device") == "cpu" else ""
    return [f"parser.train: finished; checkpoint at {actor} (step {step}; a rerun resumes from it)",
            f"  next, Hugging Face weights: python -m verl.model_merger merge --backend {backend} --local_dir {actor} "
            f"--target_dir {merged}",
            f"  then evaluate the lead:     parser eval{preset} models.lead.model={merged}"]
