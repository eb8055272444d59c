"""devplug.kit.owners: one resource per device, refused the same way by every driver."""

from __future__ import annotations

import pytest

from devplug.kit import DeviceOwners


def test_a_device_taken_by_a_second_resource_is_refused_naming_both() -> None:
    owners = DeviceOwners("drive", hint="; list each drive in one resource's serials")
    owners.take("S1", "example.com/a", "drive S1")
    owners.take("S1", "example.com/a", "drive S1")  # the same resource again: fine
    with pytest.raises(ValueError, match="claimed by both") as caught:
        owners.take("S1", "example.com/b", "drive S1")
    assert str(caught.value) == (
        "drive S1 is claimed by both example.com/a and example.com/b: a drive belongs to one resource; "
        "list each drive in one resource's serials"
    )
    assert owners.owner("S1") == "example.com/a"


def test_take_all_is_all_or_nothing_and_release_frees_only_what_it_is_told() -> None:
    owners = DeviceOwners("VF", verb="selected")
    owners.take_all([(("sys", 1), "VF 1"), (("other", 1), "VF 1 elsewhere")], "example.com/a")
    with pytest.raises(ValueError, match=r"VF 1 is selected by both example\.com/a and example\.com/b: a VF belongs"):
        owners.take_all([(("sys", 2), "VF 2"), (("sys", 1), "VF 1")], "example.com/b")
    assert owners.owner(("sys", 2)) is None  # nothing of the refused take stayed
    owners.release("example.com/a", only=lambda key: key[0] == "sys")  # type: ignore[index]
    assert owners.owner(("sys", 1)) is None
    assert owners.owner(("other", 1)) == "example.com/a"


def test_the_article_fits_the_word() -> None:
    owners = DeviceOwners("interface")
    owners.take("eth0", "a", "eth0")
    with pytest.raises(ValueError, match="an interface belongs to one resource"):
        owners.take("eth0", "b", "eth0")
