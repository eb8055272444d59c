"""A node serving one resource through DRA, every part real, for driver authors' tests and the conformance checks.

* the API server stand-in (:mod:`devplug.testing.apiserver`) over HTTP on
  loopback, holding the node (its ``status.nodeInfo.kubeletVersion`` the dev
  kubelet's release, as the kubelet writes it when it registers the Node), a
  DeviceClass selecting the driver (with ``extendedResourceName``: the
  resource name), and the scheduler stand-in (:mod:`devplug.testing.scheduler`)
  allocating claims to pods;
* ``devplug run`` as a child process (:class:`~devplug.testing.process.DaemonProcess`)
  serving the resource with ``api = "dra"``;
* the dev kubelet's DRA side (:class:`~devplug.devkubelet.DevKubelet` with
  ``dra=``) on the caller's event loop, talking to the daemon over real unix
  sockets in a short folder under ``/tmp`` (socket paths hold 107 bytes)::

      with ApiServer() as api:
          async with dra_node(api, "example.com/fpga", {"driver": "fpga", "options": {...}}, folder) as node:
              await node.published(2)
              node.make_claim("c1")
              pod, [claim] = node.schedule_pod("p1", ["c1"])
              await node.kubelet.admit_pod(pod)      # NodePrepareResources
              await node.kubelet.finish_pod("p1")    # NodeUnprepareResources

A node of another kubelet release (:data:`~devplug.devkubelet.dra.DRA_RELEASES`)::

    async with dra_node(api, ..., kubelet_dra=dataclasses.replace(TEST_DRA, release="1.32")) as node:
        api.get("nodes", NODE)["status"]["nodeInfo"]["kubeletVersion"]   # "v1.32.13"
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import platform
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.config.dra import default_driver_name
from devplug.devkubelet import ContainerSpec, DevKubelet, DRAConfig, PodClaim, PodSpec, ResourceClaimRef
from devplug.engine import read_ledger_records
from devplug.kube.names import resource_state_dir
from devplug.testing.apiserver import ApiServer
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.process import DaemonProcess
from devplug.testing.recorder import read_call_log
from devplug.testing.scheduler import SchedulerStandIn, SchedulingError

__all__ = [
    "NODE",
    "NS",
    "TEST_DRA",
    "DraNode",
    "dra_node",
    "node_info",
    "node_object",
    "short_root",
    "wipe_slices",
    "write_kubeconfig",
]

NODE = "node-a"
NS = "default"
#: How long a wait for something the daemon or the kubelet does on its own may take.
WAIT = 30.0

#: The dev kubelet's DRA timings for tests: the kubelet's behaviour, at a pace a test can wait for.
TEST_DRA = DRAConfig(
    reconcile_period=0.05,
    dial_timeout=2.0,
    get_info_timeout=2.0,
    notify_timeout=2.0,
    call_timeout=10.0,
    wiping_delay=30.0,
    manager_reconcile_period=None,
    pod_resync_period=None,
    pod_sync_backoff=None,
    health_stream_period=0.1,
)


class WaitTimeout(AssertionError):
    """Something awaited did not happen in time (the message says what, and the daemon's log)."""


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = WAIT, details: Any = None) -> Any:
    """Poll ``predicate`` on the event loop (the dev kubelet runs between polls) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{extra}")
        await asyncio.sleep(0.02)


def write_kubeconfig(api: ApiServer, path: Path) -> Path:
    """A kubeconfig of the stand-in (no credentials: it checks none)."""
    import yaml  # type: ignore[import-untyped]

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": api.url}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin"}}],
        "current-context": "standin",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def short_root() -> Iterator[Path]:
    """A fresh folder under /tmp with a short path (removed afterwards)."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class DraNode:
    """One node (see the module's docstring)."""

    root: Path
    api: ApiServer
    kubelet: DevKubelet
    #: The driver's folder (its options name it; its hook recorder writes there).
    folder: Path
    config_path: Path
    resource: str
    driver: str
    device_class: str
    env: Mapping[str, str] = field(default_factory=dict)
    daemon: DaemonProcess | None = None
    scheduler: SchedulerStandIn = field(init=False)

    def __post_init__(self) -> None:
        self.scheduler = SchedulerStandIn(self.api.storage)

    # --- the daemon

    def start_daemon(self) -> DaemonProcess:
        self.daemon = DaemonProcess(self.config_path, self.root / "daemon.log", env=self.env).start()
        return self.daemon

    def log(self) -> str:
        return self.daemon.log_text() if self.daemon is not None else ""

    @property
    def state_dir(self) -> Path:
        return resource_state_dir(self.root / "state", self.resource)

    def records(self) -> list[dict[str, Any]]:
        """The ledger's records as a restarted daemon would load them."""
        return read_ledger_records(self.state_dir / "ledger.json", self.resource)

    def calls(self, hook: str | None = None, calls_dir: Path | None = None) -> list[dict[str, Any]]:
        """The driver's recorded hook calls (of ``hook``, or all), from its ``HookRecorder`` folder."""
        return [c for c in read_call_log(calls_dir or self.folder) if hook is None or c.get("hook") == hook]

    def service_target(self) -> str:
        """The gRPC target of the daemon's DRA service socket, as the kubelet dials it (one instance running)."""
        [path] = sorted((self.root / "plugins" / self.driver).glob("dra-*.sock"))
        return f"unix:{path}"

    async def registered(self, count: int = 1) -> None:
        """Until the kubelet has ``count`` usable instances of the driver: connected ones (1.34+), registered
        ones on kubelets that dial at the first call and watch no connection (1.32, 1.33)."""
        dra = self.kubelet.dra
        monitored = dra is None or dra.config.rules.connection_monitoring
        await eventually(
            lambda: sum(1 for v in self.kubelet.dra_plugins(self.driver) if v.connected or not monitored) >= count,
            f"{count} {'connected' if monitored else 'registered'} instance(s) of {self.driver}",
            details=self.log,
        )

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.objects("resourceslices") if s["spec"]["driver"] == self.driver]

    async def published(self, devices: int) -> list[dict[str, Any]]:
        """Wait until the node's slices hold ``devices`` devices and the pool is whole (every slice of its newest
        generation there, as many as its ``resourceSliceCount``: a pool with counter sets has slices of its own for
        them, written one after the other, and the scheduler skips a pool with slices missing); the slices."""

        def count() -> bool:
            slices = self.slices()
            if sum(len(s["spec"].get("devices") or ()) for s in slices) != devices:
                return False
            pools = [s["spec"]["pool"] for s in slices]
            newest = max((int(p.get("generation", 0)) for p in pools), default=0)
            current = [p for p in pools if int(p.get("generation", 0)) == newest]
            return all(len(current) == int(p.get("resourceSliceCount", 1)) for p in current)

        await eventually(count, f"{devices} devices published", details=self.log)
        return self.slices()

    def spec_of(self, claim_uid: str) -> dict[str, Any]:
        """A prepared claim's CDI spec file, parsed."""
        data: dict[str, Any] = json.loads((self.root / "cdi" / f"dra-{self.driver}-{claim_uid}.json").read_text())
        return data

    # --- pods and claims

    def make_claim(self, name: str, count: int = 1, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A claim of ``count`` devices of the class (request ``dev``), with opaque ``config`` for the driver."""
        spec: dict[str, Any] = {
            "devices": {
                "requests": [{"name": "dev", "exactly": {"deviceClassName": self.device_class, "count": count}}]
            }
        }
        if config is not None:
            spec["devices"]["config"] = [{"requests": ["dev"], "opaque": {"driver": self.driver, "parameters": config}}]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
        return self.api.create("resourceclaims", body, NS)

    def schedule_pod(self, name: str, claims: list[str]) -> tuple[PodSpec, list[dict[str, Any]]]:
        """Create the pod in the API server, let the scheduler allocate its claims and bind it; the pod as the
        dev kubelet admits it, and the claims as stored (:class:`SchedulingError` when they cannot be allocated)."""
        made = self._create_pod(name, claims)
        return self._pod_spec(name, claims, made, self.scheduler.schedule(NS, name, NODE))

    async def schedule_pod_eventually(
        self, name: str, claims: list[str], timeout: float = WAIT
    ) -> tuple[PodSpec, list[dict[str, Any]]]:
        """:meth:`schedule_pod`, tried again whenever the node's ResourceSlices change while the claims cannot be
        allocated (as kube-scheduler's DRA plugin retries an unschedulable pod on a ResourceSlice event: its
        ``EventsToRegister`` in ``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go`` lists
        ResourceSlice Add and Update, "new resources became available"; here a device tainted a moment ago and
        published free a moment later), for at most ``timeout`` seconds;
        the last :class:`SchedulingError` after that."""
        made = self._create_pod(name, claims)
        deadline = time.monotonic() + timeout
        while True:
            seen = self.slices()
            try:
                return self._pod_spec(name, claims, made, self.scheduler.schedule(NS, name, NODE))
            except SchedulingError:
                if time.monotonic() >= deadline:
                    raise
            while self.slices() == seen and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    def _create_pod(self, name: str, claims: list[str]) -> dict[str, Any]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "app"}],
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        }
        return self.api.create("pods", pod, NS)

    def _pod_spec(
        self, name: str, claims: list[str], made: Mapping[str, Any], stored: list[dict[str, Any]]
    ) -> tuple[PodSpec, list[dict[str, Any]]]:
        spec = PodSpec(
            name,
            [ContainerSpec("app", claims=list(claims))],
            namespace=NS,
            uid=made["metadata"]["uid"],
            resource_claims=[
                PodClaim(
                    c["metadata"]["name"],
                    ResourceClaimRef(NS, c["metadata"]["name"], c["metadata"]["uid"], (self.driver,)),
                )
                for c in stored
            ],
        )
        return spec, stored

    def _pod_claim(self, claim: Mapping[str, Any]) -> PodClaim:
        meta = claim["metadata"]
        return PodClaim(meta["name"], ResourceClaimRef(NS, meta["name"], meta["uid"], (self.driver,)))

    @staticmethod
    def allocated_devices(claim: Mapping[str, Any]) -> list[str]:
        """The device names a claim's allocation holds."""
        return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def wipe_slices(api: ApiServer, node: str, driver: str) -> None:
    """What the kubelet's wipe does in the API server: ``DeleteCollection`` of the node's ResourceSlices of
    ``driver`` ("": of every driver), by the field selectors ``spec.nodeName`` and ``spec.driver``
    (``wipeResourceSlices`` in ``pkg/kubelet/cm/dra/plugin``)."""
    for found in api.objects("resourceslices"):
        spec = found.get("spec") or {}
        if spec.get("nodeName") != node or (driver and spec.get("driver") != driver):
            continue
        name = found["metadata"]["name"]
        with contextlib.suppress(Exception):  # deleted meanwhile (the garbage collector, the driver): as the kubelet
            api.delete("resourceslices", name)


def _config(
    root: Path,
    kubeconfig: Path,
    resource: str,
    table: Mapping[str, Any],
    driver: str,
    *,
    cdi: Mapping[str, Any] | None,
    release_interval: float,
    metrics_port: int | None = None,
    handover: Mapping[str, Any] | None = None,
) -> Path:
    config = dev_config(
        root,
        {resource: {**table, "api": "dra", "dra": {"driver_name": driver}}},
        release_interval=release_interval,
        cdi={"spec_dir": str(root / "cdi"), **(cdi or {})},
        metrics=None if metrics_port is None else {"enabled": True, "port": metrics_port},
    )
    config["kubelet"]["plugins_registry_dir"] = str(root / "plugins_registry")
    config["kubelet"]["plugins_dir"] = str(root / "plugins")
    config["node"] = {"name": NODE}
    config["kubernetes"] = {"kubeconfig": str(kubeconfig)}
    if handover is not None:
        config["handover"] = dict(handover)
    path = root / "devplug.toml"
    write_toml(path, config)
    return path


_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        key, _, value = line.partition("=")
        if key == "PRETTY_NAME":
            return value.strip().strip('"')
    return ""


def node_info(kubelet_dra: DRAConfig = TEST_DRA) -> dict[str, str]:
    """``status.nodeInfo`` as a kubelet of ``kubelet_dra``'s release on this machine writes it: every field of
    ``NodeSystemInfo`` (none is optional: clients such as lightkube refuse a Node without them), ``kubeletVersion``
    the release's (:attr:`DRAConfig.kubelet_version`), the machine's own for the rest, the container runtime the
    dev kubelet's, ``kubeProxyVersion`` (deprecated) empty."""
    machine = platform.machine()
    return {
        "architecture": _ARCHITECTURES.get(machine, machine),
        "bootID": _read("/proc/sys/kernel/random/boot_id"),
        "containerRuntimeVersion": "devkubelet://1",
        "kernelVersion": platform.release(),
        "kubeProxyVersion": "",
        "kubeletVersion": kubelet_dra.kubelet_version,
        "machineID": _read("/etc/machine-id"),
        "operatingSystem": "linux",
        "osImage": _os_image(),
        "systemUUID": _read("/sys/class/dmi/id/product_uuid"),
    }


def node_object(kubelet_dra: DRAConfig = TEST_DRA, name: str = NODE) -> dict[str, Any]:
    """The Node as the kubelet registers it, as far as devplug reads it: its name and ``status.nodeInfo``
    (:func:`node_info`; ``initialNode`` fills the status with ``setNodeStatus``, whose ``VersionInfo`` setter
    writes ``kubeletVersion``, before the Node is created)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"nodeInfo": node_info(kubelet_dra)},
    }


@contextlib.asynccontextmanager
async def dra_node(
    api: ApiServer,
    resource: str,
    table: Mapping[str, Any],
    folder: Path,
    *,
    driver: str | None = None,
    env: Mapping[str, str] | None = None,
    kubelet_dra: DRAConfig = TEST_DRA,
    start: bool = True,
    cdi: Mapping[str, Any] | None = None,
    release_interval: float = 0.2,
    metrics_port: int | None = None,
    handover: Mapping[str, Any] | None = None,
) -> AsyncIterator[DraNode]:
    """A node serving ``resource`` (its config ``table``: driver and options) through DRA as ``driver`` (default:
    the resource name turned around), the daemon started and registered unless ``start`` is False; the daemon
    stopped (it must exit 0) and the kubelet closed afterwards. ``kubelet_dra``: the dev kubelet's DRA side, its
    ``release`` the kubelet release modelled (the Node is created with that release's
    ``status.nodeInfo.kubeletVersion``, :attr:`DRAConfig.kubelet_version`). ``metrics_port``: serve the metrics on
    that port of 127.0.0.1 (``[metrics] enabled``); ``handover``: the config's ``[handover]`` table (a second
    ``devplug run`` on :attr:`DraNode.config_path` then takes the node over from the first)."""
    driver = driver or default_driver_name(resource)
    with short_root() as root:
        api.create("nodes", node_object(kubelet_dra))
        class_name = driver.split(".")[0]
        api.create(
            "deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": class_name},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
                    "extendedResourceName": resource,
                },
            },
        )
        kubeconfig = write_kubeconfig(api, root / "kubeconfig")
        config_path = _config(
            root,
            kubeconfig,
            resource,
            table,
            driver,
            cdi=cdi,
            release_interval=release_interval,
            metrics_port=metrics_port,
            handover=handover,
        )
        kubelet = DevKubelet(
            root / "device-plugins",
            dra=kubelet_dra,
            pod_resources_rate=None,
            on_wipe=functools.partial(wipe_slices, api, NODE),
        )
        await kubelet.start()
        node = DraNode(root, api, kubelet, folder, config_path, resource, driver, class_name, dict(env or {}))
        try:
            if start:
                node.start_daemon()
                await node.registered()
            yield node
        finally:
            try:
                if node.daemon is not None and node.daemon.running():
                    code = await asyncio.to_thread(node.daemon.stop)
                    if code != 0:
                        raise AssertionError(f"the daemon exited {code}:\n{node.log()}")
            finally:
                await kubelet.close()
