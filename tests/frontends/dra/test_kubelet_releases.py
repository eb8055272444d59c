"""Issue 37, item 1 and 2: handovers and restarts of a DRA node on each kubelet release the dev kubelet models.

A kubelet of 1.32 keeps one DRA plugin per driver name and deregisters by name (the old instance's socket going
drops the new instance and wipes the slices at once); from 1.33 it keeps each instance by endpoint. devplug learns
which from the Node's ``status.nodeInfo.kubeletVersion`` (the dev kubelet's node writes it) and, on a kubelet
keying by name, registers again once another instance's socket is gone, and waits for the kubelet to deregister
a dead instance's socket before registering after a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from typing import Any

import pytest

from devplug.daemon.status import read_status
from devplug.devkubelet.dra import DRA_RELEASES
from devplug.errors import StateError
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import TEST_DRA, DraNode
from devplug.testing.process import DaemonProcess
from tests.devkubelet.draplugin import DRAPlugin
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import DRIVER, RESOURCE, dra_node, eventually
from tests.frontends.dra.test_dra_handover import HANDOVER, successor

#: The kubelet releases the dev kubelet models, and those keying DRA plugins by name.
RELEASES = DRA_RELEASES
BY_NAME = frozenset({"1.32"})
DEVICES = {"mock0": "", "mock1": "", "mock2": ""}


def _kubelet(release: str, **changes: Any) -> Any:
    return dataclasses.replace(TEST_DRA, release=release, **changes)


def dra_status(lab: DraNode) -> dict[str, Any]:
    """The DRA part of the running daemon's status (empty while there is none)."""
    try:
        entries = read_status(lab.root / "state")["resources"]
    except StateError:
        return {}
    frontend: dict[str, Any] = next((e.get("frontend") or {} for e in entries if e["name"] == RESOURCE), {})
    return frontend


def keying_said(lab: DraNode) -> str | None:
    """The kubelet's plugin keying the daemon's status says, once it has learnt one."""
    keying = dra_status(lab).get("kubelet", {}).get("plugin_keying")
    return str(keying) if keying not in (None, "unknown") else None


def registered_at(lab: DraNode, endpoint: str) -> bool:
    """The kubelet has exactly one registered instance of the driver, at ``endpoint``."""
    views = lab.kubelet.dra_plugins(DRIVER)
    return len(views) == 1 and views[0].endpoint == endpoint


def unregistered_for(lab: DraNode) -> float:
    """How long the kubelet last had no instance of the driver: from a deregistration that left none to the next
    registration (its events' times)."""
    left = None
    for event in lab.kubelet.events:
        if event.resource != DRIVER:
            continue
        if event.kind == "dra-plugin-deregistered" and "0 instance(s) left" in event.detail:
            left = event.time
        elif event.kind == "dra-plugin-registered" and left is not None:
            gap = event.time - left
    return gap


async def admit(lab: DraNode, name: str) -> None:
    lab.make_claim(name)
    pod, _ = lab.schedule_pod(name, [name])
    await lab.kubelet.admit_pod(pod)


@pytest.mark.parametrize("release", RELEASES)
def test_a_handover_leaves_the_new_instance_registered_on_every_kubelet(api: ApiServer, release: str) -> None:
    async def scenario() -> None:
        async with dra_node(api, DEVICES, handover=HANDOVER, kubelet_dra=_kubelet(release)) as lab:
            await lab.published(len(DEVICES))
            keying = await eventually(lambda: keying_said(lab), "the kubelet's keying in the status")
            assert keying == ("by-name" if release in BY_NAME else "by-endpoint")
            await admit(lab, "before")
            old = lab.daemon
            assert old is not None
            new = successor(lab, "new").start()
            try:
                assert await asyncio.to_thread(old.wait, 30.0) == 0, old.log_text()
                lab.daemon = new

                def new_registered() -> dict[str, Any] | None:
                    dra = dra_status(lab)
                    endpoint = dra.get("instance") and lab.root / "plugins" / DRIVER / f"dra-{dra['instance']}.sock"
                    if not (
                        endpoint and registered_at(lab, str(endpoint)) and dra.get("registration", {}).get("registered")
                    ):
                        return None
                    if release in BY_NAME and dra["registration"].get("reregistration_confirmed_s") is None:
                        return None  # the old socket's deregistration drops it: registered again, confirmed
                    return dra

                dra = await eventually(new_registered, "the new instance registered", 30.0, details=new.log_text)
                if release in BY_NAME:
                    # The old socket's deregistration dropped the new instance: it registered again, verified.
                    dropped = [e for e in lab.kubelet.events_of("dra-plugin-deregistered", DRIVER)]
                    assert dropped, "the kubelet keyed by name never dropped anyone"
                    registration = dra["registration"]
                    assert registration["reregistrations"] == 1, registration
                    assert "keys DRA plugins by name" in registration["reregistered_because"], registration
                    # on evidence: the kubelet's wipe, not the 2.5 s bound
                    assert "(it wiped the slices)" in registration["reregistered_because"], registration
                    print(f"kubelet {release}: unregistered for {unregistered_for(lab):.3f} s")
                    assert registration["reregistration_confirmed_s"] is not None
                    assert dra["kubelet"]["drops_handled"] == 1
                else:
                    assert dra["registration"]["reregistrations"] == 0, dra
                    assert lab.kubelet.events_of("resource-slices-wiped", DRIVER) == []
                # The new instance serves: the kubelet prepares and unprepares through it.
                await lab.published(len(DEVICES))
                await admit(lab, "after")
                await lab.kubelet.finish_pod("before")
                await lab.kubelet.finish_pod("after")
                assert {c["hook"] for c in lab.calls() if c["hook"] in ("allocate", "deallocate")} == {
                    "allocate",
                    "deallocate",
                }
            except BaseException:
                print(f"--- old ---\n{old.log_text()[-5000:]}\n--- new ---\n{new.log_text()[-5000:]}")
                print("--- kubelet ---\n" + "\n".join(str(e) for e in lab.kubelet.events[-30:]))
                raise

    run(scenario, 120)


