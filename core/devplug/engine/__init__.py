"""The lifecycle core: devices, tenancies and drivers, free of wire protocols. It imports no front end
(:mod:`devplug.frontends`) and nothing of the daemon that assembles it (:mod:`devplug.daemon`).

One :class:`~devplug.engine.resource.Resource` per configured resource, driven
through a front end; its modules, by unit:

* the resource: ``resource`` (one resource's life: start its driver, retried,
  then serve through its front end; narrow methods for the daemon),
  ``running`` (what needs the started driver, made whole together: the
  driver host, the lifecycle, the release queue),
  ``frontend`` (the ``FrontEnd`` protocol a wire front end implements),
  ``resourcestatus`` (its state, last error, registrations),
  ``resourcereport`` (its status-file entry and its metrics figures),
  ``statedir`` (the state folder and each resource's part of it),
  ``quarantine`` (an operator's request to clear quarantined records);
* the driver: ``driverhost`` (the started driver: device list, relists,
  degrade and recover, the health loop), ``driver`` (an async method per hook),
  ``hookrunner`` (hooks in a thread of their own, under ``hook_timeout``),
  ``supervise`` (long-running tasks restarted when they fail);
* the devices: ``devicetable`` (what is advertised, its cached encoding,
  change notification), ``sharing`` (replicas of shared devices and their
  tenants), ``partitions`` (parts of a parent and its counters: what fits
  now, KEP-4815; pure) and ``partguard`` (what is held of them, withheld,
  checked), ``cdi`` (CDI specs and the Allocate answers naming their devices;
  the spec file is written by what the daemon gives, ``CdiSpecFile``);
* the lifecycle, behind ``lifecycle`` (``DeviceLifecycle``, the core's
  interface to front ends): ``admission`` (choose, allocate, record, undo),
  ``choice`` (preferred allocation within what was offered), ``requestcheck``
  (a request's checks before any hook), ``guard`` (which devices a hook may
  touch now), ``devicelocks`` (one operation at a time per device),
  ``release`` (post-stop, deallocate, retried), ``releasequeue`` (releases a
  front end found due, gated on container exit, retried with backoff),
  ``keprelease`` (the KEP's device-by-device release), ``tenantexit`` and
  ``liveness`` (whether a tenancy's containers are gone, asked of the
  ``PodProbe`` the daemon gives: the core reads no cgroup itself);
* the ledger: ``ledger`` (allocation records, changed through its methods
  only), ``records`` (the immutable records), ``ledgerfile`` (the snapshot and
  the journal on disk), ``journal`` (the framed append-only journal);
* shared helpers: ``asynctools`` (events, slices, backoff, background tasks,
  daemon threads), ``serial`` (blocking calls in order in one thread),
  ``observer`` (the events a resource reports to the metrics).
"""


# --- the published interface ------------------------------------------------------------------------------------
# What code outside the engine (front ends, the daemon, the CLI, the test kit, drivers) may import: from
# ``devplug.engine`` itself, never from its modules (tests/test_architecture.py checks every file). Each name is
# loaded from its module when first asked for (PEP 562), so ``devplug status`` reading a state file does not import
# the whole engine. docs/internals/architecture.md lists the same names.

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: Each published name and the engine module that defines it, by what uses it.
PUBLISHED: dict[str, dict[str, str]] = {
    "what a front end drives and is told": {
        "DeviceLifecycle": "lifecycle",
        "FrontEnd": "frontend",
        "TenantEnd": "admission",
        "DraClaim": "admission",
        "ClaimTenant": "ledger",
        "AllocationRecord": "ledger",
        "DeviceTable": "devicetable",
        "ExitEvidence": "tenantexit",
        "ReleaseQueue": "releasequeue",
        "ResourceState": "resourcestatus",
        "ResourceStatus": "resourcestatus",
        "PodLiveness": "liveness",
        "PodState": "liveness",
    },
    "what the daemon assembles and reports": {
        "Resource": "resource",
        "RunningResource": "running",
        "Ledger": "ledger",
        "ResourceObserver": "observer",
        "NULL_OBSERVER": "observer",
        "DeviceCodec": "devicetable",
        "ResourceFigures": "resourcereport",
        "DeviceEntries": "resourcereport",
        "check_replaceable": "statedir",
        "prepare_state_dir": "statedir",
        "supervise": "supervise",
    },
    "CDI spec files (the DRA front end's claim specs, the daemon's clean-up)": {
        "SPEC_FILE_MODE": "cdi",
        "SPEC_FILE_PREFIX": "cdi",
        "CdiNameCollisionError": "cdi",
        "build_spec": "cdi",
        "cdi_device_name": "cdi",
        "spec_file_name": "cdi",
    },
    "what the CLI reads and asks offline": {
        "read_ledger_records": "ledger",
        "read_quarantined": "quarantine",
        "clear_offline": "quarantine",
        "write_clear_request": "quarantine",
    },
    "async helpers": {
        "BackgroundTasks": "asynctools",
        "Backoff": "asynctools",
        "SerialThread": "serial",
        "in_daemon_thread": "asynctools",
        "sliced": "asynctools",
        "wait_any": "asynctools",
    },
}
_MODULE_OF = {name: module for names in PUBLISHED.values() for name, module in names.items()}

