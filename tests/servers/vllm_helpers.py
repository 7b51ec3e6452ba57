"""Shared by tests/servers/: starting and stopping a real vLLM server, and the Varnholm document.

Imported by name (`from vllm_helpers import ...`): pytest puts this folder on sys.path, as it
does for tests/verl_fakes.py.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from parser.episode import EpisodeConfig

SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 4096
STARTUP_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def vllm_command(python: str, port: int) -> list[str]:
    from parser.testing.assets import smollm2_dir

    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir()),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching",
            "--enable-prompt-tokens-details"]


def vllm_env(kv_cache_gib: str | None = None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": kv_cache_gib or os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    env.pop("PYTHONPATH", None)  # the server runs vLLM's own environment, not this checkout
    return env


def start_vllm(python: str, log_path: Path, kv_cache_gib: str | None = None):
    """Start one vLLM server on a free port and wait until it is healthy -> (url, process).

    Fails the test (with the log's tail) if it exits or is not healthy in STARTUP_TIMEOUT_S; the
    caller stops the process (`stop_vllm`)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(vllm_command(python, port), stdout=log, stderr=subprocess.STDOUT,
                                env=vllm_env(kv_cache_gib), start_new_session=True)
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() - started > STARTUP_TIMEOUT_S:
                tail = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"vLLM did not become healthy (exit {proc.poll()}); log tail:\n{tail}")
            time.sleep(2)
    except BaseException:
        stop_vllm(proc)
        raise
    print(f"\n[vllm] healthy after {time.monotonic() - started:.0f} s at {url} (log: {log_path})")
    return url, proc


def stop_vllm(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (its engine core and worker too), SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    try:  # children that outlived their leader
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
