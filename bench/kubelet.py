"""A minimal kubelet for the speed scenarios: Registration and an empty PodResources on real sockets.

On Register it dials the plugin and asks for its options (as the kubelet does,
inside the call), then holds ListAndWatch open with a :class:`ListWatcher`
that keeps raw bytes: unlike the dev kubelet it builds no Python object per
device, so a 10,000-device list pushed every 20 ms costs the measuring process
nearly nothing. PodResources lists no pods, so the daemon's reconciler polls
(as it does on a node while devices are held) but never sees a pod to release.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.client import ListWatcher, PluginClient
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc

__all__ = ["MiniKubelet", "Registration"]


@dataclass
class Registration:
    resource: str
    endpoint: str
    at: float  # time.time() when the plugin answered GetDevicePluginOptions inside Register
    client: PluginClient
    watcher: ListWatcher


class _Registrar:
    def __init__(self, kubelet: MiniKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        self.kubelet._register(request)
        return dp.Empty()


class _PodResources:
    def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse()

    def GetAllocatableResources(self, request: Any, context: Any) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse()

    def Get(self, request: pr.GetPodResourcesRequest, context: Any) -> pr.GetPodResourcesResponse:
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")
        raise AssertionError("unreachable")


class MiniKubelet:
    """``<root>/device-plugins/kubelet.sock`` and ``<root>/pod-resources/kubelet.sock``."""

    def __init__(self, root: Path) -> None:
        self.plugin_dir = root / "device-plugins"
        self.pod_resources_socket = root / "pod-resources" / "kubelet.sock"
        self.registrations: dict[str, Registration] = {}
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> MiniKubelet:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="mini-kubelet"))
        dp_grpc.add_RegistrationServicer_to_server(_Registrar(self), server)
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(), server)
        server.add_insecure_port(f"unix:{self.plugin_dir / 'kubelet.sock'}")
        server.add_insecure_port(f"unix:{self.pod_resources_socket}")
        server.start()
        self._server = server
        return self

    def _register(self, request: dp.RegisterRequest) -> None:
        client = PluginClient(self.plugin_dir / request.endpoint)
        client.options()
        at = time.time()
        watcher = client.watch()
        with self._cond:
            old = self.registrations.get(request.resource_name)
            self.registrations[request.resource_name] = Registration(
                request.resource_name, request.endpoint, at, client, watcher
            )
            self._cond.notify_all()
        if old is not None:
            old.watcher.close()
            old.client.close()

    def wait_registered(self, resource: str, timeout: float = 60.0) -> Registration:
        """The registration of ``resource``, waiting for it if needed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while resource not in self.registrations:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{resource} did not register within {timeout:g} s")
                self._cond.wait(left)
            return self.registrations[resource]

    def stop(self) -> None:
        for reg in self.registrations.values():
            reg.watcher.close()
            reg.client.close()
        self.registrations.clear()
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None

    def __enter__(self) -> MiniKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
