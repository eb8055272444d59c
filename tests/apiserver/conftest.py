"""Fixtures for the API server stand-in's tests: a server on loopback, lightkube clients, a watch in a thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devplug.testing.apiserver import ApiServer

NODE = "node-a"
DRIVER = "fpga.example.com"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def make_client(api: ApiServer, manager: str | None = None) -> Any:
    """A lightkube client of ``api`` without credentials (as devplug-shared's backend builds one)."""
    import httpx2
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "standin", "cluster": {"server": api.url}}],
            "users": [{"name": "anonymous", "user": {}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "anonymous"}}],
            "current-context": "standin",
        }
    )
    return Client(config, namespace="default", timeout=httpx2.Timeout(10.0), field_manager=manager, trust_env=False)


@pytest.fixture
def client(api: ApiServer) -> Iterator[Any]:
    made = make_client(api)
    yield made
    made.close()


class WatchThread:
    """Runs a lightkube watch in a thread; its events (type, name, resourceVersion) or its error arrive in a queue."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self.events: queue.Queue[tuple[str, str, str] | BaseException] = queue.Queue()
        self._start = start
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for kind, obj in self._start():
                self.events.put((kind, obj.metadata.name or "", obj.metadata.resourceVersion or ""))
        except BaseException as exc:  # the test reads it from the queue
            self.events.put(exc)

    def next(self, timeout: float = 10.0) -> tuple[str, str, str]:
        item = self.events.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def error(self, timeout: float = 10.0) -> BaseException:
        item = self.events.get(timeout=timeout)
        assert isinstance(item, BaseException), f"expected the watch to fail, it got {item}"
        return item


@pytest.fixture
def watch_thread() -> Callable[[Callable[[], Any]], WatchThread]:
    return WatchThread


def node(name: str = NODE, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def driver_class(name: str = "fpga", driver: str = DRIVER) -> dict[str, Any]:
    """A DeviceClass selecting every device of ``driver``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def slice_of(
    name: str, node_obj: dict[str, Any] | None, devices: list[str], *, generation: int = 1, driver: str = DRIVER
) -> dict[str, Any]:
    """A ResourceSlice of ``driver`` for the node (owned by it when the Node object is given)."""
    meta: dict[str, Any] = {"name": name}
    node_name = NODE
    if node_obj is not None:
        node_name = node_obj["metadata"]["name"]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_obj["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": d, "attributes": {"model": {"string": "agilex"}}} for d in devices],
        },
    }


def status_of(error: pytest.ExceptionInfo[Any]) -> dict[str, Any]:
    """The ``Status`` of a lightkube ``ApiError``, as a dict."""
    found: dict[str, Any] = error.value.status.to_dict()
    return found
