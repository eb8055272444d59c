"""Fixtures for devplug-shared's suite: real stores on loopback, several nodes, each a real daemon and dev kubelet.

* ``etcd_server`` -- Debian's ``etcd`` on free loopback ports with a temporary
  data dir, one for the session (each test uses its own key prefix), killed at
  the end. Without the binary the etcd cases are skipped loudly; with
  ``DEVPLUG_REQUIRE_ETCD=1`` (CI) they fail instead.
* a ``kubernetes`` store runs its own :class:`devplug.testing.leaseapi.LeaseApiServer`,
  the model of the API server's Lease endpoints and pods, for each test (node
  names recur from test to test). On it every node of the cluster has its
  kubelet's node Lease kept by :class:`devplug.testing.nodelease.NodeLeaseHeartbeat`
  (a short ``nodeLeaseDurationSeconds``, :data:`NODE_LEASE_S`), and every pod a
  node's dev kubelet admits is a Pod object bound to that node, ``Running``,
  deleted (grace 0, as the kubelet's last delete) when the dev kubelet removes it.
* ``store`` -- parametrized over ``local``, ``etcd`` and ``kubernetes``: the
  ``coordination`` table a node uses (optionally through a :class:`TcpProxy`
  that a test can cut, a network partition) and an observer backend that reads
  the claims as they are in the store.
* ``cluster`` -- :class:`Cluster`: nodes with different names, each a dev kubelet
  and a ``devplug run`` child process serving :data:`RESOURCE` with the shared
  driver; admit, delete, ``kill -9``, restart, a whole node's death;
  :meth:`Cluster.check_invariant`.

Test modules cannot import helpers (``--import-mode=importlib``), so everything
shared is here. Waits poll on conditions (:func:`poll_until`), never sleep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.errors import KubeletError
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess
from devplug.testing.leaseapi import LeaseApiServer
from devplug.testing.loudlines import LoudLine, loud_source
from devplug.testing.nodelease import NodeLeaseHeartbeat
from devplug.testing.waiting import poll_until
from devplug_shared.backends import Backend, build_backend, parse_coordination

#: The resource every test serves.
RESOURCE = "example.com/shared"
#: The kubelets' ``nodeLeaseDurationSeconds`` in the kubernetes cases (40 by default; renewed every quarter of it).
NODE_LEASE_S = 4
#: The backends' ``hold_ttl`` where a test does not set one: long enough for a crash and a restart, far beyond
#: what any test waits for (the default is 360 s).
HOLD_S = 60.0
REQUIRE_ETCD = os.environ.get("DEVPLUG_REQUIRE_ETCD") == "1"
_etcd_status: dict[str, str] = {}


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- etcd ----------------------------------------------------------------------------------------


class EtcdServer:
    """A real single-member etcd on loopback: client and peer ports free, a temporary data dir."""

    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.with_suffix(".log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--name=devplug-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=devplug-test={peer}",
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )

        def healthy() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"etcd exited {self.process.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                    return b"true" in answer.read()
            except OSError:
                return False

        poll_until(healthy, f"etcd on {self.url} to answer /health", 30.0)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """Debian's etcd on loopback for the session; a loud skip (a failure in CI) without the binary."""
    binary = shutil.which("etcd") or next((p for p in ("/usr/bin/etcd",) if os.access(p, os.X_OK)), None)
    if binary is None:
        reason = "etcd suite not run: no etcd binary (install Debian's etcd-server: bash .ci/setup-etcd)"
        _etcd_status["skipped"] = reason
        if REQUIRE_ETCD:
            pytest.fail(reason + " [DEVPLUG_REQUIRE_ETCD=1]", pytrace=False)
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="dps-etcd-", dir="/tmp"))
    server = EtcdServer(binary, folder / "data")
    try:
        server.start()
        _etcd_status["ran"] = server.url
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@loud_source
def _etcd_said() -> list[LoudLine]:
    """Say loudly at the run's end when the etcd cases did not run."""
    return [(f"WARNING: {_etcd_status['skipped']}", "red")] if "skipped" in _etcd_status else []


# --- partitions ----------------------------------------------------------------------------------


class TcpProxy:
    """Forwards a loopback port to the store; :meth:`cut` partitions (drops and refuses), :meth:`heal` ends it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The partition: every open connection is dropped and new ones are closed at once."""
        self._cut.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()


