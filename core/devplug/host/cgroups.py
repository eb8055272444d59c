"""The cgroup names the kubelet gives pods, as one truth for the container-liveness reader
(:mod:`devplug.engine.liveness`) and the dev kubelet that makes them (:mod:`devplug.devkubelet.cgroups`).

Kubernetes v1.32, ``pkg/kubelet/cm``:

* the kubelet's own cgroups hang under ``--cgroup-root``: ``kubepods`` is the node-allocatable cgroup
  (``defaultNodeAllocatableCgroupName`` in ``node_container_manager_linux.go``);
* Guaranteed pods live right under ``kubepods``, Burstable and BestEffort ones under ``kubepods/burstable`` and
  ``kubepods/besteffort`` (``qosContainerManagerImpl.Start``, ``qos_container_manager_linux.go``);
* a pod's cgroup is ``pod<uid>`` under its QoS cgroup (``GetPodContainerName``, ``GetPodCgroupNameSuffix``);
* a name's literal path (``cgroupCommon.Name``): with the cgroupfs driver the components joined by ``/``
  (``CgroupName.ToCgroupfs``); with the systemd driver each component with ``-`` replaced by ``_``
  (``escapeSystemdCgroupName``), joined by ``-``, with ``.slice`` added, expanded into its parents
  (``CgroupName.ToSystemd``, runc's ``ExpandSlice``): ``{kubepods, besteffort, pod12-34}`` is
  ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice``, and a root ``/a-b`` makes
  it ``/a_b.slice/a_b-kubepods.slice/...``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "NODE_ALLOCATABLE",
    "QOS_CLASSES",
    "expand_slice",
    "kubepods_name",
    "literal_path",
    "pod_name",
    "root_name",
]

#: The pod QoS classes (``v1.PodQOSClass``, lowercased as the kubelet names their cgroups).
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

#: ``defaultNodeAllocatableCgroupName`` in ``pkg/kubelet/cm/node_container_manager_linux.go``.
NODE_ALLOCATABLE = "kubepods"

SLICE = ".slice"


def expand_slice(slice_name: str) -> str:
    """runc's ``ExpandSlice``: ``a-b-c.slice`` is ``/a.slice/a-b.slice/a-b-c.slice``; ``-.slice`` is ``/``."""
    if len(slice_name) <= len(SLICE) or not slice_name.endswith(SLICE) or "/" in slice_name:
        raise ValueError(f"invalid slice name: {slice_name}")
    name = slice_name[: -len(SLICE)]
    if name == "-":
        return "/"
    path, prefix = "", ""
    for component in name.split("-"):
        if not component:
            raise ValueError(f"invalid slice name: {slice_name}")
        path += f"/{prefix}{component}{SLICE}"
        prefix += f"{component}-"
    return path


def root_name(cgroup_root: str) -> tuple[str, ...]:
    """``ParseCgroupfsToCgroupName(--cgroup-root)``: its components."""
    return tuple(part for part in cgroup_root.split("/") if part)


def kubepods_name(cgroup_root: str) -> tuple[str, ...]:
    """The node-allocatable cgroup's name: the root's components plus ``kubepods``."""
    return (*root_name(cgroup_root), NODE_ALLOCATABLE)


def pod_name(cgroup_root: str, qos: str, uid: str) -> tuple[str, ...]:
    """A pod's cgroup name: ``pod<uid>`` under its QoS cgroup (Guaranteed: right under ``kubepods``)."""
    if qos not in QOS_CLASSES:
        raise ValueError(f"unknown pod QoS class {qos!r} (one of {', '.join(QOS_CLASSES)})")
    base = kubepods_name(cgroup_root)
    return (*base, f"pod{uid}") if qos == "guaranteed" else (*base, qos, f"pod{uid}")


def literal_path(name: Iterable[str], driver: str) -> str:
    """``cgroupCommon.Name``: the cgroupfs path of a cgroup name for the driver (``cgroupfs`` or ``systemd``)."""
    parts = tuple(name)
    if driver == "cgroupfs":
        return "/" + "/".join(parts)
    if not parts:
        return "/"
    return expand_slice("-".join(part.replace("-", "_") for part in parts) + SLICE)
