"""The ``python`` tool: model-written code in a sandboxed child process.

Each call runs ``python -I -u`` in a fresh session, with a minimal environment, rlimits on
CPU seconds, address space, file size and processes, a wall-clock timeout that kills every
process of the call, and output read up to a cap. As in the release (docs/algorithm.md §1.1), a
final expression statement is printed.

The isolation asked for (``isolation``, the config's ``rollout.sandbox_isolation``) is probed once
per process; ``auto`` takes the strongest mode with a private root that works (``tool.isolation``)
and, where none does, refuses to start with :class:`SandboxUnavailable`. The first three build
the same private root (``_root_layout``) in new network, pid, ipc, uts and mount namespaces: only the system's
runtime (``/usr``, the ``/bin`` and ``/lib`` links, a few files of ``/etc``) and the Python install are visible,
read-only; ``/tmp`` is a new tmpfs of ``write_mb`` MB — the working directory, ``HOME`` and ``TMPDIR`` — that
``/var/tmp`` and ``/dev/shm`` link to. So nothing written outlives the call, the total written is capped, no
host file outside that runtime can be read, and no host unix socket (path or abstract) can be reached.

- ``bubblewrap``: ``bwrap`` builds the root; under root the code runs as ``nobody``.
- ``namespaces`` (root with ``unshare``, no bubblewrap): ``JAIL`` builds the root with mount
  calls and a move of it over ``/``, then runs the code as ``nobody`` with no new privileges.
- ``user-namespace`` (not root, no bubblewrap, unprivileged user namespaces): ``JAIL`` in a user
  namespace; the code keeps the host user's identity (uid 0 there, without any capability), but
  sees only the private root.
- ``nobody`` (root: the code runs as ``nobody``) and ``none``: no private root, used only when
  named. ``GUARD`` hardens them where the kernel allows: the
  code runs under a supervisor that is a child subreaper and kills every process the call left
  (``setsid`` daemons included) when the code ends or times out; Landlock confines reads to the
  same runtime as the private root, writes to the call's own directory (removed afterwards) and,
  from Landlock ABI 6, signals and abstract unix sockets to the call itself; a seccomp filter
  refuses ``socket``, System V IPC, io_uring, ``ptrace`` and ``clone(CLONE_PARENT)`` / ``clone3``.
  What each still lacks on this machine is in the warning at start (``weak_mode_gaps``) and
  docs/tools.md.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from aepo_rl.errors import UserError
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

# What JAIL and GUARD start with: libc, and ``check`` of a C call's result (-1 raises with errno).
PRELUDE = r"""
import ast, ctypes, os, signal, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def check(result, what):
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"sandbox: {what}: {os.strerror(number)}")
    return result
