"""The daemon's state folder: creating its parts, refusing planted links and foreign folders, moving old layouts.

::

    <state dir>/                     [state] dir
        devplug.lock                 the daemon lock (lock.py)
        status.json                  what ``devplug status`` reads
        resources/<domain>/<name>/   one resource's state (devplug.kube.names.resource_state_dir)
            ledger.json              its allocation ledger
            driver/                  its driver's own files

Every folder here must be a real folder (not a symbolic link) owned by the
daemon's user; devplug creates missing ones with mode 0700. A link or a
foreign folder is a :class:`~devplug.errors.StateError` naming the path and
what to do, and nothing is written through it: a planted link would
otherwise have the daemon write its ledger, or its PID, wherever it points.

State files are read one way, by the daemon and by every ``devplug`` command
(:func:`read_state_file`): opened without blocking or following a link, and
read only when ``fstat`` shows a regular file of the daemon's user, so a FIFO
planted as ``ledger.json`` is an error naming it, never a read that waits for
ever. A command that only reads finds a resource's folder with
:func:`existing_resource_dir`, which checks what the daemon checks and creates
nothing.

Earlier versions named a resource's folder after its socket file
(``resources/devplug-<domain>_<name>``, or a hash when the plugin folder's
path was long), so changing ``device_plugin_dir`` moved the state and lost
the ledger. :func:`prepare_resource_dir` moves such a folder to its place.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from devplug.errors import StateError
from devplug.kube.names import legacy_state_folder_names, resource_state_dir

__all__ = [
    "check_own_dir",
    "check_replaceable",
    "check_state_file",
    "ensure_own_dir",
    "existing_resource_dir",
    "prepare_resource_dir",
    "prepare_state_dir",
    "read_state_file",
]

log = logging.getLogger("devplug.engine")

_REMEDY = "devplug does not follow links in its state dir; make it a real folder owned by the daemon's user"


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def check_own_dir(path: Path, what: str) -> None:
    """Refuse (:class:`StateError`) ``path`` unless it is a folder, not a link, owned by the daemon's user."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StateError(f"{path}: cannot use {what}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{path}: {what} is a symbolic link (to {_link_target(path)}); {_REMEDY}")
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path}: {what} is not a folder; move it away or point [state] dir elsewhere")
    if st.st_uid != os.geteuid():
        raise StateError(
            f"{path}: {what} belongs to uid {st.st_uid}, not to the daemon's user (uid {os.geteuid()}); "
            "chown it or run the daemon as its owner"
        )


def ensure_own_dir(path: Path, what: str) -> None:
    """Create ``path`` (mode 0700) when missing, then :func:`check_own_dir` it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateError(f"{path}: cannot create {what}: {exc.strerror or exc}") from exc
    check_own_dir(path, what)


def check_state_file(path: Path, what: str) -> None:
    """Refuse a link, or anything but a regular file of the daemon's user, at ``path`` (missing is fine)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StateError(f"{path}: cannot use {what}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{path}: {what} is a symbolic link (to {_link_target(path)}); {_REMEDY}")
    if not stat.S_ISREG(st.st_mode):
        raise StateError(f"{path}: {what} is not a regular file; move it away")
    if st.st_uid != os.geteuid():
        raise StateError(f"{path}: {what} belongs to uid {st.st_uid}, not to the daemon's user (uid {os.geteuid()})")


def read_state_file(path: Path, what: str) -> bytes:
    """The bytes of the state file ``path``, read as :func:`check_state_file` would allow: opened with
    ``O_NONBLOCK`` and ``O_NOFOLLOW``, and read only when ``fstat`` shows a regular file of the daemon's user.
    :class:`FileNotFoundError` when it is missing; :class:`StateError` naming it for anything else (a FIFO, a
    device, a link, a folder, another user's file, an error while reading)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateError(f"{path}: {what} is a symbolic link (to {_link_target(path)}); {_REMEDY}") from exc
        raise StateError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateError(f"{path}: {what} is not a regular file; move it away")
        if st.st_uid != os.geteuid():
            raise StateError(
                f"{path}: {what} belongs to uid {st.st_uid}, not to the daemon's user (uid {os.geteuid()})"
            )
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise StateError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def check_replaceable(path: Path, what: str) -> None:
    """Refuse a folder at ``path``, a file only ever replaced whole (a link or anything else there is replaced)."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path}: {what} is a folder; move it away")


