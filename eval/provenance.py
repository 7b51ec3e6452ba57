"""What a run directory must record so its numbers can be trusted later.

A score without its code version, config, package versions, seeds and hardware cannot be
compared with anything. `write_manifest` stores them next to the results; each resumed session
adds one entry to `sessions` (start, end, samples written) instead of overwriting the first.
The manifest is written atomically and fsync'd (`parser.records.jsonl.write_json`); a damaged one is
refused with `ManifestDamaged`, naming the file and the fix, never a bare parse error.
`inputs` is the fingerprint of what the rows are computed from (`eval.inputs`).

    write_manifest(run_dir, config_dict, seeds={"base": 0}, inputs=eval.inputs.fingerprint(...))
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from parser.records.jsonl import BadJson, parse_json, write_json

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


class ManifestDamaged(ValueError):
    """`manifest.json` cannot be read (empty, cut, not UTF-8, not JSON, wrong types); the
    message names the file, what is wrong and what to do."""


# The manifest's top-level fields and the types a resume relies on (None: may be absent).
_SHAPE = {"created": str, "sessions": list, "config": dict, "inputs": dict}


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """The run directory's manifest, None if it has none; `ManifestDamaged` if it is unreadable.

    Nothing is repaired in place: the manifest is the only record of which inputs the rows were
    computed on, so the message says how to set it aside and resume (the rows are kept)."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return None
    fix = (f"move it aside (mv {path} {path}.damaged) and re-run: the rows in {Path(run_dir) / 'results.jsonl'} "
           "are kept and trusted by key, and a new manifest is written")
    try:
        manifest = parse_json(path.read_bytes())
    except BadJson as error:
        raise ManifestDamaged(f"{path}: cannot be read: {error}; {fix}") from None
    except OSError as error:
        raise ManifestDamaged(f"{path}: cannot be read ({error.strerror}); {fix}") from None
    if not isinstance(manifest, dict):
        raise ManifestDamaged(f"{path}: expected a JSON object, got {type(manifest).__name__}; {fix}")
    for field, kind in _SHAPE.items():
        if field in manifest and not isinstance(manifest[field], kind):
            raise ManifestDamaged(f"{path}: field {field!r} should be a {kind.__name__}, got "
                                  f"{type(manifest[field]).__name__}; {fix}")
    if not all(isinstance(session, dict) for session in manifest.get("sessions", [])):
        raise ManifestDamaged(f"{path}: field 'sessions' should hold objects; {fix}")
    if "inputs" in manifest:
        problem = _inputs_problem(manifest["inputs"])
        if problem:
            raise ManifestDamaged(f"{path}: {problem}; {fix}")
    return manifest


def _inputs_problem(inputs: dict[str, Any]) -> str | None:
    """What is wrong with a recorded fingerprint (`eval.inputs.fingerprint`'s shape), if anything."""
    for field in ("method", "seed", "subsets"):
        if field not in inputs:
            return f"field 'inputs.{field}' is missing"
    if not isinstance(inputs["subsets"], dict):
        return f"field 'inputs.subsets' should be an object, got {type(inputs['subsets']).__name__}"
    for key, subset in inputs["subsets"].items():
        if not isinstance(subset, dict) or not all(isinstance(subset.get(f), str) for f in ("source", "sha256")):
            return f"field 'inputs.subsets.{key}' should be an object with string 'source' and 'sha256'"
    return None


def write_manifest(run_dir: str | Path, config: dict[str, Any], seeds: dict[str, Any],
                   inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create or extend `manifest.json`; returns the session entry (fill `ended`/`written` later
    with `close_session`). A changed config on resume is recorded, not silently merged."""
    path = Path(run_dir) / MANIFEST
    manifest = read_manifest(run_dir) or {"created": now(), "sessions": []}
    manifest.setdefault("sessions", [])
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
    write_json(path, manifest, indent=True, default=str)
    return session


def close_session(run_dir: str | Path, **fields: Any) -> None:
    manifest = read_manifest(run_dir)
    if not manifest or not manifest.get("sessions"):
        raise ManifestDamaged(f"{Path(run_dir) / MANIFEST}: no session to close (the file was replaced while "
                              "eval.run ran); re-run the same command to resume")
    manifest["sessions"][-1].update(ended=now(), **fields)
    write_json(Path(run_dir) / MANIFEST, manifest, indent=True, default=str)
