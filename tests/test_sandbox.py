"""The python sandbox, attacked for real: each hostile program must leave the host untouched
and come back as clean text within seconds."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from aepo_rl.config import Config
from aepo_rl.tasks.common import ToolOptions, build_tools
from aepo_rl.tools import get_tool
from aepo_rl.tools import python as python_module
from aepo_rl.tools.python import ISOLATION_MODES, PRIVATE_ROOT_MODES, WEAK_MODES, SandboxUnavailable


def sandbox(**options):
    defaults = {"timeout": 4.0, "memory_mb": 256, "max_processes": 16, "max_output_bytes": 4096}
    return get_tool("python", **{**defaults, **options})


@pytest.fixture(scope="module")
def python_tool():
    return mode_sandbox("auto")


def drops_privileges(tool) -> bool:
    return tool.isolation in ("namespaces", "nobody") or (tool.isolation == "bubblewrap" and os.geteuid() == 0)


def mode_sandbox(mode: str, **options):
    """A sandbox in ``mode`` (``auto``: the one with a private root it picks), or a skip saying why
    this machine cannot run it."""
    try:
        tool = sandbox(isolation=mode, **options)
    except SandboxUnavailable as err:
        why = {"auto": "no private root (install bubblewrap)",
               "bubblewrap": "bwrap is not installed or fails here (apt-get install bubblewrap)",
               "namespaces": "this needs root and `unshare` allowed to create namespaces",
               "user-namespace": "unprivileged user namespaces are disabled here",
               "nobody": "this needs root (to switch to nobody)", "none": "the sandbox cannot start"}[mode]
        pytest.skip(f"isolation '{mode}' does not work on this machine: {why} ({str(err).split(' (', 1)[1][:200]})")
    assert tool.run("6 * 7") == "42"
    return tool


@pytest.fixture(scope="module", params=PRIVATE_ROOT_MODES)
def private_root_tool(request):
    """Each mode that should give a private root, in turn: the attacks below run in every one."""
    return mode_sandbox(request.param)


def test_isolation_mode_is_reported(python_tool):
    assert python_tool.isolation in ISOLATION_MODES
    assert (python_tool.name, python_tool.tag) == ("python", "python")
    if os.geteuid() == 0 and not drops_privileges(python_tool):
        pytest.skip("running as root but neither namespaces nor setpriv to 'nobody' work here: "
                    "the sandbox only blocks the network at Python level (see tool.isolation)")


@pytest.mark.parametrize("code, expected", [
    ("x = 6\nx * 7", "42"),
    ("print('a')\n'b'", "a\nb"),
    ("import math\nmath.factorial(5)", "120"),
    ("print(1)", "1"),  # print returns None: nothing more is printed
    ("x = 1", "(no output)"),
    ("for i in range(3):\n    i", "(no output)"),  # only a final expression statement is printed
    ("1990 - 1921", "69"),
    ("import sys\nprint('err', file=sys.stderr)\n'out'", "err\nout"),
])
def test_normal_code_and_last_expression(python_tool, code, expected):
    assert python_tool.run(code) == expected


def test_errors_come_back_as_a_short_traceback(python_tool):
    text = python_tool.run("x = 1\n1 / 0")
    assert text.endswith("ZeroDivisionError: division by zero")
    assert 'File "<python>", line 2' in text and "RUNNER" not in text and "<string>" not in text
    assert "SyntaxError" in python_tool.run("def (")
    assert python_tool.run("import sys; sys.exit(3)") == "(no output; exit status 3)"


def test_fresh_empty_directory_removed_afterwards(python_tool):
    note = f"note-{uuid.uuid4().hex[:8]}.txt"
    text = python_tool.run(f"import os\nopen({note!r}, 'w').write('hi')\nprint(os.getcwd())\nsorted(os.listdir('.'))")
    workdir, listing = text.splitlines()
    assert listing == repr([note])
    assert not os.path.exists(os.path.join(workdir, note))
    if python_tool.isolation not in PRIVATE_ROOT_MODES:  # there the directory is the call's own tmpfs /tmp
        assert not os.path.exists(workdir)
    assert python_tool.run("import os; os.listdir('.')") == "[]"


def test_minimal_environment(python_tool, monkeypatch):
    monkeypatch.setenv("AEPO_TEST_SECRET", "hunter2")
    names = set(eval(python_tool.run("import os; sorted(os.environ)")))
    assert names <= {"HOME", "LANG", "LC_ALL", "PATH", "TMPDIR", "PWD", "OLDPWD"}
    assert "hunter2" not in python_tool.run("import os; dict(os.environ)")


def test_infinite_loop_times_out():
    tool = mode_sandbox("auto", timeout=1.5, cpu_seconds=30)
    start = time.monotonic()
    assert tool.run("while True:\n    pass") == "Error: timed out after 1.5 s; the process group was killed."
    assert time.monotonic() - start < 5
    assert tool.stats["timeouts"] == 1 and tool.stats["errors"] == 1


def test_cpu_seconds_limit():
    tool = mode_sandbox("auto", timeout=20, cpu_seconds=1)
    start = time.monotonic()
    assert tool.run("while True:\n    pass") == "Error: CPU time limit of 1 s exceeded."
    assert time.monotonic() - start < 15


def test_memory_bomb(python_tool):
    assert python_tool.run("x = bytearray(8 * 1024 ** 3)").endswith("MemoryError")
    assert python_tool.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))").endswith("MemoryError")


def test_fork_bomb_is_contained_and_cleaned_up():
    tool = mode_sandbox("auto", timeout=3)
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    code = (f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    start = time.monotonic()
    text = tool.run(code)
    assert text == "Error: timed out after 3 s; the process group was killed."
    assert time.monotonic() - start < 8
    time.sleep(0.2)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _comm(pid) == marker]
    assert tool.run("6 * 7") == "42"


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_hundred_megabytes_of_output_is_capped(python_tool):
    start = time.monotonic()
    text = python_tool.run("import sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)")
    assert text == "x" * 4096 + "\n[output truncated at 4096 bytes; the process was stopped]"
    assert time.monotonic() - start < 5


def test_network_is_unreachable(python_tool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    text = python_tool.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    assert text.splitlines()[-1].split(":")[0] in {"ConnectionRefusedError", "OSError", "PermissionError"}
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing reached the host
    listener.close()
    assert python_tool.run("import socket\n"
                           "socket.create_connection(('1.1.1.1', 80), timeout=2)").startswith("Traceback")


@pytest.mark.parametrize("mode, refusal", [
    ("bubblewrap", "ConnectionRefusedError: [Errno 111] Connection refused"),  # its own loopback only
    ("namespaces", "OSError: [Errno 101] Network is unreachable"),
    ("user-namespace", "OSError: [Errno 101] Network is unreachable"),
    ("nobody", "PermissionError: network access is disabled in the sandbox"),
    ("none", "PermissionError: network access is disabled in the sandbox"),
])
def test_every_isolation_mode_blocks_the_network(mode, refusal):
    tool = mode_sandbox(mode)
    assert tool.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)").endswith(refusal)


def test_writing_outside_its_directory_fails(python_tool, tmp_path):
    if not drops_privileges(python_tool) and python_tool.isolation not in PRIVATE_ROOT_MODES:
        pytest.skip(f"isolation '{python_tool.isolation}' keeps the host user's file permissions")
    os.chmod(tmp_path, 0o755)
    for target in ["/etc/aepo_sandbox_probe", str(tmp_path / "escaped.txt"), os.path.join(os.getcwd(), "escaped.txt")]:
        text = python_tool.run(f"open({target!r}, 'w').write('x')")
        refusals = [f"PermissionError: [Errno 13] Permission denied: {target!r}"]
        if python_tool.isolation in PRIVATE_ROOT_MODES:  # the root is read-only, the host's folders are not there
            refusals += [f"OSError: [Errno 30] Read-only file system: {target!r}",
                         f"FileNotFoundError: [Errno 2] No such file or directory: {target!r}"]
        assert text.splitlines()[-1] in refusals
        assert not os.path.exists(target)


def test_host_unix_sockets_are_unreachable(private_root_tool):
    folder = tempfile.mkdtemp(prefix="aepo-socket-", dir="/tmp")  # world-writable, like /tmp itself
    listeners = []
    try:
        os.chmod(folder, 0o777)
        path = os.path.join(folder, "listener.sock")
        abstract = f"\0aepo-test-{uuid.uuid4().hex}"
        for address in [path, abstract]:
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(address)
            listener.listen()
            listener.settimeout(0.5)
            listeners.append(listener)
        os.chmod(path, 0o777)
        for address, refusal in [(path, "FileNotFoundError"), (abstract, "ConnectionRefusedError")]:
            text = private_root_tool.run(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({address!r})\n"
                                         "s.sendall(b'escaped')")
            assert text.splitlines()[-1].startswith(refusal + ":"), text
        for listener in listeners:
            with pytest.raises(TimeoutError):
                listener.accept()  # nothing reached the host
    finally:
        for listener in listeners:
            listener.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_nothing_written_outlives_the_call(private_root_tool):
    name = f"aepo-left-{uuid.uuid4().hex[:8]}"
    paths = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}", name]
    write = (f"for path in {paths!r}:\n    open(path, 'w').write('x' * 1000)\n"
             f"import os\n[os.path.getsize(p) for p in {paths!r}]")
    assert private_root_tool.run(write) == "[1000, 1000, 1000, 1000]"
    assert private_root_tool.run(f"import os\n[os.path.exists(p) for p in {paths!r}]") == "[False, False, False, False]"
    assert not [path for path in paths[:3] if os.path.exists(path)]  # nor on the host


def test_host_files_outside_the_runtime_are_invisible(private_root_tool):
    """Secrets left readable by everyone in the home folder, beside the Python install and in the
    project cannot be read; the root holds only the system's runtime and the Python install."""
    name = f"aepo-secret-{uuid.uuid4().hex[:8]}"
    install = os.path.dirname(os.path.realpath(sys.base_prefix))  # e.g. ~/.pyenv/versions
    folders = [os.path.expanduser("~"), os.getcwd()] + ([install] if install not in ("/", "/usr") else [])
    secrets = [os.path.join(folder, name) for folder in folders if os.access(folder, os.W_OK)]
    assert secrets, f"none of {folders} is writable: the test cannot leave a secret"
    try:
        for secret in secrets:
            with open(secret, "w") as f:
                f.write("hunter2")
            os.chmod(secret, 0o644)
        for secret in secrets:
            text = private_root_tool.run(f"open({secret!r}).read()")
            assert text.splitlines()[-1] == f"FileNotFoundError: [Errno 2] No such file or directory: {secret!r}", text
    finally:
        for secret in secrets:
            os.remove(secret)
    top = set(eval(private_root_tool.run("import os; os.listdir('/')")))
    assert top <= PRIVATE_TOP, top
    etc = set(eval(private_root_tool.run("import os; os.listdir('/etc')")))
    assert etc <= set(python_module._ETC) and "ld.so.cache" in etc, etc
    assert private_root_tool.run("open('/etc/shadow')").endswith("No such file or directory: '/etc/shadow'")


