"""Start, health-check and stop the subagent gateway: N model workers behind one router.

Why it exists: ParSer re-reads every chunk every round, which is cheap only when each chunk's
instructions+chunk prefix stays in one worker's KV cache and the router keeps sending that
chunk there. This module turns a config (`configs/serve/*.yaml`) into the exact command lines
for the workers (SGLang servers on GPUs; `parser.serve` or the loopback worker on CPU) and for
the router (`sglang-router` 0.3.2 or its successor `smg`), starts them as child processes, waits
until each answers, and stops exactly the processes it started (by their own PIDs / process
groups — never by name). `scripts/serve_subagents.py` and the gateway tests are thin users.

    from parser.gateway import Gateway
    with Gateway.from_config(cfg) as gw:   # cfg: the `configs/serve/default.yaml` mapping
        print(gw.url)                     # e.g. http://127.0.0.1:30000

Facts about sglang-router 0.3.2 that shape the commands (measured, see tests/test_gateway_*):
- It registers a worker with GET /health, /server_info and /model_info (falling back to
  /get_server_info, /get_model_info), then health-checks GET /health every
  `health_check_interval_secs`. It forwards response headers (so `X-Worker-Id` reaches clients).
- It loads a tokenizer for the worker's `model_path` and tries the Hugging Face hub when that is
  not a local path: give it `tokenizer_path` (or `model_path`) on offline clusters.
- Its Rust core has the header-keyed policies `consistent_hashing` (hash ring) and `manual`
  (sticky key -> worker map); both read the `X-SMG-Routing-Key` header. The 0.3.2 Python
  launcher's `--policy` choices omit `consistent_hashing`, so for that policy the router is
  started through `python -m parser.gateway router ...`, which is the same launcher with the
  choice list widened (`smg` >= 1.x accepts it directly).
- Prometheus metrics live on a separate port (`prometheus_port`); it binds 0.0.0.0 unless told.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

from parser.backends.base import ROUTING_HEADER

ROUTER_KINDS = ("sglang_router", "smg")
WORKER_KINDS = ("sglang", "parser_serve", "loopback")
# Policies that choose the worker from a routing-key header instead of the prompt text.
HEADER_KEYED_POLICIES = ("consistent_hashing", "manual")
# Policies the Rust core of sglang-router 0.3.2 knows but its Python launcher refuses.
_SHIMMED_POLICIES = ("consistent_hashing", "prefix_hash")


# ---------------------------------------------------------------------------- small helpers
def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


def flags(options: Mapping[str, Any] | None, where: str = "args") -> list[str]:
    """`{"schedule_policy": "lpm", "enable_metrics": True}` -> `--schedule-policy lpm --enable-metrics`.

    `True` is a bare switch, `False`/`None` leave the flag out, a mapping is passed as JSON (e.g.
    `default_chat_template_kwargs`), a list gives the flag several values (`--worker-urls a b`).
    """
    out: list[str] = []
    for key, value in (options or {}).items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: flag name {key!r} is not a non-empty string")
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(dict(value), separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def _get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = cfg.get(key, default)
    return default if value is None else value


# ---------------------------------------------------------------------------- launch plans
@dataclasses.dataclass
class Launch:
    """One process to start: its command line, extra environment, and where it answers."""

    name: str
    argv: list[str]
    url: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    ready_path: str = "/health"
    metrics_url: str | None = None  # Prometheus endpoint base, where separate (the router's)

    def shell(self) -> str:
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def worker_launches(workers: Mapping[str, Any], python: str = sys.executable) -> list[Launch]:
    """The worker processes of `workers` (the `workers:` block of a serve config).

    sglang: one `python -m sglang.launch_server` per `gpus_per_worker` GPUs (CUDA_VISIBLE_DEVICES
    set per worker, tensor parallel over them); `args` are SGLang server flags. Set `num: 1` and
    `args.dp_size: 8` to let one SGLang process own all GPUs instead (the router sees one worker).
    parser_serve / loopback: the project's CPU server / zero-compute worker, one per `num`, with
    `local_args` as their flags (`args` are SGLang's and are not passed to them).
    """
    kind = _get(workers, "kind", "sglang")
    if kind not in WORKER_KINDS:
        raise ValueError(f"workers.kind={kind!r}; expected one of {WORKER_KINDS}")
    num = int(_get(workers, "num", 1))
    if num < 1:
        raise ValueError(f"workers.num={num}; need at least one worker")
    host = _get(workers, "host", "127.0.0.1")
    ports = list(_get(workers, "ports", []))
    base_port = int(_get(workers, "base_port", 0))
    if ports and len(ports) != num:
        raise ValueError(f"workers.ports has {len(ports)} entries for workers.num={num}")
    args = dict(_get(workers, "args", {}))
    local_args = flags(_get(workers, "local_args", {}), "workers.local_args")
    per = int(_get(workers, "gpus_per_worker", 1))
    if per > 1:
        args.setdefault("tp_size", per)
    first = int(_get(workers, "first_gpu", 0))
    launches = []
    for i in range(num):
        port = int(ports[i]) if ports else (base_port + i if base_port else free_port(host))
        env = {str(k): str(v) for k, v in _get(workers, "env", {}).items()}
        if kind == "sglang":
            model = _get(workers, "model_path")
            if not model:
                raise ValueError("workers.model_path is required for workers.kind=sglang")
            argv = [python, "-m", "sglang.launch_server", "--model-path", str(model),
                    "--host", host, "--port", str(port), *flags(args, "workers.args")]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i * per + g) for g in range(per))
        elif kind == "parser_serve":
            model = _get(workers, "cpu_model", "tiny-qwen3.5")
            argv = [python, "-m", "parser.serve", "--model", str(model), "--host", host,
                    "--port", str(port), "--worker-id", f"w{i}", *local_args]
        else:
            argv = [python, "-m", "parser.testing.loopback", "--host", host, "--port", str(port),
                    "--worker-id", f"w{i}", *local_args]
        launches.append(Launch(f"worker{i}", argv, http_url(host, port), env))
    return launches


def _installed_launcher_policies() -> tuple[str, ...] | None:
    """The `--policy` choices of the installed sglang_router launcher (None if not installed)."""
    try:
        import argparse

        from sglang_router.router_args import RouterArgs
    except ImportError:
        return None
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    for action in parser._actions:  # argparse keeps no public map from dest to action
        if action.dest == "policy":
            return tuple(action.choices or ())
    return None


def router_launch(router: Mapping[str, Any], worker_urls: Sequence[str], python: str = sys.executable) -> Launch:
    """The router process of `router` (the `router:` block of a serve config) over `worker_urls`.

    kind `sglang_router`: `python -m sglang_router.launch_router` (the PyPI `sglang-router` wheel
    ships the Rust router inside); kind `smg`: the `smg launch` CLI (sglang-router 0.3.2 installs
    one too; the separate `smg` package is its successor). `args` are router flags.
    """
    kind = _get(router, "kind", "sglang_router")
    if kind not in ROUTER_KINDS:
        raise ValueError(f"router.kind={kind!r}; expected one of {ROUTER_KINDS}")
    if not worker_urls:
        raise ValueError("router: no worker URLs to route to")
    host = _get(router, "host", "127.0.0.1")
    port = int(_get(router, "port", 0)) or free_port(host)
    args = dict(_get(router, "args", {}))
    policy = _get(router, "policy", "cache_aware")
    metrics_port = _get(router, "prometheus_port", 0)
    args.setdefault("prometheus_host", host)  # 0.3.2 binds metrics to 0.0.0.0 by default
    args["prometheus_port"] = int(metrics_port) or free_port(host)
    common = ["--worker-urls", *worker_urls, "--policy", policy, "--host", host, "--port", str(port),
              *flags(args, "router.args")]
    if kind == "smg":
        exe = shutil.which("smg") or str(Path(python).with_name("smg"))
        argv = [exe, "launch", *common]
    else:
        choices = _installed_launcher_policies()
        if choices is not None and policy not in choices and policy in _SHIMMED_POLICIES:
            argv = [python, "-m", "parser.gateway", "router", *common]
        else:
            argv = [python, "-m", "sglang_router.launch_router", *common]
    env = {str(k): str(v) for k, v in _get(router, "env", {}).items()}
    return Launch("router", argv, http_url(host, port), env, ready_path="/readiness",
                  metrics_url=http_url(host, args["prometheus_port"]))


def routing_header(policy: str) -> str | None:
    """The header a client must put the routing key in for `policy`, or None (text-routed)."""
    return ROUTING_HEADER if policy in HEADER_KEYED_POLICIES else None


# ---------------------------------------------------------------------------- processes
def wait_ready(url: str, path: str = "/health", *, timeout_s: float = 600.0,
               process: subprocess.Popen | None = None, log: Path | None = None,
               interval_s: float = 0.2) -> None:
    """Poll `url + path` until it answers 200; fail early (with the log's tail) if `process` exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: process {process.pid} exited with {process.returncode} "
                               f"before it was ready\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(interval_s)
    raise TimeoutError(f"{url}{path} not ready after {timeout_s:.0f}s ({last})\n{_tail(log)}")


def _tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last lines of {log} ---\n" + "\n".join(text)


class ProcessGroup:
    """Child processes this object started, each in its own session; stops only those."""

    def __init__(self, log_dir: str | Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def start(self, launch: Launch) -> subprocess.Popen:
        if launch.name in self.procs:
            raise ValueError(f"a process named {launch.name!r} was already started")
        log = self.log_dir / f"{launch.name}.log"
        with open(log, "ab") as out:
            # own session: the group id is the child's pid, so stopping it also stops the
            # processes it forked (SGLang's scheduler/detokenizer) and nothing else
            proc = subprocess.Popen(launch.argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **launch.env},
                                    start_new_session=True)
        self.procs[launch.name] = proc
        self.logs[launch.name] = log
        return proc

    def wait_ready(self, launch: Launch, timeout_s: float) -> None:
        wait_ready(launch.url, launch.ready_path, timeout_s=timeout_s,
                   process=self.procs[launch.name], log=self.logs[launch.name])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one started process group (tests use it to kill a worker mid-round)."""
        proc = self.procs[name]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every started group (newest first), SIGKILL whatever is left after `grace_s`."""
        for name in reversed(list(self.procs)):
            self.kill(name, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(name, signal.SIGKILL)
                proc.wait(timeout=10)
            # children that ignored SIGTERM while their leader exited
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# ---------------------------------------------------------------------------- the gateway
@dataclasses.dataclass
class Gateway:
    """Workers + router, started together and stopped together (a context manager)."""

    workers: list[Launch]
    router: Launch
    policy: str
    group: ProcessGroup
    ready_timeout_s: float = 600.0

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], python: str = sys.executable) -> "Gateway":
        workers = worker_launches(cfg["workers"], python)
        router = router_launch(cfg["router"], [w.url for w in workers], python)
        log_dir = _get(cfg, "log_dir", None) or Path(os.environ.get("TMPDIR", "/tmp")) / f"parser-gateway-{os.getpid()}"
        return cls(workers, router, _get(cfg["router"], "policy", "cache_aware"), ProcessGroup(log_dir),
                   float(_get(cfg, "ready_timeout_s", 600.0)))

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def metrics_url(self) -> str:
        return self.router.metrics_url

    @property
    def routing_header(self) -> str | None:
        return routing_header(self.policy)

    def launches(self) -> list[Launch]:
        return [*self.workers, self.router]

    def start(self) -> "Gateway":
        try:
            for w in self.workers:
                self.group.start(w)
            for w in self.workers:  # the router gives up on workers that are not up yet
                self.group.wait_ready(w, self.ready_timeout_s)
            self.group.start(self.router)
            self.group.wait_ready(self.router, min(self.ready_timeout_s, 120.0))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.group.stop()

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------- router shim
def router_main(argv: list[str]) -> None:
    """sglang-router's own launcher with `consistent_hashing`/`prefix_hash` added to `--policy`.

    The 0.3.2 wheel's Rust core and its `policy_from_str` map both know these policies; only the
    argparse choice list leaves them out. Everything else is the installed launcher, unchanged.
    """
    import argparse

    from sglang_router.launch_router import launch_router
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="python -m parser.gateway router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    for action in parser._actions:
        if action.dest == "policy":
            action.choices = [*action.choices, *(p for p in _SHIMMED_POLICIES if p not in action.choices)]
    launch_router(RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "router":
        sys.exit("usage: python -m parser.gateway router <sglang-router launch_router flags>")
    router_main(sys.argv[2:])
