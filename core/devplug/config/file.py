"""Reading a config file safely: a regular file of bounded size, opened without blocking.

``devplug run``, ``devplug check-config``, a reload (SIGHUP) and ``devplug
reload --config`` all read the operator's TOML through :func:`read_config_bytes`.
A path that names a FIFO would block ``open()`` until a writer comes (for ever,
and with it the reload and the daemon's exit); a character device such as
``/dev/zero`` would be read without end; a file of hundreds of megabytes would
be parsed while holding the interpreter's lock, stalling every gRPC answer for
seconds. So the path is checked with ``stat`` before it is opened (opening some
devices has effects of its own), opened with ``O_NONBLOCK`` (should it have been
swapped for a FIFO in between), checked again on the open file, and read only
up to :data:`MAX_CONFIG_BYTES`. Symbolic links are followed: a Kubernetes
ConfigMap mounts its keys as links.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from devplug.errors import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "read_config_bytes"]

#: The largest config file devplug reads: a config of a thousand resources is smaller. Parsing holds the interpreter's
#: lock (the reload's parse delays every gRPC answer meanwhile): tomllib took 0.29 s for 1 MiB of resource tables
#: here, so about 75 ms at this limit.
MAX_CONFIG_BYTES = 256 * 1024

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a unix socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{path}: the config file is {_kind(st.st_mode)}, not a regular file; devplug reads its config only "
            "from a regular file (a symbolic link to one is fine), nothing was read"
        )
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(_too_large(path, st.st_size))


def _size(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB" if size >= 1024 * 1024 else f"{size} bytes"


def _too_large(path: Path, size: int | None) -> str:
    shown = _size(size) if size is not None else "larger than that"
    return (
        f"{path}: the config file is {shown}; devplug reads config files of at most {MAX_CONFIG_BYTES} bytes "
        f"({MAX_CONFIG_BYTES // 1024} KiB), "
        "nothing was read"
    )


def read_config_bytes(path: Path) -> bytes:
    """The bytes of the config file at ``path``; :class:`ConfigError` naming the file when it cannot be read, is
    not a regular file or is larger than :data:`MAX_CONFIG_BYTES`. Never blocks on a FIFO or a device."""
    try:
        _check(path, os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from exc
    try:
        _check(path, os.fstat(fd))  # the file opened, should the path have been replaced since the stat
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:  # it grew while being read
        raise ConfigError(_too_large(path, None))
    return b"".join(chunks)
