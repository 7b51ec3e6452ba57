"""Start verl's local Ray cluster again when Ray's own start-up deadline ran out on a busy machine.

Why: Ray 2.60's raylet gives its dashboard agent a fixed 15 s to report its ports (no setting
changes it) and aborts when the agent is late; `ray.init` then raises "The current node timed out
during startup" ~30 s later. The agent needs ~2.5 CPU-s of imports, so on a machine whose cores
are busy (the test suite's parallel workers plus another run's ten verl processes starting; a laptop
compiling) it can be late: two of five clean CI runs on a 2-core 2.0 GHz machine lost a launch
this way, in the runs that passed the agent took up to 15.0 s, and with this retry one launch
needed its third start.

Nothing of the run exists yet when that happens (verl starts its actors only after `ray.init`),
so `retry_ray_start` stops what the failed start left behind (Ray's GCS, monitor and log monitor:
children of this process) and lets verl start the cluster again, up to `RAY_START_ATTEMPTS`
times, saying so on stderr. Any other error, and any error once Ray is up, is raised unchanged.

    parser train --config-name train/cpu_smoke ...
    # on a busy machine: "parser.train: Ray's local cluster did not start (attempt 1 of 5: ...)"
"""
from __future__ import annotations

import os
import sys
from typing import Callable, TypeVar

import psutil
import ray

T = TypeVar("T")

# each failed start costs ~35-70 s (the raylet's 15 s, then ray.init's 30 s poll); on a 2-core machine
# at half speed, a launch starting while another launch's ten processes imported verl needed 3 tries
RAY_START_ATTEMPTS = 5
START_TIMEOUT = "The current node timed out during startup"  # ray/_private/node.py, Node.__init__
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this long
RAY_BINARIES = ("raylet", "gcs_server")  # how a dead one is known: a zombie has no command line left


def is_start_timeout(error: BaseException) -> bool:
    """Ray raised its start-up timeout and no cluster is connected: nothing of the run started."""
    return START_TIMEOUT in str(error) and not ray.is_initialized()


def stop_failed_start() -> list[int]:
    """Stop the Ray processes a failed `ray.init` left running (it keeps no handle on them) and reap
    the dead ones; returns their pids."""
    package = os.path.dirname(ray.__file__)
    ours = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                if child.name() in RAY_BINARIES:  # the raylet that aborted, not yet reaped
                    ours.append(child)
            elif any(package in part for part in child.cmdline()):
                ours.append(child)
        except psutil.Error:  # gone already
            continue
    for child in ours:
        try:
            child.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(ours, timeout=STOP_GRACE_S)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    return [child.pid for child in ours]


def retry_ray_start(run: Callable[[], T], attempts: int = RAY_START_ATTEMPTS) -> T:
    """`run()` (which starts Ray first, as verl's `run_ppo` does), again after a start-up timeout."""
    for attempt in range(1, attempts + 1):
        try:
            return run()
        except Exception as error:
            if attempt == attempts or not is_start_timeout(error):
                raise
            stopped = stop_failed_start()
            print(f"parser.train: Ray's local cluster did not start (attempt {attempt} of {attempts}: "
                  f"{error}); stopped its {len(stopped)} leftover processes, starting it again", file=sys.stderr,
                  flush=True)
    raise AssertionError("unreachable")
