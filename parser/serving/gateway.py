"""Start, health-check and stop the subagent gateway: N model workers behind one router.

Why it exists: ParSer re-reads every chunk every round, which is cheap only when each chunk's
instructions+chunk prefix stays in one worker's KV cache and the router keeps sending that
chunk there. This module turns a config (`configs/serve/*.yaml`) into the exact command lines
for the workers (SGLang servers on GPUs; `parser.serving.server`, or any module that serves the same
way, on CPU: the zero-compute loopback worker is `workers.module=parser.serving.loopback`) and for
the router, starts them as child processes, waits until each answers, and stops exactly the
processes it started (by their own PIDs / process groups — never by name).
`parser/cli/gateway.py` and the gateway tests are thin users.

    from parser.serving.gateway import Gateway
    with Gateway.from_config(cfg) as gw:   # cfg: the `configs/serve/default.yaml` mapping
        print(gw.url)                     # e.g. http://127.0.0.1:30000

Two routers, one per `router.kind` (configs/serve/router/), both launched as `python -m ...` so
the `smg` console script that both wheels install cannot pick the wrong one:
- `smg` (default): Shepherd Model Gateway, `python -m smg launch`, the maintained successor of
  sglang-router. With `routing_key_override` it pins every request that carries
  `X-SMG-Routing-Key` (`doc_id:chunk_index`, sent by `HttpBackend`) to one worker on any
  policy, assigning new keys by `assignment_mode`; requests without the key fall back to the
  policy (cache_aware: the prompt text) or to the request-id lineage (a trajectory's lead turns).
- `sglang_router`: sglang-router 0.3.2 (`python -m sglang_router.launch_router`), the router of
  the authors' release. Its launcher takes `cache_aware | manual | round_robin | power_of_two |
  random`; only `manual` reads the routing-key header.
Both register a worker through GET /health, /server_info and /model_info (older names
/get_server_info, /get_model_info), health-check GET /health, forward response headers (so
`X-Worker-Id` reaches clients), retry 408/429/5xx and open a worker's circuit breaker on them.
Neither inspects a 200's body: a worker answering 200 with garbage keeps its requests, and only
the client (`HttpBackend` raises a retryable error, `WorkerPool` moves the key) can route
around it (docs/scaling.md has the measured fault table, `scripts/gateway_faults.py`). smg
1.13's `/v1/completions` takes text prompts only (a token-id prompt is a 400): the lead's
exact token path goes to its servers directly, subagents (text or chat) through the router.
Prometheus metrics live on a separate port (`prometheus_port`), bound to the router's host.
"""
from __future__ import annotations

import dataclasses
import functools
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from parser.serving.backends.preflight import get
from parser.serving.types import ROUTING_HEADER
from parser.base.instantiate import locate, with_target
from parser.base.resources import config_dir
from parser.base.signals import finishing

