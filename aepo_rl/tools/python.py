"""The ``python`` tool: model-written code in a sandboxed child process.

Each call runs ``python -I -u`` in a fresh process group, in a new empty temporary directory
(removed afterwards), with a minimal environment, rlimits on CPU seconds, address space, file
size and processes, a wall-clock timeout that kills the whole group, and output read up to a
cap. As in the release (docs/algorithm.md §1.1), a final expression statement is printed.

Isolation is probed once and the strongest working mode is used (``tool.isolation``); a weaker
mode logs a warning naming the protections it lacks:

- ``bubblewrap`` (``bwrap`` works; root or unprivileged user namespaces): new network, pid, ipc
  and mount namespaces with a private root in which only ``/usr``, ``/etc`` and the Python
  install are visible, all read-only; ``/tmp`` is a new tmpfs of ``write_mb`` MB — the working
  directory, ``HOME`` and ``TMPDIR`` — and ``/var/tmp`` and ``/dev/shm`` link to it, so nothing
  written outlives the call, the total written is capped, and no host unix socket (path or
  abstract) can be reached. Under root the code also runs as ``nobody``.
- ``namespaces`` (root with ``unshare``): new network, pid and mount namespaces; the code runs
  as ``nobody`` (``setpriv``), sees an empty ``/root`` except the Python install, and dies with
  its whole pid namespace when killed.
- ``nobody`` (root without namespaces): runs as ``nobody``; network blocked at Python level.
- ``user-namespace`` (not root): an unprivileged user namespace with no network and its own
  pid namespace; the code keeps the host user's file permissions.
- ``none``: same user, network blocked at Python level only (socket module patched) — it cannot
  stop determined code, so use a container or root for untrusted models.

Every mode but ``bubblewrap`` runs the code in a new temporary directory of the host (removed
afterwards) and shares the host's ``/tmp``, ``/var/tmp``, ``/dev/shm`` and unix sockets.
"""

from __future__ import annotations

import logging
import os
import pwd
import selectors
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from aepo_rl.tools.base import ToolError, argument_error, register_tool

log = logging.getLogger(__name__)

# Executed by the child interpreter before the model's code: limits, network block, last expression.
RUNNER = r"""
import ast, linecache, resource, sys, traceback
cpu, memory, file_size, processes, block_network = (int(a) for a in sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
if block_network:
    import _socket, socket
    class _NoNetwork(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the sandbox")
    socket.socket = _socket.socket = _NoNetwork
source = sys.stdin.read()
linecache.cache["<python>"] = (len(source), None, source.splitlines(True), "<python>")
try:
    tree = ast.parse(source, "<python>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(tree, "<python>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<python>", "eval"), namespace)
        if value is not None:
            print(value)
except SystemExit:
    raise
except BaseException as error:
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<python>":
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)
    sys.exit(1)
"""

ISOLATION_MODES = ("bubblewrap", "namespaces", "nobody", "user-namespace", "none")
_LOST = {  # what each fallback mode lacks compared with ``bubblewrap``, for the one-time warning
    "namespaces": "a private filesystem",
    "nobody": "a private filesystem, the network namespace (Python-level blocking only) and a private pid namespace",
    "user-namespace": "a private filesystem and the switch to 'nobody' (the code has your user's file permissions)",
    "none": "a private filesystem, the network namespace (Python-level blocking only), a private pid "
            "namespace and any user switch",
}
_PRIVATE_DIR = "/tmp"  # inside the bubblewrap view: the call's own tmpfs (also /var/tmp and /dev/shm)
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PROBED: dict[tuple, str] = {}
_PROBE_LOCK = threading.Lock()


