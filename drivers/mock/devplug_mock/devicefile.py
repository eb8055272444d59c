"""One mock device file: which files are devices, and what their lines mean.

A device is a regular file (symlinks are not followed) whose name does not
start with ``.``; its name is the device ID. Each line of its content is one
directive, surrounding whitespace ignored:

``unhealthy`` (or ``unhealthy=<reason>``)
    the device is unhealthy (for that reason, shown in status and sent to the
    kubelet's DRA health stream);
``numa=N`` (or ``numa=N,M``)
    the device is attached to NUMA node ``N`` (and ``M``);
``replicas=N``
    the device is shared among ``N`` containers (:attr:`devplug.Device.replicas`),
    whatever the resource's ``replicas`` says;
``fail=<hook>[,<hook>...]``
    those hooks raise :class:`devplug.DriverError` naming the device;
``delay=<hook>:<seconds>``
    that hook sleeps that long before doing anything;
``crash=<hook>[,<hook>...]``
    right after those hooks returned (and the call was logged), the whole
    daemon process is killed with SIGKILL: the crash between a hook's return
    and the engine recording it, for crash tests.

The hooks ``fail``, ``delay`` and ``crash`` take are those in :data:`DIRECTIVE_HOOKS`.
Blank lines and lines starting with ``#`` are skipped. Any other line, or a
directive with a bad value, is ignored and reported in
:attr:`DeviceFile.problems`, which the driver logs with the file's name.
"""

from __future__ import annotations

import math
import os
import re
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from devplug import Device, Health, Topology
from devplug.types import MAX_REASON_CHARS

__all__ = [
    "DIRECTIVE_HOOKS",
    "DeviceFile",
    "is_device_name",
    "natural_key",
    "parse_device_file",
    "read_device_file",
]

#: The hooks that ``fail=`` and ``delay=`` apply to.
DIRECTIVE_HOOKS: tuple[str, ...] = (
    "preferred_allocation",
    "allocate",
    "pre_start",
    "post_stop",
    "deallocate",
)

_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class DeviceFile:
    """What one device file says: the device it describes and the test directives it carries."""

    id: str
    unhealthy: bool = False
    reason: str = ""
    numa_nodes: tuple[int, ...] = ()
    fail: frozenset[str] = frozenset()
    crash: frozenset[str] = frozenset()
    delays: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    problems: tuple[str, ...] = ()
    replicas: int | None = None

    @property
    def device(self) -> Device:
        """The device to advertise."""
        return Device(
            self.id,
            Health.UNHEALTHY if self.unhealthy else Health.HEALTHY,
            Topology(self.numa_nodes),
            reason=self.reason if self.unhealthy else "",
            replicas=self.replicas,
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.id,
                self.unhealthy,
                self.reason,
                self.numa_nodes,
                self.fail,
                self.crash,
                tuple(sorted(self.delays.items())),
                self.replicas,
            )
        )


def is_device_name(name: str) -> bool:
    """True for names that may be devices: not hidden, and a valid device ID."""
    if not name or name.startswith("."):
        return False
    return name.isprintable() and not any(c.isspace() for c in name)


def natural_key(name: str) -> tuple[list[str | int], str]:
    """Sort key putting ``mock2`` before ``mock10``."""
    parts: list[str | int] = [int(p) if i % 2 else p for i, p in enumerate(_DIGITS.split(name))]
    return parts, name


def _parse_numa(value: str) -> tuple[int, ...]:
    nodes = []
    for item in (part.strip() for part in value.split(",")):
        if not (item.isascii() and item.isdigit()):
            raise ValueError(f"numa={value}: {item!r} is not a NUMA node number (an integer >= 0)")
        nodes.append(int(item))
    return tuple(dict.fromkeys(nodes))


def _parse_hook(hook: str, line: str) -> str:
    if hook not in DIRECTIVE_HOOKS:
        raise ValueError(f"{line}: unknown hook {hook!r} (hooks: {', '.join(DIRECTIVE_HOOKS)})")
    return hook


def _parse_delay(value: str, line: str) -> tuple[str, float]:
    hook, sep, seconds_text = value.partition(":")
    if not sep:
        raise ValueError(f"{line}: expected delay=<hook>:<seconds>")
    hook = _parse_hook(hook.strip(), line)
    try:
        seconds = float(seconds_text)
    except ValueError:
        raise ValueError(f"{line}: {seconds_text.strip()!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{line}: the delay must be a finite number of seconds >= 0")
    return hook, seconds


def parse_device_file(device_id: str, text: str) -> DeviceFile:
    """Parse the content of the device file named ``device_id``."""
    unhealthy = False
    reason = ""
    numa: tuple[int, ...] = ()
    fail: set[str] = set()
    crash: set[str] = set()
    delays: dict[str, float] = {}
    problems: list[str] = []
    replicas: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        try:
            if line == "unhealthy":
                unhealthy = True
            elif sep and key == "unhealthy":
                if not value or len(value) > MAX_REASON_CHARS:
                    raise ValueError(f"{line}: the reason must have 1 to {MAX_REASON_CHARS} characters")
                unhealthy, reason = True, value
            elif sep and key == "numa":
                numa = _parse_numa(value)
            elif sep and key == "fail":
                fail.update(_parse_hook(h.strip(), line) for h in value.split(","))
            elif sep and key == "crash":
                crash.update(_parse_hook(h.strip(), line) for h in value.split(","))
            elif sep and key == "replicas":
                if not (value.isascii() and value.isdigit() and 1 <= int(value) <= 1024):
                    raise ValueError(f"{line}: the replicas must be an integer from 1 to 1024")
                replicas = int(value)
            elif sep and key == "delay":
                hook, seconds = _parse_delay(value, line)
                delays[hook] = seconds
            else:
                problems.append(f"line {number}: unknown directive {line!r}, ignored")
        except ValueError as exc:
            problems.append(f"line {number}: {exc}; ignored")
    return DeviceFile(
        id=device_id,
        unhealthy=unhealthy,
        reason=reason,
        numa_nodes=numa,
        fail=frozenset(fail),
        crash=frozenset(crash),
        delays=MappingProxyType(delays),
        problems=tuple(problems),
        replicas=replicas,
    )


#: A file changed more recently than this is always read again: file times tick coarsely (a few ms), so two
#: writes of the same size within one tick would look alike to the cache.
SETTLED_S = 1.0

_Stamp = tuple[int, int, int, int, int]
_cache: dict[str, tuple[_Stamp, DeviceFile]] = {}
_cache_lock = threading.Lock()


def read_device_file(directory: Path, name: str) -> DeviceFile | None:
    """Read and parse ``directory/name``; ``None`` when it is not (or no longer) a device file.

    Parsed files are cached by path, keyed on device, inode, size and
    modification time, and used again while those hold, unless the file
    changed within the last :data:`SETTLED_S` seconds: every hook reads its
    devices' directives, and re-parsing 1,000 files per call was most of a
    GetPreferredAllocation's time.
    """
    if not is_device_name(name):
        return None
    path = directory / name
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    key = str(path)
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # ctime: no one can set it back
    settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLED_S * 1e9
    with _cache_lock:
        cached = _cache.get(key)
    if settled and cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    parsed = parse_device_file(name, text)
    if settled:
        with _cache_lock:
            _cache[key] = (stamp, parsed)
    return parsed
