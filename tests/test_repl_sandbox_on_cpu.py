"""The RLM REPL sandbox: cells persist, sub-calls round-trip, and model code cannot get out.

    .venv/bin/pytest tests/test_repl_sandbox_on_cpu.py -q

Real worker processes (parser/engine/sandbox/repl_worker.py) under the real isolation; the only fake
is the `llm` callback, which stands in for the method's sub-call backend (gateway, retries, slots).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import pathlib
import select
import shutil
import socket
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from parser.engine.sandbox.process import ProcessSlots
from parser.engine.sandbox.repl import CONFIG, WORKER_UID_BASE, ReplLimits, ReplSandbox, SubCall

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the checkout the host scripts import from


class ScriptedLlm:
    """The method's `llm` callback: records each call, replies by rule (a prompt starting "fail" gets the
    "Error: ..." string the method returns for a failed sub-call)."""

    def __init__(self):
        self.calls: list[tuple[list[str], str | None]] = []

    async def __call__(self, prompts, model):
        self.calls.append((list(prompts), model))
        return [f"Error: Request failed: {p}" if p.startswith("fail") else f"reply to {p}" for p in prompts]


def run(coro):
    return asyncio.run(coro)


@functools.cache
def isolation_missing() -> tuple[str, ...]:
    """What the worker cannot set up on this machine (empty here: root, user namespaces allowed)."""
    async def probe():
        async with await ReplSandbox.start("", llm=ScriptedLlm(), allow_unisolated=True) as repl:
            return repl.missing

    return run(probe())


NEED_NO_ISOLATION = {"test_yaml_is_the_dataclass_defaults", "test_limits_out_of_domain_name_the_field",
                     "test_without_namespaces_it_refuses_unless_allowed"}


@pytest.fixture(autouse=True)
def isolation(request):
    """Where the worker cannot be isolated the sandbox refuses to start, so these tests cannot run there
    (the refusal itself is still tested); PARSER_REQUIRE_EXTRAS=1 makes that a failure instead."""
    if request.node.originalname not in NEED_NO_ISOLATION and isolation_missing():
        if os.environ.get("PARSER_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"this machine cannot isolate the RLM REPL worker: {'; '.join(isolation_missing())}")
        pytest.skip(f"this machine cannot isolate the RLM REPL worker: {'; '.join(isolation_missing())}")


async def cells(context, *codes, llm=None, **options):
    async with await ReplSandbox.start(context, llm=llm or ScriptedLlm(), **options) as repl:
        return [await repl.run(code) for code in codes]


def test_yaml_is_the_dataclass_defaults():
    assert OmegaConf.to_container(OmegaConf.load(CONFIG)) == dataclasses.asdict(ReplLimits())


@pytest.mark.parametrize("field, value", [("cell_timeout_s", 0), ("cell_timeout_s", float("inf")),
                                          ("processes", 1), ("memory_bytes", True), ("output_chars", 1.5)])
def test_limits_out_of_domain_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"sandbox.{field}"):
        ReplLimits(**{field: value})


def test_variables_persist_and_are_listed_as_rlms_lists_them():
    first, second, third = run(cells("the document", "x = len(context)\nprint(x)", "y = x + 1\nprint(y, SHOW_VARS())",
                                     "import re\nz = re.findall('o', context)"))
    assert first.stdout == "12\n" and first.variables == ("answer", "context_0", "context", "x")
    # SHOW_VARS shows the names kept so far: rlms keeps a cell's new names only once it has finished
    assert second.stdout == "13 Available variables: {'f': 'TextIOWrapper', 'context_0': 'str', 'context': 'str', 'x': 'int'}\n"
    assert third.variables == ("answer", "context_0", "context", "x", "y", "z")  # the module `re` is not listed
    assert not any(cell.lost_state or cell.stderr for cell in (first, second, third))


def test_a_dict_context_is_loaded_as_rlms_loads_it():
    cell, = run(cells({"a": [1, 2], 3: "x"}, "print(context, json.dumps(context_0))"))
    assert cell.stdout == "{'a': [1, 2], '3': 'x'} {\"a\": [1, 2], \"3\": \"x\"}\n"  # json.load: str keys


def test_sub_calls_round_trip_and_a_failure_reaches_the_cell_as_its_error_string():
    llm = ScriptedLlm()
    cell, = run(cells("c", "a = llm_query('one')\nb = llm_query_batched(['two', 'fail three'], model='m')\n"
                           "c = rlm_query('four')\nprint(a, b, c, sep='|')", llm=llm))
    assert cell.stdout == "reply to one|['reply to two', 'Error: Request failed: fail three']|reply to four\n"
    assert llm.calls == [(["one"], None), (["two", "fail three"], "m"), (["four"], None)]
    assert cell.sub_calls == (SubCall(("one",), None, ("reply to one",)),
                              SubCall(("two", "fail three"), "m", ("reply to two", "Error: Request failed: fail three")),
                              SubCall(("four",), None, ("reply to four",)))


def test_an_exception_becomes_stderr_as_rlms_writes_it_and_the_cell_keeps_nothing():
    failing, after = run(cells("c", "import sys\nprint('out')\nprint('err', file=sys.stderr)\nlost = 1\n1/0",
                               "print('lost' in SHOW_VARS())"))
    assert (failing.stdout, failing.stderr) == ("out\n", "err\n\nZeroDivisionError: division by zero")
    assert after.stdout == "False\n"  # rlms keeps a failing cell's new names only when it finishes


@pytest.mark.parametrize("code", ["answer['content'] = 'Edda'\nanswer['ready'] = True",
                                  "answer = {'content': 'Edda', 'ready': True}"])
def test_answer_ready_is_the_final_answer(code):
    done, later = run(cells("c", code, "print(type(answer).__name__, answer['content'])"))
    assert done.final_answer == "Edda" and later.final_answer is None
    assert later.stdout == "_AnswerDict Edda\n"  # rlms' class name


def test_aclose_is_idempotent_and_a_closed_sandbox_refuses_cells():
    async def scenario():
        repl = await ReplSandbox.start("c", llm=ScriptedLlm())
        await repl.aclose()
        await repl.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await repl.run("1")

    run(scenario())


def test_a_cell_past_max_sub_calls_gets_error_strings_without_calling_llm():
    llm = ScriptedLlm()
    cell, = run(cells("c", "print(llm_query_batched(['a', 'b', 'c']), llm_query('d'))", llm=llm,
                      limits=ReplLimits(max_sub_calls_per_cell=2)))
    bound = "Error: this cell's sub-calls passed the sandbox's bound of 2 prompts"
    assert cell.stdout == f"['reply to a', 'reply to b', {bound!r}] {bound}\n"
    assert llm.calls == [(["a", "b"], None)]


# -- escapes: each blocked or bounded, the host unchanged ----------------------------------------------
SECRET = "sk-parser-fake-secret-5e2f"
SMALL = ReplLimits(cell_timeout_s=2.0, episode_cpu_s=30, memory_bytes=256 << 20, file_bytes=4 << 20, processes=8,
                   output_chars=1000, message_bytes=1 << 20)


def survivors(pid: int) -> list[int]:
    """Processes left of worker `pid`: in its process group, or running as its uid (one that left the
    group with setsid)."""
    left = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            status = pathlib.Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        group = int(stat.rsplit(")", 1)[1].split()[2])
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if group == pid or uid == WORKER_UID_BASE + pid:
            left.append(int(entry))
    return left


@pytest.fixture()
def escapes(monkeypatch, tmp_path):
    """Runs cells in one small-limits sandbox and checks the host after it closed: no process left, its
    directory gone, nothing written where the cells aimed, the host's cwd and environment as they were."""
    monkeypatch.setenv("PARSER_FAKE_API_KEY", SECRET)
    target = tmp_path / "written-from-the-repl"
    before = (os.getcwd(), {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"})

    def go(*codes, **options):
        async def scenario():
            repl = await ReplSandbox.start("the context", llm=ScriptedLlm(), limits=options.pop("limits", SMALL),
                                           **options)
            pids, directory, results = {repl.pid}, repl.directory, []  # every worker it had
            assert os.listdir(directory) == [".root"]  # its files live in its own tmpfs, not on the host
            for code in codes:
                results.append(await repl.run(code.replace("TARGET", str(target))))
                pids.add(repl.pid)
            pids.discard(None)  # no worker after the CPU budget is spent
            await repl.aclose()
            assert not os.path.exists(directory)
            return pids, results

        pids, results = run(scenario())
        assert [survivors(pid) for pid in pids] == [[] for _ in pids]
        assert not target.exists()
        assert (os.getcwd(), {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}) == before
        return results

    return go


def test_os_system_subprocess_and_a_subclasses_walk_reach_no_program(escapes):
    walk = ("w = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
            "print(w.__init__.__globals__['system']('touch TARGET'))")
    system, spawn, walked, loader = escapes(
        "import os\nprint(os.system('touch TARGET'))", "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'touch TARGET'])",
        walk, "import os\nos.execv('/lib64/ld-linux-x86-64.so.2', ['ld.so', '--version'])")
    assert system.stdout == walked.stdout == "32512\n"  # the forked shell could not exec: exit status 127
    assert spawn.stderr == "\nPermissionError: [Errno 1] Operation not permitted: '/bin/sh'"  # seccomp, before lookup
    assert loader.stderr == "\nPermissionError: [Errno 1] Operation not permitted"  # the loader is there, exec is not


def test_native_code_it_writes_cannot_be_loaded(escapes):
    import ctypes.util

    library = ctypes.util.find_library("m")
    if library is None:
        pytest.skip("no libm to copy")
    copied, = escapes(f"import ctypes, shutil\nshutil.copy('/lib/{os.uname().machine}-linux-gnu/{library}', 'mine.so')\n"
                      "ctypes.CDLL('/work/mine.so')")
    assert "failed to map segment from shared object" in copied.stderr  # its tmpfs is noexec


def test_no_network_loopback_or_outside(escapes):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with listener:
        loopback, outside, abstract = escapes(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)",
            "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=5)",
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0parser-repl-test')")
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
    assert "OSError: [Errno 101] Network is unreachable" in loopback.stderr
    assert "OSError: [Errno 101] Network is unreachable" in outside.stderr
    assert "ConnectionRefusedError" in abstract.stderr  # the abstract socket namespace is the netns's


def test_host_files_are_not_there_to_read_or_write(escapes):
    readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
    listing, project, shadow, write = escapes(
        "import os\nprint(sorted(os.listdir('/')), os.getcwd())",
        f"print(open({str(readme)!r}).read())", "print(open('/etc/shadow').read())",
        "import os\nos.makedirs(os.path.dirname('TARGET'), exist_ok=True)\nopen('TARGET', 'w').write('x')")
    assert listing.stdout == "['lib', 'lib64', 'root', 'tmp', 'usr', 'work'] /work\n"  # stdlib and libraries only
    assert "FileNotFoundError" in project.stderr and "FileNotFoundError" in shadow.stderr
    assert write.stderr == ""  # it wrote: into its own tmpfs (`escapes` checks the host's path stays absent)


def test_no_secret_in_the_environment_and_nothing_of_the_host_in_sight(escapes):
    env, host = escapes("import os\nprint(sorted(os.environ))", "import socket\nprint(socket.gethostname())")
    assert env.stdout == "['HOME', 'LC_CTYPE', 'TMPDIR']\n"  # built from nothing; LC_CTYPE is Python's own
    assert host.stdout == "repl\n"  # its own UTS namespace (and IPC, cgroup)


def test_ctypes_cannot_mount_chroot_or_change_user(escapes):
    calls, = escapes("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "print(libc.mount(b'none', b'/work', b'tmpfs', 0, None), libc.chroot(b'/tmp'), libc.setuid(0), "
                     "libc.umount2(b'/usr/lib', 2))")
    assert calls.stdout == "-1 -1 0 -1\n"  # setuid(0) is a no-op: it is already the namespace's powerless root


def test_fork_bombs_stop_at_the_process_limit_and_leave_nothing(escapes):
    _, bomb, after = escapes("kept = 1", "import os\nwhile True:\n    os.fork()", "print(kept)")
    assert bomb.stderr == "\nBlockingIOError: [Errno 11] Resource temporarily unavailable" and not bomb.lost_state
    assert after.stdout == "1\n"  # its forks left quietly; the REPL's state is intact


def test_detached_spinners_die_with_the_worker(escapes):
    detached, = escapes("import os\nfor _ in range(20):\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
                        "            while True: pass\n    except OSError: pass\nwhile True: pass",
                        limits=dataclasses.replace(SMALL, cell_timeout_s=1.0))
    assert detached.lost_state and "deadline of 1 s" in detached.stderr  # `escapes` finds none of them left


def test_a_memory_bomb_is_a_memory_error_and_the_state_survives(escapes):
    _, bomb, after = escapes("kept = 1", "y = bytearray(1 << 30)", "print(kept, len(context))")
    assert bomb.stderr == "\nMemoryError: " and after.stdout == "1 11\n"


def test_an_endless_cell_is_killed_at_its_deadline_and_a_new_worker_has_the_context(escapes):
    async def timed():
        async with await ReplSandbox.start("the context", llm=ScriptedLlm(),
                                           limits=dataclasses.replace(SMALL, cell_timeout_s=1.0)) as repl:
            await repl.run("kept = 1")
            started = time.monotonic()
            endless = await repl.run("while True: pass")
            return endless, time.monotonic() - started, await repl.run("print(context, 'kept' in SHOW_VARS())")

    endless, seconds, after = run(timed())
    assert endless.lost_state and endless.stderr == (
        "REPL worker lost: the cell ran past its deadline of 1 s and the worker was killed; its variables are gone "
        "(a new worker holds `context` again)")
    assert seconds < 1.0 + 2 * 2.0  # the deadline, then the kill and a new worker's start (2 s grace each)
    assert after.stdout == "the context False\n" and not after.lost_state


def test_cpu_burn_ends_the_episode_at_its_cpu_budget(escapes):
    burn, after = escapes("while True: pass", "print(1)",
                          limits=dataclasses.replace(SMALL, episode_cpu_s=1, cell_timeout_s=60.0))
    assert burn.lost_state and "the episode's CPU limit" in burn.stderr
    assert after.lost_state and after.stderr == "REPL worker lost: the episode's CPU budget of 1 s is spent, so no cell runs"


def test_huge_prints_are_cut_and_counted_and_a_flood_of_the_pipe_costs_the_worker(escapes):
    huge, flood, after = escapes(
        "import sys\nprint('x' * 10**6)\nsys.stderr.write('e' * 5000)",
        "import os\nfor fd in range(3, 12):\n    try: os.write(fd, b'x' * (3 << 20))\n    except OSError: pass",
        "print('fine')")
    assert (huge.stdout, huge.stdout_chars) == ("x" * 1000, 10**6 + 1)
    assert (huge.stderr, huge.stderr_chars) == ("e" * 1000, 5000)
    assert flood.lost_state and f"a message over {1 << 20} bytes" in flood.stderr
    assert after.stdout == "fine\n"


def test_an_oversized_sub_call_and_a_lone_surrogate_cost_nothing(escapes):
    oversized, surrogate = escapes("print(llm_query('x' * (2 << 20)))", "s = '\\ud800'\nprint(s)")
    assert oversized.stdout.startswith("Error: the sub-call's prompts are ") and not oversized.lost_state
    assert oversized.stdout.endswith(f"over the sandbox's bound of {1 << 20}\n") and not oversized.sub_calls
    assert surrogate.stdout == "\ud800\n" and surrogate.variables[-1] == "s"


def test_file_writes_are_bounded_per_file_and_in_total(escapes):
    big, many = escapes("open('big', 'wb').write(b'x' * (8 << 20))",
                        "for i in range(8):\n    open(f'part{i}', 'wb').write(b'x' * (1 << 20))")
    assert big.stderr == "\nOSError: [Errno 27] File too large"  # RLIMIT_FSIZE (file_bytes = 4 MiB)
    assert many.stderr == "\nOSError: [Errno 28] No space left on device"  # its tmpfs holds file_bytes in all


def test_a_cancelled_cell_kills_the_worker_before_the_cancellation_goes_on():
    async def scenario():
        started = asyncio.Event()

        async def llm(prompts, model):
            started.set()
            return ["go"]

        async with await ReplSandbox.start("the context", llm=llm, limits=SMALL) as repl:
            await repl.run("kept = 1")
            pid = repl.pid
            cell = asyncio.create_task(repl.run("llm_query('started')\nwhile True: pass"))
            await started.wait()
            cell.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cell
            left = survivors(pid)
            return left, await repl.run("print(len(context), 'kept' in SHOW_VARS())")

    left, after = run(scenario())
    assert left == []
    assert after.lost_state and after.stdout == "11 False\n" and after.stderr.startswith("REPL worker lost: a cell was cancelled")


def test_a_broken_llm_callback_raises_in_run_and_kills_the_worker():
    """The callback must never raise or return the wrong shape (the method's contract); if it does, `run`
    raises, no worker outlives it, and the next cell says the state is lost."""
    async def scenario():
        async def wrong(prompts, model):
            return ["one reply"] * (len(prompts) + 1)

        async with await ReplSandbox.start("c", llm=wrong, limits=SMALL) as repl:
            pid = repl.pid
            with pytest.raises(TypeError, match="must return a list of 1 str"):
                await repl.run("llm_query('q')")
            return survivors(pid), await repl.run("print(context)")

    left, after = run(scenario())
    assert left == [] and after.stdout == "c\n" and after.lost_state
    assert after.stderr.startswith("REPL worker lost: a cell was stopped by TypeError")


HOST = """
import asyncio, sys
from parser.engine.sandbox.repl import ReplSandbox
async def llm(prompts, model):
    print(REPL.pid, flush=True)  # the cell is running: the test may kill this host now
    return ["go"]
async def main():
    global REPL
    REPL = await ReplSandbox.start("c", llm=llm{options})
    print(REPL.missing, flush=True)
    print((await REPL.run("print(llm_query('x'))\\nwhile True: pass")).stdout, flush=True)
asyncio.run(main())
"""


def test_the_worker_dies_with_its_host(tmp_path):
    script = tmp_path / "host.py"
    script.write_text(HOST.format(options=""))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert host.stdout.readline() == "()\n"
        pid = int(host.stdout.readline())
        watcher = os.pidfd_open(pid)
        host.kill()
        assert select.select([watcher], [], [], 10)[0] == [watcher]  # the worker exited
        os.close(watcher)
    finally:
        host.kill()
        host.wait()


def test_without_namespaces_it_refuses_unless_allowed(tmp_path):
    """A user namespace whose max_user_namespaces is 0 stands in for a machine without them (on such a
    machine the host runs as it is)."""
    script = tmp_path / "host.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stand_in = not isolation_missing()
    if stand_in and shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")

    def host(options):
        script.write_text(HOST.format(options=options).replace("while True: pass", "print(2)"))
        argv = [sys.executable, str(script)]
        if stand_in:
            argv = ["unshare", "--user", "--map-root-user", "sh", "-c",
                    f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} {script}"]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    refused = host("")
    assert refused.returncode == 1 and "SandboxUnavailable: the RLM REPL sandbox cannot isolate its worker" in refused.stderr
    assert "sandbox.allow_unisolated" in refused.stderr
    allowed = host(", allow_unisolated=True")
    assert allowed.returncode == 0, allowed.stderr
    missing, pid, output = allowed.stdout.splitlines()[:3]
    assert missing != "()" and output == "go"
    if stand_in:
        assert "unshare(CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWPID|...)" in refused.stderr and "unshare(" in missing


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or SYSTEM_PYTHON is None,
                    reason="needs root (to become another user), setpriv and a python3 outside root's home")
def test_a_host_that_is_not_root_isolates_too():
    """Run as uid 65534 (the user namespace comes first there, and builds the file tree)."""
    script = (HOST.format(options="").replace("while True: pass", "import os\\nprint(sorted(os.listdir('/')))")
              .replace("import asyncio, sys", f"import asyncio, sys\nsys.path.insert(0, {str(ROOT)!r})"))
    host = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "env", "-i",
                           SYSTEM_PYTHON, "-I", "-c", script], capture_output=True, text=True, timeout=60, cwd="/")
    assert host.returncode == 0, host.stderr
    assert host.stdout.splitlines()[0] == "()" and host.stdout.splitlines()[2:4] == ["go", "['lib', 'lib64', 'tmp', 'usr', 'work']"]