PRIVATE_TOP = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp", "var",
               *(root.split(os.sep)[1]
                 for root in python_module._python_install_roots(os.path.realpath(sys.executable)))
               }  # the private root's top level: the runtime, the Python install

ESCAPE = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.unshare(0x10000000 | 0x00020000)  # a user and a mount namespace of its own, if it may
os.makedirs("/tmp/x")
for attempt in (lambda: os.chroot("/tmp/x"), lambda: libc.umount2(b"/", 2), lambda: libc.umount2(b"/tmp", 2)):
    try:
        attempt()
    except OSError:
        pass
    for _ in range(8):  # the classic chroot escape: climb from outside the new root
        os.chdir("..")
    try:
        os.chroot(".")
    except OSError:
        pass
sorted(os.listdir("/"))
"""


def test_the_code_has_no_capabilities(private_root_tool):
    """As bubblewrap does, the code keeps no capability — also in a user namespace, where it stays
    uid 0 — so it cannot unmount its private /tmp or root."""
    text = private_root_tool.run(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "caps = {l.split(':')[0]: int(l.split()[1], 16) for l in open('/proc/self/status') if l.startswith('Cap')}\n"
        "[caps['CapEff'], caps['CapPrm'], caps['CapAmb'], libc.umount2(b'/tmp', 2), libc.umount2(b'/', 2)]")
    assert text == "[0, 0, 0, -1, -1]", text


def test_breaking_out_of_the_root_fails(private_root_tool):
    """A user namespace of its own (where allowed) gives the code root's powers there: chroot
    and unmount tricks must still leave it inside the private root."""
    text = private_root_tool.run(ESCAPE)
    assert set(eval(text)) <= PRIVATE_TOP, text


@pytest.mark.parametrize("mode", PRIVATE_ROOT_MODES)
def test_a_python_install_under_tmp_stays_visible(mode, tmp_path, monkeypatch):
    """The private /tmp is mounted before the Python install, so an install (a virtual
    environment) under the host's /tmp is not hidden by it."""
    mode_sandbox(mode)  # skips where the mode does not work
    roots = python_module._python_install_roots
    monkeypatch.setattr(python_module, "_python_install_roots", lambda python: [*roots(python), str(tmp_path)])
    os.chmod(tmp_path, 0o755)
    (tmp_path / "site.txt").write_text("installed")
    (tmp_path / "site.txt").chmod(0o644)
    tool = sandbox(isolation=mode)
    assert tool.run(f"open({str(tmp_path / 'site.txt')!r}).read()") == "installed"
    assert tool.run(f"open({str(tmp_path / 'new.txt')!r}, 'w')").splitlines()[-1].startswith(
        ("OSError: [Errno 30] Read-only file system", "PermissionError"))