if TYPE_CHECKING:
    from devplug.engine.admission import DraClaim, TenantEnd
    from devplug.engine.asynctools import BackgroundTasks, Backoff, in_daemon_thread, sliced, wait_any
    from devplug.engine.cdi import (
        SPEC_FILE_MODE,
        SPEC_FILE_PREFIX,
        CdiNameCollisionError,
        build_spec,
        cdi_device_name,
        spec_file_name,
    )
    from devplug.engine.devicetable import DeviceCodec, DeviceTable
    from devplug.engine.frontend import FrontEnd
    from devplug.engine.ledger import AllocationRecord, ClaimTenant, Ledger, read_ledger_records
    from devplug.engine.lifecycle import DeviceLifecycle
    from devplug.engine.liveness import PodLiveness, PodState
    from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
    from devplug.engine.quarantine import clear_offline, read_quarantined, write_clear_request
    from devplug.engine.releasequeue import ReleaseQueue
    from devplug.engine.resource import Resource
    from devplug.engine.resourcereport import DeviceEntries, ResourceFigures
    from devplug.engine.resourcestatus import ResourceState, ResourceStatus
    from devplug.engine.running import RunningResource
    from devplug.engine.serial import SerialThread
    from devplug.engine.statedir import check_replaceable, prepare_state_dir
    from devplug.engine.supervise import supervise
    from devplug.engine.tenantexit import ExitEvidence

# A name that is also its module's (``supervise``) is bound now: once the module is imported, Python sets the
# package attribute of that name to the module, which a lazy name would never replace.
from devplug.engine.supervise import supervise  # noqa: E402  (after PUBLISHED, which it does not need)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(
            f"module 'devplug.engine' has no attribute {name!r}: code outside the engine uses only the published "
            f"names (devplug.engine.__all__)"
        )
    value = getattr(import_module(f"devplug.engine.{module}"), name)
    globals()[name] = value  # asked once
    return value


__all__ = [
    "AllocationRecord",
    "BackgroundTasks",
    "Backoff",
    "build_spec",
    "cdi_device_name",
    "CdiNameCollisionError",
    "check_replaceable",
    "ClaimTenant",
    "clear_offline",
    "DeviceCodec",
    "DeviceEntries",
    "DeviceLifecycle",
    "DeviceTable",
    "DraClaim",
    "ExitEvidence",
    "FrontEnd",
    "in_daemon_thread",
    "Ledger",
    "NULL_OBSERVER",
    "PodLiveness",
    "PodState",
    "prepare_state_dir",
    "read_ledger_records",
    "read_quarantined",
    "ReleaseQueue",
    "Resource",
    "ResourceFigures",
    "ResourceObserver",
    "ResourceState",
    "ResourceStatus",
    "RunningResource",
    "SerialThread",
    "sliced",
    "SPEC_FILE_MODE",
    "SPEC_FILE_PREFIX",
    "spec_file_name",
    "supervise",
    "TenantEnd",
    "wait_any",
    "write_clear_request",
]
