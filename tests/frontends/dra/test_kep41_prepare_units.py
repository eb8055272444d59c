"""Issue 41, the prepare side's pure parts: Kubernetes quantities (quantity.go's grammar, exact) and the mapping of a
claim's shares of a device with consumable capacity to its replicas (shares.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from devplug.engine import DeviceTable
from devplug.frontends.dra.capacity import shared_capacity
from devplug.frontends.dra.claims import AllocatedDevice, ClaimRef
from devplug.frontends.dra.quantity import QuantityError, ceil_div, parse_quantity
from devplug.frontends.dra.shares import OverConsumedError, ShareError, assign, choose, shares_of
from devplug.types import Device, ShareCapacity

REF = ClaimRef("default", "c", "0e4f0d7c-0000-4000-8000-000000000001")
DRIVER = "mock.example.com"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("0", Fraction(0)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("500m", Fraction(1, 2)),
        ("1500m", Fraction(3, 2)),
        ("250u", Fraction(1, 4000)),
        ("3n", Fraction(3, 10**9)),
        ("2k", Fraction(2000)),
        ("4M", Fraction(4 * 10**6)),
        ("1G", Fraction(10**9)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),
        ("1Ki", Fraction(1024)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1Ti", Fraction(2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("12e6", Fraction(12 * 10**6)),
        ("1E3", Fraction(1000)),
        ("1e-3", Fraction(1, 1000)),
        ("1e+2", Fraction(100)),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", ".", "-", "1Zi", "1ki", "one", "1 Gi", "1e", "1e1.5", "Gi", "1GiB", "1e9999"])
def test_text_that_is_no_quantity_is_refused_naming_it(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert repr(text) in str(caught.value)


def test_ceil_div_rounds_up_to_whole_steps() -> None:
    assert [ceil_div(Fraction(n), 2) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert ceil_div(Fraction(1, 1000), 1) == 1


def _table(*devices: Device) -> DeviceTable:
    table = DeviceTable(replicas=1)
    table.replace(devices)
    return table


def _share(name: str, share: str | None, consumed: dict[str, str], request: str = "r") -> AllocatedDevice:
    return AllocatedDevice(request, name, name, share, False, tuple(sorted(consumed.items())))


def test_a_shared_device_offers_its_replicas_as_shares_and_a_whole_device_none() -> None:
    table = _table(Device("gpu0", replicas=4, share_capacity=ShareCapacity("memory", 4)), Device("nic0"))
    of = shared_capacity(table, "gpu0")
    assert of is not None and of.replica_ids == tuple(f"gpu0::{k}" for k in range(4)) and of.total == 16
    assert shared_capacity(table, "nic0") is None and shared_capacity(table, "gpu0::1") is None


def test_shares_take_the_lowest_free_replicas_rounded_up_to_whole_replicas() -> None:
    table = _table(Device("gpu0", replicas=4, share_capacity=ShareCapacity("memory", 4)), Device("nic0"))
    devices = [
        _share("gpu0", "s1", {"memory": "6"}),  # 6 of 4 per replica: 2 replicas
        AllocatedDevice("r", "nic0", "nic0"),
        _share("gpu0", "s2", {f"{DRIVER}/memory": "4"}),  # the key qualified with the driver's domain
    ]
    shares = shares_of(REF, devices, table, DRIVER)
    assert {i: s.replicas for i, s in shares.items()} == {0: 2, 2: 1}
    held = {"gpu0::0"}
    with pytest.raises(OverConsumedError) as caught:
        choose(REF, devices, shares, held=held.__contains__, withheld=frozenset({"gpu0::2"}))
    message = str(caught.value)
    assert "share s2 of device gpu0" in message and "2 of its 4 are free" in message and "need 3" in message
    ids = choose(REF, devices, shares, held=held.__contains__, withheld=frozenset())
    assert ids == [("gpu0::1", "gpu0::2"), ("nic0",), ("gpu0::3",)]


def test_a_repeated_prepare_gets_the_replicas_its_record_holds_compared_by_count() -> None:
    table = _table(Device("gpu0", replicas=4), Device("nic0"))
    devices = [_share("gpu0", "s1", {"shares": "2"}), AllocatedDevice("r", "nic0", "nic0")]
    shares = shares_of(REF, devices, table, DRIVER)
    assert assign(devices, shares, ("gpu0::3", "nic0", "gpu0::1"), table) == [("gpu0::1", "gpu0::3"), ("nic0",)]
    assert assign(devices, shares, ("gpu0::3", "nic0"), table) is None  # one replica short
    assert assign(devices, shares, ("gpu0::3", "gpu0::0", "gpu0::1", "nic0"), table) is None  # one too many
    assert assign(devices, shares, ("gpu0::3", "gpu0::1"), table) is None  # nic0 missing


@pytest.mark.parametrize(
    ("share", "consumed", "said"),
    [
        (None, {"shares": "1"}, "without a shareID"),
        ("s1", {}, "names no 'shares'"),
        ("s1", {"shares": "lots"}, "'lots' is not a quantity"),
        ("s1", {"shares": "0"}, "outside what the device offers"),
        ("s1", {"shares": "5"}, "outside what the device offers (above 0, at most 4)"),
    ],
)
def test_a_share_described_wrongly_is_refused_naming_claim_device_and_share(
    share: str | None, consumed: dict[str, str], said: str
) -> None:
    table = _table(Device("gpu0", replicas=4))
    with pytest.raises(ShareError) as caught:
        shares_of(REF, [_share("gpu0", share, consumed)], table, DRIVER)
    assert str(REF) in str(caught.value) and "gpu0" in str(caught.value) and said in str(caught.value)