def prepare_state_dir(state_dir: Path) -> None:
    """Create the state dir (its missing parents as usual) and check it is the daemon's own folder."""
    try:
        state_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"{state_dir}: cannot create the state dir's parent: {exc.strerror or exc}") from exc
    ensure_own_dir(state_dir, "the state dir ([state] dir)")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ledger_age(folder: Path) -> float:
    with contextlib.suppress(OSError):
        return os.lstat(folder / "ledger.json").st_mtime
    return 0.0


def _migrate(resources: Path, resource_name: str, target: Path) -> None:
    """Move the resource's folder of an earlier layout to ``target`` (when ``target`` does not exist yet)."""
    try:
        if not any(name.startswith("devplug-") for name in os.listdir(resources)):
            return  # no earlier layout here (and no hashing needed to know it)
    except FileNotFoundError:
        return
    found = [resources / n for n in legacy_state_folder_names(resource_name) if os.path.lexists(resources / n)]
    if not found:
        return
    for old in found:
        check_own_dir(old, f"the state folder of {resource_name} (earlier layout)")
    if os.path.lexists(target):
        for old in found:
            log.warning(
                "[%s] ignoring %s, a state folder of an earlier layout: %s is in use; remove it once you checked it",
                resource_name,
                old,
                target,
            )
        return
    newest = max(found, key=_ledger_age)
    try:
        os.rename(newest, target)
        _fsync_dir(target.parent)
        _fsync_dir(resources)
    except OSError as exc:
        raise StateError(f"{newest}: cannot move it to {target}: {exc.strerror or exc}") from exc
    log.info("[%s] moved its state from %s to %s (state is now keyed by resource name)", resource_name, newest, target)
    for old in found:
        if old != newest:
            log.warning(
                "[%s] also found %s, an older state folder of an earlier layout; its ledger was NOT taken over "
                "(the reconciler adopts what pods still hold); remove it once you checked it",
                resource_name,
                old,
            )


def prepare_resource_dir(state_dir: Path, resource_name: str) -> Path:
    """Make ``<state dir>/resources/<domain>/<name>`` and its ``driver`` folder ready; return the folder.

    Moves a folder of the earlier, socket-named layout into place first, and
    refuses links and foreign folders anywhere on the way, and a ledger file
    that is a link.
    """
    resources = state_dir / "resources"
    target = resource_state_dir(state_dir, resource_name)
    ensure_own_dir(resources, "the resources folder of the state dir")
    ensure_own_dir(target.parent, f"the state folder of {resource_name}'s domain")
    _migrate(resources, resource_name, target)
    ensure_own_dir(target, f"the state folder of {resource_name}")
    ensure_own_dir(target / "driver", f"the driver's state folder of {resource_name}")
    check_state_file(target / "ledger.json", f"the allocation ledger of {resource_name}")
    return target


def existing_resource_dir(state_dir: Path, resource_name: str) -> Path | None:
    """``<state dir>/resources/<domain>/<name>`` as :func:`prepare_resource_dir` checks it (real folders of the
    daemon's user, a ledger that is a regular file), creating nothing; None when a folder on the way is missing
    (the resource never ran with this state dir). For commands that read or leave a request."""
    target = resource_state_dir(state_dir, resource_name)
    steps = [
        (state_dir, "the state dir ([state] dir)"),
        (state_dir / "resources", "the resources folder of the state dir"),
        (target.parent, f"the state folder of {resource_name}'s domain"),
        (target, f"the state folder of {resource_name}"),
    ]
    for folder, what in steps:
        if not os.path.lexists(folder):
            return None
        check_own_dir(folder, what)
    check_state_file(target / "ledger.json", f"the allocation ledger of {resource_name}")
    return target