@pytest.mark.parametrize("mode", PRIVATE_ROOT_MODES)
def test_total_write_cap(mode):
    tool = mode_sandbox(mode, write_mb=4, max_file_mb=16)
    code = ("for path in ['/tmp/a', '/var/tmp/b', '/dev/shm/c', 'd']:\n"
            "    with open(path, 'wb') as f:\n        f.write(b'x' * (3 << 19))\n    print(path)")
    text = tool.run(code)
    assert text.splitlines()[:2] == ["/tmp/a", "/var/tmp/b"]  # 3 MB written; the third 1.5 MB file fails
    assert text.endswith("OSError: [Errno 28] No space left on device")
    assert tool.run("open('e', 'wb').write(b'x' * (3 << 20))") == str(3 << 20)  # the next call starts empty


@pytest.mark.parametrize("mode", PRIVATE_ROOT_MODES)
def test_limits_hold_in_the_private_root(mode):
    """The CPU limit's signal (delivered to the code, not the namespace's init) and, where the
    code runs as ``nobody``, the process limit, in each mode that builds a private root."""
    tool = mode_sandbox(mode, timeout=20, cpu_seconds=1)
    assert tool.run("while True:\n    pass") == "Error: CPU time limit of 1 s exceeded."
    if drops_privileges(tool):  # the host's root is exempt from RLIMIT_NPROC, also in a user namespace
        text = tool.run("import os\nfor _ in range(64):\n    if os.fork() == 0:\n        import time; time.sleep(5)")
        assert text.splitlines()[-1].startswith("BlockingIOError"), text


