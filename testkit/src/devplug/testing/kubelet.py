"""The dev kubelet for driver authors' suites and demos, on the public surface.

Drivers may import only :mod:`devplug.testing` (not :mod:`devplug.devkubelet`);
a driver's own demo (``drivers/fpga/demo/fpga_demo.py``) takes the dev kubelet and
the pod types from here.
"""

from __future__ import annotations

from devplug.devkubelet import (
    AdmittedPod,
    CgroupLayout,
    ContainerSpec,
    ContainerStartError,
    DevKubeletThread,
    KubeletEvent,
    PluginCallError,
    PodPhase,
    PodSpec,
    ResourceView,
    SyncLoopOp,
)
from devplug.errors import KubeletError

__all__ = [
    "AdmittedPod",
    "CgroupLayout",
    "ContainerSpec",
    "ContainerStartError",
    "DevKubeletThread",
    "KubeletError",
    "KubeletEvent",
    "PluginCallError",
    "PodPhase",
    "PodSpec",
    "ResourceView",
    "SyncLoopOp",
]