@register_tool("python")
class PythonSandbox:
    """``<python>code</python>`` → the code's stdout and stderr (or an ``Error: …`` line).

    ``run`` never raises. A call fails — its text is a :class:`ToolError` — when the code did not
    run to its end: the argument is unusable, the sandbox could not run it, or the sandbox stopped
    it at the wall-clock or CPU limit or it was killed by a signal. Code that ran to its end is a
    result whatever it printed: a traceback or non-zero exit status of the model's own code, or
    output truncated at ``max_output_bytes``. At most ``pool_size`` calls run at once (others wait
    their turn). ``stats``: calls, errors (failed calls), timeouts, peak_concurrency. The defaults sit under the rollout's
    ``tool_timeout`` (10 s) and match its ``tool_workers`` (8), so the sandbox reports its own
    timeout before the rollout gives up on the call.
    """

    name = "python"
    tag = "python"
    argument = "code"
    usage = "runs Python"
    description = "Run Python code in a sandbox; prints its output and the value of a final expression."

    def __init__(self, timeout: float = 8.0, cpu_seconds: int | None = None, memory_mb: int = 512,
                 max_file_mb: int = 16, max_processes: int = 32, max_output_bytes: int = 8192,
                 max_code_chars: int = 100_000, pool_size: int = 8, user: str = "nobody",
                 isolation: str = "auto", write_mb: int = 64):
        if isolation != "auto" and isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be 'auto' or one of {ISOLATION_MODES}, got {isolation!r}")
        self.timeout = timeout
        self.cpu_seconds = cpu_seconds or max(1, int(timeout + 0.999))
        self.memory_bytes = memory_mb << 20
        self.file_bytes = max_file_mb << 20
        self.write_bytes = write_mb << 20
        self.max_processes = max_processes
        self.max_output_bytes = max_output_bytes
        self.max_code_chars = max_code_chars
        self.user = pwd.getpwnam(user)
        self.python = os.path.realpath(sys.executable)
        self.stats = {"calls": 0, "errors": 0, "timeouts": 0, "peak_concurrency": 0}
        self._pool = threading.BoundedSemaphore(pool_size)
        self._stats_lock = threading.Lock()
        self._running = 0
        self.isolation = isolation if isolation != "auto" else self._probe()

    def run(self, arg: str) -> str:
        problem = argument_error(arg, self.max_code_chars)
        if problem:
            self._count(errors=1)
            return problem
        with self._pool:
            with self._stats_lock:
                self._running += 1
                self.stats["peak_concurrency"] = max(self.stats["peak_concurrency"], self._running)
            try:
                return self._execute(arg, self.isolation, self.timeout)
            except Exception as err:  # never raise into the rollout
                self._count(errors=1)
                return ToolError(f"Error: the sandbox failed: {type(err).__name__}: {err}")
            finally:
                with self._stats_lock:
                    self._running -= 1

    # -- one call ------------------------------------------------------------------------------

    def _execute(self, code: str, mode: str, timeout: float) -> str:
        private = mode == "bubblewrap"  # the code's directory is a tmpfs of its own: nothing to clean
        workdir = _PRIVATE_DIR if private else tempfile.mkdtemp(prefix="aepo-python-")
        staging = "" if private else tempfile.mkdtemp(prefix="aepo-mounts-")  # root-only: bind mounts pass through it
        try:
            if self._drops_user(mode) and not private:
                os.chown(workdir, self.user.pw_uid, self.user.pw_gid)
            command = self._command(mode, workdir, staging)
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    cwd="/" if private else workdir, env=_minimal_env(workdir),
                                    start_new_session=True, close_fds=True)
            try:
                output, truncated, timed_out = self._collect(proc, code, timeout)
            finally:
                _kill_group(proc)
                proc.wait()
                proc.stdout.close()
        finally:
            if not private:
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.rmtree(staging, ignore_errors=True)
        signum = -proc.returncode if proc.returncode < 0 else 0
        if mode in ("bubblewrap", "namespaces") and proc.returncode > 128:  # their init reports 128 + signal
            signum = proc.returncode - 128
        return self._report(output, truncated, timed_out, proc.returncode, signum)

    def _command(self, mode: str, workdir: str, staging: str) -> list[str]:
        limits = [str(self.cpu_seconds), str(self.memory_bytes), str(self.file_bytes),
                  str(self._process_limit(mode)), str(int(mode in ("nobody", "none")))]
        python = [self.python, "-I", "-u", "-c", RUNNER, *limits]
        as_user = [_which("setpriv"), f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                   "--clear-groups", "--no-new-privs", "--"]
        if mode == "bubblewrap":
            return self._bubblewrap() + (as_user if self._drops_user(mode) else []) + python
        if mode == "namespaces":
            # sh stays pid 1 of the new pid namespace (the kernel shields a namespace's init from
            # signals such as SIGXCPU), so python runs as its child and sh reports 128 + signal.
            script = _expose_python_script(staging) + (
                # python runs as a waited-for background job with the original stdin/stdout, so
                # sh prints no "Killed" notice of its own
                f"cd {shlex.quote(workdir)}\nexec 3>&1 4<&0 >/dev/null 2>&1 </dev/null\n"
                f"{shlex.join(as_user + python)} >&3 2>&3 <&4 3>&- 4<&- &\nwait $!")
            return [_which("unshare"), "--net", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child",
                    "--", "/bin/sh", "-ec", script]
        if mode == "nobody":
            return as_user + python
        if mode == "user-namespace":
            return [_which("unshare"), "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--", *python]
        return python

    def _bubblewrap(self) -> list[str]:
        """``bwrap`` arguments up to ``--``: new namespaces (a user namespace unless root) and a
        private root holding read-only ``/usr``, ``/etc`` and the Python install, the basic
        devices, a fresh ``/proc`` and one ``write_mb`` tmpfs at ``/tmp`` that ``/var/tmp`` and
        ``/dev/shm`` link to; everything else of the root is read-only."""
        args = [_which("bwrap"), "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent"]
        if os.geteuid() != 0:
            args.append("--unshare-user")
        for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):  # merged-/usr links or directories
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for root in _outermost(_python_install_roots(self.python)):
            if not any(root == top or root.startswith(top + os.sep) for top in ("/usr", "/etc")):
                for ancestor in reversed(Path(root).parents[:-1]):  # traversable, unlike e.g. /root
                    args += ["--perms", "0755", "--dir", str(ancestor)]
                args += ["--ro-bind", root, root]
        args += ["--proc", "/proc", "--perms", "0755", "--dir", "/dev"]
        for device in _DEVICES:
            args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            args += ["--symlink", target, f"/dev/{name}"]
        return args + ["--size", str(self.write_bytes), "--perms", "1777", "--tmpfs", _PRIVATE_DIR,
                       "--perms", "0755", "--dir", "/var", "--symlink", _PRIVATE_DIR, "/var/tmp",
                       "--symlink", _PRIVATE_DIR, "/dev/shm", "--remount-ro", "/", "--chdir", _PRIVATE_DIR, "--"]

    def _drops_user(self, mode: str) -> bool:
        """Whether the code runs as ``self.user`` (only root can switch)."""
        return mode in ("namespaces", "nobody") or (mode == "bubblewrap" and os.geteuid() == 0)

    def _process_limit(self, mode: str) -> int:
        """RLIMIT_NPROC counts every process of the real user: ``nobody`` starts near zero,
        the host user already owns some."""
        if self._drops_user(mode):
            return self.max_processes
        return _tasks_of_user(os.getuid()) + self.max_processes

    def _collect(self, proc: subprocess.Popen, code: str, timeout: float) -> tuple[bytes, bool, bool]:
        """Feed the code, read output until EOF, the byte cap or the deadline; wait for exit."""
        deadline = time.monotonic() + timeout
        threading.Thread(target=_feed, args=(proc.stdin, code.encode()), daemon=True).start()
        chunks, size = [], 0
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return b"".join(chunks), False, True
                if not selector.select(remaining):
                    continue
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
                if size > self.max_output_bytes:
                    return b"".join(chunks)[: self.max_output_bytes], True, False
        return b"".join(chunks), False, not _wait_until(proc, deadline)

    def _report(self, output: bytes, truncated: bool, timed_out: bool, returncode: int, signum: int) -> str:
        """The call's text: the output and a note on how it ended; a :class:`ToolError` when the
        sandbox stopped the code (timeout, CPU limit) or a signal killed it."""
        text = output.decode("utf-8", errors="replace").rstrip()
        note, failed = "", False
        if truncated:
            note = f"[output truncated at {self.max_output_bytes} bytes; the process was stopped]"
        elif timed_out:
            note, failed = f"Error: timed out after {self.timeout:g} s; the process group was killed.", True
        elif signum:
            note, failed = _signal_message(signum, self.cpu_seconds), True
        self._count(errors=int(failed), timeouts=int(timed_out))
        text = "\n".join([text, note]).strip()
        text = text or ("(no output)" if returncode == 0 else f"(no output; exit status {returncode})")
        return ToolError(text) if failed else text

    def _count(self, errors: int = 0, timeouts: int = 0) -> None:
        with self._stats_lock:
            self.stats["calls"] += 1
            self.stats["errors"] += errors
            self.stats["timeouts"] += timeouts

    def _probe(self) -> str:
        """The strongest isolation mode that runs ``print(6 * 7)`` on this host (cached)."""
        key = (os.geteuid(), self.user.pw_uid, self.python)
        with _PROBE_LOCK:
            if key not in _PROBED:
                _PROBED[key] = mode = next(mode for mode in _candidate_modes() if self._works(mode))
                if mode == "bubblewrap":
                    log.info("python sandbox: isolation 'bubblewrap' (private filesystem, no network)")
                else:
                    log.warning("python sandbox: bubblewrap is missing or does not work here (install the "
                                "'bubblewrap' package); isolation '%s' lacks %s: the code can reach host unix "
                                "sockets, and what it writes to /tmp, /var/tmp and /dev/shm outlives the call "
                                "(each file capped, the total not)", mode, _LOST[mode])
        return _PROBED[key]

    def _works(self, mode: str) -> bool:
        if mode == "none":
            return True
        try:
            works = self._execute("6 * 7", mode, timeout=30.0) == "42"
        except OSError:
            works = False
        self.stats.update(calls=0, errors=0, timeouts=0)
        return works


