"""What a prepared FPGA device shows in a DRA claim's ``status.devices`` (contract 1.1, KEP-4817).

With the ``device_status`` option, ``allocate`` returns for each device the AFU IDs its regions hold once the
driver is done with them (after programming the default image, when one is configured), read from the port's
``afu_id`` (dfl backend; the command backend cannot tell):

* a region: ``data`` ``{"afuId": "<32 hex digits>", "region": "<port, e.g. dfl-port.0, or the region's number>",
  "card": "<PCI address>"}``;
* a whole card: ``data`` ``{"card": "<PCI address>", "regions": [{"region": ..., "afuId": ...}, ...]}``;

and a condition ``Programmed``: ``True`` when every region holds an image other than the blank one (reason
``DefaultImage`` when it is the configured default image, else ``ImageLoaded``), ``False`` when one holds the
blank image (``blank_afu_id``; reason ``Blank``), ``Unknown`` when one cannot be read (reason ``AfuIdUnknown``).
An unreadable AFU ID is left out of ``data``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from devplug.types import DeviceCondition, DeviceStatus
from devplug_fpga.devices import Region, Target
from devplug_fpga.options import FpgaOptions

__all__ = ["PROGRAMMED", "device_status"]

#: The condition type a prepared FPGA device carries.
PROGRAMMED = "Programmed"


def _region_name(region: Region) -> str:
    return region.port or str(region.index)


def _condition(afu_ids: Sequence[str | None], options: FpgaOptions) -> DeviceCondition:
    if not afu_ids:
        return DeviceCondition(PROGRAMMED, "Unknown", "NoRegions", "the card has no regions")
    if any(a is None for a in afu_ids):
        return DeviceCondition(PROGRAMMED, "Unknown", "AfuIdUnknown", "the AFU ID of a region cannot be read")
    if options.blank_afu_id is not None and options.blank_afu_id in afu_ids:
        return DeviceCondition(PROGRAMMED, "False", "Blank", "a region holds the blank image")
    if options.default_afu_id is not None and all(a == options.default_afu_id for a in afu_ids):
        return DeviceCondition(PROGRAMMED, "True", "DefaultImage", "the default image is loaded")
    return DeviceCondition(PROGRAMMED, "True", "ImageLoaded", "an image is loaded")


def device_status(target: Target, afu_ids: Sequence[str | None], options: FpgaOptions) -> DeviceStatus:
    """The status of ``target`` whose regions (in order) hold ``afu_ids`` (``None``: unreadable)."""
    condition = _condition(afu_ids, options)
    data: dict[str, Any]
    if target.whole:
        regions = []
        for region, afu in zip(target.regions, afu_ids, strict=True):
            entry = {"region": _region_name(region)}
            if afu is not None:
                entry["afuId"] = afu
            regions.append(entry)
        data = {"card": target.card.address, "regions": regions}
    else:
        (region,) = target.regions
        (afu,) = afu_ids
        data = {"region": _region_name(region), "card": target.card.address}
        if afu is not None:
            data["afuId"] = afu
    return DeviceStatus(conditions=(condition,), data=data)