"""

# How JAIL's and GUARD's code process becomes the code's: as root (the host's, or of a user
# namespace) it drops every capability from its bounding set so none can come back, not even
# through execve as root; it switches to the given user (if any: "uid:gid"), keeps no capability
# (in a user namespace, or in mode ``none`` as root, the code stays uid 0 without any) and
# forbids new privileges (setuid programs cannot raise them).
BECOME_USER = r"""
if os.geteuid() == 0:
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for cap in range(int(last.read()) + 1):
            check(libc.prctl(24, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")
check(libc.prctl(47, 4, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
if user:
    uid, gid = (int(x) for x in user.split(":"))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
check(libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()), "capset")  # version 3, none
check(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
"""

# Put before RUNNER by the modes that build their own root (``namespaces``, ``user-namespace``):
# run as root of new mount, pid, network, ipc and uts namespaces, it mounts the layout of
# ``_root_layout`` on a tmpfs, makes that the root (the host's is covered and out of reach), and
# forks: it stays pid 1 (the kernel shields a namespace's init from signals such as SIGXCPU, so
# the code runs as its child) and exits 128 + signal when the code is killed; the child becomes
# the code's user (BECOME_USER), adds site-packages (``-S`` left them out, so their ``.pth`` files
# do not run as root) and goes on with RUNNER.
JAIL = PRELUDE + r"""
layout, root, user = ast.literal_eval(sys.argv[1]), sys.argv[2], sys.argv[3]
del sys.argv[1:4]
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, MOVE, REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
KEPT = {os.ST_NOSUID: NOSUID, os.ST_NODEV: NODEV, os.ST_NOEXEC: NOEXEC, os.ST_NOATIME: 1024,
        os.ST_NODIRATIME: 2048, os.ST_RELATIME: 1 << 21}  # a bind mount's flags a user namespace must keep
def mount(source, target, kind, flags, data=None):
    if libc.mount(source and source.encode(), target.encode(), kind and kind.encode(), flags, data and data.encode()):
        number = ctypes.get_errno()
        raise OSError(number, f"sandbox: mount {source} on {target}: {os.strerror(number)}")
binds = []  # (target, flags): made read-only (or nosuid for devices) once all are mounted
def bind(source, target, flags):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    mount(source, target, None, BIND | REC)  # with the mounts below it, which a user namespace may not split off
    binds.append((target, flags))
os.umask(0o022)
mount("aepo-sandbox", root, "tmpfs", NOSUID | NODEV, "mode=0755,size=1m")
for kind, path, *extra in layout:
    target = root + path
    if kind == "dir":
        os.makedirs(target, exist_ok=True)
    elif kind == "symlink":
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(extra[0], target)
    elif kind == "ro-bind":
        bind(path, target, RDONLY | NOSUID | NODEV)
    elif kind == "dev-bind":
        bind(path, target, NOSUID | NOEXEC)
    elif kind == "proc":
        os.makedirs(target, exist_ok=True)
        mount("proc", target, "proc", NOSUID | NODEV | NOEXEC)
    elif kind == "tmpfs":
        os.makedirs(target, exist_ok=True)
        mount("aepo-sandbox", target, "tmpfs", NOSUID | NODEV, f"mode=1777,size={extra[0]}")
with open("/proc/self/mountinfo") as info:
    points = [line.split()[4] for line in info]
for point in points:  # each bind and each mount below it: mountinfo escapes space, tab, newline, backslash
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        point = point.replace(code, char)
    for target, flags in binds:
        if point == target or point.startswith(target + "/"):
            kept = os.statvfs(point).f_flag
            mount(None, point, None, REMOUNT | BIND | flags | sum(v for k, v in KEPT.items() if kept & k))
mount(None, root, None, REMOUNT | RDONLY | NOSUID | NODEV)
os.chdir(root)
mount(root, "/", None, MOVE)
os.chroot(".")
os.chdir("/tmp")
child = os.fork()
if child:
    for stream in (0, 1, 2):
        os.close(stream)
    status = os.waitpid(child, 0)[1]
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
""" + BECOME_USER + r"""
import site
site.main()  # site-packages and their .pth files, as the code's user (python -S started without them)
"""

# Run by the modes without a private root (``nobody``, ``none``) before the code's own
# interpreter. The process that runs it, started in a session of its own, becomes a child
# subreaper and forks: it stays outside every restriction as the call's supervisor, and when the
# code exits or SIGTERM comes (the host's timeout or output cap) it kills every process of the
# call — each orphan, a ``setsid`` daemon too, is reparented to it — until it has no child left,
# then exits 128 + signal or the code's status. The child opens its Landlock rules' folders and
# the interpreter, becomes the code's user (BECOME_USER), confines itself with Landlock (if its
# ABI is given: reads of the layout's runtime, everything in its own directory, nothing else; no
# TCP; from ABI 6 no signal or abstract unix socket outside the call) and a seccomp filter (if
# given: ``_SECCOMP``), and starts the code's interpreter (RUNNER) afresh, as that user.
GUARD = PRELUDE + r"""
layout, workdir, user, abi, seccomp, command = ast.literal_eval(sys.argv[1])
class Stop(Exception):
    pass
def stop(signum, frame):
    raise Stop
check(libc.prctl(36, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
signal.signal(signal.SIGTERM, stop)
child = os.fork()
if child:
    for stream in (0, 1, 2):
        os.close(stream)
    status = None  # the host's SIGTERM came first
    try:
        try:
            status = os.waitpid(child, 0)[1]
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    except Stop:
        pass
    def descendants():
        parent = {}
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    parent[int(name)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        found, level = set(), {os.getpid()}
        while level:
            level = {pid for pid, ppid in parent.items() if ppid in level and pid not in found}
            found |= level
        return found
    while True:  # no child left means no process of the call left: orphans come to the subreaper
        for pid in descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if status is None or os.WIFSIGNALED(status):
        os._exit(128 + (os.WTERMSIG(status) if status is not None else signal.SIGKILL))
    os._exit(os.WEXITSTATUS(status))
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if abi:
    EXECUTE, WRITE, READ, READ_DIR, TRUNCATE = 1, 2, 4, 8, 1 << 14
    FILE_RIGHTS = EXECUTE | WRITE | READ | TRUNCATE | 1 << 15  # what a rule on a file (not a folder) may grant
    handled = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = struct.pack("QQQ", handled, 3, 3)[:8 if abi < 4 else 16 if abi < 6 else 24]  # + no TCP; + scoped
    ruleset = check(libc.syscall(444, attr, ctypes.c_size_t(len(attr)), 0), "landlock_create_ruleset")
    rules = [(path, READ | READ_DIR | EXECUTE) for kind, path, *_ in layout if kind == "ro-bind"]
    rules += [(path, READ | WRITE | TRUNCATE) for kind, path, *_ in layout if kind == "dev-bind"]
    for path, rights in rules + [(workdir, handled)]:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rights &= handled if os.path.isdir(path) else handled & FILE_RIGHTS
        check(libc.syscall(445, ruleset, 1, struct.pack("=Qi", rights, fd), 0), f"landlock_add_rule({path})")
        os.close(fd)
binary = os.open(command[0], os.O_RDONLY | os.O_CLOEXEC)  # opened as the host user: nobody may not reach it
""" + BECOME_USER + r"""
if abi:
    check(libc.syscall(446, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
if seccomp:
    arch, x32, refused, clone3, clone = seccomp
    ERRNO, ALLOW, EPERM, ENOSYS = 0x50000, 0x7FFF0000, 1, 38
    program = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (6, 0, 0, ERRNO | EPERM), (0x20, 0, 0, 0)]  # arch; nr
    if x32:
        program += [(0x35, 0, 1, 0x40000000), (6, 0, 0, ERRNO | EPERM)]
    for number in refused:
        program += [(0x15, 0, 1, number), (6, 0, 0, ERRNO | EPERM)]
    program += [(0x15, 0, 1, clone3), (6, 0, 0, ERRNO | ENOSYS), (0x15, 1, 0, clone), (6, 0, 0, ALLOW),
                (0x20, 0, 0, 16), (0x45, 0, 1, 0x8000), (6, 0, 0, ERRNO | EPERM), (6, 0, 0, ALLOW)]  # CLONE_PARENT
    code = b"".join(struct.pack("HBBI", *line) for line in program)
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.cast(ctypes.c_char_p(code), ctypes.c_void_p).value)
    check(libc.prctl(22, 2, fprog, 0, 0), "prctl(PR_SET_SECCOMP)")
os.execve(binary, command, os.environ)
"""

ISOLATION_MODES = ("bubblewrap", "namespaces", "nobody", "user-namespace", "none")
PRIVATE_ROOT_MODES = ("bubblewrap", "namespaces", "user-namespace")  # the code sees only _root_layout
WEAK_MODES = ("nobody", "none")  # no private root: used only when named, hardened by GUARD
_SECCOMP = {  # AUDIT_ARCH; refuse the x32 ABI; refused: socket, io_uring_setup, ptrace, System V IPC; clone3; clone
    "x86_64": (0xC000003E, True, (41, 425, 101, 29, 30, 31, 64, 65, 66, 68, 69, 70, 71, 220), 435, 56),
    "aarch64": (0xC00000B7, False, (198, 425, 117, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196), 435, 220),
}
_PRIVATE_DIR = "/tmp"  # inside a private root: the call's own tmpfs (also /var/tmp and /dev/shm)
_DEVICES = ("null", "zero", "full", "random", "urandom")
# what of the host's /etc the private root shows: the dynamic linker's cache, users and groups
# (for pwd and getpass), name service and host files, the time zone and the alternatives links
_ETC = ("alternatives", "group", "host.conf", "hosts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
        "nsswitch.conf", "passwd")
_PROBED: dict[tuple, tuple[str | None, str]] = {}  # (isolation, euid, uid, python) -> (mode or None, why others failed)
_WARNED: set[str] = set()  # the modes without a private root already warned about in this process
_PROBE_LOCK = threading.Lock()


class SandboxUnavailable(UserError):
    """The isolation asked for cannot run here (``auto``: no private root can be built): the message
    names why, the three ways to get a private root, and the weaker modes with what they let through."""


@register_tool("python")
class PythonSandbox:
    """``<python>code</python>`` → the code's stdout and stderr (or an ``Error: …`` line).

    ``run`` never raises. A call fails — its text is a :class:`ToolError` — when the code did not
    run to its end: the argument is unusable, the sandbox could not run it, or the sandbox stopped
    it at the wall-clock or CPU limit or it was killed by a signal. Code that ran to its end is a
    result whatever it printed: a traceback or non-zero exit status of the model's own code, or
    output truncated at ``max_output_bytes``. At most ``pool_size`` calls run at once (others wait
    their turn). ``stats``: calls, errors (failed calls), timeouts, peak_concurrency. The defaults sit under the
    rollout's ``tool_timeout`` (10 s) and match its ``tool_workers`` (8), so the sandbox reports its own
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
        self._layout = _root_layout(self.python, self.write_bytes)
        self.landlock = landlock_abi()
        self.seccomp = _seccomp_filter()
        mode, failures = self._probe(isolation)
        if mode is None:
            raise SandboxUnavailable(_refusal(isolation, failures, self.landlock, self.seccomp is not None))
        self.isolation = mode
        if mode in WEAK_MODES:
            _warn_once(mode, weak_mode_gaps(mode, self.landlock, self.seccomp is not None))

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
        private = mode in PRIVATE_ROOT_MODES  # the code's directory is a tmpfs of its own: nothing to clean
        workdir = _PRIVATE_DIR if private else tempfile.mkdtemp(prefix="aepo-python-")
        # an empty folder of the host on which the call's namespace mounts its root (host sees nothing)
        staging = tempfile.mkdtemp(prefix="aepo-root-") if mode in ("namespaces", "user-namespace") else ""
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
                if mode in WEAK_MODES:  # GUARD's supervisor kills what the code left, setsid daemons included
                    _stop_supervisor(proc)
                _kill_group(proc)
                proc.wait()
                proc.stdout.close()
        finally:
            if not private:
                shutil.rmtree(workdir, ignore_errors=True)
            if staging:
                os.rmdir(staging)
        signum = -proc.returncode if proc.returncode < 0 else 0
        if proc.returncode > 128:  # bwrap, JAIL's init and GUARD's supervisor report 128 + signal
            signum = proc.returncode - 128
        return self._report(output, truncated, timed_out, proc.returncode, signum)

    def _command(self, mode: str, workdir: str, staging: str) -> list[str]:
        limits = [str(self.cpu_seconds), str(self.memory_bytes), str(self.file_bytes),
                  str(self._process_limit(mode)), str(int(mode in ("nobody", "none")))]
        if mode == "bubblewrap":
            as_user = [_which("setpriv"), f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                       "--clear-groups", "--no-new-privs", "--"]
            return (self._bubblewrap() + (as_user if self._drops_user(mode) else [])
                    + [self.python, "-I", "-u", "-c", RUNNER, *limits])
        if mode in ("namespaces", "user-namespace"):  # JAIL builds the root that bwrap would
            user = f"{self.user.pw_uid}:{self.user.pw_gid}" if self._drops_user(mode) else ""
            namespaces = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--"]
            if mode == "user-namespace":
                namespaces = ["--user", "--map-root-user", *namespaces]
            return [_which("unshare"), *namespaces, self.python, "-I", "-S", "-u", "-c", JAIL + RUNNER,
                    repr(self._layout), staging, user, *limits]
        user = f"{self.user.pw_uid}:{self.user.pw_gid}" if self._drops_user(mode) else ""
        code = [self.python, "-I", "-u", "-c", RUNNER, *limits]
        return [self.python, "-I", "-S", "-u", "-c", GUARD, repr((self._layout, workdir, user, self.landlock,
                                                                  self.seccomp, code))]

    def _bubblewrap(self) -> list[str]:
        """``bwrap`` arguments up to ``--``: new namespaces (a user namespace unless root) and the
        private root of ``_root_layout``, read-only but for its ``/tmp``."""
        args = [_which("bwrap"), "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent"]
        if os.geteuid() != 0:
            args.append("--unshare-user")
        for kind, path, *extra in self._layout:
            args += {"dir": ["--perms", "0755", "--dir", path], "proc": ["--proc", path],
                     "ro-bind": ["--ro-bind", path, path], "dev-bind": ["--dev-bind", path, path],
                     "symlink": ["--symlink", *extra, path],
                     "tmpfs": ["--size", str(*extra), "--perms", "1777", "--tmpfs", path]}[kind]
        return args + ["--remount-ro", "/", "--chdir", _PRIVATE_DIR, "--"]

    def _drops_user(self, mode: str) -> bool:
        """Whether the code runs as ``self.user`` (only root can switch)."""
        return mode in ("namespaces", "nobody") or (mode == "bubblewrap" and os.geteuid() == 0)

    def _process_limit(self, mode: str) -> int:
        """RLIMIT_NPROC counts every process of the real user: ``nobody`` starts near zero,
        the host user already owns some. Root is exempt from it: no need to count."""
        if self._drops_user(mode) or os.getuid() == 0:
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

    def _probe(self, isolation: str) -> tuple[str | None, str]:
        """The mode ``isolation`` runs in here — for ``auto`` the strongest with a private root that
        runs ``6 * 7`` — or None, and why the modes tried failed (cached per process)."""
        key = (isolation, os.geteuid(), self.user.pw_uid, self.python)
        with _PROBE_LOCK:
            if key not in _PROBED:
                failures = [] if isolation != "auto" or _which_or_none("bwrap") else ["bwrap is not installed"]
                found = None
                for mode in _candidate_modes() if isolation == "auto" else [isolation]:
                    failure = self._failure(mode)
                    if not failure:
                        found = mode
                        break
                    failures.append(f"{mode} failed: {failure}")
                _PROBED[key] = found, "; ".join(failures)
                if found in PRIVATE_ROOT_MODES:
                    log.info("python sandbox: isolation '%s' (private root, private capped /tmp, no network)", found)
        return _PROBED[key]

    def _failure(self, mode: str) -> str:
        """How ``mode`` fails to run ``6 * 7`` here (its last line of output), or "" when it works."""
        try:
            text = self._execute("6 * 7", mode, timeout=30.0)
        except OSError as err:
            text = f"{type(err).__name__}: {err}"
        self.stats.update(calls=0, errors=0, timeouts=0)
        return "" if text == "42" else (text.strip().splitlines() or ["no output"])[-1]


def _warn_once(mode: str, gaps: list[str]) -> None:
    """The warning at start (once per process and mode) of a mode without a private root, chosen by
    name: what the code can still do on this machine and how to get a private root."""
    with _PROBE_LOCK:
        if mode in _WARNED:
            return
        _WARNED.add(mode)
    log.warning("python sandbox: isolation '%s' (chosen by name) has no private root; on this machine the code can "
                "still %s. Install bubblewrap (`apt-get install bubblewrap` on Debian/Ubuntu, `dnf install bubblewrap` "
                "on Fedora) or allow namespaces, and run untrusted models only with a private root (docs/tools.md).",
                mode, "; ".join(gaps))


def _refusal(isolation: str, failures: str, landlock: int, seccomp: bool) -> str:
    """Why ``isolation`` cannot run here, the three ways to get a private root, and the weaker
    mode this user could name with what it lets through on this machine."""
    weak = "nobody" if os.geteuid() == 0 else "none"
    what = "no private root can be built here" if isolation == "auto" else f"isolation '{isolation}' does not work here"
    return (f"python sandbox: {what} ({failures}), so model-written code would not run isolated. Get a private root "
            "in one of three ways: install bubblewrap (`apt-get install bubblewrap` on Debian/Ubuntu, `dnf install "
            "bubblewrap` on Fedora); or run as root where `unshare` may create namespaces (a container needs "
            "CAP_SYS_ADMIN, e.g. `docker run --cap-add SYS_ADMIN --security-opt seccomp=unconfined`); or enable "
            "unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 "
            "`sysctl kernel.apparmor_restrict_unprivileged_userns=0`). Or accept a weaker mode by name: "
            f"rollout.sandbox_isolation={weak} (get_tool('python', isolation='{weak}') in Python), in which on this "
            f"machine the code can {'; '.join(weak_mode_gaps(weak, landlock, seccomp))} (docs/tools.md).")


def weak_mode_gaps(mode: str, landlock: int, seccomp: bool) -> list[str]:
    """What model-written code can still do in ``mode`` (``nobody`` or ``none``) under GUARD, with
    Landlock ABI ``landlock`` (0: no Landlock) and the seccomp filter or not (docs/tools.md)."""
    nobody = mode == "nobody"
    gaps = ["fill the disk that holds its directory (each file is capped at max_file_mb, their total is not)"]
    if landlock:
        gaps.append("see which host paths exist, with their sizes and dates (stat), without reading them")
    else:
        readable = "those readable by all" if nobody else "yours, /proc/<pid>/environ of your processes included"
        writable = ("world-writable folders such as /tmp, /var/tmp, /dev/shm" if nobody
                    else "your home, your projects, a Python install you own")
        user = "nobody" if nobody else "your user"
        gaps += ["see the host's processes through /proc of a shared pid namespace",
                 f"read every host file {user} may read ({readable})",
                 f"write and leave files wherever {user} may ({writable})"]
    if landlock < 6:
        gaps.append("signal other processes running as nobody (other calls' code included)" if nobody else
                    "signal your processes (kill the trainer, or its supervisor, after which what it started "
                    "outlives the call)")
    if not seccomp:
        reach = ("UDP" if landlock >= 4 else "TCP and UDP") + (" and abstract unix sockets" if landlock < 6 else "")
        gaps.append(f"open sockets below Python's socket module (ctypes): host unix sockets, {reach} of the host; "
                    "use System V IPC; leave its supervisor with clone(CLONE_PARENT)")
    if mode == "none" and os.geteuid() == 0:
        gaps.append("start processes without limit (RLIMIT_NPROC does not bind uid 0; as root, name 'nobody')")
    return gaps


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (Linux before 5.13, Landlock not
    enabled, or its system calls refused, e.g. by a container's seccomp profile)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(0, libc.syscall(444, None, ctypes.c_size_t(0), 1))  # LANDLOCK_CREATE_RULESET_VERSION


def _seccomp_filter() -> tuple | None:
    """GUARD's seccomp table for this machine (``_SECCOMP``), None where the architecture is not in
    it or the kernel has no seccomp."""
    libc = ctypes.CDLL(None, use_errno=True)
    table = _SECCOMP.get(os.uname().machine)
    return table if table and libc.prctl(21, 0, 0, 0, 0) >= 0 else None  # PR_GET_SECCOMP


def _candidate_modes() -> list[str]:
    """The modes with a private root that ``auto`` tries here, strongest first."""
    have = {tool: _which_or_none(tool) for tool in ("bwrap", "unshare", "setpriv")}
    if os.geteuid() == 0:
        bubblewrap = have["bwrap"] and have["setpriv"]  # under root, setpriv switches to nobody
        return (["bubblewrap"] if bubblewrap else []) + (["namespaces"] if have["unshare"] else [])
    return (["bubblewrap"] if have["bwrap"] else []) + (["user-namespace"] if have["unshare"] else [])


def _which_or_none(tool: str) -> str | None:
    return shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")


def _which(tool: str) -> str:
    path = _which_or_none(tool)
    if path is None:
        raise FileNotFoundError(f"{tool} not found")
    return path


def _root_layout(python: str, write_bytes: int) -> list[tuple]:
    """The private root of every mode in ``PRIVATE_ROOT_MODES``, as ``(kind, path, *extra)``
    entries built in order: the system's runtime read-only (``/usr``, the ``/bin`` and ``/lib``
    links or folders, the ``_ETC`` part of ``/etc``), one tmpfs of ``write_bytes`` at ``/tmp``,
    the Python install read-only with its parents as bare traversable folders (so nothing else
    of e.g. ``/root``; after the tmpfs, so an install under ``/tmp`` stays visible), a fresh
    ``/proc``, the basic devices, and ``/var/tmp`` and ``/dev/shm`` linked to ``/tmp``."""
    layout = [("dir", "/etc")]  # traversable (bwrap would make the parent of its files 0700)
    for path in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", *(f"/etc/{n}" for n in _ETC)]:
        if os.path.islink(path):  # merged-/usr links; /etc/localtime
            layout.append(("symlink", path, os.readlink(path)))
        elif os.path.exists(path):
            layout.append(("ro-bind", path))
    layout.append(("tmpfs", _PRIVATE_DIR, write_bytes))
    for root in _outermost(_python_install_roots(python)):
        if not (root == "/usr" or root.startswith("/usr/")):
            layout += [("dir", str(ancestor)) for ancestor in reversed(Path(root).parents[:-1])]
            layout.append(("ro-bind", root))
    layout += [("proc", "/proc"), ("dir", "/dev"), *(("dev-bind", f"/dev/{device}") for device in _DEVICES)]
    layout += [("symlink", f"/dev/{name}", target) for name, target in (
        ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"))]
    return layout + [("dir", "/var"), ("symlink", "/var/tmp", _PRIVATE_DIR), ("symlink", "/dev/shm", _PRIVATE_DIR)]


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
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8"}


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


def _stop_supervisor(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """Ask GUARD's supervisor (SIGTERM) to kill every process of the call and wait for it to exit,
    at most ``grace`` seconds (``_kill_group`` follows either way)."""
    if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        _wait_until(proc, time.monotonic() + grace)


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
