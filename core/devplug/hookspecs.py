"""The driver contract: every hook devplug calls on a driver, when, and what it returns.

A driver is a class, published in the entry-point group ``devplug.drivers``
under the name operators write in the config (``driver = "mock"``). For each
configured resource the engine builds one instance, ``DriverClass(options)``,
where ``options`` is an instance of the class attribute ``Options`` (a
dataclass describing the driver's option schema; see :mod:`devplug.options`),
and registers it in a plugin manager of that resource alone. Hooks are
methods marked with :data:`devplug.hookimpl`; only ``list_devices`` is
required. Which optional hooks a driver implements decides what the engine
advertises to the kubelet (``pre_start_required``,
``get_preferred_allocation_available``, and the KEP's ``post_stop_required``
and ``deallocate_available``).

Besides ``Options``, a driver class may define a classmethod
``check_resources(options: Mapping[str, Options], settings: Mapping[str, ResourceSettings]) -> None``
(``settings`` optional), called when the config is checked (``devplug
check-config`` and daemon start) with the options of every resource that uses
the driver, by resource name, and their :class:`devplug.ResourceSettings`
(``hook_timeout``, ``health_interval``, ``replicas``). It raises
``ValueError`` (or :class:`devplug.ConfigError`) for what no single
resource's options can show, such as two resources selecting the same
device, or a cleaning timeout longer than ``hook_timeout``; the message
becomes a config error naming those resources. And a class attribute
``health_interval`` (seconds) is the driver's default for resources whose
config sets none (``check_health`` is then called that often; 0 or absent:
never, unless the config sets it).

How hooks are called:

* Hooks are plain (blocking) functions. The engine runs them off its event
  loop, in a thread of the resource's own, one hook at a time per driver
  instance, each under the resource's ``hook_timeout``. A hook that exceeds it
  is abandoned by its caller (its thread left to finish, a fresh thread serving
  the next hook, so other devices' hooks may then run beside it) and counts as
  failed; its devices stay out of service, and no other hook is called on them,
  until it really returns. The engine never calls two hooks on one device at
  once; a driver may let hooks on *different* devices run concurrently (take
  a lock only around its own shared state, not around slow device work).
* A hook fails by raising; :class:`devplug.DriverError` carries an expected
  failure whose message reaches the kubelet and the log. Anything else is
  logged with its traceback. What a failure does is said in each hook's
  docstring ("Raising ..."): no failure ever hands an uncleaned device to
  another pod.
* Device IDs are the IDs the driver advertised. The engine validates every
  kubelet request against the device table before a hook sees it, so
  ``allocate`` never gets an unknown, unhealthy or duplicate ID.
* Shared devices (``replicas = N`` in the resource's config, or
  :attr:`devplug.Device.replicas`): the kubelet sees each device as N
  replicas, ``<id>::0`` .. ``<id>::<N-1>``, and several containers may hold
  replicas of one device. Hooks still get the driver's own (physical) device
  IDs, each once; the optional argument ``replicas``
  (:class:`devplug.Replicas`) says which replica IDs the call is about and
  how many other tenants share each device. Declare ``replicas`` in a hook's
  signature to receive it; hooks without it are called the same way. On a
  resource without sharing nothing changes: the IDs are the advertised ones
  and ``replicas`` maps each to itself.

Phases, in the order a resource goes through them: start → list_devices →
(check_health)* → per pod: preferred_allocation → allocate → pre_start* →
post_stop → deallocate → … → stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import pluggy

from devplug.context import DriverContext
from devplug.types import Claim, ContainerAllocation, Device, Health, HealthReport, Replicas, ResourceSettings

PROJECT_NAME = "devplug"

_hookspec = pluggy.HookspecMarker(PROJECT_NAME)

# --- what a driver class is -----------------------------------------------------


@runtime_checkable
class DriverClass(Protocol):
    """A driver class, as published in the entry-point group ``devplug.drivers``.

    ``Options`` (optional) is a dataclass describing the driver's options; the
    core checks each resource's ``options`` table against it (see
    :mod:`devplug.options`) and constructs one instance per resource with it,
    ``DriverClass(options)``; a class without ``Options`` is constructed with
    no argument. Hooks are methods marked ``@hookimpl`` named after the specs
    below; ``list_devices`` is required. ``hook_contract`` names the version of
    this contract the class was written against (see :mod:`devplug.contract`).
    ``health_interval`` (optional, seconds) is the default for resources whose
    config sets none.

    Example::

        class FpgaDriver:
            hook_contract = "1.0"

            @dataclass(frozen=True)
            class Options:
                cards: int = 1

            def __init__(self, options: Options) -> None:
                self.options = options

            @hookimpl
            def list_devices(self):
                return [Device(f"fpga{i}") for i in range(self.options.cards)]
    """

    Options: ClassVar[type[Any]]

    def __init__(self, options: Any) -> None: ...


@runtime_checkable
class ChecksResources(Protocol):
    """A driver class that checks all of its resources together when the config is checked.

    ``check_resources(options, settings)`` is a classmethod, called by ``devplug
    check-config`` and at daemon start with every resource's options that use
    the driver, by resource name, and (when it declares the ``settings``
    parameter; drivers without it are called with the options alone) each
    resource's :class:`devplug.ResourceSettings`. It raises ``ValueError`` (or
    :class:`devplug.ConfigError`) for what no single resource shows.

    Example::

        @classmethod
        def check_resources(cls, options, settings):
            seen = {}
            for resource, opts in options.items():
                if opts.erase_timeout > settings[resource].hook_timeout:
                    raise ValueError(f"{resource}: erase_timeout is longer than hook_timeout")
                for card in opts.cards:
                    if card in seen:
                        raise ValueError(f"card {card} is claimed by {seen[card]} and {resource}")
                    seen[card] = resource
    """

    @classmethod
    def check_resources(cls, options: Mapping[str, Any], settings: Mapping[str, ResourceSettings]) -> None: ...


# --- driver instance lifecycle ------------------------------------------------


@_hookspec
def start(ctx: DriverContext) -> None:
    """Set the driver instance up before its resource is served.

    Called once, when the daemon starts the resource and before the first
    ``list_devices``. Check what the driver needs (kernel modules, sysfs
    access, vendor tools), start watcher threads that push device changes
    through ``ctx``, and keep ``ctx`` for later. Raise :class:`devplug.DriverError`
    with a clear message if the driver cannot work: the resource is then not
    registered, and the engine retries ``start`` with backoff. Returns nothing
    (a value returned is ignored).

    Example::

        @hookimpl
        def start(self, ctx):
            self.ctx = ctx  # push changes later with ctx.update_devices(...)
            self.watcher = start_watching(self.options.folder, on_change=ctx.request_relist)
    """


@_hookspec
def stop() -> None:
    """Tear the driver instance down.

    Called once, when the daemon shuts down (SIGTERM/SIGINT) or a reload
    restarts or removes the resource, after the resource stopped serving,
    and only if ``start`` succeeded. Stop watcher
    threads and release handles; do not release devices held by pods, which
    stay allocated across daemon restarts. Returns nothing (a value returned is
    ignored). Raising is logged; the shutdown goes on.

    Example::

        @hookimpl
        def stop(self):
            self.watcher.close()
    """


# --- devices and health -----------------------------------------------------


@_hookspec(firstresult=True)
def list_devices() -> Sequence[Device]:
    """Return every device of the resource, healthy or not. Required.

    Called after ``start``, after the driver asks for it
    (``ctx.request_relist()``), and when the engine recovers the resource after
    a failed hook. The first non-``None`` result is used; it replaces the
    device table. Device IDs must be unique.

    Raising (or a list with a bad or duplicate ID) degrades the resource: every
    device is advertised unhealthy, and ``list_devices`` is called again with
    backoff until it answers; pods holding devices keep them, releases go on.

    Example::

        @hookimpl
        def list_devices(self):
            return [Device(name, topology=Topology((numa_of(name),))) for name in self.scan()]
    """
    raise NotImplementedError


@_hookspec(firstresult=True)
def check_health(devices: Sequence[Device]) -> Mapping[str, Health | HealthReport] | None:
    """Probe the devices and return their health by device ID.

    Called every ``health_interval`` seconds (the resource's config, or the
    driver class's ``health_interval`` default) with the current device table,
    when the driver implements it. Return every device's health, or only some:
    the engine applies only what changed and logs each change. A
    :class:`devplug.HealthReport` carries the reason too (shown in ``devplug
    status``, the ``devplug_device_unhealthy`` metric, and the pod's
    ``allocatedResourcesStatus`` where the kubelet's API has a message); a bare
    :class:`devplug.Health` keeps the device's reason as it was. Drivers that
    learn about health from events push it through ``ctx.update_devices``
    instead. IDs not in the table are ignored. The first non-``None`` result
    is used.

    Raising (or a value that is not a health) degrades the resource as for
    ``list_devices``: every device unhealthy until ``list_devices`` answers.

    Example::

        @hookimpl
        def check_health(self, devices):
            return {d.id: self.probe(d.id) for d in devices}  # HealthReport(Health.UNHEALTHY, "link down")
    """


# --- allocation ---------------------------------------------------------------


@_hookspec(firstresult=True)
def preferred_allocation(
    available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas
) -> Sequence[str] | None:
    """Choose ``size`` device IDs for one container from ``available``.

    Called before each allocation, when the driver implements it (the engine
    then advertises ``get_preferred_allocation_available``). ``available``
    holds healthy devices the kubelet offers (it already includes those in
    ``must_include``, which must all be chosen). Return the chosen IDs, or
    ``None`` to let the core default pack the devices on as few NUMA nodes as
    possible (:func:`devplug.allocation.pack_numa`). The first non-``None``
    result is used; the engine puts ``must_include`` first, drops IDs outside
    ``available`` and answers at most ``size`` IDs (the kubelet would pick at
    random among any more).

    Raising fails the kubelet's GetPreferredAllocation, and the kubelet then
    refuses to admit the pod (Kubernetes v1.32 ``devicesToAllocate``); the pod
    is retried as the kubelet retries admissions. A call that outlives
    ``hook_timeout`` is refused at once while it still runs.

    Shared devices: ``available`` holds each physical device with at least one
    replica offered, once; ``must_include`` names physical devices (once per
    replica that must be included); ``replicas.by_device`` lists each
    device's offered replica IDs and ``replicas.in_use`` its replicas other
    pods hold now. Return physical device IDs, a device named once per replica
    wanted (the engine picks its free replicas), or replica IDs. ``None``
    lets the core spread the replicas: distinct devices first, least loaded
    first, on the NUMA nodes already chosen
    (:func:`devplug.allocation.spread_replicas`).

    Example::

        @hookimpl
        def preferred_allocation(self, available, must_include, size):
            ordered = sorted(available, key=lambda d: self.load_of(d.id))  # least loaded first
            return [*must_include, *(d.id for d in ordered if d.id not in must_include)][:size]
    """


@_hookspec
def allocate(device_ids: Sequence[str], replicas: Replicas, claim: Claim | None) -> ContainerAllocation | None:
    """Prepare the devices for one container and say how the container gets them.

    Called at pod admission, once per container that requests devices of
    the resource, with that container's device IDs (through the device-plugin
    API), or once per ResourceClaim, with the claim's devices of this driver
    (through DRA: ``claim`` says which claim, its devices by request, and this
    driver's opaque configuration from the claim's allocation; ``None``
    through the device-plugin API). Declare ``claim`` to receive it. Return the env vars,
    mounts, device nodes, annotations and CDI device names the container
    needs, or ``None`` to contribute nothing. Every implementation is called
    and the results are merged; two that disagree on an env key or a
    container path fail the allocation. If a later container of the same
    request fails, the engine undoes this one through ``deallocate``.

    Raising fails the whole request, all or nothing: the kubelet's Allocate
    gets the message (the pod is not admitted), and the engine calls
    ``deallocate`` for this container's devices (they may be partly prepared)
    and for the earlier containers' of the request. A device whose undo fails
    too stays out of service, and its ``deallocate`` is retried with backoff
    (``retry=True``) until it succeeds. A call that outlives ``hook_timeout``
    keeps its devices out of service until it returns, then is undone.

    What a device always needs (its device nodes, mounts, envs) is better
    described once on the :class:`~devplug.types.Device` itself
    (``Device(id, allocation=ContainerAllocation(...))``): the engine merges
    the requested devices' descriptions with this hook's answer (the hook may
    then be left out), and with ``[cdi] enabled`` writes them into a CDI spec
    and answers with CDI device names.

    Shared devices: ``device_ids`` are the physical devices of the
    container's replicas, each once (a container given two replicas of one
    device gets it once; ``replicas.by_device`` names both replica IDs).
    Other tenants may be using them (``replicas.tenants``), so prepare
    per-tenant state only. The engine adds the env var
    ``DEVPLUG_SHARED_DEVICES_<RESOURCE>`` and the annotation
    ``<resource>.shared-devices`` (the physical IDs, comma-separated). An undo
    of a shared allocation runs ``post_stop`` for it, then ``deallocate`` only
    for devices no other tenant holds.

    Example::

        @hookimpl
        def allocate(self, device_ids):
            return ContainerAllocation(
                envs={"FPGA_DEVICES": ",".join(device_ids)},
                devices=tuple(DeviceSpec(f"/dev/{d}", f"/dev/{d}") for d in device_ids),
            )
    """


@_hookspec
def pre_start(device_ids: Sequence[str], replicas: Replicas) -> None:
    """Get the devices ready right before a container starts.

    Called before every start of a container that holds the devices (restarts
    included), when the driver implements it (the engine then advertises
    ``pre_start_required``). The kubelet waits at most 30 s; raising fails the
    container's start (the kubelet retries it with its back-off; the devices
    stay allocated to the pod). Shared devices: the physical IDs, ``replicas``
    as for ``allocate``. Returns nothing (a value returned is ignored).

    Example::

        @hookimpl
        def pre_start(self, device_ids):
            for dev in device_ids:
                self.reset_counters(dev)
    """


# --- release (the KEP's half of the lifecycle) ----------------------------------


@_hookspec
def post_stop(device_ids: Sequence[str], retry: bool, replicas: Replicas) -> None:
    """Clean the devices up after the container that used them stopped.

    Called once per allocation, after the kubelet stopped attributing the
    devices to any live container (learned from PodResources and the kubelet's
    checkpoint on stock kubelets, from the KEP's PostStopContainer on kubelets
    that call it), and always before the devices are allocated to anyone else;
    then ``deallocate``. Deprogram, scrub, reset here. The devices may have
    vanished meanwhile. Returns nothing (a value returned is ignored).

    Called only once no process of the pod is left on the node (its cgroup is
    empty), or, where that cannot be read, ``[liveness] unknown_grace``
    seconds after the pod vanished from the kubelet's view.

    At least once: the engine records that the hook is about to run before it
    calls it, and that it returned afterwards. A daemon killed in between (or
    a ledger rebuilt from the kubelet's state) calls it again after the restart
    with ``retry=True``; a hook must then cope with finding the work done.
    Declare ``retry`` in the signature to receive it; hooks without it are
    called the same way.

    Raising (:class:`devplug.DriverError`, with a message naming the device)
    fails the release: the devices stay out of service (advertised unhealthy,
    never allocated), the release is retried with capped exponential backoff,
    with ``retry=True``, until it succeeds; the message is shown in ``devplug
    status``. A call outliving ``hook_timeout`` is waited for; its outcome
    decides.

    Shared devices: called once per tenancy (each allocation of replicas),
    with that tenancy's physical devices, while other tenants may still be
    using them (``replicas.tenants`` says how many): clean this tenant's
    state only, never reset the device. The device itself is cleaned by
    ``deallocate`` when its last tenant has left.

    Example::

        @hookimpl
        def post_stop(self, device_ids, retry):
            for dev in device_ids:
                if retry and self.is_blank(dev):
                    continue
                self.load_blank_image(dev)
    """


@_hookspec
def deallocate(device_ids: Sequence[str], retry: bool, replicas: Replicas) -> None:
    """Take the devices back: they are free for the next allocation once this returns.

    Called once per allocation when no container uses the devices any more
    (after ``post_stop``), and to undo an ``allocate`` whose request failed
    part-way. Unbind drivers, free shared slots, switch modes here. The
    devices may have vanished meanwhile; must be safe to call for devices
    only partly prepared. Returns nothing (a value returned is ignored). At
    least once, like ``post_stop``: ``retry=True``
    when an earlier call for these devices may have done part of the work (a
    restart, a failed attempt). Raising keeps the devices out of service and
    the release is retried with backoff, as for ``post_stop``.

    Shared devices: called with a physical device only once its last replica
    is released (after that tenancy's ``post_stop``), so a device is never
    reset under another tenant; ``replicas.by_device`` names the replicas
    released with it and ``replicas.tenants`` is 0 for each.

    Example::

        @hookimpl
        def deallocate(self, device_ids, retry):
            for dev in device_ids:
                self.unbind_from_vfio(dev, missing_ok=retry)
    """


# --- the hook list --------------------------------------------------------------

#: Every hook of the contract, in lifecycle order (the order of the specs above): the one hook list. The facade's
#: capabilities, the metrics' hook counters, the SDK's hook stubs and the README's hook table follow it (tests check).
HOOK_NAMES: tuple[str, ...] = tuple(
    name for name, obj in tuple(globals().items()) if hasattr(obj, f"{PROJECT_NAME}_spec")
)
