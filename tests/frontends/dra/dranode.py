"""A node served through DRA, for the DRA front end's tests: every part real.

* the API server stand-in (:mod:`devplug.testing.apiserver`) over HTTP on
  loopback, with this node, a DeviceClass of the driver, and the scheduler
  stand-in allocating claims to pods;
* ``devplug run`` as a child process (:class:`~devplug.process.DaemonProcess`),
  the mock driver serving ``example.com/mock`` with ``api = "dra"``;
* the dev kubelet's DRA side (:class:`~devplug.devkubelet.DevKubelet` with
  ``dra=``) on the event loop of the test, talking to the daemon over the real
  unix sockets under the test's folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devplug.devkubelet import ContainerSpec, DevKubelet, DRAConfig, PodClaim, PodSpec, ResourceClaimRef
from devplug.engine.ledger import read_ledger_records
from devplug.process import DaemonProcess
from devplug.resource_names import resource_state_dir
from devplug.testing.apiserver import ApiServer
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.scheduler import SchedulerStandIn
from devplug_mock import read_calls
from tests.devkubelet.draplugin import FAST
from tests.frontends.dra.conftest import NODE, node, write_kubeconfig

RESOURCE = "example.com/mock"
DRIVER = "mock.example.com"
NS = "default"
CLASS = "mock"
#: How long a test waits for something the daemon or the kubelet does on its own.
WAIT = 20.0

#: The dev kubelet's DRA timings for these tests (the kubelet's behaviour, at a test's pace).
KUBELET_DRA = FAST


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = WAIT, details: Any = None) -> Any:
    """Poll ``predicate`` on the event loop (the dev kubelet runs between polls) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}{extra}", pytrace=False)
        await asyncio.sleep(0.02)