ROUTER_KINDS = ("smg", "sglang_router")
# The old `workers.kind` -> the function that writes one worker's command line (kept for one release).
WORKER_ALIASES = {"kind": {kind: f"parser.serving.gateway.{kind}_worker" for kind in ("sglang", "parser_serve", "module")}}
# Policies that choose the worker from the routing-key header instead of the prompt text.
HEADER_KEYED_POLICIES = ("consistent_hashing", "manual")
# The module each router kind is started with (`python -m MODULE [launch] ...`).
ROUTER_MODULES = {"smg": ("smg", "launch"), "sglang_router": ("sglang_router.launch_router",)}
ROUTER_PRESETS = config_dir("serve", "router")
ROUTER_EXTRAS = {"smg": "gateway", "sglang_router": "sglang-router"}  # the package extra that installs each router


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
    ready_workers: int = 0  # a router: ready once /readiness counts this many healthy workers

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def worker_launches(workers: Mapping[str, Any], python: str = sys.executable) -> list[Launch]:
    """The worker processes of `workers` (the `workers:` block of a serve config), one per `num`.

    `workers._target_` names the function that writes one worker's command line
    (`sglang_worker`, the default; `parser_serve_worker`; `module_worker`); the old
    `kind: sglang | parser_serve | module` still works for one release, with a FutureWarning.
    """
    workers = with_target({k: v for k, v in workers.items() if v is not None}, where="workers",
                          aliases=WORKER_ALIASES, default="parser.serving.gateway.sglang_worker")
    command = locate(workers["_target_"], where="workers")
    num = int(_get(workers, "num", 1))
    if num < 1:
        raise ValueError(f"workers.num={num}; need at least one worker")
    host = _get(workers, "host", "127.0.0.1")
    ports = list(_get(workers, "ports", []))
    base_port = int(_get(workers, "base_port", 0))
    if ports and len(ports) != num:
        raise ValueError(f"workers.ports has {len(ports)} entries for workers.num={num}")
    launches = []
    for i in range(num):
        port = int(ports[i]) if ports else (base_port + i if base_port else free_port(host))
        argv, env = command(workers, index=i, host=host, port=port, python=python)
        env = {**{str(k): str(v) for k, v in _get(workers, "env", {}).items()}, **env}
        launches.append(Launch(f"worker{i}", argv, http_url(host, port), env))
    return launches


def sglang_worker(workers: Mapping[str, Any], *, index: int, host: str, port: int,
                  python: str) -> tuple[list[str], dict[str, str]]:
    """`python -m sglang.launch_server` on `gpus_per_worker` GPUs of its own (CUDA_VISIBLE_DEVICES,
    tensor parallel over them); `args` are SGLang server flags. Set `num: 1` and `args.dp_size: 8`
    to let one SGLang process own all GPUs instead (the router sees one worker)."""
    model = _get(workers, "model_path")
    if not model:
        raise ValueError("workers.model_path is required for workers._target_=parser.serving.gateway.sglang_worker")
    args = dict(_get(workers, "args", {}))
    per = int(_get(workers, "gpus_per_worker", 1))
    if per > 1:
        args.setdefault("tp_size", per)
    first = int(_get(workers, "first_gpu", 0))
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model),
            "--host", host, "--port", str(port), *flags(args, "workers.args")]
    return argv, {"CUDA_VISIBLE_DEVICES": ",".join(str(first + index * per + g) for g in range(per))}


def parser_serve_worker(workers: Mapping[str, Any], *, index: int, host: str, port: int,
                        python: str) -> tuple[list[str], dict[str, str]]:
    """The project's CPU server (`parser serve`) on `cpu_model`, `local_args` as
    its flags (`args` are SGLang's and are not passed)."""
    model = _get(workers, "cpu_model", "tiny-qwen3.5")
    return [python, "-m", "parser.serving.server", "--model", str(model), "--host", host, "--port", str(port),
            "--worker-id", f"w{index}", *flags(_get(workers, "local_args", {}), "workers.local_args")], {}


def module_worker(workers: Mapping[str, Any], *, index: int, host: str, port: int,
                  python: str) -> tuple[list[str], dict[str, str]]:
    """`python -m <workers.module>`: any server that takes `--host --port --worker-id` as
    `parser.serving.server` does (the zero-compute loopback worker, `parser.serving.loopback`),
    `local_args` as its flags."""
    module = _get(workers, "module")
    if not module:
        raise ValueError("workers.module is required for workers._target_=parser.serving.gateway.module_worker "
                         "(a module run as `python -m MODULE --host H --port P --worker-id wI`)")
    return [python, "-m", str(module), "--host", host, "--port", str(port), "--worker-id", f"w{index}",
            *flags(_get(workers, "local_args", {}), "workers.local_args")], {}


