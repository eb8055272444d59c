"""End to end through the dev kubelet and the real daemon: allocation, release, deprogram failures, crashes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from devplug import DeviceSpec
from devplug.errors import KubeletError

RESOURCE = "example.com/fpga"
CARD = "0000:3b:00.0"
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"
DEFAULT_AFU = "d5fa0100000000000000000000000d5f"
TENANT_AFU = "7e4a47000000000000000000000007e4"
SUFFIX = "EXAMPLE_COM_FPGA"


def test_a_region_is_programmed_for_its_pod_and_deprogrammed_once_after_it(lab: Any) -> None:
    card = lab.model.add_card(CARD, ports=2, afu_id=BLANK_AFU)
    lab.start(
        lab.dfl_options(
            default_image=str(lab.default), default_afu_id=DEFAULT_AFU, power_save_watts=20, mounts=[str(lab.root)]
        )
    )
    assert sorted(lab.healths()) == [f"{CARD}-region0", f"{CARD}-region1"]

    pod = lab.admit_pod("tenant")

    container = pod.container("app")
    (device,) = container.devices[RESOURCE]
    region = int(device.rsplit("region", 1)[1])
    port = card.ports[region]
    allocation = container.allocations[RESOURCE]
    assert allocation.devices == (DeviceSpec(f"/dev/{port}", f"/dev/{port}", "rw"),)
    assert allocation.envs[f"FPGA_DEVICES_{SUFFIX}"] == device
    assert allocation.envs[f"FPGA_REGIONS_{SUFFIX}"] == port
    assert allocation.envs[f"FPGA_AFU_IDS_{SUFFIX}"] == DEFAULT_AFU
    assert [(m.host_path, m.read_only) for m in allocation.mounts] == [(str(lab.root), True)]
    assert lab.model.afu_id(port) == DEFAULT_AFU
    lab.model.set_afu_id(port, TENANT_AFU)  # the tenant loads its own bitstream

    lab.kubelet.remove_pod("tenant")

    lab.wait(lambda: lab.released(device), what=f"{device} released")
    assert lab.model.afu_id(port) == BLANK_AFU
    blank_loads = [e for e in lab.model.programs(port_id=region) if e.get("afu_id") == BLANK_AFU]
    assert len(blank_loads) == 1
    resets = [e for e in lab.model.ioctl_log() if e["ioctl"] == "DFL_FPGA_PORT_RESET" and e["node"] == port]
    assert len(resets) == 1
    assert lab.model.power_max(card.fme) == 20_000_000  # the whole card is free: power save
    # The ledger and the driver's state are written before the daemon tells the kubelet (ListAndWatch): the device
    # is advertised healthy again once that update arrives, not at the moment its release is on disk.
    lab.wait(lambda: lab.health(device) == "Healthy", what=f"{device} advertised healthy after its release")

    lab.admit("next")  # the next pod restores the card's power threshold
    assert lab.model.power_max(card.fme) == 127_000_000


def test_a_failed_deprogram_keeps_the_device_out_of_service_until_the_operator_clears_it(lab: Any) -> None:
    lab.tool.behave(deprogram={"exit": 3, "stderr": "ERROR: flash controller timeout on 0000:3b:00.0"})
    lab.start(lab.command_options(mode="whole"))

    lab.admit("tenant")
    lab.kubelet.remove_pod("tenant")

    lab.wait(lambda: lab.health(CARD) == "Unhealthy", what="the card reported unhealthy")
    marker = lab.driver_dir() / "quarantine" / CARD
    lab.wait(marker.exists, what="the quarantine marker")

    def failure_shown() -> str:
        failures = lab.status()["resources"][0]["release_failures"]
        return " ".join(failures.values())

    shown = lab.wait(failure_shown, what="the release failure in devplug status")
    assert "out of service" in shown
    assert "flash controller timeout" in shown
    assert f"rm {marker}" in shown
    assert "flash controller timeout" in lab.log()
    lab.wait(lambda: "out of service: command" in (lab.reason(CARD) or ""), what="the device's reason in status")
    with pytest.raises(KubeletError, match="no healthy devices"):
        lab.admit("next")
    assert len(lab.tool.calls("deprogram", "start")) == 1  # retries do not run the tool again

    lab.tool.behave()  # the operator fixes the card...
    marker.unlink()  # ...and clears it

    lab.wait(lambda: lab.released(CARD), what="the release to finish after the marker was removed")
    lab.wait(lambda: lab.health(CARD) == "Healthy", what="the card healthy again")
    assert len(lab.tool.calls("deprogram", "done")) == 1
    assert lab.tool.content(CARD) == "blank"
    assert lab.admit("next") == (CARD,)


def test_kill_9_mid_deprogram_is_finished_on_restart_exactly_once(lab: Any) -> None:
    lab.tool.behave(deprogram={"hang": True})
    lab.start(lab.command_options(mode="regions", regions_per_card=2))
    (device,) = lab.admit("tenant")
    lab.kubelet.remove_pod("tenant")
    lab.wait(lambda: lab.tool.calls("deprogram", "hanging"), what="the deprogram under way")

    lab.kill()
    lab.tool.behave()
    lab.restart()

    lab.wait(lambda: lab.released(device), what=f"{device} released after the restart")
    assert len(lab.tool.calls("deprogram", "start")) == 2  # the interrupted one, and the one that finished
    assert len(lab.tool.calls("deprogram", "done")) == 1
    assert len(lab.tool.calls("verify", "done")) == 1
    assert "finishing a deprogram that was cut short" in lab.log()


def test_kill_9_after_the_deprogram_does_not_deprogram_again(lab: Any) -> None:
    lab.tool.behave(powersave={"hang": True})
    lab.start(lab.command_options(mode="whole", power_save_command=lab.tool.command("powersave")))
    lab.admit("tenant")
    lab.kubelet.remove_pod("tenant")
    lab.wait(lambda: lab.tool.calls("powersave", "hanging"), what="power save under way after the deprogram")
    assert lab.tool.calls("deprogram", "done")
    assert CARD not in lab.driver_state()  # freed by deallocate, which the daemon dies inside

    lab.kill()
    lab.tool.behave()
    lab.restart()

    lab.wait(lambda: lab.released(CARD), what="the card released after the restart")
    assert len(lab.tool.calls("deprogram", "start")) == 1  # deallocate, called again, had nothing left to deprogram
    assert len(lab.tool.calls("powersave", "done")) == 1


def test_kill_9_mid_programming_never_hands_out_a_half_programmed_device(lab: Any) -> None:
    lab.tool.behave(program={"hang": True})
    options = lab.command_options(
        mode="whole",
        default_image=str(lab.default),
        program_command=lab.tool.command("program", "--region", "{region}", "--image", "{bitstream}"),
    )
    lab.start(options)
    failed: list[BaseException] = []

    def admit() -> None:
        try:
            lab.admit("tenant")
        except BaseException as exc:
            failed.append(exc)

    admission = threading.Thread(target=admit, daemon=True)
    admission.start()
    lab.wait(lambda: lab.tool.calls("program", "hanging"), what="programming under way")
    lab.kill()
    admission.join(30)
    assert failed, "the admission cannot succeed: the daemon died inside Allocate"

    lab.tool.behave()
    lab.restart()

    lab.wait(lambda: lab.released(CARD), what="the half-programmed card released")
    lab.wait(lambda: lab.health(CARD) == "Healthy", what="the card healthy again")  # advertised after the release
    assert len(lab.tool.calls("deprogram", "done")) == 1
    assert lab.tool.content(CARD) == "blank"
    assert lab.admit("next") == (CARD,)
    assert lab.tool.content(CARD) == "default.gbs"  # programmed whole for the next pod


def test_kill_9_between_two_regions_of_one_release_redoes_only_the_unfinished_one(lab: Any) -> None:
    lab.start(lab.command_options(mode="regions", regions_per_card=2))
    devices = lab.admit("tenant", count=2)
    assert sorted(devices) == [f"{CARD}-region0", f"{CARD}-region1"]
    first = lab.ledger()[0]["devices"][0]  # post_stop works through the devices in this order
    second_region = "1" if first.endswith("region0") else "0"
    lab.tool.behave({f"deprogram:{second_region}": {"hang": True}})
    lab.kubelet.remove_pod("tenant")
    lab.wait(
        lambda: lab.tool.calls("deprogram", "hanging") and len(lab.tool.calls("verify", "done")) == 1,
        what="the first region deprogrammed and verified, the second one started",
    )

    lab.kill()
    lab.tool.behave()
    lab.restart()

    lab.wait(lambda: all(lab.released(d) for d in devices), what="both regions released")
    per_region = [c["args"]["--region"] for c in lab.tool.calls("deprogram", "done")]
    assert sorted(per_region) == ["0", "1"]  # each deprogrammed to the end exactly once
    assert f"{first} was deprogrammed and verified before; not again" in lab.log()


def test_kill_9_mid_partial_reconfiguration_is_finished_on_restart_once(lab: Any) -> None:
    card = lab.model.add_card(CARD, ports=1, afu_id=BLANK_AFU)
    lab.start(lab.dfl_options())
    (device,) = lab.admit("tenant")
    lab.model.set_afu_id(card.ports[0], TENANT_AFU)
    lab.model.hold_pr()
    lab.kubelet.remove_pod("tenant")
    lab.wait(lab.model.pr_waiting, what="the blank image's PR under way")

    lab.kill()  # the PR dies with the daemon: the region still holds the tenant's bitstream
    lab.model.release_pr()
    assert lab.model.afu_id(card.ports[0]) == TENANT_AFU
    lab.restart()

    lab.wait(lambda: lab.released(device), what=f"{device} released after the restart")
    assert lab.model.afu_id(card.ports[0]) == BLANK_AFU
    assert len([e for e in lab.model.programs(port_id=0) if e.get("afu_id") == BLANK_AFU]) == 1
    assert "finishing a deprogram that was cut short" in lab.log()


def test_a_default_image_that_fails_to_load_fails_the_allocate_and_leaves_the_card_clean(lab: Any) -> None:
    lab.tool.behave({"program": {"exit": 2, "stderr": "ERROR: image does not match the shell"}})
    options = lab.command_options(
        mode="whole",
        default_image=str(lab.default),
        program_command=lab.tool.command("program", "--region", "{region}", "--image", "{bitstream}"),
    )
    lab.start(options)

    with pytest.raises(KubeletError, match="image does not match the shell"):
        lab.admit("tenant")

    assert lab.tool.content(CARD) == "blank"  # deprogrammed after the failed load
    assert len(lab.tool.calls("deprogram", "done")) == 1
    assert lab.driver_state() == {}
    assert lab.health(CARD) == "Healthy"


def test_a_slow_deprogram_of_one_region_holds_up_no_other_region(lab: Any) -> None:
    """The vendor tool runs without the driver's lock (issue 23): while one region's deprogram hangs, the other
    region is released and allocated again, and the slow one is never deprogrammed twice at once."""
    lab.tool.behave({"deprogram:0": {"hang": True}})
    lab.start(lab.command_options(mode="regions", regions_per_card=2), hook_timeout=1.0)
    slow, quick = f"{CARD}-region0", f"{CARD}-region1"
    admitted = {lab.admit("a")[0]: "a", lab.admit("b")[0]: "b"}
    assert set(admitted) == {slow, quick}
    lab.kubelet.remove_pod(admitted[slow])
    lab.wait(lambda: lab.tool.calls("deprogram", "hanging"), what="the slow deprogram under way")
    lab.kubelet.remove_pod(admitted[quick])
    lab.wait(lambda: lab.released(quick), what=f"{quick} released while {slow}'s deprogram hangs")
    assert lab.health(quick) == "Healthy" and lab.health(slow) == "Unhealthy"
    assert lab.admit("c") == (quick,)  # allocated again meanwhile
    assert len(lab.tool.calls("deprogram", "start", card=CARD)) == 2  # one per region: the slow one not redone
    assert "driver failing" not in lab.log()

    lab.tool.release("deprogram")
    lab.wait(lambda: lab.released(slow), what=f"{slow} released once its deprogram returned")
    assert len([c for c in lab.tool.calls("deprogram", "done") if c["args"].get("--region") == "0"]) == 1
