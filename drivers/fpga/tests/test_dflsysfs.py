"""The DFL model: each modelled effect against what the kernel documents (see devplug.testing.dflsysfs)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from devplug.testing.dflsysfs import DFL_FPGA_FME_PORT_PR, PORT_PR_STRUCT, DflModel, model_image
from devplug_fpga.devices import targets
from devplug_fpga.dfl import DflBackend
from devplug_fpga.door import port_pr, port_reset
from devplug_fpga.options import FpgaOptions

AFU = "0123456789abcdef0123456789abcdef"


def test_cards_are_base_regions_with_an_fme_and_pr_regions_are_not(tmp_path: Path) -> None:
    model = DflModel(tmp_path)
    model.add_card("0000:3b:00.0", ports=2)
    model.add_card("0000:5e:00.0", ports=1)
    regions = model.listdir(model.sysfs_root / "class/fpga_region")
    assert len(regions) == 5  # two base regions, three PR regions
    cards = DflBackend(FpgaOptions(model_root=tmp_path), model).scan()
    assert [(c.address, c.fme, [r.port for r in c.regions]) for c in cards] == [
        ("0000:3b:00.0", "dfl-fme.0", ["dfl-port.0", "dfl-port.1"]),
        ("0000:5e:00.0", "dfl-fme.1", ["dfl-port.2"]),
    ]
    assert sorted(targets(cards, "both")) == [
        "0000:3b:00.0",
        "0000:3b:00.0-region0",
        "0000:3b:00.0-region1",
        "0000:5e:00.0",
        "0000:5e:00.0-region0",
    ]
    assert model.read_text(model.attribute("dfl-port.2", "id")) == "0"  # numbered per card


def test_pr_loads_the_image_into_the_port_and_reset_keeps_it(tmp_path: Path) -> None:
    model = DflModel(tmp_path)
    card = model.add_card("0000:3b:00.0", ports=2)
    image = model_image(tmp_path / "afu.gbs", AFU).read_bytes()
    port_pr(model, model.dev_root / card.fme, 1, image)
    assert model.afu_id(card.ports[1]) == AFU
    assert model.afu_id(card.ports[0]) == "0" * 32
    port_reset(model, model.dev_root / card.ports[1])
    assert model.afu_id(card.ports[1]) == AFU
    assert [e["ioctl"] for e in model.ioctl_log()] == ["DFL_FPGA_FME_PORT_PR", "DFL_FPGA_PORT_RESET"]


def test_pr_refuses_what_fme_pr_refuses(tmp_path: Path) -> None:
    model = DflModel(tmp_path)
    card = model.add_card("0000:3b:00.0", ports=1)
    node = model.dev_root / card.fme
    with pytest.raises(OSError, match="Invalid argument") as bad_port:
        port_pr(model, node, 1, model_image(tmp_path / "a.gbs", AFU).read_bytes())
    assert bad_port.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="argsz or flags") as flags:
        model.ioctl(node, DFL_FPGA_FME_PORT_PR, PORT_PR_STRUCT.pack(PORT_PR_STRUCT.size, 1, 0, 0, 0))
    assert flags.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="argsz or flags") as short:
        model.ioctl(node, DFL_FPGA_FME_PORT_PR, PORT_PR_STRUCT.pack(16, 0, 0, 0, 0))
    assert short.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="Input/output error") as garbage:
        port_pr(model, node, 0, b"not a bitstream")
    assert garbage.value.errno == errno.EIO
    assert model.afu_id(card.ports[0]) == "0" * 32
    model.hold_open(card.fme)
    with pytest.raises(OSError, match="busy") as busy:
        port_pr(model, node, 0, model_image(tmp_path / "a.gbs", AFU).read_bytes())
    assert busy.value.errno == errno.EBUSY


def test_error_files_clear_only_with_the_code_read_and_read_only_files_refuse(tmp_path: Path) -> None:
    model = DflModel(tmp_path)
    card = model.add_card("0000:3b:00.0", ports=1)
    errors = model.attribute(card.ports[0], "errors/errors")
    model.set_error(card.ports[0], "errors", 0x12)
    with pytest.raises(OSError, match="not the error code read") as wrong:
        model.write_text(errors, "0x2")
    assert wrong.value.errno == errno.EINVAL
    model.write_text(errors, "0x12")
    assert model.read_text(errors) == "0x0"
    with pytest.raises(PermissionError):
        model.write_text(model.attribute(card.ports[0], "afu_id"), AFU)
    with pytest.raises(PermissionError):
        model.write_text(model.attribute(card.fme, "errors/catfatal_errors"), "0x0")


def test_power_threshold_rounds_down_to_watts_and_clamps(tmp_path: Path) -> None:
    model = DflModel(tmp_path)
    card = model.add_card("0000:3b:00.0", ports=1)
    power = model.attribute(card.fme, "hwmon/hwmon1/power1_max")
    model.write_text(power, "20500000")
    assert model.power_max(card.fme) == 20_000_000
    model.write_text(power, "900000000")
    assert model.power_max(card.fme) == 127_000_000