def router_preset(kind: str) -> dict[str, Any]:
    """The shipped `router:` block of one kind (configs/serve/router/<kind>.yaml), as a dict."""
    import yaml

    if kind not in ROUTER_KINDS:
        raise ValueError(f"router.kind={kind!r}; expected one of {ROUTER_KINDS}")
    return yaml.safe_load((ROUTER_PRESETS / f"{kind}.yaml").read_text())


def router_launch(router: Mapping[str, Any], worker_urls: Sequence[str], python: str = sys.executable) -> Launch:
    """The router process of `router` (the `router:` block of a serve config) over `worker_urls`.

    kind `smg`: `python -m smg launch` (PyPI `smg`, the `gateway` extra); kind `sglang_router`:
    `python -m sglang_router.launch_router` (PyPI `sglang-router`, the `sglang-router` extra).
    Both wheels ship the Rust router inside. `args` are that router's own flags (checked
    against each binary's `--help` by tests/e2e/test_gateway_commands_on_cpu.py).
    """
    kind = _get(router, "kind", "smg")
    if kind not in ROUTER_KINDS:
        raise ValueError(f"router.kind={kind!r}; expected one of {ROUTER_KINDS}")
    if not worker_urls:
        raise ValueError("router: no worker URLs to route to")
    host = _get(router, "host", "127.0.0.1")
    port = int(_get(router, "port", 0)) or free_port(host)
    args = dict(_get(router, "args", {}))
    policy = _get(router, "policy", "cache_aware")
    metrics_port = _get(router, "prometheus_port", 0)
    args.setdefault("prometheus_host", host)  # both bind metrics to 0.0.0.0 unless told
    args["prometheus_port"] = int(metrics_port) or free_port(host)
    argv = [python, "-m", *ROUTER_MODULES[kind], "--worker-urls", *worker_urls, "--policy", policy,
            "--host", host, "--port", str(port), *flags(args, "router.args")]
    env = {str(k): str(v) for k, v in _get(router, "env", {}).items()}
    # both answer /readiness once one worker is up: wait for all, or round 1 skips the late ones
    return Launch("router", argv, http_url(host, port), env, ready_path="/readiness",
                  metrics_url=http_url(host, args["prometheus_port"]), ready_workers=len(worker_urls))


