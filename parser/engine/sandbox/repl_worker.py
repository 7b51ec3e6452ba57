"""The RLM REPL's child process: isolates itself, then runs model-written cells in one persistent namespace.

Why a standalone file: this is the only code that shares a process with model-written code, so it imports
nothing of the project (the host starts it by path, `python -I -S -X utf8 repl_worker.py SETTINGS`, behind
`parser.engine.sandbox.process`'s limits shim) and trusts nothing it gets back from that code.

Isolation, before any message is read (Linux; each step that fails is named in the `ready` message, and
without `allow_unisolated` the worker exits there and the host refuses to start):
  1. as root, drop to a uid of its own (WORKER_UID_BASE + its pid), so every host file is "other" to it
     and RLIMIT_NPROC holds (set once inside the user namespace, it counts only that namespace's processes);
  2. `unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID)` and IPC, UTS, cgroup: a network
     namespace with a down loopback and nothing else; a pid namespace whose init is the REPL (when it
     dies, the kernel kills every process it started, however they detached); a mount namespace in which
  3. a size-bounded, noexec tmpfs becomes the root, with only the interpreter's standard library and the
     shared libraries bind-mounted read-only (no /bin, /etc, /proc, /home, project files), then
     `pivot_root` and a detached old root: there is nothing of the host's file tree left to reach;
  4. every capability dropped (bounding set too) and `no_new_privs`, so the namespace's root cannot
     remount, unmount or chroot its way out;
  5. a seccomp filter that refuses execve/execveat: no program runs at all; then death with its parent.

Protocol (one JSON object per line; fds 0 and 1 are moved to private fds and replaced by /dev/null so a
stray C-level print cannot corrupt it): the host sends `{"context": ...}` once, then `{"run": code}`;
the worker answers `{"done": {...}}` (after `{"init": pid}` from the process that waits for it, and
`{"ready": ...}`, `{"loaded": ...}`), and while a cell runs it may ask `{"llm": {"prompts", "model"}}`
and waits for `{"replies": [...]}`.

The namespace mirrors rlms 0.1.3's LocalREPL (rlm/environments/local_repl.py): its builtins, `answer`
(a dict whose `ready` flip captures the answer, re-wrapped when rebound), `context`/`context_0` loaded by
the same statements (so `f`, and `json` for a list/dict context, are REPL names as there), each cell
exec'd in a merged copy of globals and locals of which only new public names are kept, and an exception
appended to stderr as "\\n{type}: {message}".
"""
import builtins
import ctypes
import io
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x20000000, 0x10000000, 0x40000000
CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x02000000, 0x04000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 22, 38
SECCOMP_MODE_FILTER = 2
# What the interpreter's extension modules link (the multiarch directory, not all of /usr/lib with its
# hundreds of programs); /lib and /lib64 are links into /usr on merged-/usr systems, and are kept so.
_MULTIARCH = f"/usr/lib/{os.uname().machine}-linux-gnu"
SYSTEM_LIBRARIES = (_MULTIARCH if os.path.isdir(_MULTIARCH) else "/usr/lib", "/usr/lib64", "/lib", "/lib64")
# execve/execveat per architecture: (AUDIT_ARCH_*, execve, execveat)
EXEC_SYSCALLS = {"x86_64": (0xC000003E, 59, 322), "aarch64": (0xC00000B7, 221, 281)}
ROOT_MOUNT_POINT = ".root"  # inside the host's temporary directory: where the tmpfs root is mounted

# rlms' _SAFE_BUILTINS: these names are the real builtins; these others are None (blocked there too).
SAFE_BUILTINS = (
    "print len str int float list dict set tuple bool type isinstance issubclass enumerate zip map filter sorted "
    "reversed range min max sum abs round any all pow divmod chr ord hex bin oct repr ascii format hash id iter "
    "next slice callable hasattr getattr setattr delattr dir vars bytes bytearray memoryview complex object super "
    "property staticmethod classmethod __import__ open Exception BaseException ValueError TypeError KeyError "
    "IndexError AttributeError FileNotFoundError OSError IOError RuntimeError NameError ImportError StopIteration "
    "AssertionError NotImplementedError ArithmeticError LookupError Warning"
).split()
BLOCKED_BUILTINS = ("input", "eval", "exec", "compile", "globals", "locals")
SIMPLE_TYPES = (str, int, float, bool, list, dict, tuple)  # rlms' format_execution_result lists these