# -- the namespace is rlms' LocalREPL's ------------------------------------------------------------------
RLMS_CELLS = [
    "x = 1\nprint(x, SHOW_VARS())", "print(SHOW_VARS())", "import sys\nprint('out')\nprint('err', file=sys.stderr)",
    "y = 2\n1/0", "print('y' in dir())", "try:\n    1/0\nexcept ZeroDivisionError:\n    pass",
    "def f():\n    return x\nprint(f())", "x = 5\nprint(f())", "del x\nprint(x)", "print(eval, exec, globals)",
    "context = 'changed'\nprint(context[:9])", "print(context[:9], context_0[:9])", "llm_query = 3",
    "print(llm_query('q'), llm_query_batched(['a', 'b']), rlm_query('c'))", "print(type(answer).__name__, answer)",
    "answer['ready'] = True", "answer['content'] = 'A'\nanswer['ready'] = True\nraise ValueError('late')",
    "answer = {'content': 'B', 'ready': True}", "answer = ['not a dict']", "print(answer)",
    "import json, re\nprint(json.dumps({'k': re.findall('o', 'foo')}))", "print(open)\nprint(__import__('math').pi)",
]


@pytest.mark.parametrize("context", ["a str context", {"k": [1, 2], "n": None}, ["x", "y"]], ids=["str", "dict", "list"])
def test_cells_give_what_rlms_local_repl_gives(context):
    """rlms 0.1.3's in-process LocalREPL (the reference: scripted cells, not model code) and the sandbox run
    the same cells: the same stdout, stderr, listed variables and final answer, cell by cell."""
    local_repl = pytest.importorskip("rlm.environments.local_repl")
    from rlm.utils.parsing import format_execution_result

    reference = local_repl.LocalREPL(context_payload=context)
    try:
        expected = []
        for code in RLMS_CELLS:
            result = reference.execute_code(code)
            expected.append((result.stdout, result.stderr, result.final_answer, format_execution_result(result)))
    finally:
        reference.cleanup()

    async def no_handler(prompts, model):  # what LocalREPL answers without an LM handler
        return ["Error: No LM handler configured"] * len(prompts)

    got = run(cells(context, *RLMS_CELLS, llm=no_handler))
    def listed(cell):  # rlms' formatting of the names the sandbox listed
        return format_execution_result(local_repl.REPLResult(stdout=cell.stdout, stderr=cell.stderr,
                                                             locals=dict.fromkeys(cell.variables, "")))

    assert [(c.stdout, c.stderr, c.final_answer, listed(c)) for c in got] == expected


def test_shared_slots_bound_the_workers_and_are_given_back():
    async def scenario():
        slots = ProcessSlots(1)
        first = await ReplSandbox.start("c", llm=ScriptedLlm(), slots=slots)
        held = slots().locked()
        second = asyncio.create_task(ReplSandbox.start("c", llm=ScriptedLlm(), slots=slots))  # waits for the slot
        await first.aclose()
        await first.aclose()  # gives its slot back once
        async with await second as repl:
            cell = await repl.run("print(context)")
        await slots().acquire()
        return held, cell.stdout, slots().locked()  # locked again after one acquire: one slot, not two

    assert run(scenario()) == (True, "c\n", True)