@pytest.mark.parametrize("mode", WEAK_MODES)
def test_a_mode_without_private_root_says_so_at_start(mode, caplog, monkeypatch):
    """Named, a weak mode runs, with a warning (once per process) of what the code can still do here."""
    monkeypatch.setattr(python_module, "_WARNED", set())  # the warning is given once per process
    with caplog.at_level("WARNING", logger="aepo_rl.tools.python"):
        tool = mode_sandbox(mode)
        sandbox(isolation=mode)
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"isolation '{mode}' (chosen by name) has no private root; on this machine the code can still " in warning
    assert "apt-get install bubblewrap" in warning
    assert "; ".join(python_module.weak_mode_gaps(mode, tool.landlock, tool.seccomp is not None)) in warning


@pytest.mark.parametrize("landlock, seccomp, expected", [
    (0, False, ["see the host's processes", "read every host file", "write and leave files", "signal",
                "open sockets below Python"]),
    (5, True, ["see which host paths exist", "signal"]),
    (6, True, ["see which host paths exist"]),
])
def test_weak_mode_gaps_name_what_the_platform_cannot_stop(landlock, seccomp, expected):
    for mode in WEAK_MODES:
        gaps = python_module.weak_mode_gaps(mode, landlock, seccomp)
        assert gaps[0].startswith("fill the disk")  # never capped without a private root
        for words in expected:
            assert any(gap.startswith(words) for gap in gaps), (mode, words, gaps)
        assert len(gaps) == 1 + len(expected) + (mode == "none" and os.geteuid() == 0)  # + no process limit


