"""Text for people from the control socket's answers (``devplug kubelet admit|remove|restart|show``).

Each function takes the JSON an answer holds (:mod:`devplug.devkubelet.control`) and returns lines; the command
line prints them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["SHOW_SECTIONS", "format_pod", "format_removal", "format_show"]

#: What ``devplug kubelet show`` can show, in the order it shows them.
SHOW_SECTIONS = ("kubelet", "devices", "allocations", "pods", "events")


def _allocation_lines(allocation: Mapping[str, Any], indent: str) -> list[str]:
    lines = []
    for spec in allocation.get("devices", []):
        lines.append(f"{indent}device node {spec['container_path']} <- {spec['host_path']} ({spec['permissions']})")
    for mount in allocation.get("mounts", []):
        ro = ", read-only" if mount["read_only"] else ""
        lines.append(f"{indent}mount {mount['container_path']} <- {mount['host_path']}{ro}")
    for key, value in sorted(allocation.get("envs", {}).items()):
        lines.append(f"{indent}env {key}={value}")
    for key, value in sorted(allocation.get("annotations", {}).items()):
        lines.append(f"{indent}annotation {key}={value}")
    for name in allocation.get("cdi_devices", []):
        lines.append(f"{indent}CDI device {name}")
    return lines


def format_pod(pod: Mapping[str, Any]) -> str:
    """A pod as admitted: its UID and phase, then each container's devices and what the plugin answered."""
    lines = [f"pod {pod['namespace']}/{pod['name']}  uid {pod['uid']}  {pod['phase']}"]
    for container in pod["containers"]:
        kind = "init container" if container["init"] else "container"
        state = ""
        if "running" in container:
            state = "  running" if container["running"] else "  not running"
        lines.append(f"  {kind} {container['name']}{state}")
        if not container["devices"]:
            lines.append("    no devices")
        for resource, ids in container["devices"].items():
            lines.append(f"    {resource}: {', '.join(ids) or '-'}")
            lines.extend(_allocation_lines(container["allocations"].get(resource, {}), "      "))
    return "\n".join(lines)


def format_removal(result: Mapping[str, Any]) -> str:
    """What a removal did: the pod's phase now, and which of its containers still run."""
    running = result["running_containers"]
    still = f"; containers still running: {', '.join(running)}" if running else "; no container runs"
    return f"pod {result['pod']}: {result['how']} removal, now {result['phase']}{still} ({result['seconds']:g} s)"


def _kubelet_lines(shown: Mapping[str, Any]) -> list[str]:
    lines = [
        f"registration   {shown['kubelet_socket']}",
        f"PodResources   {shown['pod_resources_socket']}",
        f"KEP mode       {'on: PostStopContainer and Deallocate are called' if shown['kep_mode'] else 'off'}",
        f"sources ready  {'yes' if shown['sources_ready'] else 'no (restart window: PodResources lists no pods)'}",
        f"containers     {shown['containers'] or 'no processes (names with a state, stopped at once)'}",
        "a daemon serving this dev kubelet needs in its config:",
    ]
    return lines + ["  " + line if line else "" for line in shown["daemon_settings"].splitlines()]


def _device_lines(shown: Mapping[str, Any]) -> list[str]:
    if not shown["resources"]:
        return ["no resource has registered"]
    lines = []
    for res in shown["resources"]:
        flags = [name for name, on in res["options"].items() if on]
        state = "registered" if res["registered"] else "NOT registered"
        lines.append(
            f"{res['name']}  {state} ({res['registrations']} registration(s), endpoint {res['endpoint'] or '-'})  "
            f"capacity {res['capacity']}, allocatable {res['allocatable']}, free {res['free']}"
        )
        lines.append(f"  options: {', '.join(flags) or 'none'}")
        for device in res["devices"]:
            numa = f"  NUMA {','.join(map(str, device['numa_nodes']))}" if device["numa_nodes"] else ""
            held = f"  held by {device['held_by']}" if device["held_by"] else ("  in use" if device["in_use"] else "")
            lines.append(f"  {device['id']:<24} {device['health']:<10}{numa}{held}")
    return lines


def _allocation_table(shown: Mapping[str, Any]) -> list[str]:
    if not shown["allocations"]:
        return ["no allocations (podDevices is empty)"]
    return [
        f"{a['pod'] or '(unknown pod ' + a['pod_uid'] + ')'}  {a['container']}  {a['resource']}: "
        f"{', '.join(a['devices'])}"
        for a in shown["allocations"]
    ]


def _event_lines(shown: Mapping[str, Any]) -> list[str]:
    if not shown["events"]:
        return ["no events"]
    return [f"{time.strftime('%H:%M:%S', time.localtime(e['time']))}  {e['line']}" for e in shown["events"]]


def format_show(shown: Mapping[str, Any], sections: Iterable[str] = SHOW_SECTIONS) -> str:
    """The sections of ``devplug kubelet show`` asked for, each under its name."""
    wanted = set(sections)
    parts = []
    for section in SHOW_SECTIONS:
        if section not in wanted:
            continue
        if section == "kubelet":
            body = _kubelet_lines(shown)
        elif section == "devices":
            body = _device_lines(shown)
        elif section == "allocations":
            body = _allocation_table(shown)
        elif section == "pods":
            body = [format_pod(p) for p in shown["pods"]] or ["no pods"]
        else:
            body = _event_lines(shown)
        parts.append(f"== {section}\n" + "\n".join(body))
    return "\n".join(parts)