def test_a_kubelet_keying_by_name_that_drops_the_driver_gets_it_registered_again(api: ApiServer) -> None:
    """Another instance of the driver registers (the kubelet keeping one per name takes it instead of devplug's)
    and goes: the kubelet drops whoever is registered under the name and wipes the slices; devplug, seeing the
    other socket go, registers again and publishes its slices again."""

    async def scenario() -> None:
        async with dra_node(api, DEVICES, kubelet_dra=_kubelet("1.32")) as lab:
            await lab.published(len(DEVICES))
            ours = lab.kubelet.dra_plugins(DRIVER)[0].endpoint
            stranger = await DRAPlugin(lab.root, DRIVER, instance="stranger").start()
            try:
                await eventually(lambda: registered_at(lab, str(stranger.service_socket)), "the stranger replacing us")
            finally:
                await stranger.stop()  # removes its registration socket: the kubelet deregisters by name
            await eventually(lambda: registered_at(lab, ours), "devplug registered again", 30.0)
            await lab.published(len(DEVICES))

            def reregistered() -> dict[str, Any] | None:
                registration: dict[str, Any] = dra_status(lab).get("registration", {})
                return registration if registration.get("reregistration_confirmed_s") is not None else None

            registration = await eventually(reregistered, "the re-registration in the status", details=lab.log)
            assert registration["reregistrations"] == 1 and "stranger" in registration["reregistered_because"]
            await admit(lab, "after-the-drop")
            await lab.kubelet.finish_pod("after-the-drop")

    run(scenario, 90)


@pytest.mark.parametrize("release", RELEASES)
def test_a_restart_after_kill_9_registers_once_the_dead_socket_is_deregistered(api: ApiServer, release: str) -> None:
    """The kubelet's deregistration of the dead instance's socket is made to reach its handler 0.5 s late (it runs
    beside the new socket's registration, and a loaded node may order them either way): on a kubelet keying by
    name, a new instance registering at once would be dropped by it."""

    async def scenario() -> None:
        async with dra_node(api, DEVICES, kubelet_dra=_kubelet(release, deregistration_delay=0.5)) as lab:
            await lab.published(len(DEVICES))
            await admit(lab, "kept")
            old = lab.daemon
            assert old is not None
            os.kill(old.pid, signal.SIGKILL)
            old.wait(10.0)
            lab.daemon = DaemonProcess(lab.config_path, lab.root / "daemon-2.log", env=lab.env).start()

            def instance() -> str | None:
                dra = dra_status(lab)
                return str(dra["instance"]) if dra.get("registration", {}).get("registered") else None

            name = await eventually(instance, "the restarted daemon registered", 30.0, details=lab.daemon.log_text)
            endpoint = str(lab.root / "plugins" / DRIVER / f"dra-{name}.sock")
            await eventually(lambda: registered_at(lab, endpoint), "the kubelet calling the new instance only", 30.0)
            events = [
                (e.kind, e.detail)
                for e in lab.kubelet.events
                if e.resource == DRIVER and e.kind in ("dra-plugin-registered", "dra-plugin-deregistered")
            ]
            if release in BY_NAME:
                # The dead instance's deregistration came before the new registration (run together, the
                # deregistration by name could drop the new instance).
                kinds = [kind for kind, _ in events]
                assert kinds[-2:] == ["dra-plugin-deregistered", "dra-plugin-registered"], events
            assert dra_status(lab)["registration"]["reregistrations"] == 0
            await lab.kubelet.finish_pod("kept")  # the claim prepared before the kill is unprepared by the new one

    run(scenario, 90)