class Outage(Protocol):
    """A node cut from the store, and a way to read the claims meanwhile."""

    def cut(self) -> None: ...

    def heal(self) -> None: ...

    def holders(self) -> dict[str, str]: ...


class ProxyOutage:
    """The node's proxy to the store is cut; the other nodes and the observer still reach it."""

    def __init__(self, proxy: TcpProxy, cluster: Cluster) -> None:
        self.proxy = proxy
        self.cluster = cluster

    def cut(self) -> None:
        self.proxy.cut()

    def heal(self) -> None:
        self.proxy.heal()

    def holders(self) -> dict[str, str]:
        return self.cluster.holders()


class SqliteOutage:
    """The SQLite file is locked (``BEGIN EXCLUSIVE``): no daemon can read or write it until :meth:`heal`."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def cut(self) -> None:
        self.db.execute("BEGIN EXCLUSIVE")

    def heal(self) -> None:
        self.db.execute("ROLLBACK")
        self.db.close()

    def holders(self) -> dict[str, str]:
        """The claims as stored (the lock's own connection may read), live or not."""
        rows = self.db.execute("SELECT slot, holder FROM claims WHERE resource = ?", (RESOURCE,)).fetchall()
        return {str(slot): str(holder) for slot, holder in rows}


# --- stores --------------------------------------------------------------------------------------


@dataclass
class Store:
    """One backend for one test: the ``coordination`` table nodes use, and an observer of the claims."""

    kind: str
    root: Path
    etcd: EtcdServer | None = None
    api: LeaseApiServer | None = None
    scope: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    proxies: list[TcpProxy] = field(default_factory=list)

    def target_port(self) -> int:
        if self.etcd is not None:
            return self.etcd.client_port
        assert self.api is not None
        return int(self.api.url.rsplit(":", 1)[1])

    def proxy(self) -> TcpProxy:
        proxy = TcpProxy(self.target_port())
        self.proxies.append(proxy)
        return proxy

    def table(
        self,
        *,
        lease_ttl: float = 10.0,
        hold_ttl: float | None = None,
        proxy: TcpProxy | None = None,
        timeout: float = 1.0,
    ) -> dict[str, Any]:
        """The ``coordination`` table; ``hold_ttl`` (local, etcd) defaults to :data:`HOLD_S` or ``lease_ttl``."""
        hold = max(lease_ttl, HOLD_S) if hold_ttl is None else hold_ttl
        if self.kind == "local":
            path = str(self.root / "slots.sqlite")
            return {"backend": "local", "path": path, "lease_ttl": lease_ttl, "hold_ttl": hold, "timeout": timeout}
        port = proxy.port if proxy is not None else self.target_port()
        if self.kind == "etcd":
            return {
                "backend": "etcd",
                "endpoints": [f"http://127.0.0.1:{port}"],
                "prefix": f"/devplug-test/{self.scope}",
                "lease_ttl": lease_ttl,
                "hold_ttl": hold,
                "timeout": timeout,
            }
        return {
            "backend": "kubernetes",
            "server": f"http://127.0.0.1:{port}",
            "namespace": f"t-{self.scope}",
            "lease_ttl": lease_ttl,
            "timeout": timeout,
        }

    def backend(self, node: str, *, lease_ttl: float = 10.0) -> Backend:
        """A backend of this store acting as ``node`` (the observer reads as ``observer``)."""
        kind, options = parse_coordination(self.table(lease_ttl=lease_ttl), "coordination")
        folder = self.root / f"backend-{node}"
        folder.mkdir(exist_ok=True)
        return build_backend(kind, options, node=node, resource=RESOURCE, state_dir=folder)

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


BACKENDS = ("local", "etcd", "kubernetes")


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Each backend in turn: local SQLite, a real etcd, the Lease API model."""
    root = Path(tempfile.mkdtemp(prefix="dps-", dir="/tmp"))
    kind: str = request.param
    made = Store(kind, root)
    if kind == "etcd":
        made.etcd = request.getfixturevalue("etcd_server")
    elif kind == "kubernetes":  # an API server of its own: node names, node Leases and pods are per cluster
        made.api = LeaseApiServer().start()
    try:
        yield made
    finally:
        made.close()
        if made.api is not None:
            made.api.close()
        shutil.rmtree(root, ignore_errors=True)


# --- nodes ---------------------------------------------------------------------------------------


@dataclass
class Node:
    """One node: its dev kubelet and its devplug daemon, in a folder of its own (and, on the kubernetes store, its
    kubelet's node Lease heartbeat)."""

    name: str
    root: Path
    kubelet: DevKubeletThread
    daemon: DaemonProcess
    proxy: TcpProxy | None = None
    alive: bool = True
    heartbeat: NodeLeaseHeartbeat | None = None

    @property
    def state_dir(self) -> Path:
        return self.root / "state" / "resources" / "example.com" / "shared" / "driver"

    def health(self) -> dict[str, str]:
        """The kubelet's view of the slots: ID -> health."""
        view = self.kubelet.resource(RESOURCE)
        return {} if view is None else {d.id: d.health for d in view.devices}

    def log(self) -> str:
        return self.daemon.log_text()


class Cluster:
    """Nodes sharing one store; every node serves :data:`RESOURCE` with the shared driver."""

    #: The kubelets' ``nodeLeaseDurationSeconds`` (kubernetes store).
    node_lease_s = NODE_LEASE_S

    def __init__(self, store: Store) -> None:
        self.store = store
        self.nodes: dict[str, Node] = {}
        self.observer = store.backend("observer")
        self._pods = 0

    def add_node(
        self,
        name: str,
        *,
        devices: tuple[str, ...] = ("dev",),
        capacity: int = 2,
        refresh_interval: float = 0.1,
        watch_store: bool = True,
        lease_ttl: float = 10.0,
        hold_ttl: float | None = None,
        partitionable: bool = False,
        discovery: dict[str, Any] | None = None,
        start: bool = True,
    ) -> Node:
        root = Path(tempfile.mkdtemp(prefix=f"dps-{name}-", dir="/tmp"))
        kubelet = DevKubeletThread(
            root / "device-plugins", pod_resources_socket=root / "pod-resources" / "kubelet.sock"
        )
        kubelet.start()
        proxy = self.store.proxy() if partitionable and self.store.kind != "local" else None
        options = {
            "node_name": name,
            "capacity": capacity,
            "refresh_interval": refresh_interval,
            "watch_store": watch_store,
            "discovery": discovery or {"handler": "static", "devices": list(devices)},
            "coordination": self.store.table(lease_ttl=lease_ttl, hold_ttl=hold_ttl, proxy=proxy),
        }
        config = dev_config(
            root, {RESOURCE: {"driver": "shared", "options": options}}, release_interval=0.1, grace_period=1.0
        )
        path = write_toml(root / "devplug.toml", config)
        heartbeat = None
        if self.store.api is not None:  # the node's kubelet keeps its Lease in kube-node-lease
            heartbeat = NodeLeaseHeartbeat(self.store.api.store, name, NODE_LEASE_S).start()
        node = Node(name, root, kubelet, DaemonProcess(path, root / "daemon.log"), proxy, heartbeat=heartbeat)
        self.nodes[name] = node
        if start:
            self.start(node)
        return node

    def start(self, node: Node) -> None:
        before = node.kubelet.registrations(RESOURCE)
        node.daemon.start()
        try:
            node.kubelet.wait_registered(RESOURCE, timeout=20.0, after=before)
            node.kubelet.wait_for(
                lambda k: len(k.events_of("list-and-watch", RESOURCE)) > 0, timeout=20.0, what="a device list"
            )
        except TimeoutError as exc:
            pytest.fail(f"{node.name}: {exc}\n--- daemon log ---\n{node.log()[-4000:]}", pytrace=False)
        node.alive = True

    def kill(self, node: Node) -> None:
        """``kill -9`` of the node's daemon; its pods keep running."""
        node.daemon.kill()

    def restart(self, node: Node) -> None:
        self.kill(node)
        self.start(node)

    def node_dies(self, node: Node) -> None:
        """The whole node dies: its daemon (``kill -9``), its kubelet (no more pods, no more node Lease)."""
        self.kill(node)
        node.kubelet.close()
        if node.heartbeat is not None:
            node.heartbeat.stop()
        node.alive = False

    def admit(self, node: Node, count: int = 1, prefix: str = "pod") -> tuple[str, tuple[str, ...]]:
        """Admit a pod asking ``count`` slots on ``node``: (pod name, its slots); KubeletError if rejected. On the
        kubernetes store the pod is also a Pod object bound to the node, as the scheduler and kubelet leave it."""
        self._pods += 1
        name = f"{prefix}-{self._pods}"
        api = self.store.api
        if api is not None:
            requests = {RESOURCE: str(count)}
            container = {"name": "app", "resources": {"limits": requests, "requests": requests}}
            api.pods.create(
                "default", {"metadata": {"name": name}, "spec": {"nodeName": node.name, "containers": [container]}}
            )
        try:
            pod = node.kubelet.admit_pod(PodSpec(name, [ContainerSpec("app", {RESOURCE: count})]))
        except KubeletError:
            if api is not None:  # the kubelet rejects it: phase Failed (UnexpectedAdmissionError)
                api.pods.set_phase("default", name, "Failed")
            raise
        if api is not None:
            api.pods.set_phase("default", name, "Running")
        return name, pod.container("app").devices[RESOURCE]

    def try_admit(self, node: Node, count: int = 1) -> tuple[str, tuple[str, ...]] | KubeletError:
        try:
            return self.admit(node, count)
        except KubeletError as exc:
            return exc

    def delete(self, node: Node, pod: str) -> None:
        node.kubelet.remove_pod(pod)
        if self.store.api is not None:  # the kubelet's last delete, once the containers stopped
            self.store.api.pods.delete("default", pod, grace_period_seconds=0)

    def holders(self) -> dict[str, str]:
        """Slot -> holding node, as in the store now."""
        return {slot: claim.holder for slot, claim in self.observer.holders().items()}

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
        def details() -> str:
            lines = [f"\nstore: {self.holders()}"]
            for node in self.nodes.values():
                lines.append(f"{node.name} view: {node.health()} attributed: {node.kubelet.attributed(RESOURCE)}")
                lines.append(f"--- {node.name} log (tail) ---\n" + "\n".join(node.log().splitlines()[-25:]))
            return "\n".join(lines)

        return poll_until(predicate, what, timeout, details)

    @staticmethod
    def quiet(seconds: float) -> None:
        """Let time pass for a negative assertion (nothing happened meanwhile); never used to synchronise."""
        time.sleep(seconds)

    def wait_view(self, node: Node, slot: str, health: str, timeout: float = 15.0) -> None:
        self.wait(lambda: node.health().get(slot) == health, f"{node.name}'s kubelet to see {slot} {health}", timeout)

    def outage(self, node: Node) -> Outage:
        """Cut ``node`` from the store: its proxy (etcd, kubernetes), or a lock on the SQLite file (local)."""
        if self.store.kind == "local":
            return SqliteOutage(self.store.root / "slots.sqlite")
        assert node.proxy is not None, f"{node.name} was not added with partitionable=True"
        return ProxyOutage(node.proxy, self)

    def check_invariant(self) -> dict[str, str]:
        """No slot held by live pods on two nodes, and every held slot claimed in the store by its node."""
        owners: dict[str, str] = {}
        for node in self.nodes.values():
            if not node.alive:
                continue
            for slot, (pod, _) in node.kubelet.attributed(RESOURCE).items():
                assert slot not in owners, f"slot {slot} held by live pods on {owners[slot]} and {node.name} ({pod})"
                owners[slot] = node.name
        holders = self.holders()
        for slot, name in owners.items():
            assert holders.get(slot) == name, f"slot {slot} is used by a pod on {name} but the store says {holders}"
        return owners

    def close(self) -> None:
        failures = []
        for node in self.nodes.values():
            if node.daemon.running():
                try:
                    code = node.daemon.stop()
                except subprocess.TimeoutExpired:
                    code = -9
                if code != 0:
                    failures.append(f"{node.name}: daemon exited {code}:\n{node.log()[-3000:]}")
            node.kubelet.close()
            if node.heartbeat is not None:
                node.heartbeat.stop()
            shutil.rmtree(node.root, ignore_errors=True)
        self.observer.close()
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)


@pytest.fixture
def cluster(store: Store) -> Iterator[Cluster]:
    """Nodes on the parametrized store; daemons still running at the end get SIGTERM and must exit 0."""
    made = Cluster(store)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``wait_until(predicate, what="...", timeout=10)``: the kit's :func:`poll_until` for test modules."""

    def wait(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
        return poll_until(predicate, what, timeout)

    return wait


@pytest.fixture
def unused_port() -> Callable[[], int]:
    """A function returning a loopback TCP port free now (:func:`free_port`)."""
    return free_port