@dataclass
class DraNode:
    """One test's node (see the module's docstring)."""

    root: Path
    api: ApiServer
    kubelet: DevKubelet
    mock_dir: Path
    config_path: Path
    daemon: DaemonProcess | None = None
    scheduler: SchedulerStandIn = field(init=False)

    def __post_init__(self) -> None:
        self.scheduler = SchedulerStandIn(self.api.storage)

    # --- the daemon

    def start_daemon(self) -> DaemonProcess:
        self.daemon = DaemonProcess(self.config_path, self.root / "daemon.log").start()
        return self.daemon

    def log(self) -> str:
        return self.daemon.log_text() if self.daemon is not None else ""

    @property
    def state_dir(self) -> Path:
        return resource_state_dir(self.root / "state", RESOURCE)

    def records(self) -> list[dict[str, Any]]:
        """The ledger's records as the file holds them."""
        return read_ledger_records(self.state_dir / "ledger.json", RESOURCE)

    def calls(self, hook: str | None = None) -> list[dict[str, Any]]:
        """The mock driver's call log (of ``hook``, or every hook)."""
        return [c for c in read_calls(self.mock_dir) if hook is None or c.get("hook") == hook]

    async def registered(self, count: int = 1) -> None:
        await eventually(
            lambda: sum(1 for v in self.kubelet.dra_plugins(DRIVER) if v.connected) >= count,
            f"{count} connected instance(s) of {DRIVER}",
            details=self.log,
        )

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.objects("resourceslices") if s["spec"]["driver"] == DRIVER]

    async def published(self, devices: int) -> list[dict[str, Any]]:
        def count() -> bool:
            return sum(len(s["spec"].get("devices") or ()) for s in self.slices()) == devices

        await eventually(count, f"{devices} devices published", details=self.log)
        return self.slices()

    # --- pods and claims

    def make_claim(self, name: str, count: int = 1, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": CLASS, "count": count}}]}
        }
        if config is not None:
            spec["devices"]["config"] = [{"requests": ["dev"], "opaque": {"driver": DRIVER, "parameters": config}}]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
        return self.api.create("resourceclaims", body, NS)

    def schedule_pod(self, name: str, claims: list[str]) -> tuple[PodSpec, list[dict[str, Any]]]:
        """Create the pod in the API server, let the scheduler allocate its claims and bind it; the pod as the
        dev kubelet admits it, and the claims as stored."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "app"}],
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        }
        made = self.api.create("pods", pod, NS)
        stored = self.scheduler.schedule(NS, name, NODE)
        spec = PodSpec(
            name,
            [ContainerSpec("app", claims=list(claims))],
            namespace=NS,
            uid=made["metadata"]["uid"],
            resource_claims=[
                PodClaim(
                    c["metadata"]["name"], ResourceClaimRef(NS, c["metadata"]["name"], c["metadata"]["uid"], (DRIVER,))
                )
                for c in stored
            ],
        )
        return spec, stored

    def allocated_devices(self, claim: dict[str, Any]) -> list[str]:
        return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def write_devices(mock_dir: Path, devices: Mapping[str, str]) -> None:
    mock_dir.mkdir(parents=True, exist_ok=True)
    for name, content in devices.items():
        (mock_dir / name).write_text(content)


def node_config(
    root: Path, kubeconfig: Path, mock_dir: Path, *, cdi: Mapping[str, Any] | None = None, release_interval: float = 0.2
) -> Path:
    config = dev_config(
        root,
        {
            RESOURCE: {
                "driver": "mock",
                "api": "dra",
                "dra": {"driver_name": DRIVER},
                "options": {"directory": str(mock_dir)},
            }
        },
        release_interval=release_interval,
        cdi={"spec_dir": str(root / "cdi"), **(cdi or {})},
    )
    config["kubelet"]["plugins_registry_dir"] = str(root / "plugins_registry")
    config["kubelet"]["plugins_dir"] = str(root / "plugins")
    config["node"] = {"name": NODE}
    config["kubernetes"] = {"kubeconfig": str(kubeconfig)}
    path = root / "devplug.toml"
    write_toml(path, config)
    return path


def device_class(api: ApiServer) -> None:
    api.create(
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                "extendedResourceName": RESOURCE,
            },
        },
    )


@contextlib.asynccontextmanager
async def dra_node(
    api: ApiServer,
    devices: Mapping[str, str] | None = None,
    *,
    kubelet_dra: DRAConfig = KUBELET_DRA,
    start: bool = True,
    cdi: Mapping[str, Any] | None = None,
) -> AsyncIterator[DraNode]:
    """A node with the daemon started and registered (unless ``start`` is False), stopped afterwards."""
    with short_root() as root:
        async with _node(root, api, devices, kubelet_dra=kubelet_dra, start=start, cdi=cdi) as lab:
            yield lab


@contextlib.asynccontextmanager
async def _node(
    root: Path,
    api: ApiServer,
    devices: Mapping[str, str] | None,
    *,
    kubelet_dra: DRAConfig,
    start: bool,
    cdi: Mapping[str, Any] | None,
) -> AsyncIterator[DraNode]:
    mock_dir = root / "mock"
    write_devices(mock_dir, devices if devices is not None else {"mock0": "", "mock1": "", "mock2": ""})
    api.create("nodes", node())
    device_class(api)
    kubeconfig = write_kubeconfig(api, root / "kubeconfig")
    config_path = node_config(root, kubeconfig, mock_dir, cdi=cdi)
    kubelet = DevKubelet(root / "device-plugins", dra=kubelet_dra, pod_resources_rate=None)
    await kubelet.start()
    lab = DraNode(root, api, kubelet, mock_dir, config_path)
    try:
        if start:
            lab.start_daemon()
            await lab.registered()
        yield lab
    finally:
        try:
            if lab.daemon is not None and lab.daemon.running():
                code = await asyncio.to_thread(lab.daemon.stop)
                assert code == 0, f"the daemon exited {code}:\n{lab.log()}"
        finally:
            await kubelet.close()


@contextlib.contextmanager
def short_root() -> Iterator[Path]:
    """A folder under /tmp with a short path: unix socket paths hold at most 107 bytes, and pytest's ``tmp_path``
    plus ``plugins/<driver>/dra-<instance>.sock`` can be longer."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spec_of(root: Path, claim_uid: str) -> dict[str, Any]:
    """The claim's CDI spec file, parsed."""
    data: dict[str, Any] = json.loads((root / "cdi" / f"dra-{DRIVER}-{claim_uid}.json").read_text())
    return data
