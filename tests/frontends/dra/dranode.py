"""The DRA front end's tests' node: :mod:`devplug.testing.dranode` serving the mock driver as ``example.com/mock``
(DRA driver ``mock.example.com``), its devices files in the mock's folder."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from devplug.devkubelet import DRAConfig
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import NODE, NS, TEST_DRA, DraNode, WaitTimeout, short_root
from devplug.testing.dranode import dra_node as node_with
from devplug.testing.dranode import eventually as _eventually

__all__ = ["DRIVER", "NODE", "NS", "RESOURCE", "DraNode", "allocated_by_hand", "dra_node", "eventually", "short_root"]

RESOURCE = "example.com/mock"
DRIVER = "mock.example.com"


async def eventually(predicate: Any, what: str, timeout: float = 20.0, details: Any = None) -> Any:
    """:func:`devplug.testing.dranode.eventually`, failing the test (not erroring it) on a time-out."""
    try:
        return await _eventually(predicate, what, timeout, details)
    except WaitTimeout as exc:
        pytest.fail(str(exc), pytrace=False)


@contextlib.asynccontextmanager
async def dra_node(
    api: ApiServer,
    devices: Mapping[str, str] | None = None,
    *,
    kubelet_dra: DRAConfig = TEST_DRA,
    start: bool = True,
    cdi: Mapping[str, Any] | None = None,
    metrics_port: int | None = None,
    handover: Mapping[str, Any] | None = None,
) -> AsyncIterator[DraNode]:
    """A node whose mock devices are ``devices`` (file name -> content; default three healthy ones)."""
    with short_root() as scratch:
        folder = scratch / "mock"
        folder.mkdir()
        for name, content in (devices if devices is not None else {"mock0": "", "mock1": "", "mock2": ""}).items():
            (folder / name).write_text(content)
        table = {"driver": "mock", "options": {"directory": str(folder)}}
        async with node_with(
            api,
            RESOURCE,
            table,
            folder,
            driver=DRIVER,
            kubelet_dra=kubelet_dra,
            start=start,
            cdi=cdi,
            metrics_port=metrics_port,
            handover=handover,
        ) as node:
            yield node


def allocated_by_hand(lab: DraNode, claim: Mapping[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """``claim`` given ``results`` on this node, written through the status subresource as kube-scheduler writes an
    allocation (for what a test wants exactly: a share, admin access, more than the node has); the claim as
    stored."""
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    status = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    stored: dict[str, Any] = lab.api.update(
        "resourceclaims", {**claim, "status": status}, NS, "kube-scheduler", "status"
    )
    return stored
