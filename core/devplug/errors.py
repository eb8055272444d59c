"""devplug's exceptions, one tree.

::

    DevplugError                      anything devplug raises on purpose
    ├── ConfigError                   bad config file or driver options (names file, resource, key)
    ├── DriverNotFoundError(ConfigError)  no installed driver by that name (lists the installed ones)
    ├── DriverLoadError               a driver's distribution failed to import or is malformed
    ├── DriverError                   a driver hook failed; drivers raise this for expected failures
    │   └── HookTimeoutError          a driver hook did not return within its timeout
    ├── RequestError                  a kubelet request that cannot be served (unknown, unhealthy
    │                                 or duplicate device IDs); nothing was done
    │   └── DeviceBusyError           the devices are still in use or being worked on (the previous
    │                                 tenant's containers still run, a hook on them has not
    │                                 returned); nothing was done
    ├── AllocationConflictError       two contributions to one container allocation disagree
    ├── StateError                    the daemon's own files (lock, ledger) cannot be used
    │   ├── StateWriteError           a state file could not be written (full disk): request refused
    │   └── AlreadyRunningError       another daemon holds the state dir's lock
    ├── KubeApiError                  an API server's answer that cannot be used: later than the call's
    │                                 deadline, larger than the cap, a redirect (devplug.kube.client)
    └── KubeletError                  the dev kubelet refused or failed a request

Expected errors (bad config, bad requests, a driver saying no) carry a message
meant for the operator. Only ``devplug.cli`` (the command line) turns them into exit codes.
"""

from __future__ import annotations

from typing import Any


class DevplugError(Exception):
    """Base class of every error devplug raises on purpose."""


class ConfigError(DevplugError):
    """The config file or a driver's options are invalid.

    The message names the file, the resource and the key, and gives a hint.
    """


class DriverNotFoundError(ConfigError):
    """No installed driver has the requested name."""


class DriverLoadError(DevplugError):
    """An installed driver could not be loaded (import error, not a driver class)."""


class DriverError(DevplugError):
    """A driver hook failed.

    Drivers raise it (or a subclass) for expected failures, with a message that
    names the device; the engine reports the message to the kubelet and the log.
    When the engine re-raises a hook's failure it prefixes the resource and the
    hook, and keeps them apart in ``hook`` and ``reason`` (the driver's own
    words), which are None on an error a driver raised itself.
    """

    hook: str | None = None
    reason: str | None = None


class HookTimeoutError(DriverError):
    """A driver hook did not return within its configured timeout.

    ``still_running`` is the abandoned call (an ``asyncio.Future``) when the
    engine raised it: what the hook did once it returns may need undoing.
    """

    still_running: Any = None


class RequestError(DevplugError):
    """A kubelet request names devices that cannot be served; nothing was done."""


class DeviceBusyError(RequestError):
    """The devices of a request are still in use, or a driver hook on them has not returned; nothing was done.

    The kubelet gets ``FAILED_PRECONDITION``: the request may succeed later, once the previous tenant's containers
    exited or the hook returned.
    """


class AllocationConflictError(DevplugError):
    """Two contributions to one container's allocation set the same env key or container path."""


class StateError(DevplugError):
    """The daemon's state directory, lock or ledger cannot be used."""


class StateWriteError(StateError):
    """A state file (the allocation ledger) could not be written: a full disk, a quota, an I/O error.

    ``no_space`` is True for the errors more space would cure (ENOSPC, EDQUOT,
    EFBIG). The request that needed the write was not served and changed nothing.
    """

    def __init__(self, message: str, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space


class AlreadyRunningError(StateError):
    """Another devplug daemon holds the lock on the state directory."""


class KubeApiError(DevplugError):
    """An API server's answer that devplug cannot use: it did not come whole within the call's deadline, it is
    larger than devplug reads, or it is a redirect. The message names the request (method and path)."""


class KubeletError(DevplugError):
    """The dev kubelet refused a request or a plugin call failed during it."""