def _no_private_root(monkeypatch):
    """This machine as one without bwrap where namespaces are refused."""
    monkeypatch.setattr(python_module, "_PROBED", {})
    monkeypatch.setattr(python_module, "_which_or_none", lambda tool: None if tool == "bwrap" else shutil.which(tool))
    monkeypatch.setattr(python_module, "_candidate_modes", lambda: ["namespaces"])
    monkeypatch.setattr(python_module, "JAIL", "raise PermissionError('mount: Operation not permitted')\n")


def test_auto_without_a_private_root_refuses_naming_the_ways_out(monkeypatch):
    """Where bwrap is missing and namespaces are not allowed, 'auto' refuses to start: it names why,
    the three ways to a private root, and the key that chooses a weaker mode with its risk."""
    _no_private_root(monkeypatch)
    with pytest.raises(SandboxUnavailable) as refusal:
        sandbox()
    message = str(refusal.value)
    assert message.startswith("python sandbox: no private root can be built here (bwrap is not installed; "
                              "namespaces failed: PermissionError: mount: Operation not permitted)")
    for way in ("apt-get install bubblewrap", "CAP_SYS_ADMIN", "unprivileged user namespaces",
                f"rollout.sandbox_isolation={'nobody' if os.geteuid() == 0 else 'none'}", "fill the disk"):
        assert way in message


def test_a_named_mode_that_cannot_run_here_refuses_at_start(monkeypatch):
    monkeypatch.setattr(python_module, "_PROBED", {})
    monkeypatch.setattr(python_module, "JAIL", "raise PermissionError('mount: Operation not permitted')\n")
    with pytest.raises(SandboxUnavailable, match=r"isolation 'namespaces' does not work here \(namespaces failed: "
                                                 r"PermissionError: mount: Operation not permitted\)"):
        sandbox(isolation="namespaces")


def test_aepo_eval_refuses_in_one_line_before_any_model(monkeypatch, capsys):
    from aepo_rl.cli import main

    _no_private_root(monkeypatch)
    monkeypatch.setattr("aepo_rl.evaluate.load_policy", lambda *a, **k: pytest.fail("a model was built"))
    assert main(["eval", "eval.num_questions=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aepo: python sandbox: no private root can be built here") and err.count("\n") == 1


def test_the_key_reaches_the_task_and_refuses_before_any_model(monkeypatch):
    """rollout.sandbox_isolation reaches the task's python tool; without a private root the task
    itself (what training, eval and AEPOTrainer build first) refuses, before any model."""
    from aepo_rl.api import AEPOTrainer
    from aepo_rl.tasks import get_task

    cfg = Config()
    cfg.rollout.sandbox_isolation = "none"
    assert ToolOptions.from_config(cfg).python_isolation == "none"
    tools = build_tools(cfg.task, allowed=("python",), options=ToolOptions.from_config(cfg))
    assert tools["python"].isolation == "none"
    _no_private_root(monkeypatch)
    with pytest.raises(SandboxUnavailable, match="no private root can be built here"):
        get_task(Config())
    with pytest.raises(SandboxUnavailable, match="rollout.sandbox_isolation="):
        AEPOTrainer("aepo", train_dataset=[{"prompt": "1+1?", "answer": "2"}], tools=["python"])
    AEPOTrainer("aepo", train_dataset=[{"prompt": "1+1?", "answer": "2"}], tools=["python"],
                overrides={"rollout.sandbox_isolation": "none"})  # named: runs (with the warning)


def test_root_on_this_machine_gets_a_private_root(python_tool):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("not root with `unshare`: the private root needs bubblewrap or user namespaces here")
    if python_tool.isolation not in PRIVATE_ROOT_MODES:
        pytest.skip(f"namespaces are not allowed here (isolation '{python_tool.isolation}', e.g. a container "
                    "without CAP_SYS_ADMIN): install bubblewrap")
    assert python_tool.isolation in ("bubblewrap", "namespaces")


def test_killing_the_parent_or_host_leaves_the_host_running(python_tool):
    for code in ["import os\nos.kill(os.getppid(), 9)", f"import os\nos.kill({os.getpid()}, 9)",
                 "import os, signal\nos.killpg(0, signal.SIGKILL)"]:
        text = python_tool.run(code)
        assert isinstance(text, str) and text
    assert python_tool.run("6 * 7") == "42"  # and pytest (this process) is still alive


def test_file_size_limit():
    tool = mode_sandbox("auto", max_file_mb=1)
    assert tool.run("open('big', 'wb').write(b'x' * (2 << 20))").endswith("OSError: [Errno 27] File too large")


def test_huge_or_binary_code_answers_with_error_text(python_tool):
    for bad in ["x = 1\n" * 200_000, "print(1)\x00", "print('\udcff')", b"print(1)"]:
        assert python_tool.run(bad).startswith("Error:")


def test_pool_bounds_concurrency():
    tool = mode_sandbox("auto", pool_size=2)
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(tool.run, ["import time\ntime.sleep(0.6)\n'done'"] * 4))
    assert results == ["done"] * 4
    assert tool.stats["peak_concurrency"] == 2
    assert time.monotonic() - start >= 1.2  # two waves of 0.6 s
    assert threading.active_count() < 50


