"""A recording stand-in for any driver: its hook calls recorded for tests, with no code in the driver.

:func:`recording_driver` makes a driver class that holds an instance of the
real one and calls it for every hook, noting each call as it starts and
recording it when it ends (with the exception's message if it raised) in a
:class:`devplug.testing.recorder.HookRecorder` file: what
:func:`devplug.testing.recorder.read_hook_calls` reads back, and what
:class:`devplug.testing.conformance.DriverConformance` watches. Everything
else is the real driver's: its ``Options`` (so the config is checked as it
would be), its ``hook_contract``, its ``check_resources``, which hooks it
implements and with which arguments (so the engine calls the stand-in exactly
as it calls the driver), and any other attribute (``nonblocking_hooks``, ...).

In a unit test, build the stand-in where you would build the driver::

    from devplug.testing.recording import recording_driver
    from devplug.testing.recorder import read_hook_calls

    Recorded = recording_driver(NvmeDriver, tmp_path / "calls")
    driver = Recorded(NvmeDriver.Options(...))          # driver.wrapped is the NvmeDriver
    ...
    assert [c.hook for c in read_hook_calls(tmp_path / "calls")] == ["start", "list_devices", ...]

For a daemon under test (a child process, which finds drivers by entry point),
:func:`recording_entry_point` writes a small module declaring the stand-in of
an installed driver, for ``devplug_daemon(..., test_drivers=...)``;
``DriverConformance`` does it for you when its ``records_itself`` is False.

What a record holds, per hook: ``device_ids`` (the call's devices; for
``preferred_allocation`` the available ones, with ``must_include`` and
``size`` as extra fields; for ``check_health`` the devices probed; none for
``start``, ``stop`` and ``list_devices``), ``retry`` for the release hooks,
and for shared devices the call's ``replicas`` and ``tenants``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devplug.hookspecs import PROJECT_NAME
from devplug.kit.hookrecord import CALLS_FILE, HookRecorder
from devplug.types import Device, Replicas

__all__ = ["RecordingDriver", "driver_class_named", "recording_driver", "recording_entry_point"]

_MARKER = f"{PROJECT_NAME}_impl"


def _hooks_of(cls: type) -> list[str]:
    from devplug.drivers import HOOK_NAMES

    return [name for name in HOOK_NAMES if hasattr(getattr(cls, name, None), _MARKER)]


def _shared(replicas: object) -> dict[str, Any]:
    """What a record says about shared devices (nothing when the call's devices are not shared)."""
    if not isinstance(replicas, Replicas) or not replicas.shared:
        return {}
    return {
        "replicas": {dev: list(ids) for dev, ids in replicas.by_device.items()},
        "tenants": dict(replicas.tenants),
    }


def _ids(devices: object) -> list[str]:
    return [d.id if isinstance(d, Device) else str(d) for d in devices or ()]  # type: ignore[attr-defined]


def _what(hook: str, arguments: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The device IDs and extra fields of a call's record."""
    if hook == "preferred_allocation":
        extra = {"must_include": list(arguments.get("must_include", ())), "size": arguments.get("size")}
        return _ids(arguments.get("available")), {**extra, **_shared(arguments.get("replicas"))}
    if hook == "check_health":
        return _ids(arguments.get("devices")), {}
    if "device_ids" in arguments:
        return list(arguments["device_ids"]), _shared(arguments.get("replicas"))
    return [], {}


class RecordingDriver:
    """The base of every class :func:`recording_driver` makes: an instance holds the real driver (:attr:`wrapped`)
    and a :class:`~devplug.testing.recorder.HookRecorder` (:attr:`recorder`)."""

    #: The real driver class.
    wrapped_class: type
    #: Where the calls are recorded.
    calls_dir: Path
    #: The record's file name in :attr:`calls_dir`.
    calls_file: str = CALLS_FILE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls_dir.mkdir(parents=True, exist_ok=True)
        #: The record of this instance's hook calls.
        self.recorder = HookRecorder(self.calls_dir, self.calls_file)
        #: The real driver, built from the same arguments (the engine passes the options when the class has
        #: ``Options``; a test may pass what else the driver's constructor takes).
        self.wrapped = self.wrapped_class(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this object lacks: the real driver's attributes (nonblocking_hooks, ...).
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return f"<recording {self.wrapped!r} in {self.calls_dir}>"


#: Hook arguments a driver may leave out of its signature (it is then called without them): the stand-in takes
#: them anyway, to record them (``retry``), and passes them on only to a driver that declares them.
_OPTIONAL_ARGUMENTS = ("retry", "replicas", "claim")
_MISSING: Any = object()


def _call_wrapped(self: RecordingDriver, hook: str, declared: frozenset[str], arguments: dict[str, Any]) -> Any:
    """Record one call of ``hook`` with ``arguments`` (the contract's), calling the real driver with those it
    ``declared``."""
    given = {name: value for name, value in arguments.items() if value is not _MISSING}
    device_ids, extra = _what(hook, given)
    with self.recorder.call(hook, device_ids, retry=given.get("retry") is True, extra=extra):
        return getattr(self.wrapped, hook)(**{name: v for name, v in given.items() if name in declared})


def _recording_hook(cls: type, hook: str) -> Callable[..., Any]:
    """A method recording each call of ``hook`` and calling the real driver's: it takes every argument of the
    contract's hook (so it sees ``retry`` even where the driver does not declare it), keeps the driver's hookimpl
    options, and passes the driver the arguments it declares."""
    from devplug import hookspecs

    original = getattr(cls, hook)
    function = original.__func__ if inspect.ismethod(original) else original
    opts = dict(getattr(function, _MARKER, {}))
    if opts.get("hookwrapper") or opts.get("wrapper"):

        @functools.wraps(function)
        def passing(self: RecordingDriver, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.wrapped, hook)(*args, **kwargs)

        return passing
    declared = frozenset(list(inspect.signature(function).parameters)[1:])
    params = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    written = ", ".join(["self", *(f"{p}=_MISSING" if p in _OPTIONAL_ARGUMENTS else p for p in params)])
    passed = ", ".join(f"{p!r}: {p}" for p in params)
    namespace: dict[str, Any] = {"_MISSING": _MISSING, "_call": _call_wrapped, "_declared": declared}
    exec(  # a def with the contract's own parameter names: pluggy reads which arguments a hook takes from its code
        f"def {hook}({written}):\n    return _call(self, {hook!r}, _declared, {{{passed}}})\n", namespace
    )
    recording: Callable[..., Any] = namespace[hook]
    recording.__doc__ = function.__doc__
    recording.__qualname__ = f"RecordingDriver.{hook}"
    setattr(recording, _MARKER, opts)
    return recording


def _passing_check(check: Callable[..., None]) -> Callable[..., None]:
    """The stand-in's ``check_resources``: it takes ``settings`` (so the engine offers them) and passes them on
    only when the real driver's declares them, as the engine would."""
    from devplug.drivers.construction import takes_settings

    takes = takes_settings(check)

    def check_resources(_cls: type, options: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> None:
        if takes and settings is not None:
            check(options, settings=settings)
        else:
            check(options)

    return check_resources


def recording_driver(driver_class: type, calls_dir: Path, *, calls_file: str = CALLS_FILE) -> type[RecordingDriver]:
    """A stand-in for ``driver_class`` recording every hook call in ``calls_dir / calls_file`` (see the module
    docstring). Its instances take what ``driver_class`` takes and build one of it."""
    namespace: dict[str, Any] = {
        "wrapped_class": driver_class,
        "calls_dir": Path(calls_dir),
        "calls_file": calls_file,
        "__doc__": f"{driver_class.__qualname__}, its hook calls recorded in {calls_dir} (devplug.testing.recording).",
        "__module__": __name__,
    }
    for attribute in ("Options", "hook_contract"):
        if attribute in dir(driver_class):
            namespace[attribute] = getattr(driver_class, attribute)
    check = getattr(driver_class, "check_resources", None)
    if check is not None:
        namespace["check_resources"] = classmethod(_passing_check(check))
    for hook in _hooks_of(driver_class):
        namespace[hook] = _recording_hook(driver_class, hook)
    made: type[RecordingDriver] = type(f"Recording{driver_class.__name__}", (RecordingDriver,), namespace)
    return made


def driver_class_named(name: str) -> type:
    """The installed driver class of entry-point name ``name``, checked as the daemon checks it (its contract, its
    ``list_devices``); :class:`devplug.errors.DriverNotFoundError` names the installed ones."""
    from devplug.drivers import load_driver_class

    return load_driver_class(name)


def recording_entry_point(folder: Path, driver: str, calls_dir: Path) -> tuple[str, str]:
    """Declare the recording stand-in of the driver named ``driver`` for a daemon under test.

    Writes a module into ``folder`` (the folder
    :func:`devplug.testing.entrypoints.entry_point_env` puts first on the
    child's ``PYTHONPATH``; the ``devplug_daemon`` fixture's is
    ``devplug_root / "test-drivers"``) whose class loads ``driver`` by its entry
    point when the daemon imports it, and returns ``(name, "module:Class")``
    for ``test_drivers``: configure the resource with ``driver = name``.
    """
    stem = re.sub(r"[^A-Za-z0-9_]", "_", driver)
    module = f"devplug_recording_{stem}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(
        f'"""The recording stand-in of driver {driver!r} (written by devplug.testing.recording)."""\n\n'
        "from pathlib import Path\n\n"
        "from devplug.testing.recording import driver_class_named, recording_driver\n\n"
        f"Driver = recording_driver(driver_class_named({driver!r}), Path({str(calls_dir)!r}))\n"
    )
    return f"{driver}-recorded", f"{module}:Driver"