@functools.lru_cache(maxsize=8)
def router_help(kind: str, python: str = sys.executable) -> str:
    """The installed router's own `--help` text (what its launcher really accepts)."""
    if kind not in ROUTER_KINDS:
        raise ValueError(f"router.kind={kind!r}; expected one of {ROUTER_KINDS}")
    argv = [python, "-m", *ROUTER_MODULES[kind], "--help"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{shlex.join(argv)}: {error}") from error
    if done.returncode != 0 or "--worker-urls" not in done.stdout:
        extra = f"pip install 'parser-agents[{ROUTER_EXTRAS[kind]}]'"
        raise RuntimeError(f"{shlex.join(argv)} failed (exit {done.returncode}; is it installed? {extra}):\n"
                           f"{(done.stderr or done.stdout)[-2000:]}")
    return done.stdout


def unknown_router_flags(argv: Sequence[str], help_text: str) -> list[str]:
    """Flags (and choice values) in a router command line that its `--help` does not list.

    A flag is known when `--help` names it; a flag whose help shows `{a,b,c}` must take one of
    those values. Returns one readable line per problem (empty: every flag is the router's).
    """
    known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    choices = {flag: {v.strip() for v in values.split(",")} for flag, values in re.findall(r"(--[a-z0-9-]+) \{([^}]*)\}", help_text)}
    problems = []
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        if token not in known:
            problems.append(f"{token} is not a flag of this router")
        elif token in choices:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            if value not in choices[token]:
                problems.append(f"{token} {value}: expected one of {sorted(choices[token])}")
    return problems


def check_router_flags(router: Launch, kind: str, python: str = sys.executable) -> None:
    """Raise before starting a router whose command line its installed binary would refuse."""
    problems = unknown_router_flags(router.argv, router_help(kind, python))
    if problems:
        raise ValueError(f"router.kind={kind}: the installed router refuses this command line "
                         f"({shlex.join(router.argv[:4])} --help lists its flags; router.args keys are flags "
                         f"with '_' for '-'):\n  " + "\n  ".join(problems))


def reads_routing_key(router: Mapping[str, Any]) -> bool:
    """Whether this router picks the worker from the routing-key header (else from the text)."""
    policy = _get(router, "policy", "cache_aware")
    override = _get(router, "kind", "smg") == "smg" and bool(_get(_get(router, "args", {}), "routing_key_override", False))
    return policy in HEADER_KEYED_POLICIES or override


# ---------------------------------------------------------------------------- processes
def wait_ready(url: str, path: str = "/health", *, timeout_s: float = 600.0,
               process: subprocess.Popen | None = None, log: Path | None = None,
               interval_s: float = 0.2, workers: int = 0) -> None:
    """Poll `url + path` until it answers 200 (and, for `workers`, reports that many healthy
    workers in its JSON); fail early (with the log's tail) if `process` exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: process {process.pid} exited with {process.returncode} "
                               f"before it was ready\n{_tail(log)}")
        try:  # each poll whole within its 5 s (or what is left): a worker trickling its answer cannot hold it
            status, _, body = get(url + path, max(0.1, min(5.0, deadline - time.monotonic())))
            if status == 200 and not workers:
                return
            if status == 200:
                healthy = _healthy_workers(body)
                if healthy >= workers:
                    return
                last = f"{healthy} of {workers} workers healthy"
            else:
                last = f"HTTP {status}"
        except (OSError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(interval_s)
    raise TimeoutError(f"{url}{path} not ready after {timeout_s:.0f}s ({last})\n{_tail(log)}")


def _healthy_workers(body: bytes) -> int:
    try:
        count = json.loads(body).get("healthy_workers", 0)
    except (ValueError, AttributeError):
        return 0
    return count if isinstance(count, int) else 0


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
                   process=self.procs[launch.name], log=self.logs[launch.name], workers=launch.ready_workers)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one started process group (tests use it to kill a worker mid-round)."""
        proc = self.procs[name]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every started group (newest first), SIGKILL whatever is left after `grace_s`;
        a Ctrl-C or SIGTERM meanwhile lands once all are stopped (`finishing`)."""
        with finishing():
            self._stop(grace_s)

    def _stop(self, grace_s: float) -> None:
        for name in reversed(list(self.procs)):
            self.kill(name, signal.SIGTERM)
            self.kill(name, signal.SIGCONT)  # a group frozen by SIGSTOP (a fault test) handles it
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
    keyed: bool = False  # the router reads ROUTING_HEADER (see reads_routing_key)
    router_kind: str = "smg"
    python: str = sys.executable

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], python: str = sys.executable) -> "Gateway":
        workers = worker_launches(cfg["workers"], python)
        router = router_launch(cfg["router"], [w.url for w in workers], python)
        log_dir = _get(cfg, "log_dir", None) or Path(os.environ.get("TMPDIR", "/tmp")) / f"parser-gateway-{os.getpid()}"
        return cls(workers, router, _get(cfg["router"], "policy", "cache_aware"), ProcessGroup(log_dir),
                   float(_get(cfg, "ready_timeout_s", 600.0)), reads_routing_key(cfg["router"]),
                   _get(cfg["router"], "kind", "smg"), python)

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def metrics_url(self) -> str:
        return self.router.metrics_url

    @property
    def routing_header(self) -> str | None:
        """The header the router reads the routing key from, or None (it routes on the text)."""
        return ROUTING_HEADER if self.keyed else None

    def launches(self) -> list[Launch]:
        return [*self.workers, self.router]

    def start(self) -> "Gateway":
        check_router_flags(self.router, self.router_kind, self.python)  # before anything is started
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
