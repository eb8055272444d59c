"""build_pool's refusals and limits: what the API server would refuse is refused here first, naming the device
and the attribute, and nothing is published; names of slices and of devices whose IDs are no DNS labels."""

from __future__ import annotations

import re

import pytest

from devplug.engine.devicetable import DeviceTable
from devplug.frontends.dra.slicecontent import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    DeviceDescription,
    Pool,
    SliceContentError,
    Version,
    build_pool,
    slice_name,
)
from devplug.testing.apiserver import validation
from devplug.types import Device, Health

DRIVER = "fpga.example.com"


def pool_of(*devs: Device, describe: DeviceDescription | None = None, taints: bool = True) -> Pool:
    table = DeviceTable()
    table.replace(devs)
    return build_pool(
        table,
        driver=DRIVER,
        pool="node-a",
        node="node-a",
        taints=taints,
        describe=(lambda dev: describe) if describe is not None else None,
    )


@pytest.mark.parametrize(
    ("description", "message"),
    [
        (DeviceDescription(attributes={"numaNode": 3}), "attribute 'numaNode' is devplug's own"),
        (DeviceDescription(attributes={f"{DRIVER}/replica": 3}), f"attribute '{DRIVER}/replica' is devplug's own"),
        (
            DeviceDescription(attributes={"model": "a", f"{DRIVER}/model": "b"}),
            f"attribute '{DRIVER}/model' is given twice (bare and in {DRIVER}/)",
        ),
        (DeviceDescription(attributes={"Bad.Domain/x": 1}), "'Bad.Domain/x': the domain must be a DNS subdomain"),
        (DeviceDescription(attributes={"x" * 33: 1}), "must end in a C identifier of at most 32 characters"),
        (DeviceDescription(attributes={"big": 2**63}), "attribute 'big': 9223372036854775808 does not fit"),
        (DeviceDescription(attributes={"s": "x" * 65}), "attribute 's': the string is longer than 64 bytes"),
        (DeviceDescription(attributes={"v": Version("1.2")}), "attribute 'v': '1.2' is no semantic version"),
        (DeviceDescription(attributes={"f": 1.5}), "attribute 'f': 1.5 is not a bool, int, str or Version"),  # type: ignore[dict-item]
        (DeviceDescription(capacity={"memory": "16 GB"}), "capacity 'memory': '16 GB' is no quantity"),
        (DeviceDescription(capacity={"memory": "4K"}), "capacity 'memory': '4K' is no quantity"),  # kilo is k
        (
            DeviceDescription(attributes={"v": Version("1.2.3-" + "a" * 60)}),
            "attribute 'v': the version is longer than 64 bytes",
        ),
        (
            DeviceDescription(attributes={f"a{i}": i for i in range(MAX_ATTRIBUTES_AND_CAPACITIES)}),
            f"{MAX_ATTRIBUTES_AND_CAPACITIES + 1} attributes and 0 capacities, more than the API's",
        ),
    ],
)
def test_a_bad_description_is_refused_naming_the_device_and_the_attribute(
    description: DeviceDescription, message: str
) -> None:
    with pytest.raises(SliceContentError, match=f"^device 'fpga0': .*{re.escape(message)}"):
        pool_of(Device("fpga0"), describe=description)


def test_a_describer_that_raises_is_named() -> None:
    table = DeviceTable()
    table.replace([Device("fpga0")])

    def describe(dev: Device) -> DeviceDescription:
        raise KeyError("model")

    with pytest.raises(SliceContentError, match="device 'fpga0': the driver's description failed: KeyError: 'model'"):
        build_pool(table, driver=DRIVER, pool="node-a", node="node-a", describe=describe)


def test_two_ids_of_one_name_are_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    import devplug.frontends.dra.devicenames as names

    # a collision of 65-bit hashes cannot be found: make one by giving both IDs one name
    monkeypatch.setattr(names, "device_name", lambda device_id: "gpu0")
    with pytest.raises(SliceContentError, match="device IDs 'GPU0' and 'gpu0' both map"):
        pool_of(Device("GPU0"), Device("gpu0"))


def test_an_id_longer_than_a_string_attribute_has_no_device_id_attribute_and_a_valid_name() -> None:
    long_id = "pci-" + "a" * 100
    pool = pool_of(Device(long_id))
    ((_, spec),) = pool.slices
    (device,) = spec["devices"]
    assert "deviceID" not in device.get("attributes", {})
    assert len(device["name"]) <= 63 and pool.names.device_id(device["name"]) == long_id


def test_without_taints_unavailable_devices_are_left_out_and_counted() -> None:
    pool = pool_of(Device("a"), Device("b", health=Health.UNHEALTHY), taints=False)
    ((_, spec),) = pool.slices
    assert [d["name"] for d in spec["devices"]] == ["a"]
    assert (pool.omitted, pool.tainted) == (1, 0)
    tainted = pool_of(Device("a"), Device("b", health=Health.UNHEALTHY))
    assert (tainted.omitted, tainted.tainted) == (0, 1)
    assert tainted.digest != pool.digest


def test_slice_names_are_valid_object_names_for_any_pool_and_driver() -> None:
    assert slice_name("node-a", DRIVER, 0) == "node-a-fpga.example.com-0"
    for pool in ("Node_A", "n" * 250, "a/b"):
        name = slice_name(pool, DRIVER, 3)
        assert validation.dns_subdomain(name, "metadata.name") == [], name
        assert name.endswith("-3")
        assert slice_name(pool, DRIVER, 3) == name != slice_name(pool + "x", DRIVER, 3)


@pytest.mark.parametrize("quantity", ["4", "16Gi", "1.5", "500m", "2k", "3M", "1e3", "+7Ei", ".5"])
def test_quantities_in_kubernetes_syntax_are_published(quantity: str) -> None:
    pool = pool_of(Device("fpga0"), describe=DeviceDescription(capacity={"memory": quantity}))
    ((_, spec),) = pool.slices
    assert spec["devices"][0]["capacity"] == {"memory": {"value": quantity}}
