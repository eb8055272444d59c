"""The driver class attributes the engine reads (issue 11): ``nonblocking_hooks`` runs hooks on the event loop,
``durable_allocate`` makes an Allocate's intent survive a power loss (an fdatasync of the journal)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from devplug import ContainerAllocation, Device, hookimpl
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.testing.daemon import DaemonThread

from .conftest import in_process_config, view_of

INLINE, THREADED, DURABLE, PLAIN = (f"example.com/{n}" for n in ("inline", "threaded", "durable", "plain"))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _wait_serving(kubelet: DevKubeletThread, *resources: str) -> None:
    """Every resource registered and advertising a healthy device."""
    for name in resources:
        kubelet.wait_registered(name, timeout=10)
    kubelet.wait_for(lambda k: all(view_of(k, n).healthy_ids for n in resources), timeout=10)


class Threaded:
    """The default: hooks in the resource's hook thread."""

    seen: dict[str, tuple[bool, str]] = {}  # noqa: RUF012  (hook -> (on the event loop, thread name))

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("d0")]

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        type(self).seen["allocate"] = (_on_event_loop(), threading.current_thread().name)
        return ContainerAllocation()

    @hookimpl
    def pre_start(self, device_ids: Sequence[str]) -> None:
        type(self).seen["pre_start"] = (_on_event_loop(), threading.current_thread().name)


class Inline(Threaded):
    nonblocking_hooks = True
    seen: dict[str, tuple[bool, str]] = {}  # noqa: RUF012


def test_nonblocking_hooks_run_on_the_event_loop_and_others_in_the_hook_thread(
    dev_kubelet: DevKubeletThread, devplug_root: Path
) -> None:
    with DaemonThread(in_process_config(devplug_root, {INLINE: Inline, THREADED: Threaded})):
        _wait_serving(dev_kubelet, INLINE, THREADED)
        dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {INLINE: 1, THREADED: 1})]))
    assert set(Inline.seen) == set(Threaded.seen) == {"allocate", "pre_start"}
    for on_loop, thread in Inline.seen.values():
        assert on_loop and not thread.startswith("hooks["), thread
    for on_loop, thread in Threaded.seen.values():
        assert not on_loop and thread == f"hooks[{THREADED}]", thread


class Plain:
    """Records, in :data:`EVENTS`, when its allocate hook runs."""

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("d0")]

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        EVENTS.append(f"allocate {type(self).__name__}")
        return ContainerAllocation()


class Durable(Plain):
    durable_allocate = True


EVENTS: list[str] = []


def test_durable_allocate_syncs_the_intent_before_the_hook_and_only_for_that_driver(
    dev_kubelet: DevKubeletThread, devplug_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fdatasync

    def recording(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if ".journal." in target:  # the ledgers' journal segments, not snapshots or status files
            EVENTS.append(f"fdatasync {Path(target).parent.name}")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    EVENTS.clear()
    with DaemonThread(in_process_config(devplug_root, {DURABLE: Durable, PLAIN: Plain})):
        _wait_serving(dev_kubelet, DURABLE, PLAIN)
        EVENTS.clear()
        dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {DURABLE: 1})]))
        durable_events = list(EVENTS)
        EVENTS.clear()
        dev_kubelet.admit_pod(PodSpec("q", [ContainerSpec("c", {PLAIN: 1})]))
        plain_events = list(EVENTS)
    # The ledger's folder is the resource's own (resources/example.com/durable/ledger.journal.N).
    assert durable_events[:2] == ["fdatasync durable", "allocate Durable"], durable_events
    assert plain_events == ["allocate Plain"], plain_events


class Counted(Plain):
    """Counts its ``list_devices`` calls in :data:`LISTS`; inline, as the mock runs in the benchmark."""

    nonblocking_hooks = True

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        LISTS.append(threading.current_thread().name)
        return [Device("d0")]


LISTS: list[str] = []


def test_stopping_does_not_list_the_devices_again(dev_kubelet: DevKubeletThread, devplug_root: Path) -> None:
    """The relist loop is woken by ``stop``: it must end there, not call ``list_devices`` on the way out (with a
    driver reading 10,000 device files that kept the shutdown waiting most of a second)."""
    LISTS.clear()
    with DaemonThread(in_process_config(devplug_root, {PLAIN: Counted})):
        _wait_serving(dev_kubelet, PLAIN)
        assert len(LISTS) == 1  # at start
    assert len(LISTS) == 1, LISTS
