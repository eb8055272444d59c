"""devplug-fpga against the kit's driver contract checks, on the DFL model (no FPGA needed).

The daemon under test runs the installed driver (``fpga``) with its ``model_root`` option pointing at a
:class:`~devplug.testing.dflsysfs.DflModel` in the test's folder: one card of two regions, each deprogrammed on
release by loading the blank image through ``DFL_FPGA_FME_PORT_PR`` (made slow, for one region, by the model's
PR hold). Its hook calls are recorded by the kit's stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug import ContainerAllocation, DeviceSpec
from devplug.testing.conformance import DriverConformance
from devplug.testing.dflsysfs import DflModel, model_image

CARD = "0000:3b:00.0"
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"


class TestFpgaConformance(DriverConformance):
    apis = ("device-plugin", "dra")
    driver = "fpga"
    resource = "example.com/fpga"
    records_itself = False
    device_count = 2  # the card's two regions
    bad_option_key = "command_timeout"

    def options(self, folder: Path) -> Mapping[str, Any]:
        machine = folder / "machine"
        if not (machine / "sys").exists():
            DflModel(machine).add_card(CARD, ports=self.device_count, afu_id=BLANK_AFU)
        return {
            "backend": "dfl",
            "model_root": str(machine),
            "blank_image": str(model_image(folder / "blank.gbs", BLANK_AFU)),
            "blank_afu_id": BLANK_AFU,
        }

    def node_dev_root(self, folder: Path) -> Path:
        return folder / "machine" / "dev"  # the model's /dev/dfl-port.N

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        card = DflModel(folder / "machine").card(CARD)
        ports = [card.ports[int(d.rsplit("region", 1)[1])] for d in device_ids]
        assert allocation.devices == tuple(DeviceSpec(f"/dev/{p}", f"/dev/{p}", "rw") for p in ports)
        suffix = "EXAMPLE_COM_FPGA"
        assert allocation.envs[f"FPGA_DEVICES_{suffix}"] == ",".join(device_ids)
        assert allocation.envs[f"FPGA_ADDRESSES_{suffix}"] == CARD
        assert allocation.envs[f"FPGA_REGIONS_{suffix}"] == ",".join(ports)

    def slow_release(self, folder: Path, device_id: str) -> bool:
        model = DflModel(folder / "machine")
        region = int(device_id.rsplit("region", 1)[1])
        model.hold_pr(f"{model.card(CARD).fme}.{region}")  # only this region's blank load waits
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        DflModel(folder / "machine").release_pr()

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "command_timeout": 0}


class TestFpgaConformanceWithDraWords(TestFpgaConformance):
    """The same contract with the issue 41 options on: the regions parts of their card (each takes 1 of its 2
    regions, so the counters forbid nothing the contract asks) and each device's status from allocate."""

    def options(self, folder: Path) -> Mapping[str, Any]:
        return {**super().options(folder), "partitions": True, "device_status": True}
