"""The dev kubelet: a faithful stand-in for the kubelet's device manager, over real gRPC on unix sockets.

For devplug's tests, ``devplug demo``, ``devplug kubelet`` and driver authors
without a kubelet. It serves Registration on ``kubelet.sock`` and PodResources
v1, dials each plugin inside Register, consumes ListAndWatch, and admits and
removes pods the way the kubelet does (init-container device reuse, preferred
allocation, one Allocate per container, PreStartContainer at each start). In
KEP mode it also calls PostStopContainer and Deallocate at pod removal.

* :class:`DevKubelet` -- asyncio (grpc.aio);
* :class:`DevKubeletThread` -- the same, synchronous, on its own loop thread;
* :func:`run_foreground` -- serve until cancelled, logging every event.
"""

from __future__ import annotations

from devplug.devkubelet.devicemanager import ContainerStartError
from devplug.devkubelet.kubelet import KUBELET_SOCKET, DevKubelet, run_foreground
from devplug.devkubelet.model import (
    EVENT_KINDS,
    AdmittedContainer,
    AdmittedPod,
    ContainerSpec,
    DeviceInfo,
    KubeletEvent,
    PluginOptions,
    PodSpec,
    ResourceView,
)
from devplug.devkubelet.plugin_client import PluginCallError
from devplug.devkubelet.threaded import DevKubeletThread

__all__ = [
    "EVENT_KINDS",
    "KUBELET_SOCKET",
    "AdmittedContainer",
    "AdmittedPod",
    "ContainerSpec",
    "ContainerStartError",
    "DevKubelet",
    "DevKubeletThread",
    "DeviceInfo",
    "KubeletEvent",
    "PluginCallError",
    "PluginOptions",
    "PodSpec",
    "ResourceView",
    "run_foreground",
]
