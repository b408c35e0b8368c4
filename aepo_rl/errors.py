"""User errors: mistakes in what the user gave, reported by ``aepo`` as one line, never a traceback.

Raise :class:`UserError` (or a subclass: ``ConfigError``, ``DatasetError``, ``JsonlError``,
``EndpointError``, ...) where the mistake is detected, with a message that names the file, line,
key or argument at fault and the fix. ``aepo`` prints it to stderr and exits with status 2; any
other exception is an internal error (status 1), whose traceback ``--debug`` or ``AEPO_DEBUG=1``
shows. This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


class UserError(Exception):
    """A file, folder, data row, model, endpoint, argument or config key the user gave is wrong; the
    message names it and the fix."""


class MissingExtraError(UserError, ModuleNotFoundError):
    """An optional dependency is not installed; the message names the ``pip install -e '.[extra]'`` to run in the
    aepo-rl clone."""


def import_extra(module: str, extra: str, what: str):
    """``module`` imported, or a :class:`MissingExtraError` saying that ``what`` needs it and which extra
    installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f"{what} needs {module.split('.')[0]}: pip install -e '.[{extra}]' in the aepo-rl "
                                "clone") from None


class EndpointError(UserError, ConnectionError):
    """A server the user named (``--endpoint``, ``rollout.engine_url``, ``task.judge_url``) is unreachable or
    refused the request; the message names its URL and how to start it."""


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_NOT_ALLOWED = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_FOUND = {errno.ENOENT, errno.ENOTDIR}


DISK_NEARLY_FULL_BYTES = 64 * 2**20
"""Free space under which a library's failed write is taken for a full disk."""


@contextlib.contextmanager
def disk_full_as_oserror(path: str | Path) -> Iterator[None]:
    """Turn a write failure that a library reports in its own words (torch's "PytorchStreamWriter
    failed writing file", safetensors' I/O error) into ``OSError(ENOSPC)`` naming ``path`` when the
    disk that holds ``path`` has less than :data:`DISK_NEARLY_FULL_BYTES` free, so ``aepo`` reports
    "disk full writing <path>" instead of the library's message. Any other failure passes unchanged."""
    try:
        yield
    except OSError:
        raise
    except Exception as err:
        folder = Path(path)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if shutil.disk_usage(folder).free < DISK_NEARLY_FULL_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise


def os_error_message(err: OSError) -> str | None:
    """One line for an OSError the user can fix (disk full, permission denied, missing path), else None.

    An OSError raised with a message and no errno (``FileNotFoundError("--resume runs/x: no
    config.yaml there ...")``) is a message for the user and is returned as it is.
    """
    path = err.filename
    if err.errno is None:
        return str(err) if isinstance(err, (FileNotFoundError, FileExistsError, NotADirectoryError,
                                            IsADirectoryError, PermissionError)) else None
    if err.errno in _DISK_FULL:
        where = f" writing {path}" if path is not None else ""
        return f"disk full{where} ({err.strerror}): free some space or write somewhere else (trainer.run_dir, --out)"
    if path is None:
        return None
    if err.errno in _NOT_ALLOWED:
        return (f"cannot write {path}: permission denied; choose a folder you can write to "
                "(trainer.run_dir, --out) or change its permissions")
    if err.errno in _NOT_FOUND:
        return f"{path}: no such file or folder; check the path"
    if err.errno == errno.EISDIR:
        return f"{path} is a folder; give a file"
    return None


def check_writable(path: str | Path, what: str) -> Path:
    """Raise UserError unless ``path`` (a file or folder, existing or not) could be created or
    written: checked before long work starts, so an unwritable ``--out`` fails at once.

    ``what`` names the option or key that gave the path ("--out", "trainer.run_dir").
    """
    path = Path(path).expanduser()
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise UserError(f"{what}={path}: {existing} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        raise UserError(f"{what}={path}: cannot write {existing}: permission denied; choose a folder you can "
                        "write to or change its permissions")
    return path