def test_rollout_sandbox_write_mb_sizes_the_private_tmp():
    cfg = Config()
    cfg.rollout.sandbox_write_mb = 3
    tool = build_tools(cfg.task, allowed=("python",), options=ToolOptions.from_config(cfg))["python"]
    if tool.isolation not in PRIVATE_ROOT_MODES:
        pytest.skip(f"isolation '{tool.isolation}' has no private /tmp here (see the warning at start)")
    assert tool.run("import os\nst = os.statvfs('/tmp')\nst.f_blocks * st.f_frsize") == str(3 << 20)


# -- the attacks of a new user's review (design note newcomer-4, rows 4b and 4c), in every mode ------------------
# A mode this machine cannot run is skipped with the reason; a weak mode's hardening this kernel lacks
# (Landlock, its ABI 6, seccomp) skips the attack it would stop, naming the gap docs/tools.md lists.

@pytest.fixture(scope="module", params=ISOLATION_MODES)
def any_mode_tool(request):
    """Each of the five modes in turn, as named by a user."""
    return mode_sandbox(request.param, timeout=2.0)


def needs(tool, landlock: int = 0, seccomp: bool = False) -> None:
    """Skip a weak mode's attack that its hardening on this kernel does not stop (a listed gap)."""
    if tool.isolation in WEAK_MODES and (tool.landlock < landlock or (seccomp and tool.seccomp is None)):
        gaps = "; ".join(python_module.weak_mode_gaps(tool.isolation, tool.landlock, tool.seccomp is not None))
        pytest.skip(f"isolation '{tool.isolation}' cannot stop this here (Landlock ABI {tool.landlock}, "
                    f"seccomp {tool.seccomp is not None}): {gaps}")


def test_attack_read_host_files(any_mode_tool, tmp_path):
    """A secret readable by all in the project and in the home folder, and /etc/shadow, stay unread."""
    needs(any_mode_tool, landlock=1)
    name = f"aepo-secret-{uuid.uuid4().hex[:8]}"
    secrets = [os.path.join(folder, name) for folder in (os.getcwd(), os.path.expanduser("~"))
               if os.access(folder, os.W_OK)]
    try:
        for secret in secrets:
            with open(secret, "w") as f:
                f.write("hunter2")
            os.chmod(secret, 0o644)
        for target in [*secrets, "/etc/shadow"]:
            text = any_mode_tool.run(f"open({target!r}).read()")
            assert text.splitlines()[-1].split(":")[0] in {"PermissionError", "FileNotFoundError"}, text
            assert "hunter2" not in text
    finally:
        for secret in secrets:
            os.remove(secret)


