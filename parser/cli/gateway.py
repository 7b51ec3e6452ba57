"""Start the subagent gateway: N SGLang workers + the router, from one config.

Starts every worker (one SGLang server per GPU group, see `configs/serve/default.yaml`), waits
until each answers /health, starts the router in front of them (smg by default, which pins each
chunk's routing key to one worker; `router=sglang_router` for sglang-router 0.3.2), waits until
its /readiness counts every worker, prints the gateway URL, and then stays up until Ctrl-C / SIGTERM,
when it stops exactly the processes it started (by their PIDs / process groups). Everything
binds 127.0.0.1 unless the config says otherwise. Logs: one file per process in Hydra's run dir.

    parser gateway                                   # 8 GPUs: 8 workers + router
    parser gateway workers.num=2 workers.first_gpu=6 # a slice of a node
    parser gateway dry_run=true                      # print the commands only
    parser gateway router=sglang_router              # the authors' router
    parser gateway --config-name lead                # the lead agent
    parser gateway --config-name yarn_full_context   # ~1M-token baselines
    # CPU, no model: 3 zero-compute loopback workers
    parser gateway workers._target_=parser.serving.gateway.module_worker workers.module=parser.serving.loopback workers.num=3 workers.base_port=0

Then point the subagent backend at the printed URL (`configs/backend/qwen35_gateway.yaml`) and
check locality / balance / prefix reuse with `scripts/gateway_report.py` (the command is printed).

Raises on start-up failure (a router flag the installed binary does not list, a worker or the
router exits or is not ready in time), after stopping whatever it had started; the error
carries the tail of that process's log.
"""
from __future__ import annotations

import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


from parser.base.settings import precheck
from parser.base.signals import stop_on_signals
from parser.serving.gateway import Gateway
from parser.base.resources import config_dir


def describe(gateway: Gateway) -> str:
    workers = " ".join(w.url for w in gateway.workers)
    header = gateway.routing_header
    lines = [
        f"gateway: {gateway.url}",
        f"workers: {workers}",
        f"router metrics: {gateway.metrics_url}/metrics",
        f"policy: {gateway.policy}"
        + (f" (clients send the routing key in {header}: HttpBackend(routing_header={header!r}))" if header else ""),
        f"check: python scripts/gateway_report.py --gateway {gateway.url} --workers {workers}"
        + (f" --routing-header {header}" if header else ""),
    ]
    return "\n".join(lines)


def main() -> None:
    """`parser gateway`: the settings checked first (a typo, a `+key=` nothing reads, a port or a
    worker count outside its domain: one line, exit 2, nothing started), then the gateway."""
    precheck(config_dir("serve"), "default", sys.argv[1:], prog="parser gateway")
    _main()


@hydra.main(version_base="1.3", config_path=str(config_dir("serve")), config_name="default")
def _main(cfg: DictConfig) -> None:
    conf = OmegaConf.to_container(cfg, resolve=True)
    if not conf.get("log_dir"):
        conf["log_dir"] = HydraConfig.get().runtime.output_dir
    gateway = Gateway.from_config(conf)

    # -- what will run ------------------------------------------------------------------------
    for launch in gateway.launches():
        print(f"[{launch.name}] {launch.shell()}", flush=True)
    if conf.get("dry_run"):
        return

    # -- run until told to stop ---------------------------------------------------------------
    started = time.monotonic()
    try:  # Ctrl-C or SIGTERM, even started with SIGINT ignored, unwinds `with gateway:`, which stops every process
        with stop_on_signals(), gateway:
            print(f"ready after {time.monotonic() - started:.0f}s; logs in {conf['log_dir']}", flush=True)
            print(describe(gateway), flush=True)
            reported_dead: set[str] = set()
            while True:
                time.sleep(1.0)
                for name, proc in gateway.group.procs.items():
                    if proc.poll() is not None and name not in reported_dead:
                        reported_dead.add(name)
                        print(f"[{name}] exited with {proc.returncode}; see {gateway.group.logs[name]}", flush=True)
                if "router" in reported_dead:
                    raise SystemExit("the router exited; stopping the workers")
    except KeyboardInterrupt:
        print("stopping: every process this script started", flush=True)


if __name__ == "__main__":
    main()