# ---------------------------------------------------------------------------------------------- isolation
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _drop_user(libc, uid: int) -> None:
    """Step 1 (as root only): become `uid`, a user that owns nothing on the host."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # or /proc/self is root's


def _enter_namespaces(libc, flags: int, proc_self: int) -> None:
    """Step 2: root of fresh namespaces (`flags`), mapped to the outer uid; `proc_self` is /proc/self
    opened before the file tree changed."""
    outer_uid, outer_gid = os.geteuid(), os.getegid()
    _check(libc.unshare(flags), "unshare(CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWPID|...) (user namespaces disabled? "
                                "sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {outer_uid} 1"), ("gid_map", f"0 {outer_gid} 1")):
        fd = os.open(name, os.O_WRONLY, dir_fd=proc_self)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _new_root(libc, mount_point: str, tmpfs_bytes: int, owner: int) -> None:
    """Step 3, in a mount namespace this process may change: a tmpfs root holding /work (the cwd, owned
    by `owner`), /tmp and read-only binds of the stdlib and system libraries; pivot into it."""
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount(/, MS_PRIVATE)")
    _check(libc.mount(b"tmpfs", mount_point.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      f"size={max(tmpfs_bytes, 1 << 20)},mode=0755".encode()), "mount(tmpfs root)")
    for path in (*SYSTEM_LIBRARIES, os.path.dirname(os.__file__)):
        target = mount_point + path
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib, recreated as it is
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
            _check(libc.mount(path.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            _check(libc.mount(None, target.encode(), None,
                              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None), f"read-only {path}")
    for name, mode in (("work", 0o700), ("tmp", 0o1777), (".old", 0o700)):
        os.mkdir(f"{mount_point}/{name}", mode)
    os.chmod(f"{mount_point}/tmp", 0o1777)
    os.chown(f"{mount_point}/work", owner, owner)
    _check(libc.syscall(155, mount_point.encode(), f"{mount_point}/.old".encode()), "pivot_root")  # SYS_pivot_root
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount(old root)")
    os.rmdir("/.old")
    os.chdir("/work")


def _drop_capabilities(libc) -> None:
    """Step 4: no capability left in the namespace, none to regain by exec."""
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            _check(-1, f"prctl(PR_CAPBSET_DROP, {cap})")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, all zero
    _check(libc.capset(ctypes.byref(header), data), "capset")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _forbid_exec(libc) -> None:
    """Step 5: a seccomp filter that fails execve/execveat with EPERM (and every syscall of another ABI:
    x32 numbers, 32-bit calls), so no program runs: not the helpers among the system libraries, not the
    loader, not a binary the code wrote (its tmpfs is noexec as well)."""
    machine = os.uname().machine
    if machine not in EXEC_SYSCALLS:
        raise OSError(0, f"a seccomp filter for {machine} (known: {', '.join(EXEC_SYSCALLS)})")
    arch, execve, execveat = EXEC_SYSCALLS[machine]
    load, equal, at_least, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    program = [(load, 0, 0, 4), (equal, 0, 5, arch), (load, 0, 0, 0), (at_least, 3, 0, 0x40000000),
               (equal, 2, 0, execve), (equal, 1, 0, execveat), (ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050001)]
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_SockFprog(len(program), filters)), 0, 0),
           "prctl(PR_SET_SECCOMP)")


def _die_with(libc, parent: int) -> None:
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # a credential change clears it
    if os.getppid() not in (parent, 0):  # 0: the pid namespace's init, whose parent is outside it
        os._exit(137)


def _become_init(libc, parent: int, channel: "Channel") -> None:
    """Fork into the new pid namespace: the child (its init) runs the REPL; this process tells the host
    the child's pid (the host kills the REPL by it, so that this process reaps it: killed together, the
    child would linger as a zombie of the host's init), then waits and exits as the child did."""
    told_read, told_write = os.pipe()
    child = os.fork()
    if child:
        os.close(told_read)
        _die_with(libc, parent)
        channel.send({"init": child})
        os.close(told_write)  # the child speaks only after this line
        _, status, usage = os.wait4(child, 0)
        if os.WIFEXITED(status):
            os._exit(os.WEXITSTATUS(status))
        # A namespace's init ignores SIGXCPU, so the CPU limit kills with SIGKILL a second later: say which
        cpu_limit = resource.getrlimit(resource.RLIMIT_CPU)[0]
        spent = usage.ru_utime + usage.ru_stime >= cpu_limit > 0
        os._exit(128 + (signal.SIGXCPU if spent else os.WTERMSIG(status)))
    os.close(told_write)
    os.read(told_read, 1)
    os.close(told_read)


def _give(directory: str, uid: int) -> bool:
    """Make `uid` own the cwd (used if the file tree cannot be built); False where `uid` does not exist
    (root of a user namespace that maps no other uid)."""
    try:
        os.chown(directory, uid, uid)
    except OSError:
        return False
    return True


