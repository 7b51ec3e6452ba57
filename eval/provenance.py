"""What a run directory must record so its numbers can be trusted later.

A score without its code version, config, package versions, seeds and hardware cannot be
compared with anything. `write_manifest` stores them next to the results; each resumed session
adds one entry to `sessions` (start, end, samples written) instead of overwriting the first.
`inputs` is the fingerprint of what the rows are computed from (`eval.inputs`).

    write_manifest(run_dir, config_dict, seeds={"base": 0}, inputs=eval.inputs.fingerprint(...))
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
PACKAGES = ("parser-agents", "torch", "transformers", "tokenizers", "sglang", "sglang-router", "verl",
            "hydra-core", "omegaconf", "numpy", "matplotlib", "aiohttp", "json-repair")


def git_state(repo: str | Path | None = None) -> dict[str, Any]:
    """Commit hash and whether the tree had uncommitted changes (a dirty tree is not reproducible).
    By default git looks from this package's own folder: a checkout's commit, none when installed."""
    repo = Path(repo or Path(__file__).parent)

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info["cuda"] = torch.cuda.is_available()
        if info["cuda"]:
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        info["cuda"] = None
    return info


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def write_manifest(run_dir: str | Path, config: dict[str, Any], seeds: dict[str, Any],
                   inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create or extend `manifest.json`; returns the session entry (fill `ended`/`written` later
    with `close_session`). A changed config on resume is recorded, not silently merged."""
    path = Path(run_dir) / MANIFEST
    manifest = read_manifest(run_dir) or {"created": now(), "sessions": []}
    manifest.setdefault("config", config)
    if inputs is not None:
        manifest["inputs"] = inputs
    session = {
        "started": now(),
        "git": git_state(),
        "packages": package_versions(),
        "hardware": hardware(),
        "seeds": seeds,
        "pid": os.getpid(),
    }
    if manifest["config"] != config:
        session["config"] = config  # this session ran with a different config than the first
    manifest["sessions"].append(session)
    _atomic_write(path, manifest)
    return session


def close_session(run_dir: str | Path, **fields: Any) -> None:
    path = Path(run_dir) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["sessions"][-1].update(ended=now(), **fields)
    _atomic_write(path, manifest)


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
