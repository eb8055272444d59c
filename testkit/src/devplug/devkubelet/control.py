"""The dev kubelet's control socket: admit and remove pods, restart, and look inside a running dev kubelet.

``devplug kubelet --dir DIR`` serves a :class:`DevKubelet` in the foreground and, beside it, this control socket
(by default ``DIR/../devkubelet.sock``: outside the device-plugin folder, whose non-folder entries the kubelet
deletes at every start). ``devplug kubelet admit|remove|restart|show --dir DIR`` are its clients, run in a
second terminal while a driver is tried by hand.

The protocol is one JSON object per line over a unix stream socket (mode 0600): the client sends one request and
reads one answer, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``, then the connection ends.
Requests (``op``):

* ``admit``: ``pod``, ``namespace``, ``containers`` (each ``name``, ``requests`` ``{resource: count}``, ``init``,
  ``stop_delay`` seconds or ``ignore_sigterm``), ``grace`` (``terminationGracePeriodSeconds``): the pod is
  admitted as :meth:`DevKubelet.admit_pod` admits it; the answer is the pod as admitted (:func:`pod_json`);
* ``remove``: ``pod``, ``namespace``, ``how`` -- ``graceful`` (:meth:`DevKubelet.remove_pod`, ``wait`` for its
  containers to be gone), ``force`` (:meth:`DevKubelet.force_delete_pod`), ``static``
  (:meth:`DevKubelet.remove_static_pod`) or ``finish`` (:meth:`DevKubelet.finish_pod`: the containers end, the
  pod object stays);
* ``restart``: a kubelet restart (:meth:`DevKubelet.restart`), ``pod_list_delay`` seconds of restart window;
* ``show``: a snapshot (:func:`snapshot`) of the resources and devices, the allocations (``podDevices``), the pods,
  the last ``events`` events, and what a daemon must be told to find the pods' containers (``liveness``).

Library code: errors are :class:`~devplug.errors.KubeletError`; the command line prints and exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devplug.devkubelet.daemonconfig import daemon_settings
from devplug.devkubelet.kubelet import DevKubelet
from devplug.devkubelet.model import MAX_POD_LIST_DELAY, AdmittedPod, ContainerSpec, PodSpec, check_delay
from devplug.errors import KubeletError
from devplug.kube.ids import dns1123_label_problem, dns1123_subdomain_problem
from devplug.types import ContainerAllocation

__all__ = [
    "CONTROL_SOCKET",
    "REMOVALS",
    "ControlServer",
    "NoDevKubeletError",
    "call",
    "default_control_socket",
    "pod_json",
    "snapshot",
]

_log = logging.getLogger("devplug.devkubelet")

#: The control socket's file name, in the parent of the device-plugin folder (the kubelet's root dir).
CONTROL_SOCKET = "devkubelet.sock"

#: How ``remove`` may take a pod away: the kubelet's ways, and the containers ending on their own.
REMOVALS = ("graceful", "force", "static", "finish")

#: The longest request line the server reads (a pod of many containers fits many times over).
_LINE_LIMIT = 1 << 20


class NoDevKubeletError(KubeletError):
    """No dev kubelet answers on the control socket (none runs there, or it stopped)."""


def default_control_socket(device_plugin_dir: Path) -> Path:
    """``<device_plugin_dir>/../devkubelet.sock``: beside ``device-plugins/`` and ``pod-resources/``."""
    return Path(device_plugin_dir).absolute().parent / CONTROL_SOCKET


def _allocation_json(allocation: ContainerAllocation) -> dict[str, Any]:
    return {
        "envs": dict(allocation.envs),
        "mounts": [
            {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
            for m in allocation.mounts
        ],
        "devices": [
            {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
            for d in allocation.devices
        ],
        "annotations": dict(allocation.annotations),
        "cdi_devices": [c.name for c in allocation.cdi_devices],
    }


def pod_json(pod: AdmittedPod, running: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """A pod as JSON: name, namespace, UID, phase, and each container's devices and Allocate answers.

    ``running`` (container name -> whether it runs) adds each container's ``running``.
    """
    containers = []
    for container in pod.containers:
        entry: dict[str, Any] = {
            "name": container.name,
            "init": container.init,
            "devices": {res: list(ids) for res, ids in container.devices.items()},
            "allocations": {res: _allocation_json(a) for res, a in container.allocations.items()},
        }
        if running is not None:
            entry["running"] = running.get(container.name, False)
        containers.append(entry)
    return {
        "name": pod.spec.name,
        "namespace": pod.spec.namespace,
        "uid": pod.uid,
        "phase": pod.phase.value,
        "containers": containers,
    }


def snapshot(kubelet: DevKubelet, liveness: Mapping[str, Any], events: int = 20) -> dict[str, Any]:
    """What ``devplug kubelet show`` shows: resources, allocations, pods, the last ``events`` events."""
    resources = []
    for view in kubelet.resources():
        attributed = kubelet.attributed(view.name)
        resources.append(
            {
                "name": view.name,
                "endpoint": view.endpoint,
                "registered": view.registered,
                "registrations": view.registrations,
                "options": {
                    "pre_start_required": view.options.pre_start_required,
                    "get_preferred_allocation_available": view.options.get_preferred_allocation_available,
                    "post_stop_required": view.options.post_stop_required,
                    "deallocate_available": view.options.deallocate_available,
                },
                "capacity": view.capacity,
                "allocatable": view.allocatable,
                "free": view.free,
                "devices": [
                    {
                        "id": d.id,
                        "health": d.health,
                        "numa_nodes": list(d.numa_nodes),
                        "in_use": d.id in view.in_use,
                        "held_by": "/".join(attributed[d.id]) if d.id in attributed else "",
                    }
                    for d in view.devices
                ],
            }
        )
    allocations = [
        {
            "pod": entry.pod,
            "pod_uid": entry.pod_uid,
            "container": entry.container,
            "resource": entry.resource,
            "devices": list(entry.device_ids),
        }
        for entry in kubelet.pod_device_entries()
    ]
    pods = []
    for pod in kubelet.known_pods():
        running = set(kubelet.running_containers(pod.spec.name, pod.spec.namespace))
        pods.append(pod_json(pod, {c.name: c.name in running for c in pod.containers}))
    recent = kubelet.events[-events:] if events > 0 else []
    return {
        "kubelet_socket": str(kubelet.kubelet_socket),
        "pod_resources_socket": str(kubelet.pod_resources_socket),
        "kep_mode": kubelet.kep_mode,
        "sources_ready": kubelet.sources_ready,
        "containers": kubelet.cgroup_layout.describe() if kubelet.cgroup_layout is not None else "",
        "liveness": dict(liveness),
        "daemon_settings": daemon_settings(kubelet.device_plugin_dir, kubelet.pod_resources_socket, liveness),
        "resources": resources,
        "allocations": allocations,
        "pods": pods,
        "events": [
            {
                "time": e.time,
                "kind": e.kind,
                "resource": e.resource,
                "detail": e.detail,
                "device_ids": list(e.device_ids),
                "line": str(e),
            }
            for e in recent
        ],
    }


def _text(request: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = request.get(key, default)
    if not isinstance(value, str) or not value:
        raise KubeletError(f"control request: {key!r} must be a non-empty string, got {value!r}")
    return value


def _pod_spec(request: Mapping[str, Any]) -> PodSpec:
    """The :class:`PodSpec` an ``admit`` request asks for (``ValueError`` from the spec becomes a KubeletError)."""
    raw = request.get("containers")
    if not isinstance(raw, list) or not raw:
        raise KubeletError("control request: 'containers' must be a non-empty list")
    containers = []
    try:
        for item in raw:
            if not isinstance(item, dict):
                raise ValueError(f"a container must be an object, got {item!r}")
            stop_delay = math.inf if item.get("ignore_sigterm") else item.get("stop_delay", 0.0)
            requests = item.get("requests", {})
            if not isinstance(requests, dict):
                raise ValueError(f"container {item.get('name')!r}: requests must be an object, got {requests!r}")
            containers.append(
                ContainerSpec(_text(item, "name"), requests, init=bool(item.get("init", False)), stop_delay=stop_delay)
            )
        return PodSpec(
            _text(request, "pod"),
            containers,
            namespace=_text(request, "namespace", "default"),
            termination_grace_period=request.get("grace", 30),
        )
    except ValueError as exc:
        raise KubeletError(f"cannot admit that pod: {exc}") from exc


class ControlServer:
    """Serves the control protocol for one :class:`DevKubelet` on a unix socket, on the kubelet's event loop.

    ``liveness`` is the ``[liveness]`` table a daemon needs to find the dev kubelet's containers; ``show``
    answers it. The socket outlives kubelet restarts (it is not in the device-plugin folder).
    """

    def __init__(self, kubelet: DevKubelet, path: Path, liveness: Mapping[str, Any]) -> None:
        self._kubelet = kubelet
        self._path = Path(path).absolute()
        self._liveness = dict(liveness)
        self._server: asyncio.AbstractServer | None = None

    @property
    def path(self) -> Path:
        """Where the control socket is."""
        return self._path

    async def start(self) -> None:
        """Serve on :attr:`path` (a stale socket file there is replaced; any other file is an error)."""
        if self._path.is_symlink() or (self._path.exists() and not self._path.is_socket()):
            raise KubeletError(f"cannot serve the control socket on {self._path}: something else is there")
        if self._path.is_socket():
            try:
                await asyncio.to_thread(call, self._path, {"op": "show", "events": 0}, 2.0)
            except NoDevKubeletError:
                self._path.unlink()  # a socket nobody serves: a dev kubelet that died
            else:
                raise KubeletError(f"another dev kubelet serves the control socket {self._path}")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self._path), limit=_LINE_LIMIT)
        except OSError as exc:
            raise KubeletError(f"cannot serve the control socket on {self._path}: {exc}") from exc
        os.chmod(self._path, 0o600)

    async def close(self) -> None:
        """Stop serving and remove the socket file."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        await server.wait_closed()
        if self._path.is_socket():
            self._path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await reader.readline()
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise KubeletError(f"control request: expected a JSON object, got {line[:200]!r}")
                answer: dict[str, Any] = {"ok": True, "result": await self._handle(request)}
            except (KubeletError, TimeoutError) as exc:
                answer = {"ok": False, "error": str(exc)}
            except (ValueError, asyncio.LimitOverrunError) as exc:
                answer = {"ok": False, "error": f"control request: not one line of JSON: {exc}"}
            except Exception as exc:  # a bug here must not end the dev kubelet: answer and log it
                _log.exception("dev kubelet: control request failed")
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away; nothing to answer
        finally:
            writer.close()

    async def _handle(self, request: Mapping[str, Any]) -> Any:
        op = request.get("op")
        kubelet = self._kubelet
        if op == "admit":
            spec = _pod_spec(request)
            pod = await kubelet.admit_pod(spec)
            return pod_json(pod)
        if op == "remove":
            name, namespace = _text(request, "pod"), _text(request, "namespace", "default")
            for what, problem in (
                ("pod name", dns1123_subdomain_problem(name)),
                ("pod namespace", dns1123_label_problem(namespace)),
            ):
                if problem is not None:
                    raise KubeletError(f"control request: {what} {problem}")
            how = request.get("how", "graceful")
            if how not in REMOVALS:
                raise KubeletError(f"control request: 'how' must be one of {', '.join(REMOVALS)}, got {how!r}")
            kubelet.pod_uid(name, namespace)  # KubeletError naming the pod when it was never admitted
            started = time.monotonic()
            if how == "graceful":
                await kubelet.remove_pod(name, namespace, wait=bool(request.get("wait", True)))
            elif how == "force":
                await kubelet.force_delete_pod(name, namespace)
            elif how == "static":
                await kubelet.remove_static_pod(name, namespace)
            else:
                await kubelet.finish_pod(name, namespace)
            phase = kubelet.pod_phase(name, namespace)
            return {
                "pod": f"{namespace}/{name}",
                "how": how,
                "phase": phase.value if phase is not None else "",
                "running_containers": kubelet.running_containers(name, namespace),
                "seconds": round(time.monotonic() - started, 3),
            }
        if op == "restart":
            delay = request.get("pod_list_delay")
            if delay is not None:
                try:
                    delay = check_delay(delay, "'pod_list_delay'", MAX_POD_LIST_DELAY)
                except ValueError as exc:
                    raise KubeletError(f"control request: {exc}") from None
            await kubelet.restart(delay)
            return {"restarts": len(kubelet.events_of("restart")), "sources_ready": kubelet.sources_ready}
        if op == "show":
            events = request.get("events", 20)
            if isinstance(events, bool) or not isinstance(events, int) or events < 0:
                raise KubeletError(f"control request: 'events' must be a count >= 0, got {events!r}")
            return snapshot(kubelet, self._liveness, events)
        raise KubeletError(f"control request: unknown op {op!r} (admit, remove, restart, show)")


def call(path: Path, request: Mapping[str, Any], timeout: float = 60.0) -> Any:
    """Send one request to the control socket at ``path`` and return its ``result``.

    Raises :class:`NoDevKubeletError` when nothing answers there, and :class:`KubeletError` with the dev kubelet's
    message when it refused the request or did not answer within ``timeout`` seconds.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NoDevKubeletError(
                f"no dev kubelet answers on {path} ({exc.strerror}): start one with `devplug kubelet --dir DIR`"
            ) from None
        except OSError as exc:
            raise NoDevKubeletError(f"cannot reach the dev kubelet on {path}: {exc}") from None
        data = bytearray()
        try:
            sock.sendall(json.dumps(dict(request)).encode() + b"\n")
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise KubeletError(
                f"the dev kubelet on {path} did not answer {request.get('op')!r} within {timeout:g} s"
            ) from None
        except OSError as exc:
            raise NoDevKubeletError(f"the dev kubelet on {path} went away: {exc}") from None
    finally:
        sock.close()
    if not data:
        raise NoDevKubeletError(f"the dev kubelet on {path} closed the connection without an answer")
    answer = json.loads(data)
    if not answer.get("ok"):
        raise KubeletError(str(answer.get("error")))
    return answer.get("result")