def isolate(settings: dict, channel: "Channel") -> list[str]:
    """Steps 1-5; returns what could not be done (empty: fully isolated). Nothing here runs model code.
    As root the file tree is built first, with root's rights (the interpreter may live under a home only
    root can enter), and the user namespace comes after the uid drop; otherwise the user namespace
    comes first and gives the rights to build it."""
    if not sys.platform.startswith("linux"):
        return [f"Linux namespaces (this is {sys.platform})"]
    libc = ctypes.CDLL(None, use_errno=True)
    mount_point = os.path.join(settings["directory"], ROOT_MOUNT_POINT)
    # and the host's SysV IPC and message queues, its hostname and cgroup paths out of sight
    namespaces = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    missing: list[str] = []
    proc_self = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    try:
        uid = settings["uid_base"] + os.getpid()
        if os.geteuid() == 0 and _give(settings["directory"], uid):  # root that can name other uids
            try:
                _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
                _new_root(libc, mount_point, settings["file_bytes"], uid)
            except OSError as error:
                missing.append(f"a private file tree: {error}")
            _drop_user(libc, uid)
            _enter_namespaces(libc, namespaces, proc_self)
        else:
            _enter_namespaces(libc, namespaces | CLONE_NEWNS, proc_self)
            try:
                _new_root(libc, mount_point, settings["file_bytes"], 0)
            except OSError as error:
                missing.append(f"a private file tree: {error}")
    except OSError as error:
        missing.append(str(error))
    else:
        _become_init(libc, settings["parent"], channel)
        try:
            _check(libc.sethostname(b"repl", 4), "sethostname")
            _drop_capabilities(libc)
        except OSError as error:
            missing.append(f"dropping capabilities: {error}")
    finally:
        os.close(proc_self)  # a directory fd of the host's /proc would lead back out of the new root
    try:
        _forbid_exec(libc)
    except OSError as error:
        missing.append(f"no exec: {error}")
    # Set inside the new user namespace, the limit counts that namespace's processes only (the kernel
    # checks the outer levels against the limit the namespace was created under): a host user's own
    # processes do not use up the worker's.
    resource.setrlimit(resource.RLIMIT_NPROC, (settings["processes"], settings["processes"]))
    _die_with(libc, settings["parent"])
    os.environ.update(HOME=os.getcwd(), TMPDIR="/tmp" if not missing else os.getcwd())
    return missing


