"""Container liveness as the core sees it: whether any process of a pod is left on the node.

The kubelet can forget a pod while its containers still run: a static pod whose
manifest was removed, or a pod deleted with ``--grace-period=0 --force``, leaves
its pod manager at once (``HandlePodRemoves`` in ``pkg/kubelet/kubelet.go``),
so PodResources and the checkpoint stop attributing its devices, while the pod
worker is still killing its containers within their grace period
(``pkg/kubelet/pod_workers.go``). Neither can tell a plugin that the old
containers still run; the node's cgroups can.

The core asks through :class:`PodProbe`, which the daemon gives it
(:class:`devplug.daemon.podliveness.ContainerLiveness` reads the kubelet's pod
cgroups, and is told by inotify when a pod's last process is gone): the core
itself reads no cgroup and watches no file. Answers are :class:`PodLiveness`
values: ``running``, ``exited``, or ``unknown`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from devplug.config import LivenessConfig

__all__ = ["PodLiveness", "PodProbe", "PodState"]


class PodState(StrEnum):
    """Whether a pod's containers still run, as far as the node's cgroups tell."""

    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PodLiveness:
    """One answer about one pod: its state and why (the cgroup read, or why nothing could be read)."""

    state: PodState
    detail: str


class PodProbe(Protocol):
    """Whether pods' containers still run, node-wide (event loop thread only): what :class:`~devplug.engine.tenantexit.
    ExitEvidence` and the release queue ask, and what the daemon reports."""

    #: Why the pods' cgroups cannot be read (None while they can).
    problem: str | None

    @property
    def layout(self) -> object | None:
        """What was found to read (None while nothing is)."""
        ...

    @property
    def mode(self) -> str:
        """How liveness is read (``cgroup v2``, ``cgroup v1``), or ``unknown``."""
        ...

    def start(self) -> None:
        """Look for what to read and say what was found (once the event loop runs)."""

    def close(self) -> None:
        """Stop watching (at shutdown)."""

    def reconfigure(self, config: LivenessConfig) -> None:
        """A reload changed ``[liveness]``."""

    def available(self) -> bool:
        """Whether pods' liveness can be read now."""
        ...

    def describe(self) -> dict[str, Any]:
        """For the status file."""
        ...

    def pod(self, uid: str | None) -> PodLiveness:
        """Whether any process of the pod with UID ``uid`` is left (``uid`` None: no way to tell)."""
        ...

    def on_exit(self, uid: str, callback: Callable[[PodLiveness], None]) -> Callable[[], None]:
        """Call ``callback`` (once, on the event loop) when the pod's last process is gone or liveness becomes
        unknown; returns a function that cancels the wait."""
        ...

    async def wait_exited(self, uid: str, timeout: float) -> PodLiveness:
        """The pod's liveness once its last process is gone, or as it is after ``timeout`` seconds."""
        ...
