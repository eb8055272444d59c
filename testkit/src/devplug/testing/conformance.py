"""The driver contract as tests: subclass :class:`DriverConformance` in a driver's suite to get them.

Every check runs the real thing: ``devplug run`` as a child process (the
driver loaded through its entry point), the dev kubelet over unix sockets,
and the driver's own record of its hook calls
(:class:`devplug.testing.recorder.HookRecorder`), which is how the checks see
what the daemon asked of the driver. The kit knows nothing of any driver: a
subclass says what is driver-specific::

    from devplug.testing.conformance import DriverConformance

    class TestFpgaConformance(DriverConformance):
        driver = "fpga"                   # the entry-point name
        device_count = 2                  # devices the options below give
        bad_option_key = "cards"          # the key bad_options gets wrong

        def options(self, folder):        # options for a resource living in a fresh folder
            return {"bitstream_dir": str(folder), "cards": 2}

        def bad_options(self, folder):
            return {"bitstream_dir": str(folder), "cards": -1}

The checks watch the driver through a record of its hook calls. A driver
needs no code for it: with ``records_itself = False`` the daemon under test
serves the driver through :func:`devplug.testing.recording.recording_driver`,
a stand-in that records every hook call in :meth:`DriverConformance.calls_dir`.
A driver written before the stand-in existed records its own calls with a
``HookRecorder`` there (``records_itself = True``, the default, so such suites
keep working). The checks, one test each:

* ``test_advertises_its_devices`` -- every device registered, listed to the kubelet, healthy;
* ``test_allocates_a_pod`` -- a pod gets distinct advertised devices, the ``allocate`` hook (when the driver
  records one) saw exactly them, the kubelet got the driver's answer (:meth:`check_allocation`), and its
  container started: every ``DeviceSpec`` host path is a device node (on the node whose ``/dev`` is
  :meth:`node_dev_root`'s), as containerd requires;
* ``test_releases_exactly_once[stock|kep]`` -- after the pod is removed, each release hook (``post_stop`` then
  ``deallocate``, as far as the driver implements them: :attr:`release_hooks`) ran once, not flagged as a retry,
  after the pod was gone; a restart repeats nothing; the device is healthy again. On a stock kubelet
  (PodResources) and on a KEP one (PostStopContainer, Deallocate);
* ``test_a_release_killed_midway_is_finished_after_restart`` -- ``kill -9`` while a release hook runs (made
  slow by :meth:`slow_release`; skipped when it returns False); after a restart the interrupted hook runs again,
  once, with ``retry=True``, the later ones once; the hooks are at least once, so this is exactly what is allowed;
* ``test_a_slow_release_is_never_doubled_and_stays_on_its_device`` -- a release hook made slow
  (:meth:`slow_release`) outlives ``hook_timeout``: no second release call starts on that device while it runs,
  the device is advertised unhealthy meanwhile, the resource is not degraded, and the other devices keep serving
  (another pod is admitted on them); needs two devices;
* ``test_check_config_*`` -- ``devplug check-config`` accepts :meth:`options`, and refuses an unknown key and
  :meth:`bad_options` with exit code 2, naming the file, the resource and the key;
* ``test_serves_a_claim_through_dra`` -- with ``"dra"`` in :attr:`DriverConformance.apis`, the same driver, its
  config unchanged but ``api = "dra"``, served as a DRA kubelet plugin (:mod:`devplug.testing.dranode`: the API
  server and scheduler stand-ins, the dev kubelet's DRA side): every device published in the node's
  ResourceSlices, a pod's claim prepared with the ``allocate`` hook seeing exactly its device, the container's
  CDI spec holding what the driver answers (:meth:`check_allocation`, annotations aside: CDI cannot carry them),
  and at the pod's end each release hook once, not flagged as a retry, the ledger empty.

With :attr:`DriverConformance.replicas` above 1 the same checks run on shared devices: the resource is
configured with ``replicas``, the kubelet sees that many replicas of each device, a pod of two gets replicas
of two distinct devices, the driver's hooks see the physical devices (so :meth:`check_allocation`,
:meth:`slow_release` and :meth:`fast_release` get physical IDs, and the allocation without the engine's
``DEVPLUG_SHARED_DEVICES_<RESOURCE>`` entries), and a lone tenant's release still runs every release hook once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.kit.hookrecord import RELEASE_HOOKS, HookCall, read_hook_calls
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.entrypoints import entry_point_env
from devplug.testing.plugin import RunningDaemon
from devplug.testing.recording import recording_entry_point
from devplug.testing.waiting import WAIT, poll_until
from devplug.types import ContainerAllocation, DeviceSpec, Mount, replica_id

__all__ = ["WAIT", "DriverConformance", "poll_until"]


class DriverConformance:
    """The contract checks every driver passes; subclass it as ``Test<Driver>Conformance`` and fill in below.

    Required: :attr:`driver`, :attr:`device_count`, :meth:`options`. The rest has defaults.
    """

    #: The driver's entry-point name (what operators write as ``driver = "..."``).
    driver: ClassVar[str] = ""
    #: The resource name the checks serve.
    resource: ClassVar[str] = "example.com/conformance"
    #: How many devices :meth:`options` gives (at least 1; the allocation check takes up to 2).
    device_count: ClassVar[int] = 1
    #: The release hooks the driver implements, in the order the engine calls them.
    release_hooks: ClassVar[tuple[str, ...]] = RELEASE_HOOKS
    #: Whether the driver records its ``allocate`` calls (a driver with no ``allocate`` hook has none).
    records_allocate: ClassVar[bool] = True
    #: The option key :meth:`bad_options` gets wrong, which ``check-config`` must name.
    bad_option_key: ClassVar[str] = ""
    #: Test doubles the daemon may load without their being installed: ``{name: "module:Class"}``.
    test_drivers: ClassVar[Mapping[str, str]] = {}
    #: Where the modules of :attr:`test_drivers` are.
    python_path: ClassVar[Sequence[Path]] = ()
    #: Replicas per device (the resource's ``replicas``): above 1, every check runs on shared devices.
    replicas: ClassVar[int] = 1
    #: Whether the driver records its own hook calls with a :class:`~devplug.testing.recorder.HookRecorder` in
    #: :meth:`calls_dir`, as drivers had to before the kit could (the default, so their suites keep working).
    #: False: the daemon serves the driver through :mod:`devplug.testing.recording`'s stand-in, which records
    #: every hook call there, and the driver needs no recording code.
    records_itself: ClassVar[bool] = True
    #: The kubelet APIs the checks serve the driver through: ``"device-plugin"``, and ``"dra"`` for the DRA check.
    apis: ClassVar[tuple[str, ...]] = ("device-plugin",)

    # --- what a driver's subclass supplies ----------------------------------------------------------

    def options(self, folder: Path) -> Mapping[str, Any]:
        """The driver's options for a resource whose files live in ``folder`` (a fresh, empty folder).

        Called before the daemon starts; may prepare ``folder`` (a fake device tree, say).
        """
        raise NotImplementedError(f"{type(self).__name__} must define options(folder)")

    def calls_dir(self, folder: Path) -> Path:
        """Where the hook calls are recorded (default: ``folder``): by the driver's own
        :class:`~devplug.testing.recorder.HookRecorder`, or by the recording stand-in (:attr:`records_itself`)."""
        return folder

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        """Assert that ``allocation`` is what the driver answers for ``device_ids`` (default: no check).

        Called with what the kubelet received for the pod's container.
        """

    def slow_release(self, folder: Path, device_id: str) -> bool:
        """Make the next release of ``device_id`` take long (at least a minute) so a ``kill -9`` lands in it.

        Return False when the driver cannot (the kill check is then skipped).
        """
        return False

    def fast_release(self, folder: Path, device_id: str) -> None:
        """Undo :meth:`slow_release`: releases of ``device_id`` take their normal time again."""

    def bad_options(self, folder: Path) -> Mapping[str, Any] | None:
        """Options with one wrong value, at :attr:`bad_option_key` (``None``: no such check)."""
        return None

    def node_dev_root(self, folder: Path) -> Path | None:
        """The node's ``/dev`` for the dev kubelet when the driver's machine is a model in ``folder`` (default:
        None, the host's ``/dev``).

        The dev kubelet's runtime, as containerd, refuses a container whose
        ``DeviceSpec`` host path is not a device node; a host path under
        ``/dev`` is looked up here.
        """
        return None

    # --- fixtures ---------------------------------------------------------------------------------------

    @pytest.fixture
    def conformance_folder(self, devplug_root: Path) -> Path:
        """The driver's folder for this test, under the short ``devplug_root``."""
        folder = devplug_root / "driver"
        folder.mkdir()
        return folder

    @pytest.fixture(autouse=True)
    def _node_dev_root(self, request: pytest.FixtureRequest) -> None:
        """Every check with a dev kubelet gets :meth:`node_dev_root` as the kubelet's ``/dev``, when it names one."""
        if "dev_kubelet" not in request.fixturenames:
            return
        dev_root = self.node_dev_root(request.getfixturevalue("conformance_folder"))
        if dev_root is not None:
            request.getfixturevalue("dev_kubelet").dev_root = dev_root

    # --- helpers ------------------------------------------------------------------------------------------

    def served_driver(self, folder: Path) -> tuple[str, dict[str, str], tuple[Path, ...]]:
        """What the daemon serves: the driver name to configure, the test drivers it may load and where their
        modules are. :attr:`driver` with :attr:`test_drivers` and :attr:`python_path`, or, when the driver does not
        record itself (:attr:`records_itself`), its recording stand-in beside them (a module written next to
        ``folder``)."""
        drivers = dict(self.test_drivers)
        path = tuple(self.python_path)
        if self.records_itself:
            return self.driver, drivers, path
        modules = folder.parent / f"{folder.name}-recording"
        name, target = recording_entry_point(modules, self.driver, self.calls_dir(folder))
        drivers[name] = target
        return name, drivers, (*path, modules)

    def resource_table(self, folder: Path) -> dict[str, Any]:
        """The config's table for :attr:`resource` (with ``replicas`` when :attr:`replicas` is above 1)."""
        table: dict[str, Any] = {"driver": self.served_driver(folder)[0], "options": dict(self.options(folder))}
        if self.replicas > 1:
            table["replicas"] = self.replicas
        return table

    def physical_id(self, device_id: str) -> str:
        """The driver's device ID behind an advertised one (the same ID unless :attr:`replicas` is above 1)."""
        if self.replicas == 1:
            return device_id
        device, _, index = device_id.rpartition("::")
        assert device and replica_id(device, int(index)) == device_id, f"{device_id!r} is not a replica ID"
        return device

    def shared_entries(self, physical_ids: Sequence[str]) -> ContainerAllocation:
        """What the engine adds to a shared allocation: ``DEVPLUG_SHARED_DEVICES_<RESOURCE>`` (env, annotation)."""
        suffix = "".join(c if c.isalnum() else "_" for c in self.resource).upper()
        listed = ",".join(physical_ids)
        return ContainerAllocation(
            envs={f"DEVPLUG_SHARED_DEVICES_{suffix}": listed},
            annotations={f"{self.resource}.shared-devices": listed},
        )

    def start_daemon(self, devplug_daemon: Callable[..., RunningDaemon], folder: Path) -> RunningDaemon:
        """Start ``devplug run`` serving :attr:`resource` (quick releases: interval 0.1 s, grace 1 s)."""
        _, drivers, path = self.served_driver(folder)
        return devplug_daemon(
            {self.resource: self.resource_table(folder)},
            release_interval=0.1,
            grace_period=1.0,
            test_drivers=drivers,
            python_path=path,
        )

    def release_calls(self, folder: Path, device_id: str, *, started: bool = False) -> list[HookCall]:
        """The recorded release-hook calls touching ``device_id``, finished (or with ``started``, begun)."""
        calls = read_hook_calls(self.calls_dir(folder), device=device_id, started=started)
        return [c for c in calls if c.hook in self.release_hooks]

    def admit(self, kubelet: DevKubeletThread, pod: str, count: int) -> tuple[str, ...]:
        """Admit a one-container pod asking ``count`` devices; the device IDs it got."""
        admitted = kubelet.admit_pod(PodSpec(pod, [ContainerSpec("app", {self.resource: count})]))
        return admitted.container("app").devices[self.resource]

    def wait_healthy(self, kubelet: DevKubeletThread, device_id: str) -> None:
        """Wait until the kubelet sees ``device_id`` healthy."""

        def healthy() -> bool:
            view = kubelet.resource(self.resource)
            device = None if view is None else view.device(device_id)
            return device is not None and device.healthy

        poll_until(healthy, f"{device_id} advertised healthy")

    def _released(self, folder: Path, device_id: str, times: int = 1) -> Callable[[], bool]:
        last = self.release_hooks[-1]
        return lambda: sum(c.hook == last and c.ok for c in self.release_calls(folder, device_id)) >= times

    def _check_config(self, folder: Path, options: Mapping[str, Any]) -> tuple[Path, subprocess.CompletedProcess[str]]:
        table = {"driver": self.driver, "options": dict(options)}
        path = write_toml(folder / "check.toml", dev_config(folder, {self.resource: table}))
        env = entry_point_env(folder / "test-drivers", self.test_drivers, self.python_path)
        done = subprocess.run(
            [sys.executable, "-m", "devplug", "check-config", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
        )
        return path, done

    # --- the checks -----------------------------------------------------------------------------------------

    def test_advertises_its_devices(
        self, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon], conformance_folder: Path
    ) -> None:
        self.start_daemon(devplug_daemon, conformance_folder)

        advertised = self.device_count * self.replicas

        def listed() -> bool:
            view = dev_kubelet.resource(self.resource)
            return view is not None and view.capacity == advertised == view.allocatable

        poll_until(listed, f"{advertised} healthy devices of {self.resource} listed to the kubelet")
        view = dev_kubelet.resource(self.resource)
        assert view is not None
        assert view.registered
        assert len({d.id for d in view.devices}) == advertised
        physical = [self.physical_id(d.id) for d in view.devices]
        assert all(physical.count(p) == self.replicas for p in physical), "each device advertised replicas times"

    def test_allocates_a_pod(
        self, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon], conformance_folder: Path
    ) -> None:
        self.start_daemon(devplug_daemon, conformance_folder)
        count = min(2, self.device_count)
        admitted = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {self.resource: count})]))
        container = admitted.container("app")
        ids = container.devices[self.resource]
        view = dev_kubelet.resource(self.resource)
        assert view is not None
        assert len(set(ids)) == count
        assert set(ids) <= {d.id for d in view.devices}
        physical = list(dict.fromkeys(self.physical_id(i) for i in ids))
        assert len(physical) == count, f"replicas {ids} not spread over distinct devices"
        if self.records_allocate:
            calls = read_hook_calls(self.calls_dir(conformance_folder), hook="allocate")
            assert [(sorted(c.device_ids), c.ok) for c in calls] == [(sorted(physical), True)]
        allocation = container.allocations[self.resource]
        if self.replicas > 1:
            shared = self.shared_entries(physical)
            assert dict(allocation.envs).items() >= dict(shared.envs).items(), allocation.envs
            assert dict(allocation.annotations).items() >= dict(shared.annotations).items(), allocation.annotations
            allocation = ContainerAllocation(
                envs={k: v for k, v in allocation.envs.items() if k not in shared.envs},
                mounts=allocation.mounts,
                devices=allocation.devices,
                annotations={k: v for k, v in allocation.annotations.items() if k not in shared.annotations},
                cdi_devices=allocation.cdi_devices,
            )
        self.check_allocation(physical, allocation, conformance_folder)
        assert dev_kubelet.container_failure("p", "app") is None
        assert dev_kubelet.running_containers("p") == ["app"]

    @pytest.mark.parametrize("kubelet", ["stock", "kep"])
    def test_releases_exactly_once(
        self,
        kubelet: str,
        dev_kubelet: DevKubeletThread,
        devplug_daemon: Callable[..., RunningDaemon],
        conformance_folder: Path,
    ) -> None:
        dev_kubelet.kep_mode = kubelet == "kep"
        daemon = self.start_daemon(devplug_daemon, conformance_folder)
        (advertised,) = self.admit(dev_kubelet, "p", 1)
        dev = self.physical_id(advertised)
        assert self.release_calls(conformance_folder, dev) == [], "released while the pod runs"
        removed_at = time.time()
        dev_kubelet.remove_pod("p")
        poll_until(self._released(conformance_folder, dev), f"{dev} to be released after its pod was removed")
        self.wait_healthy(dev_kubelet, advertised)
        daemon.restart()  # a daemon reading its own state back repeats nothing
        assert daemon.stop() == 0
        calls = self.release_calls(conformance_folder, dev)
        assert [(c.hook, c.retry, c.error) for c in calls] == [(h, False, None) for h in self.release_hooks]
        began = self.release_calls(conformance_folder, dev, started=True)
        assert began, "the driver records no call starts (HookRecorder.call or .begin)"
        assert min(c.time for c in began) >= removed_at, "a release began before the pod was removed"

    def test_a_release_killed_midway_is_finished_after_restart(
        self, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon], conformance_folder: Path
    ) -> None:
        daemon = self.start_daemon(devplug_daemon, conformance_folder)
        (advertised,) = self.admit(dev_kubelet, "p", 1)
        dev = self.physical_id(advertised)
        if not self.slow_release(conformance_folder, dev):
            pytest.skip(f"{type(self).__name__}.slow_release cannot make a release slow")
        dev_kubelet.remove_pod("p")

        def running() -> str | None:
            done = [c.hook for c in self.release_calls(conformance_folder, dev)]
            began = [c.hook for c in self.release_calls(conformance_folder, dev, started=True)]
            return next((h for h in self.release_hooks if began.count(h) > done.count(h)), None)

        hook = poll_until(running, f"a release hook of {dev} to start")
        daemon.kill()
        finished = [c.hook for c in self.release_calls(conformance_folder, dev)]
        assert hook not in finished, f"{hook} finished before the kill: slow_release did not make it slow enough"

        self.fast_release(conformance_folder, dev)
        daemon.restart()
        poll_until(self._released(conformance_folder, dev), f"{dev}'s release to be finished after the restart")
        self.wait_healthy(dev_kubelet, advertised)
        assert daemon.stop() == 0
        calls = self.release_calls(conformance_folder, dev)
        assert [c.hook for c in calls] == list(self.release_hooks), "each release hook finishes exactly once"
        assert all(c.ok for c in calls)
        killed = self.release_hooks.index(hook)
        assert calls[killed].retry, f"the {hook} call after the restart must be flagged retry=True"
        assert not any(c.retry for c in calls[:killed]), "hooks finished before the kill are not retried"

    def test_a_slow_release_is_never_doubled_and_stays_on_its_device(
        self, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon], conformance_folder: Path
    ) -> None:
        if self.device_count < 2:
            pytest.skip("needs two devices: one slow, one to keep serving")
        hook_timeout = 1.0
        _, drivers, path = self.served_driver(conformance_folder)
        daemon = devplug_daemon(
            {self.resource: {**self.resource_table(conformance_folder), "hook_timeout": hook_timeout}},
            release_interval=0.1,
            grace_period=1.0,
            test_drivers=drivers,
            python_path=path,
        )
        (advertised,) = self.admit(dev_kubelet, "p", 1)
        dev = self.physical_id(advertised)
        if not self.slow_release(conformance_folder, dev):
            pytest.skip(f"{type(self).__name__}.slow_release cannot make a release slow")
        dev_kubelet.remove_pod("p")
        poll_until(lambda: self.release_calls(conformance_folder, dev, started=True), f"a release hook of {dev}")

        def unhealthy() -> bool:
            view = dev_kubelet.resource(self.resource)
            device = None if view is None else view.device(advertised)
            return device is not None and not device.healthy

        poll_until(unhealthy, f"{advertised} advertised unhealthy while its release runs")
        deadline = time.monotonic() + 4 * hook_timeout  # well past hook_timeout: retries would have started
        while time.monotonic() < deadline:
            began = [c.hook for c in self.release_calls(conformance_folder, dev, started=True)]
            done = [c.hook for c in self.release_calls(conformance_folder, dev)]
            running = [h for h in self.release_hooks if began.count(h) > done.count(h)]
            assert len(running) <= 1 and all(began.count(h) - done.count(h) <= 1 for h in running), (
                f"two release calls on {dev} at once: started {began}, finished {done}"
            )
            time.sleep(0.05)
        view = dev_kubelet.resource(self.resource)
        assert view is not None
        healthy = {self.physical_id(d.id) for d in view.devices if d.healthy}
        assert dev not in healthy and len(healthy) == self.device_count - 1, "only the slow device may be out"
        other = self.admit(dev_kubelet, "q", 1)
        assert self.physical_id(other[0]) != dev
        daemon.kill()  # the slow hook would outlive the test; its device's state no longer matters

    def test_check_config_accepts_the_options(self, conformance_folder: Path) -> None:
        _, done = self._check_config(conformance_folder, self.options(conformance_folder))
        assert done.returncode == 0, done.stderr

    def test_check_config_names_an_unknown_option(self, conformance_folder: Path) -> None:
        options = {**self.options(conformance_folder), "no_such_option": 1}
        path, done = self._check_config(conformance_folder, options)
        assert done.returncode == 2, done.stderr
        for part in (str(path), self.resource, "no_such_option"):
            assert part in done.stderr, f"{part!r} not named in: {done.stderr}"

    def test_check_config_names_a_bad_option(self, conformance_folder: Path) -> None:
        bad = self.bad_options(conformance_folder)
        if bad is None:
            pytest.skip(f"{type(self).__name__}.bad_options gives no bad options")
        assert self.bad_option_key, "set bad_option_key to the key bad_options gets wrong"
        path, done = self._check_config(conformance_folder, bad)
        assert done.returncode == 2, done.stderr
        for part in (str(path), self.resource, self.bad_option_key):
            assert part in done.stderr, f"{part!r} not named in: {done.stderr}"

    # --- the same driver through DRA ----------------------------------------------------------------------

    def test_serves_a_claim_through_dra(self, conformance_folder: Path) -> None:
        if "dra" not in self.apis:
            pytest.skip(f"{type(self).__name__}.apis does not list 'dra'")

        async def bounded() -> None:
            await asyncio.wait_for(self._claim_through_dra(conformance_folder), 4 * WAIT)

        asyncio.run(bounded())

    async def _claim_through_dra(self, folder: Path) -> None:
        from devplug.testing.apiserver import ApiServer
        from devplug.testing.dranode import dra_node

        _, drivers, path = self.served_driver(folder)  # the recording stand-in too, as the device-plugin checks
        env = entry_point_env(folder / "test-drivers", drivers, path)
        with ApiServer() as api:
            async with dra_node(
                api, self.resource, self.resource_table(folder), self.calls_dir(folder), env=env
            ) as node:
                # A shared device is one device with consumable capacity where the server keeps it (issue 41,
                # KEP-5075: DRAConsumableCapacity, on by default from 1.36), else one device per replica.
                consumable = self.replicas > 1 and "DRAConsumableCapacity" not in api.storage.disabled_features
                await node.published(self.device_count * (1 if consumable else self.replicas))
                node.make_claim("c1")
                pod, [claim] = node.schedule_pod("p1", ["c1"])
                await node.kubelet.admit_pod(pod)
                [state] = node.kubelet.dra_claims()
                assert state.prepared and state.uid == claim["metadata"]["uid"]
                [record] = node.records()
                [advertised] = record["devices"]
                dev = self.physical_id(advertised)
                if self.records_allocate:
                    calls = read_hook_calls(self.calls_dir(folder), hook="allocate")
                    assert [(sorted(c.device_ids), c.ok) for c in calls] == [([dev], True)]
                cdi = node.kubelet.container_cdi_devices("p1", "app")
                allocation = ContainerAllocation()
                if cdi:
                    assert cdi == [f"{node.driver}/claim={state.uid}-dev"]
                    allocation = _from_cdi(node.spec_of(state.uid))
                if self.replicas > 1:
                    shared = self.shared_entries([dev])
                    assert dict(allocation.envs).items() >= dict(shared.envs).items(), allocation.envs
                    allocation = replace(
                        allocation, envs={k: v for k, v in allocation.envs.items() if k not in shared.envs}
                    )
                self.check_allocation([dev], allocation, folder)
                assert self.release_calls(folder, dev) == [], "released while the pod runs"
                await node.kubelet.finish_pod("p1")
                assert node.kubelet.dra_claims() == []
                calls = self.release_calls(folder, dev)
                assert [(c.hook, c.retry, c.error) for c in calls] == [(h, False, None) for h in self.release_hooks]
                assert node.records() == []


def _from_cdi(spec: Mapping[str, Any]) -> ContainerAllocation:
    """What a claim's CDI spec gives its containers, as the allocation it was written from."""
    [device] = spec["devices"]
    edits = device["containerEdits"]
    return ContainerAllocation(
        envs=dict(e.split("=", 1) for e in edits.get("env", ())),
        devices=tuple(
            DeviceSpec(n["path"], n.get("hostPath", n["path"]), n.get("permissions", "rwm"))
            for n in edits.get("deviceNodes", ())
        ),
        mounts=tuple(
            Mount(m["containerPath"], m["hostPath"], read_only="ro" in m.get("options", ()))
            for m in edits.get("mounts", ())
        ),
    )