def _candidate_modes() -> list[str]:
    have = {tool: shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin") for tool in ("bwrap", "unshare", "setpriv", "mount")}
    if os.geteuid() == 0:
        modes = (["bubblewrap"] if have["bwrap"] and have["setpriv"] else []) + (
            ["namespaces"] if have["unshare"] and have["setpriv"] and have["mount"] else [])
        return modes + (["nobody"] if have["setpriv"] else []) + ["none"]
    return (["bubblewrap"] if have["bwrap"] else []) + (["user-namespace"] if have["unshare"] else []) + ["none"]


def _which(tool: str) -> str:
    path = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise FileNotFoundError(f"{tool} not found")
    return path


def _expose_python_script(staging: str) -> str:
    """Shell lines that hide every non-world-traversable ancestor of the Python install (e.g.
    ``/root``) under an empty tmpfs and bind the install back, so ``nobody`` can run Python but
    cannot see the rest of that folder (caches, credentials)."""
    lines, count = [], 0
    for blocker, paths in _blocked_python_paths().items():
        stages = [f"{staging}/{count + i}" for i in range(len(paths))]
        count += len(paths)
        for path, stage in zip(paths, stages):
            lines += [f"mkdir {shlex.quote(stage)}", f"mount --rbind {shlex.quote(path)} {shlex.quote(stage)}"]
        lines.append(f"mount -t tmpfs -o mode=0755,size=1m aepo-sandbox {shlex.quote(blocker)}")
        for path, stage in zip(paths, stages):
            lines += [f"mkdir -p {shlex.quote(path)}", f"mount --move {shlex.quote(stage)} {shlex.quote(path)}"]
    return "".join(line + "\n" for line in lines)


def _blocked_python_paths() -> dict[str, list[str]]:
    """{shallowest ancestor others cannot traverse: [import roots under it]}."""
    roots = _outermost([sys.base_prefix, sys.prefix, *sys.path])
    blocked: dict[str, list[str]] = {}
    for root in roots:
        for ancestor in reversed(Path(root).parents):
            if ancestor != Path("/") and not os.stat(ancestor).st_mode & 0o001:
                blocked.setdefault(str(ancestor), []).append(root)
                break
    return blocked


def _python_install_roots(python: str) -> list[str]:
    """Where the interpreter and its imports live: the executable's folder, the (virtual
    environment's and base) prefixes and the site-packages folders — not the host's other
    ``sys.path`` entries such as the current project."""
    return [os.path.dirname(python), sys.base_prefix, sys.prefix, *site.getsitepackages()]


def _outermost(paths: list[str]) -> list[str]:
    """The existing directories among ``paths`` (resolved), without those inside another one."""
    roots = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}
    return sorted(r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots))


def _minimal_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except OSError:  # the child exited before reading all of its code
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _wait_until(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for the child to exit WITHOUT reaping it (so its group id cannot be reused before
    ``_kill_group``); False when the deadline passes first."""
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.005)
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_message(signum: int, cpu_seconds: int) -> str:
    if signum == signal.SIGXCPU:
        return f"Error: CPU time limit of {cpu_seconds} s exceeded."
    return f"Error: the process was killed by {signal.Signals(signum).name}."


def _tasks_of_user(uid: int) -> int:
    """Threads and processes owned by ``uid`` (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count