def test_attack_files_left_in_host_temp_folders(any_mode_tool):
    """Files written to /tmp, /var/tmp and /dev/shm and the working directory do not outlive the call
    on the host; the working directory itself is gone after it."""
    needs(any_mode_tool, landlock=1)
    name = f"aepo-left-{uuid.uuid4().hex[:8]}"
    paths = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}"]
    code = (f"import os\nprint(os.getcwd())\nopen({name!r}, 'w').write('x')\nfor path in {paths!r}:\n"
            "    try:\n        open(path, 'w').write('x')\n"
            "    except OSError as err:\n        print(type(err).__name__)")
    text = any_mode_tool.run(code)
    workdir = text.splitlines()[0]
    assert not [path for path in paths if os.path.exists(path)], text
    if any_mode_tool.isolation in WEAK_MODES:  # a host folder of its own, removed; private roots: their own tmpfs
        assert workdir.startswith(tempfile.gettempdir()) and not os.path.exists(workdir)
        assert text.splitlines()[1:] == ["PermissionError"] * 3, text


def _processes_named(marker: str) -> list[str]:
    """Live processes (not zombies, whose parent has yet to reap them) named ``marker``."""
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and _comm(pid) == marker and _state(pid) not in "ZX"]


def _state(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


DAEMON = """import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # a daemon: double fork, new session, renamed
        ctypes.CDLL(None).prctl(15, b"{marker}", 0, 0, 0)
        time.sleep({sleep})
        try:
            open({sentinel!r}, "w").write("escaped")
        except OSError:
            pass
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
{tail}"""


@pytest.mark.parametrize("ending", ["returns", "times out"])
def test_attack_setsid_daemon_does_not_outlive_the_call(any_mode_tool, ending):
    """A double-forked setsid daemon is killed when the call ends (the code returning or timing out):
    none is left running, and the host file it would write later never appears."""
    marker = f"aepo{uuid.uuid4().hex[:10]}"
    folder = tempfile.mkdtemp(prefix="aepo-daemon-")
    os.chmod(folder, 0o777)
    sentinel = os.path.join(folder, "late.txt")
    try:
        tail = "'returned'" if ending == "returns" else "while True:\n    pass"
        text = any_mode_tool.run(DAEMON.format(marker=marker, sleep=0.8, sentinel=sentinel, tail=tail))
        assert text == ("returned" if ending == "returns"
                        else "Error: timed out after 2 s; the process group was killed.")
        deadline = time.monotonic() + 1.0  # killed with its namespace's init, a daemon may still be exiting
        while _processes_named(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _processes_named(marker)
        time.sleep(1.0)
        assert not os.path.exists(sentinel) and not _processes_named(marker)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_weak_mode_supervisor_alone_kills_the_daemon(monkeypatch):
    """Without Landlock or seccomp (an older kernel), GUARD's supervisor still kills the daemon."""
    monkeypatch.setattr(python_module, "landlock_abi", lambda: 0)
    monkeypatch.setattr(python_module, "_seccomp_filter", lambda: None)
    monkeypatch.setattr(python_module, "_WARNED", set(WEAK_MODES))
    tool = mode_sandbox("none", timeout=3.0)
    assert (tool.landlock, tool.seccomp) == (0, None)
    marker = f"aepo{uuid.uuid4().hex[:10]}"
    assert tool.run(DAEMON.format(marker=marker, sleep=30, sentinel="/nonexistent/x", tail="'returned'")) == "returned"
    assert not _processes_named(marker)


CTYPES_CONNECT = """import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket({family}, socket.SOCK_STREAM, 0)
address = {address!r}
result = libc.connect(fd, address, len(address)) if fd >= 0 else -1
print(fd >= 0, result, libc.send(fd, b"escaped", 7, 0) if result == 0 else -1)
"""


def _sockaddr_in(port: int) -> bytes:
    return socket.AF_INET.to_bytes(2, "little") + port.to_bytes(2, "big") + socket.inet_aton("127.0.0.1") + bytes(8)


def test_attack_loopback_tcp_through_ctypes(any_mode_tool):
    """A host TCP server on 127.0.0.1 is not reached, even by socket() and connect() through ctypes."""
    needs(any_mode_tool, seccomp=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    try:
        port = listener.getsockname()[1]
        text = any_mode_tool.run(CTYPES_CONNECT.format(family="socket.AF_INET", address=_sockaddr_in(port)))
        assert text.split()[1] == "-1", text  # no socket (weak modes: seccomp), or no route out of its own namespace
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_attack_abstract_unix_socket_through_ctypes(any_mode_tool):
    needs(any_mode_tool, seccomp=True)
    name = f"\0aepo-test-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(name)
    listener.listen()
    listener.settimeout(0.5)
    try:
        address = socket.AF_UNIX.to_bytes(2, "little") + name.encode()
        text = any_mode_tool.run(CTYPES_CONNECT.format(family="socket.AF_UNIX", address=address))
        assert text.split()[1] == "-1", text
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_attack_append_to_the_interpreters_stdlib(any_mode_tool):
    """The interpreter's standard library cannot be changed: opening ``os.py`` for appending (nothing
    is written even where it opens) and appending to a sentinel file the test puts beside it fail."""
    needs(any_mode_tool, landlock=1)
    stdlib = os.path.dirname(os.__file__)
    text = any_mode_tool.run(f"import os\nopen(os.path.join({stdlib!r}, 'os.py'), 'ab').close()\n'opened'")
    assert text.splitlines()[-1].split(":")[0] in {"PermissionError", "OSError", "FileNotFoundError"}, text
    if not os.access(stdlib, os.W_OK):
        return
    sentinel = os.path.join(stdlib, f"aepo_sentinel_{uuid.uuid4().hex[:8]}.py")
    try:
        with open(sentinel, "w") as f:
            f.write("VALUE = 1\n")
        os.chmod(sentinel, 0o666)  # writable by all: only the sandbox can stop the code
        text = any_mode_tool.run(f"open({sentinel!r}, 'a').write('VALUE = 2\\n')")
        assert text.splitlines()[-1].split(":")[0] in {"PermissionError", "OSError", "FileNotFoundError"}, text
        with open(sentinel) as f:
            assert f.read() == "VALUE = 1\n"
    finally:
        os.remove(sentinel)


def test_attack_killing_host_processes(any_mode_tool):
    """A process of the host's user (standing in for the trainer) and the code's parent survive
    SIGKILL from the code; the call still answers."""
    needs(any_mode_tool, landlock=6)
    victim = subprocess.Popen(["sleep", "30"])
    try:
        code = (f"import os\nfor pid in ({victim.pid}, os.getppid()):\n    try:\n        os.kill(pid, 9)\n"
                "    except OSError as err:\n        print(type(err).__name__)\n'done'")
        text = any_mode_tool.run(code)
        assert text.splitlines()[-1] == "done", text
        time.sleep(0.1)
        assert victim.poll() is None
        assert any_mode_tool.run("6 * 7") == "42"
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("mode", WEAK_MODES)
def test_weak_modes_keep_the_limits(mode):
    """Under GUARD's supervisor: the wall clock, the output cap and (where RLIMIT_NPROC binds the
    code's user) a fork bomb, each cleaned up to the last process."""
    tool = mode_sandbox(mode, timeout=2.0)
    assert tool.run("while True:\n    pass") == "Error: timed out after 2 s; the process group was killed."
    text = tool.run("import sys\nfor _ in range(1600):\n    sys.stdout.write('x' * 65536)")
    assert text.endswith("[output truncated at 4096 bytes; the process was stopped]")
    if mode == "none" and os.geteuid() == 0:
        return  # no process limit for uid 0: a gap weak_mode_gaps names; no fork bomb on a shared machine
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    code = (f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert tool.run(code) == "Error: timed out after 2 s; the process group was killed."
    assert not _processes_named(marker)
    assert tool.run("6 * 7") == "42"


@pytest.mark.parametrize("mode", WEAK_MODES)
def test_weak_modes_run_threads_and_subprocesses(mode):
    """The seccomp filter leaves threads and subprocesses working (clone3 falls back to clone);
    multiprocessing's locks need POSIX semaphores in /dev/shm, which Landlock keeps unwritable."""
    tool = mode_sandbox(mode)
    code = ("import subprocess, threading\nfound = []\nthread = threading.Thread(target=found.append, args=[1])\n"
            "thread.start()\nthread.join()\nfound, subprocess.run(['echo', 'hi'], capture_output=True).stdout")
    assert tool.run(code) == "([1], b'hi\\n')"
    if tool.landlock:
        assert tool.run("import multiprocessing\nmultiprocessing.Lock()").endswith("PermissionError: [Errno 13] "
                                                                              "Permission denied")