# ----------------------------------------------------------------------------------------------- the REPL
class Capture(io.TextIOBase):
    """sys.stdout/stderr during a cell: keeps the first `keep` characters, counts them all (a huge print
    costs the worker its own memory, never the pipe's or the host's)."""

    def __init__(self, keep: int):
        self.keep, self.total, self.parts, self.kept = keep, 0, [], 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if self.kept < self.keep:
            piece = text[: self.keep - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


class _AnswerDict(dict):
    """rlms' _AnswerDict: a plain dict to the model; setting a truthy `ready` reports `content`."""

    def __init__(self, on_ready):
        super().__init__()
        super().__setitem__("content", "")
        super().__setitem__("ready", False)
        self._on_ready = on_ready

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "ready" and value and self._on_ready is not None:
            try:
                self._on_ready(self.get("content", ""))
            except Exception:
                pass


class Repl:
    """One persistent namespace; `llm` is the channel's sub-call (prompts, model) -> replies."""

    def __init__(self, llm, keep: int):
        self._llm, self.keep = llm, keep
        namespace = {name: getattr(builtins, name) for name in SAFE_BUILTINS}
        namespace.update(dict.fromkeys(BLOCKED_BUILTINS))
        self.globals = {"__builtins__": namespace, "__name__": "__main__", "SHOW_VARS": self.show_vars,
                        "llm_query": self.llm_query, "llm_query_batched": self.llm_query_batched,
                        "rlm_query": self.llm_query, "rlm_query_batched": self.llm_query_batched}
        self.locals: dict = {"answer": _AnswerDict(self._capture)}
        self.final: str | None = None
        self.pid = os.getpid()

    def _capture(self, content) -> None:
        self.final = str(content)

    def show_vars(self) -> str:
        available = {k: type(v).__name__ for k, v in self.locals.items() if not k.startswith("_") and k != "answer"}
        if not available:
            return "No variables created yet. Use ```repl``` blocks to create variables."
        return f"Available variables: {available}"

    def llm_query(self, prompt, model=None):
        return self.llm_query_batched([prompt], model)[0]

    def llm_query_batched(self, prompts, model=None):
        """At depth 1 rlm_query(_batched) are these too, as in rlms. Never raises on a failed call: the
        failure is the reply ("Error: ..."), as rlms returns it."""
        prompts = list(prompts)
        replies = [None if isinstance(p, str) else f"Error: Invalid prompt type: {type(p)}" for p in prompts]
        asked = [p for p in prompts if isinstance(p, str)]
        if model is not None and not isinstance(model, str):
            return [f"Error: Invalid model name: {model!r}"] * len(prompts)
        if asked:
            answers = iter(self._llm(asked, model))
            replies = [next(answers) if reply is None else reply for reply in replies]
        return replies

    def _restore_scaffold(self) -> None:
        current = self.locals.get("answer")
        if not isinstance(current, _AnswerDict):  # rebound: take a ready plain dict's answer, wrap it again
            replacement = _AnswerDict(self._capture)
            if isinstance(current, dict):
                for key, value in current.items():
                    dict.__setitem__(replacement, key, value)
                if current.get("ready") and self.final is None:
                    self.final = str(current.get("content", ""))
            self.locals["answer"] = replacement
        if "context_0" in self.locals:
            self.locals["context"] = self.locals["context_0"]

    def execute(self, code: str, hidden: dict | None = None) -> dict:
        self.final = None
        out, err = Capture(self.keep), Capture(self.keep)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        error = ""
        try:
            combined = {**self.globals, **self.locals, **(hidden or {})}
            exec(code, combined, combined)
            for key, value in combined.items():
                if isinstance(key, str) and key not in self.globals and not key.startswith("_"):
                    self.locals[key] = value
            self._restore_scaffold()
        except BaseException as exc:  # rlms catches Exception; SystemExit there ended the host (docs/security.md)
            try:
                error = f"\n{type(exc).__name__}: {exc}"
            except BaseException:
                error = f"\n{type(exc).__name__}: <unprintable>"
        finally:
            sys.stdout, sys.stderr = saved
        if os.getpid() != self.pid:  # a process the cell forked: it must never speak for the REPL
            os._exit(0)
        stderr = (err.getvalue() + error[: self.keep])[: self.keep]
        return {"stdout": out.getvalue(), "stdout_chars": out.total, "stderr": stderr,
                "stderr_chars": err.total + len(error), "variables": self.variables(), "final_answer": self.final}

    def variables(self) -> list[str]:
        names = []
        for key, value in self.locals.items():
            try:
                if not key.startswith("_") and isinstance(value, SIMPLE_TYPES):
                    names.append(key)
            except Exception:
                continue
        return names

    def load_context(self, context) -> None:
        """rlms' add_context statements, reading from the pipe's copy instead of a file in the cwd."""
        if isinstance(context, str):
            data, code = context, "with _context_file as f:\n    context_0 = f.read()"
        else:
            data, code = json.dumps(context), "import json\nwith _context_file as f:\n    context_0 = json.load(f)"
        source = io.TextIOWrapper(io.BytesIO(data.encode("utf-8", "surrogatepass")), encoding="utf-8",
                                  errors="surrogatepass")
        self.execute(code, {"_context_file": source})
        self.execute("context = context_0")


# --------------------------------------------------------------------------------------------------- main
class Channel:
    """The pipe to the host. Lines are ASCII JSON (a lone surrogate a cell printed travels escaped)."""

    def __init__(self, reader, writer, max_message_bytes: int):
        self.reader, self.writer, self.max_message_bytes = reader, writer, max_message_bytes

    def send(self, message: dict) -> None:
        self.writer.write(json.dumps(message).encode("ascii") + b"\n")
        self.writer.flush()

    def receive(self) -> dict:
        line = self.reader.readline()
        if not line:
            os._exit(0)  # the host closed the pipe (closed the sandbox, or died)
        return json.loads(line.decode("utf-8", "surrogatepass"))

    def llm(self, prompts: list[str], model) -> list[str]:
        line = json.dumps({"llm": {"prompts": prompts, "model": model}}).encode("ascii") + b"\n"
        if len(line) > self.max_message_bytes:  # the host would take it for a flood and kill the worker
            return [f"Error: the sub-call's prompts are {len(line)} bytes as sent, over the sandbox's bound of "
                    f"{self.max_message_bytes}"] * len(prompts)
        self.writer.write(line)
        self.writer.flush()
        replies = self.receive().get("replies")
        return [r if isinstance(r, str) else "Error: no reply" for r in replies][: len(prompts)]


def main() -> None:
    settings = json.loads(sys.argv[1])
    reader, writer = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    channel = Channel(reader, writer, settings["message_bytes"])
    missing = isolate(settings, channel)
    channel.send({"ready": {"missing": missing}})
    if missing and not settings["allow_unisolated"]:
        os._exit(3)
    # At the CPU limit: exit now, saying why (a namespace's init would ignore SIGXCPU; SIGKILL comes 1 s later)
    signal.signal(signal.SIGXCPU, lambda *_: os._exit(128 + signal.SIGXCPU))
    repl = Repl(channel.llm, settings["output_chars"])
    repl.load_context(channel.receive()["context"])
    channel.send({"loaded": {"variables": repl.variables()}})
    while True:
        code = channel.receive()["run"]
        done = repl.execute(code)
        while True:  # reap what the cell's processes left (this is their namespace's init)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        channel.send({"done": done})


if __name__ == "__main__":
    main()
